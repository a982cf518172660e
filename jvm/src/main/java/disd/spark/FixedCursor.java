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
            return;
        }
        if (!type.equals(kind.spark())) {
            widen(v, b, n);
            return;
        }
        switch (kind) {
            case BOOL:
                v.putBytes(0, n, b, 0);
                for (int i = 0; i < n; i++) {
                    if (b[i] == -1) {
                        v.putNull(i);
                    }
                }
                break;
            case BYTE:
                v.putBytes(0, n, b, 0);
                for (int i = 0; i < n; i++) {
                    if (b[i] == Byte.MIN_VALUE) {
                        v.putNull(i);
                    }
                }
                break;
            case SHORT:
                if (LE) {
                    v.putShorts(0, n, b, 0);
                } else {
                    for (int i = 0; i < n; i++) {
                        v.putShort(i, (short) SHORTS.get(b, i << 1));
                    }
                }
                for (int i = 0; i < n; i++) {
                    if ((short) SHORTS.get(b, i << 1) == Short.MIN_VALUE) {
                        v.putNull(i);
                    }
                }
                break;
            case INT:
                v.putIntsLittleEndian(0, n, b, 0);
                for (int i = 0; i < n; i++) {
                    if ((int) INTS.get(b, i << 2) == Integer.MIN_VALUE) {
                        v.putNull(i);
                    }
                }
                break;
            case LONG:
                v.putLongsLittleEndian(0, n, b, 0);
                for (int i = 0; i < n; i++) {
                    if ((long) LONGS.get(b, i << 3) == Long.MIN_VALUE) {
                        v.putNull(i);
                    }
                }
                break;
            case FLOAT:
                v.putFloatsLittleEndian(0, n, b, 0);
                for (int i = 0; i < n; i++) {
                    if ((int) INTS.get(b, i << 2) == FLOAT_NULL) {
                        v.putNull(i);
                    }
                }
                break;
            case DOUBLE:
                v.putDoublesLittleEndian(0, n, b, 0);
                for (int i = 0; i < n; i++) {
                    if ((long) LONGS.get(b, i << 3) == DOUBLE_NULL) {
                        v.putNull(i);
                    }
                }
                break;
            case TIMESTAMP:
                // nanoseconds to Spark's microseconds, truncated toward zero (as Arrow's cast)
                for (int i = 0; i < n; i++) {
                    long x = (long) LONGS.get(b, i << 3);
                    if (x == Long.MIN_VALUE) {
                        v.putNull(i);
                    } else {
                        v.putLong(i, x / 1000);
                    }
                }
                break;
            case CHAR:
                chars(v, b, n);
                break;
            default:
                throw new IllegalStateException("not a fixed-width type: " + kind);
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
            double[] d = doubles(n);
            for (int i = 0; i < n; i++) {
                d[i] = Float.intBitsToFloat((int) INTS.get(b, i << 2));
            }
            v.putDoubles(0, n, d, 0);
            for (int i = 0; i < n; i++) {
                if ((int) INTS.get(b, i << 2) == FLOAT_NULL) {
                    v.putNull(i);
                }
            }
            return;
        }
        if (wide.length < n) {
            wide = new long[n];
        }
        long[] x = wide;
        long nil;
        switch (kind) {
            case BYTE:
                for (int i = 0; i < n; i++) {
                    x[i] = b[i];
                }
                nil = Byte.MIN_VALUE;
                break;
            case SHORT:
                for (int i = 0; i < n; i++) {
                    x[i] = (short) SHORTS.get(b, i << 1);
                }
                nil = Short.MIN_VALUE;
                break;
            case INT:
                for (int i = 0; i < n; i++) {
                    x[i] = (int) INTS.get(b, i << 2);
                }
                nil = Integer.MIN_VALUE;
                break;
            default:
                throw new IllegalStateException("no widening from " + kind + " to " + type);
        }
        put(v, x, n, nil);
    }

    /** {@code x[0..n)} into {@code v} as {@code type}, rows equal to {@code nil} null. */
    private void put(WritableColumnVector v, long[] x, int n, long nil) {
        if (type.equals(DataTypes.LongType)) {
            v.putLongs(0, n, x, 0);
        } else if (type.equals(DataTypes.IntegerType)) {
            int[] t = out instanceof int[] && ((int[]) out).length >= n ? (int[]) out : new int[n];
            out = t;
            for (int i = 0; i < n; i++) {
                t[i] = (int) x[i];
            }
            v.putInts(0, n, t, 0);
        } else if (type.equals(DataTypes.ShortType)) {
            short[] t = out instanceof short[] && ((short[]) out).length >= n ? (short[]) out : new short[n];
            out = t;
            for (int i = 0; i < n; i++) {
                t[i] = (short) x[i];
            }
            v.putShorts(0, n, t, 0);
        } else if (type.equals(DataTypes.ByteType)) {
            byte[] t = out instanceof byte[] && ((byte[]) out).length >= n ? (byte[]) out : new byte[n];
            out = t;
            for (int i = 0; i < n; i++) {
                t[i] = (byte) x[i];
            }
            v.putBytes(0, n, t, 0);
        } else if (type.equals(DataTypes.FloatType)) {
            float[] t = out instanceof float[] && ((float[]) out).length >= n ? (float[]) out : new float[n];
            out = t;
            for (int i = 0; i < n; i++) {
                t[i] = x[i];
            }
            v.putFloats(0, n, t, 0);
        } else if (type.equals(DataTypes.DoubleType)) {
            double[] t = doubles(n);
            for (int i = 0; i < n; i++) {
                t[i] = x[i];
            }
            v.putDoubles(0, n, t, 0);
        } else {
            throw new IllegalStateException("no widening from " + kind + " to " + type);
        }
        for (int i = 0; i < n; i++) {
            if (x[i] == nil) {
                v.putNull(i);
            }
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
            double[] d = doubles(n);
            for (int i = 0; i < n; i++) {
                d[i] = Double.longBitsToDouble((long) LONGS.get(b, i << 3));
            }
            for (int i = 0; i < n; i++) {
                double x = d[i];
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
            for (int i = 0; i < n; i++) {
                if ((long) LONGS.get(b, i << 3) == DOUBLE_NULL) {
                    v.putNull(i);
                }
            }
            return;
        }
        if (wide.length < n) {
            wide = new long[n];
        }
        long[] x = wide;
        long nil;
        switch (kind) {
            case SHORT:
                for (int i = 0; i < n; i++) {
                    x[i] = (short) SHORTS.get(b, i << 1);
                }
                nil = Short.MIN_VALUE;
                break;
            case INT:
                for (int i = 0; i < n; i++) {
                    x[i] = (int) INTS.get(b, i << 2);
                }
                nil = Integer.MIN_VALUE;
                break;
            case LONG:
                for (int i = 0; i < n; i++) {
                    x[i] = (long) LONGS.get(b, i << 3);
                }
                nil = Long.MIN_VALUE;
                break;
            default:
                throw new IllegalStateException("no narrowing from " + kind + " to " + narrowTo);
        }
        long lo;
        long hi;
        switch (narrowTo) {
            case BYTE:
                lo = Byte.MIN_VALUE;
                hi = Byte.MAX_VALUE;
                break;
            case SHORT:
                lo = Short.MIN_VALUE;
                hi = Short.MAX_VALUE;
                break;
            case INT:
                lo = Integer.MIN_VALUE;
                hi = Integer.MAX_VALUE;
                break;
            default:
                throw new IllegalStateException("no narrowing from " + kind + " to " + narrowTo);
        }
        for (int i = 0; i < n; i++) {
            long y = x[i];
            if ((y < lo || y > hi) && y != nil) {
                throw doesNotFit(Long.toString(y));
            }
        }
        put(v, x, n, nil);
    }

    private DisSourceError doesNotFit(String value) {
        String stored = kind.name().toLowerCase(java.util.Locale.ROOT);
        String query = narrowTo.name().toLowerCase(java.util.Locale.ROOT);
        return new DisSourceError(what + " holds " + value + " (a " + stored + " in schema version " + version
            + "), which the query's type " + query + " cannot hold: the column widened to " + stored
            + " after this streaming query started; restart the query to read the table in its newest version");
    }

    private double[] doubles(int n) {
        double[] t = out instanceof double[] && ((double[]) out).length >= n ? (double[]) out : new double[n];
        out = t;
        return t;
    }

    @Override
    void close() {
        in.close();
    }
}
