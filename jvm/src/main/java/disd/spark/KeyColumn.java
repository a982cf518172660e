package disd.spark;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.Dictionary;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One group key of a pushed aggregation ({@link AggReader}): the key's distinct values and their
 * dense ids (1, 2, ...; 0 is null).  A dictionary-encoded string vector maps its dictionary ids
 * to key ids through an array; a constant vector (the partition column) is one lookup per batch.
 */
final class KeyColumn {
    final AggPlan.Key key;
    /** The reader whose batches the key's vectors are (their dictionaries are its cursors'). */
    private final ColumnarReader in;
    private long[] scratch = new long[0];
    Map<UTF8String, Integer> strings;
    List<byte[]> stringValues;
    LongIntMap longs;
    long[] longValues;
    Dictionary dict;        // the dictionary {@link #dictIds} belongs to
    int[] dictIds = new int[0]; // dictionary id -> key id + 1 (0: not looked up yet)

    KeyColumn(AggPlan.Key key, ColumnarReader in) {
        this.key = key;
        this.in = in;
    }

    void reset() {
        strings = new HashMap<>();
        stringValues = new ArrayList<>();
        longs = new LongIntMap();
        longValues = new long[16];
        dict = null;
        dictIds = new int[0];
    }

    int size() {
        return key.string ? stringValues.size() : longs.size();
    }

    /** The ids of rows [0, n) into {@code ids}; true when the vector is one value for them all. */
    boolean ids(ColumnVector v, int n, int[] ids) {
        if (v instanceof ConstantColumnVector) {
            int id = v.isNullAt(0) ? 0 : string(v.getUTF8String(0));
            java.util.Arrays.fill(ids, 0, n, id);
            return true;
        }
        boolean nulls = v.hasNull();
        if (key.string) {
            WritableColumnVector w = (WritableColumnVector) v;
            if (w.hasDictionary()) {
                Dictionary d = in.dictionary(key.input);
                if (d != dict) {
                    dict = d;
                    dictIds = new int[0];
                }
                WritableColumnVector di = w.getDictionaryIds();
                for (int i = 0; i < n; i++) {
                    if (nulls && v.isNullAt(i)) {
                        ids[i] = 0;
                        continue;
                    }
                    int d0 = di.getInt(i);
                    if (d0 >= dictIds.length) {
                        dictIds = java.util.Arrays.copyOf(dictIds, Math.max(d0 + 1, dictIds.length * 2));
                    }
                    int id = dictIds[d0] - 1;
                    if (id < 0) {
                        id = string(UTF8String.fromBytes(d.decodeToBinary(d0)));
                        dictIds[d0] = id + 1;
                    }
                    ids[i] = id;
                }
            } else {
                for (int i = 0; i < n; i++) {
                    ids[i] = nulls && v.isNullAt(i) ? 0 : string(v.getUTF8String(i));
                }
            }
        } else {
            scratch = AggReader.integers(v, key.type, n, scratch);
            long[] x = scratch;
            for (int i = 0; i < n; i++) {
                ids[i] = nulls && v.isNullAt(i) ? 0 : longId(x[i]);
            }
        }
        return false;
    }

    private int string(UTF8String s) {
        Integer id = strings.get(s);
        if (id == null) {
            byte[] b = s.getBytes();
            if (b == s.getBaseObject()) {
                b = b.clone(); // the vector's own buffer is reused by the next batch
            }
            stringValues.add(b);
            id = stringValues.size();
            strings.put(UTF8String.fromBytes(b), id);
        }
        return id;
    }

    private int longId(long x) {
        int before = longs.size();
        int id = longs.getOrAdd(x) + 1;
        if (id - 1 == before) {
            if (before == longValues.length) {
                longValues = java.util.Arrays.copyOf(longValues, before * 2);
            }
            longValues[before] = x;
        }
        return id;
    }

    void put(WritableColumnVector v, int row, int id) {
        if (id == 0) {
            v.putNull(row);
        } else if (key.string) {
            v.putByteArray(row, stringValues.get(id - 1));
        } else {
            AggReader.putLong(v, key.type, row, longValues[id - 1]);
        }
    }
}
