package disd.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.Dictionary;
import org.apache.spark.sql.execution.vectorized.OffHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A task: the slices of one input partition as ColumnarBatches of at most {@code batchRows} rows
 * (cut at multiples of it, so fixed-width reads stay on 64 KiB block boundaries).  Each column of a
 * slice is one range of its file, read in order into a reused array, copied into the column vector
 * in bulk and then scanned for the DIS's null sentinels (docs/storage-format.md).  The vectors are
 * reused from batch to batch, as Spark's own Parquet reader does; the partition column is a
 * constant vector per slice.
 *
 * <p>A location written in an older schema version is read in that version
 * ({@link SchemaVersions}): each output column from its origin's file (renamed: the old name),
 * converted from the old width where the column widened since (the old type's null sentinel
 * stays null), or all null where the column was added since.  Every column is filled into the
 * same vector class, so the generated code that reads the batches sees one implementation.
 *
 * <p>A streaming query keeps the version it started in, so it may meet a location written in a
 * newer version ({@link Planner.Part#schema} then knows it): each output column is read from the
 * column it became there ({@link SchemaVersions#sources}: renamed forward, null when dropped
 * since), and a column widened since is narrowed back to the query's type after a range check per
 * batch, which fails with a message to restart the query when a value does not fit.
 */
final class ColumnarReader implements PartitionReader<ColumnarBatch> {
    static final VarHandle SHORTS = MethodHandles.byteArrayViewVarHandle(short[].class, ByteOrder.LITTLE_ENDIAN);
    static final VarHandle INTS = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);
    static final VarHandle LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    static final boolean LE = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;
    static final long MASK = 0x7FFF_FFFF_FFFF_FFFFL;
    static final int FLOAT_NULL = Float.floatToIntBits(-Float.MAX_VALUE);
    static final long DOUBLE_NULL = Double.doubleToLongBits(-Double.MAX_VALUE);

    private final ReadSpec spec;
    private final Planner.Part part;
    private final List<Projection.Output> outputs;
    private final ColumnVector[] vectors;
    private final ColumnarBatch batch;
    private final Cursor[] cursors;
    private Fetch fetch;
    private int sliceIndex = -1;
    private Planner.Slice slice;
    private long pos;
    /** Per schema version: for each output, its column in that version (null: added since). */
    private final Map<Integer, TableSchema.Column[]> stored = new HashMap<>();

    ColumnarReader(ReadSpec spec, Planner.Part part) {
        this.spec = spec;
        this.part = part;
        this.outputs = spec.projection.outputs;
        int cap = spec.batchRows;
        vectors = new ColumnVector[outputs.size()];
        cursors = new Cursor[outputs.size()];
        for (int i = 0; i < vectors.length; i++) {
            Projection.Output o = outputs.get(i);
            if (o.isPartition()) {
                vectors[i] = new ConstantColumnVector(cap, DataTypes.StringType);
            } else {
                vectors[i] = spec.offHeap ? new OffHeapColumnVector(cap, o.type) : new OnHeapColumnVector(cap, o.type);
            }
        }
        batch = new ColumnarBatch(vectors);
    }

    @Override
    public boolean next() {
        while (slice == null || pos >= slice.stop) {
            if (!advance()) {
                return false;
            }
        }
        long a = pos;
        long b = Math.min(slice.stop, (a / spec.batchRows + 1) * spec.batchRows);
        int n = (int) (b - a);
        for (int i = 0; i < vectors.length; i++) {
            if (cursors[i] != null) {
                WritableColumnVector v = (WritableColumnVector) vectors[i];
                v.reset();
                cursors[i].fill(v, n);
            }
        }
        batch.setNumRows(n);
        pos = b;
        return true;
    }

    private boolean advance() {
        closeCursors();
        if (++sliceIndex >= part.slices.size()) {
            slice = null;
            return false;
        }
        if (fetch == null) {
            fetch = spec.fetch(part);
        }
        slice = part.slices.get(sliceIndex);
        pos = slice.start;
        fetch.check(slice.location);
        TableSchema.Column[] cols = storedColumns(slice.location.version);
        for (int i = 0; i < vectors.length; i++) {
            Projection.Output o = outputs.get(i);
            TableSchema.Column c = cols[i];
            if (o.isPartition()) {
                ((ConstantColumnVector) vectors[i]).setUtf8String(UTF8String.fromString(slice.location.columnPartition));
            } else if (c == null) {
                cursors[i] = NullCursor.INSTANCE;
            } else if (c.kind == TableSchema.Kind.STRING) {
                cursors[i] = new StringCursor(fetch, slice, c.name);
            } else {
                cursors[i] = new FixedCursor(fetch, slice, c.name, c.kind, o.type, o.kind, spec.projection.table.key(),
                    o.source);
            }
        }
        return true;
    }

    /** The column each output reads in schema version {@code version} (0: the query's): in an
     *  older version its origin, in a newer one (a stream's) the column it became. */
    private TableSchema.Column[] storedColumns(int version) {
        TableSchema query = part.schema != null ? part.schema : spec.projection.table;
        int v = version <= 0 ? query.version : version;
        TableSchema.Column[] cols = stored.get(v);
        if (cols == null) {
            cols = new TableSchema.Column[outputs.size()];
            TableSchema at = query.atVersion(v);
            Map<String, String> origin = v == query.version ? null : SchemaVersions.sources(query, v);
            for (int i = 0; i < cols.length; i++) {
                Projection.Output o = outputs.get(i);
                if (o.isPartition()) {
                    continue;
                }
                String name = origin == null ? o.source : origin.get(o.source);
                cols[i] = name == null ? null : at.column(name);
            }
            stored.put(v, cols);
        }
        return cols;
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    /** The dictionary of output {@code i}'s vector in the current batch, when it has one (the
     *  slice's string dictionary, or the one of single characters). */
    Dictionary dictionary(int i) {
        Cursor c = cursors[i];
        if (c instanceof StringCursor) {
            return ((StringCursor) c).dict;
        }
        return c instanceof FixedCursor ? CharDictionary.INSTANCE : null;
    }

    private void closeCursors() {
        for (int i = 0; i < cursors.length; i++) {
            if (cursors[i] != null) {
                cursors[i].close();
                cursors[i] = null;
            }
        }
    }

    @Override
    public void close() {
        try {
            closeCursors();
        } finally {
            if (fetch != null) {
                fetch.close();
                fetch = null;
            }
            for (ColumnVector v : vectors) {
                v.close();
            }
        }
    }

    // -- columns ----------------------------------------------------------------------------------
    abstract static class Cursor {
        byte[] buf = new byte[0];

        abstract void fill(WritableColumnVector v, int n);

        abstract void close();

        byte[] buffer(int size) {
            if (buf.length < size) {
                buf = new byte[Math.max(size, buf.length + (buf.length >> 1))];
            }
            return buf;
        }
    }

    /** A column added after the location's version: every row null. */
    static final class NullCursor extends Cursor {
        static final NullCursor INSTANCE = new NullCursor();

        @Override
        void fill(WritableColumnVector v, int n) {
            v.setDictionary(null);
            v.putNulls(0, n);
        }

        @Override
        void close() {
        }
    }

    /** A fixed-width column: rows [start, stop) of {@code <column>.dat}, stored as {@code kind},
     *  presented as {@code type} (the same, or an exact widening of it); or, when the location is
     *  in a version newer than the query's, where the column widened after the query started, stored
     *  as {@code kind} and narrowed back to the query's {@code queryKind} first. */
    static final class FixedCursor extends Cursor {
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

    /**
     * A string column: {@code <Column>.off} holds each row's end offset in {@code <Column>.dat}
     * (bit 63: null).  Rows [start, stop) need offsets [start-1, stop) and the data between the end
     * of row start-1 and the end of row stop-1.
     */
    static final class StringCursor extends Cursor {
        final Fetch.Stream off;
        final Fetch.Stream dat;
        long prevEnd;
        /** The slice's distinct values so far; null once there are too many (then plain). */
        StringDictionary dict = new StringDictionary();

        StringCursor(Fetch fetch, Planner.Slice s, String column) {
            String offFile = column + ".off";
            String datFile = column + ".dat";
            long first = Math.max(0, s.start - 1);
            long lastEnd = (long) LONGS.get(fetch.small(s.location, offFile, (s.stop - 1) * 8, s.stop * 8), 0) & MASK;
            Fetch.Stream o = fetch.open(s.location, offFile, first * 8, s.stop * 8);
            try {
                if (s.start > 0) {
                    byte[] p = new byte[8];
                    o.read(p, 0, 8);
                    prevEnd = (long) LONGS.get(p, 0) & MASK;
                }
                dat = fetch.open(s.location, datFile, prevEnd, lastEnd);
            } catch (RuntimeException e) {
                o.close();
                throw e;
            }
            off = o;
        }

        @Override
        void fill(WritableColumnVector v, int n) {
            byte[] ends = buffer(n * 8);
            off.read(ends, 0, n * 8);
            long last = (long) LONGS.get(ends, (n - 1) << 3) & MASK;
            long size = last - prevEnd;
            if (size < 0 || size > Integer.MAX_VALUE - 16) {
                throw new DisSourceError("string offsets out of order in a column file (end " + last + " after "
                    + prevEnd + ")");
            }
            byte[] d = dataBuffer((int) size + 8); // 8 spare bytes: the dictionary reads whole words
            if (size > 0) {
                dat.read(d, 0, (int) size);
            }
            if (dict == null || !encode(v, ends, d, n)) {
                dict = null;
                v.setDictionary(null);
                plain(v, ends, d, n, (int) size);
            }
            prevEnd = last;
        }

        /** As a dictionary (false, and nothing kept, once the column has too many distinct values). */
        private boolean encode(WritableColumnVector v, byte[] ends, byte[] d, int n) {
            WritableColumnVector ids = v.reserveDictionaryIds(n);
            long p = prevEnd;
            for (int i = 0; i < n; i++) {
                long e = (long) LONGS.get(ends, i << 3);
                long end = e & MASK;
                if (e < 0) {
                    v.putNull(i);
                } else {
                    int id = dict.id(d, (int) (p - prevEnd), (int) (end - p));
                    if (id < 0) {
                        return false;
                    }
                    ids.putInt(i, id);
                }
                p = end;
            }
            v.setDictionary(dict);
            return true;
        }

        private void plain(WritableColumnVector v, byte[] ends, byte[] d, int n, int size) {
            int base = size > 0 ? v.arrayData().appendBytes(size, d, 0) : 0;
            long p = prevEnd;
            for (int i = 0; i < n; i++) {
                long e = (long) LONGS.get(ends, i << 3);
                long end = e & MASK;
                if (e < 0) {
                    v.putNull(i);
                    v.putArray(i, base + (int) (p - prevEnd), 0);
                } else {
                    v.putArray(i, base + (int) (p - prevEnd), (int) (end - p));
                }
                p = end;
            }
        }

        private byte[] dataBuf = new byte[0];

        private byte[] dataBuffer(int size) {
            if (dataBuf.length < size) {
                dataBuf = new byte[Math.max(size, dataBuf.length + (dataBuf.length >> 1))];
            }
            return dataBuf;
        }

        @Override
        void close() {
            try {
                off.close();
            } finally {
                dat.close();
            }
        }
    }

    // -- dictionaries -----------------------------------------------------------------------------
    /**
     * A string column's distinct values, each its own array.  Spark hashes and compares a string
     * whose bytes are a whole array without copying them ({@code UTF8String.getBytes}); a value
     * that is a slice of a batch's data is copied for every row a grouping or join looks at.  So a
     * string column with few distinct values (a symbol, an exchange) goes to Spark
     * dictionary-encoded, as Parquet's reader hands over its dictionary pages.  Past
     * {@link #MAX_VALUES} values or {@link #MAX_BYTES} bytes the slice goes on plain.
     */
    static final class StringDictionary implements Dictionary {
        static final int MAX_VALUES = 1 << 16;
        static final long MAX_BYTES = 4L << 20;
        static final int MAX_LENGTH = 256;
        byte[][] values = new byte[64][];
        long[] heads = new long[64]; // each value's first 8 bytes, zero-padded
        int size;
        long bytes;
        int[] table = new int[256]; // ids + 1; 0: empty

        /** The id of bytes [off, off+len) of {@code d} (which has 8 bytes to spare after them),
         *  added if new; -1 when full. */
        int id(byte[] d, int off, int len) {
            if (len > MAX_LENGTH) {
                return -1;
            }
            long head = len == 0 ? 0 : (long) LONGS.get(d, off) & (len >= 8 ? -1L : (1L << (len << 3)) - 1);
            long h = head * 0x9E3779B97F4A7C15L + len;
            for (int i = 8; i < len; i += 8) {
                long w = (long) LONGS.get(d, off + i);
                if (len - i < 8) {
                    w &= (1L << ((len - i) << 3)) - 1;
                }
                h = (h ^ w) * 0x9E3779B97F4A7C15L;
            }
            int hash = (int) (h ^ (h >>> 29) ^ (h >>> 47));
            int mask = table.length - 1;
            for (int slot = hash & mask; ; slot = (slot + 1) & mask) {
                int t = table[slot];
                if (t == 0) {
                    break;
                }
                byte[] v = values[t - 1];
                if (heads[t - 1] == head && v.length == len && (len <= 8 || tailEquals(v, d, off, len))) {
                    return t - 1;
                }
            }
            if (size >= MAX_VALUES || bytes + len > MAX_BYTES) {
                return -1;
            }
            if (size == values.length) {
                values = java.util.Arrays.copyOf(values, size * 2);
                heads = java.util.Arrays.copyOf(heads, size * 2);
            }
            values[size] = java.util.Arrays.copyOfRange(d, off, off + len);
            heads[size] = head;
            bytes += len;
            size++;
            if (size * 2 > table.length) {
                table = new int[table.length * 2];
                for (int i = 0; i < size; i++) {
                    insert(values[i], i + 1);
                }
            } else {
                insert(hash, size);
            }
            return size - 1;
        }

        private static boolean tailEquals(byte[] v, byte[] d, int off, int len) {
            for (int i = 8; i < len; i++) {
                if (v[i] != d[off + i]) {
                    return false;
                }
            }
            return true;
        }

        private void insert(byte[] v, int idPlusOne) {
            byte[] padded = java.util.Arrays.copyOf(v, v.length + 8);
            int len = v.length;
            long head = len == 0 ? 0 : (long) LONGS.get(padded, 0) & (len >= 8 ? -1L : (1L << (len << 3)) - 1);
            long h = head * 0x9E3779B97F4A7C15L + len;
            for (int i = 8; i < len; i += 8) {
                long w = (long) LONGS.get(padded, i);
                if (len - i < 8) {
                    w &= (1L << ((len - i) << 3)) - 1;
                }
                h = (h ^ w) * 0x9E3779B97F4A7C15L;
            }
            insert((int) (h ^ (h >>> 29) ^ (h >>> 47)), idPlusOne);
        }

        private void insert(int hash, int idPlusOne) {
            int mask = table.length - 1;
            int slot = hash & mask;
            while (table[slot] != 0) {
                slot = (slot + 1) & mask;
            }
            table[slot] = idPlusOne;
        }

        @Override
        public byte[] decodeToBinary(int id) {
            return values[id];
        }

        @Override
        public int decodeToInt(int id) {
            throw new UnsupportedOperationException();
        }

        @Override
        public long decodeToLong(int id) {
            throw new UnsupportedOperationException();
        }

        @Override
        public float decodeToFloat(int id) {
            throw new UnsupportedOperationException();
        }

        @Override
        public double decodeToDouble(int id) {
            throw new UnsupportedOperationException();
        }
    }

    /** Every UTF-16 code unit's one-character UTF-8 string, the code unit being the id. */
    static final class CharDictionary implements Dictionary {
        static final CharDictionary INSTANCE = new CharDictionary();
        private final byte[][] utf8 = new byte[1 << 16][];

        @Override
        public byte[] decodeToBinary(int id) {
            byte[] b = utf8[id];
            if (b == null) {
                int c = id >= 0xD800 && id <= 0xDFFF ? 0xFFFD : id;
                b = new String(new char[] {(char) c}).getBytes(java.nio.charset.StandardCharsets.UTF_8);
                utf8[id] = b;
            }
            return b;
        }

        @Override
        public int decodeToInt(int id) {
            throw new UnsupportedOperationException();
        }

        @Override
        public long decodeToLong(int id) {
            throw new UnsupportedOperationException();
        }

        @Override
        public float decodeToFloat(int id) {
            throw new UnsupportedOperationException();
        }

        @Override
        public double decodeToDouble(int id) {
            throw new UnsupportedOperationException();
        }
    }
}
