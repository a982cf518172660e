package disd.spark;

import static disd.spark.ColumnFormat.DOUBLE_NULL;
import static disd.spark.ColumnFormat.FLOAT_NULL;
import static disd.spark.ColumnFormat.INTS;
import static disd.spark.ColumnFormat.LE;
import static disd.spark.ColumnFormat.LONGS;
import static disd.spark.ColumnFormat.SHORTS;

import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;

/** A fixed-width column: rows [start, stop) of {@code <column>.dat}, stored as {@code kind},
 *  presented as {@code type} (the same, or an exact widening of it); or, when the location is
 *  in a version newer than the query's, where the column widened after the query started, stored
 *  as {@code kind} and narrowed back to the query's {@code queryKind} first. */
final class FixedCursor extends Cursor {
    final Fetch.Stream in;
    final TableSchema.Kind kind;
    final DataType type;
    final int width;
    /** The query's type when it is narrower than the stored one, else null. */
    final TableSchema.Kind narrowTo;
    /** The column and location, for the error when a value does not fit {@code narrowTo}. */
    final String what;
    final int version;

    FixedCursor(Fetch fetch, Planner.Slice s, String column, TableSchema.Kind kind, DataType type) {
        this(fetch, s, column, kind, type, kind, "", column);
    }

    FixedCursor(Fetch fetch, Planner.Slice s, String column, TableSchema.Kind kind, DataType type,
                TableSchema.Kind queryKind, String table, String queryColumn) {
        this.kind = kind;
        this.type = type;
        width = kind.width;
        narrowTo = queryKind != null && queryKind != kind && narrows(kind, queryKind) ? queryKind : null;
        what = table + " column '" + queryColumn + "'" + (queryColumn.equals(column) ? "" : " (now '" + column + "')")
            + " in location " + s.location.offsetKey();
        version = s.location.version;
        in = fetch.open(s.location, column + ".dat", s.start * width, s.stop * width);
    }

    /** Whether {@code stored} is a widening of {@code query} (docs/schema-versions.md). */
    static boolean narrows(TableSchema.Kind stored, TableSchema.Kind query) {
        switch (query) {
            case BYTE:
                return stored == TableSchema.Kind.SHORT || stored == TableSchema.Kind.INT
                    || stored == TableSchema.Kind.LONG;
            case SHORT:
                return stored == TableSchema.Kind.INT || stored == TableSchema.Kind.LONG;
            case INT:
                return stored == TableSchema.Kind.LONG;
            case FLOAT:
                return stored == TableSchema.Kind.DOUBLE;
            default:
                return false;
        }
    }

    @Override
    void fill(WritableColumnVector v, int n) {
        byte[] b = buffer(n * width);
        in.read(b, 0, n * width);
        if (narrowTo != null) {
            narrow(v, b, n);
        } else if (!type.equals(kind.spark())) {
            widen(v, b, n);
        } else if (kind == TableSchema.Kind.CHAR) {
            chars(v, b, n);
        } else if (kind == TableSchema.Kind.TIMESTAMP) {
            // nanoseconds to Spark's microseconds, truncated toward zero (as Arrow's cast)
            for (int i = 0; i < n; i++) {
                v.putLong(i, (long) LONGS.get(b, i << 3) / 1000);
            }
            markNulls(v, b, n);
        } else {
            same(v, b, n);
            markNulls(v, b, n);
        }
    }

    /** The stored values as they are, in bulk: the vector's type is the stored one. */
    private void same(WritableColumnVector v, byte[] b, int n) {
        switch (kind) {
            case BOOL:
            case BYTE:
                v.putBytes(0, n, b, 0);
                break;
            case SHORT:
                if (LE) {
                    v.putShorts(0, n, b, 0);
                } else {
                    for (int i = 0; i < n; i++) {
                        v.putShort(i, (short) SHORTS.get(b, i << 1));
                    }
                }
                break;
            case INT:
                v.putIntsLittleEndian(0, n, b, 0);
                break;
            case LONG:
                v.putLongsLittleEndian(0, n, b, 0);
                break;
            case FLOAT:
                v.putFloatsLittleEndian(0, n, b, 0);
                break;
            case DOUBLE:
                v.putDoublesLittleEndian(0, n, b, 0);
                break;
            default:
                throw new IllegalStateException("not a fixed-width type: " + kind);
        }
    }

    /**
     * The rows of {@code b} that hold the stored kind's null sentinel (docs/storage-format.md)
     * marked null in {@code v}: the one place every path of this cursor finds its nulls.
     * A loop per width, so that no value is boxed nor read through a virtual call.
     */
    private void markNulls(WritableColumnVector v, byte[] b, int n) {
        switch (kind) {
            case BOOL:
                nullBytes(v, b, n, (byte) -1);
                break;
            case BYTE:
                nullBytes(v, b, n, Byte.MIN_VALUE);
                break;
            case SHORT:
                nullShorts(v, b, n, Short.MIN_VALUE);
                break;
            case INT:
                nullInts(v, b, n, Integer.MIN_VALUE);
                break;
            case FLOAT:
                nullInts(v, b, n, FLOAT_NULL);
                break;
            case LONG:
            case TIMESTAMP:
                nullLongs(v, b, n, Long.MIN_VALUE);
                break;
            case DOUBLE:
                nullLongs(v, b, n, DOUBLE_NULL);
                break;
            default:
                throw new IllegalStateException("not a fixed-width type: " + kind);
        }
    }

    private static void nullBytes(WritableColumnVector v, byte[] b, int n, byte nil) {
        for (int i = 0; i < n; i++) {
            if (b[i] == nil) {
                v.putNull(i);
            }
        }
    }

    private static void nullShorts(WritableColumnVector v, byte[] b, int n, short nil) {
        for (int i = 0; i < n; i++) {
            if ((short) SHORTS.get(b, i << 1) == nil) {
                v.putNull(i);
            }
        }
    }

    private static void nullInts(WritableColumnVector v, byte[] b, int n, int nil) {
        for (int i = 0; i < n; i++) {
            if ((int) INTS.get(b, i << 2) == nil) {
                v.putNull(i);
            }
        }
    }

    private static void nullLongs(WritableColumnVector v, byte[] b, int n, long nil) {
        for (int i = 0; i < n; i++) {
            if ((long) LONGS.get(b, i << 3) == nil) {
                v.putNull(i);
            }
        }
    }

    /** One UTF-16 code unit per row, as a one-character string (a lone surrogate: U+FFFD):
     *  dictionary-encoded, the code unit being the id. */
    private void chars(WritableColumnVector v, byte[] b, int n) {
        WritableColumnVector ids = v.reserveDictionaryIds(n);
        v.setDictionary(CharDictionary.INSTANCE);
        for (int i = 0; i < n; i++) {
            int c = ((short) SHORTS.get(b, i << 1)) & 0xFFFF;
            if (c == 0xFFFF) {
                v.putNull(i);
            } else {
                ids.putInt(i, c);
            }
        }
    }

    private long[] wide = new long[0];
    private float[] floats = new float[0];
    private Object out;

    /**
     * An exact widening: a location written before the column widened, or a user's schema
     * asking for a wider type (Projection.converts).  The stored values go to a long[] (a
     * double[] for float), then to the new type's array, into the vector in bulk; rows holding
     * the stored type's null sentinel are then marked null.
     */
    private void widen(WritableColumnVector v, byte[] b, int n) {
        if (kind == TableSchema.Kind.FLOAT) {
            double[] d = scratch(double[].class, n);
            for (int i = 0; i < n; i++) {
                d[i] = Float.intBitsToFloat((int) INTS.get(b, i << 2));
            }
            v.putDoubles(0, n, d, 0);
        } else if (kind == TableSchema.Kind.BYTE || kind == TableSchema.Kind.SHORT || kind == TableSchema.Kind.INT) {
            put(v, integers(b, n), n);
        } else {
            throw new IllegalStateException("no widening from " + kind + " to " + type);
        }
        markNulls(v, b, n);
    }

    /** The stored values of an integer kind as longs, in a reused array (the null sentinel, the
     *  kind's smallest value, stays that value). */
    private long[] integers(byte[] b, int n) {
        if (wide.length < n) {
            wide = new long[n];
        }
        long[] x = wide;
        switch (kind) {
            case BYTE:
                for (int i = 0; i < n; i++) {
                    x[i] = b[i];
                }
                break;
            case SHORT:
                for (int i = 0; i < n; i++) {
                    x[i] = (short) SHORTS.get(b, i << 1);
                }
                break;
            case INT:
                for (int i = 0; i < n; i++) {
                    x[i] = (int) INTS.get(b, i << 2);
                }
                break;
            case LONG:
                for (int i = 0; i < n; i++) {
                    x[i] = (long) LONGS.get(b, i << 3);
                }
                break;
            default:
                throw new IllegalStateException("not an integer type: " + kind);
        }
        return x;
    }

    /** The smallest value of an integer kind: its null sentinel; its complement is the largest. */
    private static long smallest(TableSchema.Kind k) {
        switch (k) {
            case BYTE:
                return Byte.MIN_VALUE;
            case SHORT:
                return Short.MIN_VALUE;
            case INT:
                return Integer.MIN_VALUE;
            case LONG:
                return Long.MIN_VALUE;
            default:
                throw new IllegalStateException("not an integer type: " + k);
        }
    }

    /** {@code x[0..n)} into {@code v} as {@code type}, in bulk (nulls are the caller's). */
    private void put(WritableColumnVector v, long[] x, int n) {
        if (type.equals(DataTypes.LongType)) {
            v.putLongs(0, n, x, 0);
        } else if (type.equals(DataTypes.IntegerType)) {
            int[] t = scratch(int[].class, n);
            for (int i = 0; i < n; i++) {
                t[i] = (int) x[i];
            }
            v.putInts(0, n, t, 0);
        } else if (type.equals(DataTypes.ShortType)) {
            short[] t = scratch(short[].class, n);
            for (int i = 0; i < n; i++) {
                t[i] = (short) x[i];
            }
            v.putShorts(0, n, t, 0);
        } else if (type.equals(DataTypes.ByteType)) {
            byte[] t = scratch(byte[].class, n);
            for (int i = 0; i < n; i++) {
                t[i] = (byte) x[i];
            }
            v.putBytes(0, n, t, 0);
        } else if (type.equals(DataTypes.FloatType)) {
            float[] t = scratch(float[].class, n);
            for (int i = 0; i < n; i++) {
                t[i] = x[i];
            }
            v.putFloats(0, n, t, 0);
        } else if (type.equals(DataTypes.DoubleType)) {
            double[] t = scratch(double[].class, n);
            for (int i = 0; i < n; i++) {
                t[i] = x[i];
            }
            v.putDoubles(0, n, t, 0);
        } else {
            throw new IllegalStateException("no widening from " + kind + " to " + type);
        }
    }

    /**
     * A column that widened after the query started, read from a location of the newer
     * version: the stored values to a long[] (a double[] for double), checked against the
     * query's type (a value outside its range — for float, a finite double beyond float's
     * range — fails the batch: the query's type cannot present it), then put as the query
     * presents the column; the stored type's null sentinel stays null.
     */
    private void narrow(WritableColumnVector v, byte[] b, int n) {
        if (kind == TableSchema.Kind.DOUBLE) {
            double[] d = scratch(double[].class, n);
            for (int i = 0; i < n; i++) {
                double x = Double.longBitsToDouble((long) LONGS.get(b, i << 3));
                float f = (float) x;
                if (Float.isInfinite(f) && !Double.isInfinite(x) && (long) LONGS.get(b, i << 3) != DOUBLE_NULL) {
                    throw doesNotFit(Double.toString(x));
                }
                d[i] = f;
            }
            if (type.equals(DataTypes.FloatType)) {
                if (floats.length < n) {
                    floats = new float[n];
                }
                float[] t = floats;
                for (int i = 0; i < n; i++) {
                    t[i] = (float) d[i];
                }
                v.putFloats(0, n, t, 0);
            } else {
                v.putDoubles(0, n, d, 0);
            }
        } else {
            long[] x = integers(b, n);
            long nil = smallest(kind);
            long lo = smallest(narrowTo);
            long hi = ~lo;
            for (int i = 0; i < n; i++) {
                long y = x[i];
                if ((y < lo || y > hi) && y != nil) {
                    throw doesNotFit(Long.toString(y));
                }
            }
            put(v, x, n);
        }
        markNulls(v, b, n);
    }

    private DisSourceError doesNotFit(String value) {
        String stored = kind.name().toLowerCase(java.util.Locale.ROOT);
        String query = narrowTo.name().toLowerCase(java.util.Locale.ROOT);
        return new DisSourceError(what + " holds " + value + " (a " + stored + " in schema version " + version
            + "), which the query's type " + query + " cannot hold: the column widened to " + stored
            + " after this streaming query started; restart the query to read the table in its newest version");
    }

    /** A reused array of class {@code cls} (int[].class, …) at least {@code n} long: a cursor
     *  presents one type, so one array serves every batch. */
    private <A> A scratch(Class<A> cls, int n) {
        if (!cls.isInstance(out) || java.lang.reflect.Array.getLength(out) < n) {
            out = java.lang.reflect.Array.newInstance(cls.getComponentType(), n);
        }
        return cls.cast(out);
    }

    @Override
    void close() {
        in.close();
    }
}
