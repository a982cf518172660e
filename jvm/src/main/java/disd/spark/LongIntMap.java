package disd.spark;

/** long -> dense int id (0, 1, ... in order of first appearance), open addressing. */
final class LongIntMap {
    private long[] keys = new long[64];
    private int[] vals = new int[64]; // id + 1; 0: empty
    private int size;

    int size() {
        return size;
    }

    int getOrAdd(long key) {
        int mask = keys.length - 1;
        long h = key * 0x9E3779B97F4A7C15L;
        int slot = (int) (h ^ (h >>> 32)) & mask;
        while (true) {
            int v = vals[slot];
            if (v == 0) {
                keys[slot] = key;
                vals[slot] = ++size;
                if (size * 2 > keys.length) {
                    grow();
                }
                return size - 1;
            }
            if (keys[slot] == key) {
                return v - 1;
            }
            slot = (slot + 1) & mask;
        }
    }

    private void grow() {
        long[] ok = keys;
        int[] ov = vals;
        keys = new long[ok.length * 2];
        vals = new int[ok.length * 2];
        int mask = keys.length - 1;
        for (int i = 0; i < ok.length; i++) {
            if (ov[i] != 0) {
                long h = ok[i] * 0x9E3779B97F4A7C15L;
                int slot = (int) (h ^ (h >>> 32)) & mask;
                while (vals[slot] != 0) {
                    slot = (slot + 1) & mask;
                }
                keys[slot] = ok[i];
                vals[slot] = ov[i];
            }
        }
    }
}
