package disd.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.List;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
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
        for (int i = 0; i < vectors.length; i++) {
            Projection.Output o = outputs.get(i);
            if (o.isPartition()) {
                ((ConstantColumnVector) vectors[i]).setUtf8String(UTF8String.fromString(slice.location.columnPartition));
            } else if (o.kind == TableSchema.Kind.STRING) {
                cursors[i] = new StringCursor(fetch, slice, o.source);
            } else {
                cursors[i] = new FixedCursor(fetch, slice, o);
            }
        }
        return true;
    }

    @Override
    public ColumnarBatch get() {
        return batch;
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

    /** A fixed-width column: rows [start, stop) of {@code <Column>.dat}. */
    static final class FixedCursor extends Cursor {
        final Fetch.Stream in;
        final TableSchema.Kind kind;
        final DataType type;
        final int width;

        FixedCursor(Fetch fetch, Planner.Slice s, Projection.Output o) {
            kind = o.kind;
            type = o.type;
            width = kind.width;
            in = fetch.open(s.location, o.source + ".dat", s.start * width, s.stop * width);
        }

        @Override
        void fill(WritableColumnVector v, int n) {
            byte[] b = buffer(n * width);
            in.read(b, 0, n * width);
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

        /** One UTF-16 code unit per row, as a one-character string (a lone surrogate: U+FFFD). */
        private void chars(WritableColumnVector v, byte[] b, int n) {
            byte[] out = new byte[n * 3];
            int[] starts = new int[n];
            int k = 0;
            for (int i = 0; i < n; i++) {
                int c = ((short) SHORTS.get(b, i << 1)) & 0xFFFF;
                starts[i] = k;
                if (c == 0xFFFF) {
                    continue;
                }
                if (c >= 0xD800 && c <= 0xDFFF) {
                    c = 0xFFFD;
                }
                if (c < 0x80) {
                    out[k++] = (byte) c;
                } else if (c < 0x800) {
                    out[k++] = (byte) (0xC0 | (c >> 6));
                    out[k++] = (byte) (0x80 | (c & 0x3F));
                } else {
                    out[k++] = (byte) (0xE0 | (c >> 12));
                    out[k++] = (byte) (0x80 | ((c >> 6) & 0x3F));
                    out[k++] = (byte) (0x80 | (c & 0x3F));
                }
            }
            int base = v.arrayData().appendBytes(k, out, 0);
            for (int i = 0; i < n; i++) {
                int end = i + 1 < n ? starts[i + 1] : k;
                if (((short) SHORTS.get(b, i << 1) & 0xFFFF) == 0xFFFF) {
                    v.putNull(i);
                    v.putArray(i, base + starts[i], 0);
                } else {
                    v.putArray(i, base + starts[i], end - starts[i]);
                }
            }
        }

        /** An exact widening the user's schema asked for (Projection.converts). */
        private void widen(WritableColumnVector v, byte[] b, int n) {
            for (int i = 0; i < n; i++) {
                long x;
                double d = 0;
                boolean isNull;
                switch (kind) {
                    case BYTE:
                        x = b[i];
                        isNull = x == Byte.MIN_VALUE;
                        break;
                    case SHORT:
                        x = (short) SHORTS.get(b, i << 1);
                        isNull = x == Short.MIN_VALUE;
                        break;
                    case INT:
                        x = (int) INTS.get(b, i << 2);
                        isNull = x == Integer.MIN_VALUE;
                        break;
                    case FLOAT:
                        int bits = (int) INTS.get(b, i << 2);
                        isNull = bits == FLOAT_NULL;
                        d = Float.intBitsToFloat(bits);
                        x = 0;
                        break;
                    default:
                        throw new IllegalStateException("no widening from " + kind);
                }
                if (isNull) {
                    v.putNull(i);
                    continue;
                }
                if (kind != TableSchema.Kind.FLOAT) {
                    d = x;
                }
                if (type.equals(DataTypes.ShortType)) {
                    v.putShort(i, (short) x);
                } else if (type.equals(DataTypes.IntegerType)) {
                    v.putInt(i, (int) x);
                } else if (type.equals(DataTypes.LongType)) {
                    v.putLong(i, x);
                } else if (type.equals(DataTypes.FloatType)) {
                    v.putFloat(i, (float) d);
                } else {
                    v.putDouble(i, d);
                }
            }
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
            int base = 0;
            if (size > 0) {
                byte[] d = dataBuffer((int) size);
                dat.read(d, 0, (int) size);
                base = v.arrayData().appendBytes((int) size, d, 0);
            }
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
            prevEnd = last;
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
}
