package disd.spark;

import static disd.spark.ColumnFormat.LONGS;

/**
 * A string column's distinct values, each its own array.  Spark hashes and compares a string
 * whose bytes are a whole array without copying them ({@code UTF8String.getBytes}); a value
 * that is a slice of a batch's data is copied for every row a grouping or join looks at.  So a
 * string column with few distinct values (a symbol, an exchange) goes to Spark
 * dictionary-encoded, as Parquet's reader hands over its dictionary pages.  Past
 * {@link #MAX_VALUES} values or {@link #MAX_BYTES} bytes the slice goes on plain.
 */
final class StringDictionary extends BytesDictionary {
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
        long head = head(d, off, len);
        int hash = hash(d, off, len, head);
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
        insert(hash(padded, 0, v.length, head(padded, 0, v.length)), idPlusOne);
    }

    /** The first 8 bytes of [off, off+len) of {@code d}, zero-padded (d has 8 bytes to spare
     *  after them): the quick test of equal values before their tails are compared. */
    private static long head(byte[] d, int off, int len) {
        return len == 0 ? 0 : (long) LONGS.get(d, off) & (len >= 8 ? -1L : (1L << (len << 3)) - 1);
    }

    /** The hash of bytes [off, off+len) of {@code d}, whose {@link #head} is {@code head}: read a
     *  word at a time, the last one masked to the value's bytes. */
    private static int hash(byte[] d, int off, int len, long head) {
        long h = head * 0x9E3779B97F4A7C15L + len;
        for (int i = 8; i < len; i += 8) {
            long w = (long) LONGS.get(d, off + i);
            if (len - i < 8) {
                w &= (1L << ((len - i) << 3)) - 1;
            }
            h = (h ^ w) * 0x9E3779B97F4A7C15L;
        }
        return (int) (h ^ (h >>> 29) ^ (h >>> 47));
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
}
