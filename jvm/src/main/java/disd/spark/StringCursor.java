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
