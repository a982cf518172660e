package disd.spark;

import static disd.spark.ColumnFormat.LONGS;
import static disd.spark.ColumnFormat.MASK;

import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/**
 * A string column: {@code <Column>.off} holds each row's end offset in {@code <Column>.dat}
 * (bit 63: null).  Rows [start, stop) need offsets [start-1, stop) and the data between the end
 * of row start-1 and the end of row stop-1.
 */
final class StringCursor extends Cursor {
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
        byte[] d = dataBuf = grown(dataBuf, (int) size + 8); // 8 spare bytes: the dictionary reads whole words
        if (size > 0) {
            dat.read(d, 0, (int) size);
        }
        if (dict != null && put(v, ends, d, n, v.reserveDictionaryIds(n), 0)) {
            v.setDictionary(dict);
        } else {
            dict = null;
            v.setDictionary(null);
            put(v, ends, d, n, null, size > 0 ? v.arrayData().appendBytes((int) size, d, 0) : 0);
        }
        prevEnd = last;
    }

    /**
     * The rows into {@code v}, walking their end offsets once: as dictionary ids into
     * {@code ids} when it is given (false, and nothing kept, once the column has too many
     * distinct values), else plain, as slices of the batch's data appended at {@code base} of
     * the vector's bytes.
     */
    private boolean put(WritableColumnVector v, byte[] ends, byte[] d, int n, WritableColumnVector ids, int base) {
        long p = prevEnd;
        for (int i = 0; i < n; i++) {
            long e = (long) LONGS.get(ends, i << 3);
            long end = e & MASK;
            int from = (int) (p - prevEnd);
            if (e < 0) {
                v.putNull(i);
                if (ids == null) {
                    v.putArray(i, base + from, 0);
                }
            } else if (ids == null) {
                v.putArray(i, base + from, (int) (end - p));
            } else {
                int id = dict.id(d, from, (int) (end - p));
                if (id < 0) {
                    return false;
                }
                ids.putInt(i, id);
            }
            p = end;
        }
        return true;
    }

    private byte[] dataBuf = new byte[0];

    @Override
    void close() {
        try {
            off.close();
        } finally {
            dat.close();
        }
    }
}
