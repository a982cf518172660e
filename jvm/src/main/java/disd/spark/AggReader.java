package disd.spark;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OffHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A task of a pushed aggregation ({@link AggPlan}): the input partition's batches, decoded by
 * {@link ColumnarReader} exactly as a plain scan decodes them, folded into one row per group, then
 * handed to Spark as ColumnarBatches of partial aggregates.
 *
 * <p>Each group key's values get small dense ids ({@link KeyColumn}; 0: null, so null keys form
 * their own group); a dictionary-encoded string column maps its dictionary ids to them through an
 * array, and the partition column is one lookup per batch.  The ids of a row's keys give its
 * group.  Past
 * {@link #MAX_GROUPS} groups the partials so far go out and the task starts afresh: Spark's final
 * aggregation merges rows of the same group, so memory stays bounded whatever the key's cardinality.
 *
 * <p>Spark merges a pushed SUM by summing the partials cast to the column's own type; an int
 * column's partial sum is therefore sent as int-sized pieces, one row each (the group's other
 * aggregates in the first row; counts 0 and nulls in the others), which sum to the exact total.
 */
final class AggReader implements PartitionReader<ColumnarBatch> {
    static final int MAX_GROUPS = 1 << 20;

    private final AggPlan plan;
    private final ColumnarReader in;
    private final int k;
    private final AggPlan.Agg[] aggs;
    private final KeyColumn[] keyCols;
    private final WritableColumnVector[] out;
    private final ColumnarBatch batch;
    private final int cap;

    // groups
    private int groups;
    private int capacity;
    private int[][] groupComps;
    private LongIntMap[] pairs;
    private LongIntMap final_;
    private long[][] lacc;
    private double[][] dacc;
    private boolean[][] seen;

    // per batch scratch
    private int[] gid = new int[0];
    private int[][] comps;
    private long[] lbuf = new long[0];
    private double[] dbuf = new double[0];

    // state
    private boolean inputDone;
    private boolean emitting;
    private int emitGroup;
    private int emitPart;
    private final long[] rem;

    AggReader(AggPlan plan, ColumnarReader in, int batchRows, boolean offHeap) {
        this.plan = plan;
        this.in = in;
        this.k = plan.keys.size();
        this.aggs = plan.aggs.toArray(new AggPlan.Agg[0]);
        this.keyCols = new KeyColumn[k];
        for (int j = 0; j < k; j++) {
            keyCols[j] = new KeyColumn(plan.keys.get(j), in);
        }
        this.comps = new int[k][0];
        this.rem = new long[aggs.length];
        StructField[] fields = plan.schema().fields();
        this.cap = Math.max(1, batchRows);
        out = new WritableColumnVector[fields.length];
        for (int i = 0; i < fields.length; i++) {
            out[i] = offHeap ? new OffHeapColumnVector(cap, fields[i].dataType())
                : new OnHeapColumnVector(cap, fields[i].dataType());
        }
        batch = new ColumnarBatch(out);
        resetGroups();
    }

    private void resetGroups() {
        groups = 0;
        int c = 64;
        capacity = c;
        groupComps = new int[k][c];
        pairs = new LongIntMap[k];
        for (int j = 1; j < k; j++) {
            pairs[j] = new LongIntMap();
        }
        final_ = new LongIntMap();
        for (KeyColumn kc : keyCols) {
            kc.reset();
        }
        lacc = new long[aggs.length][];
        dacc = new double[aggs.length][];
        seen = new boolean[aggs.length][];
        for (int a = 0; a < aggs.length; a++) {
            if (aggs[a].num == AggPlan.Num.DOUBLE) {
                dacc[a] = new double[c];
            } else {
                lacc[a] = new long[c];
            }
            seen[a] = new boolean[c];
        }
    }

    @Override
    public boolean next() {
        while (true) {
            if (emitting) {
                if (fill()) {
                    return true;
                }
                emitting = false;
                if (inputDone) {
                    return false;
                }
                resetGroups();
            }
            if (inputDone) {
                return false;
            }
            while (groups < MAX_GROUPS) {
                if (!in.next()) {
                    inputDone = true;
                    break;
                }
                add(in.get());
            }
            emitting = true;
            emitGroup = 0;
            emitPart = 0;
        }
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() {
        try {
            in.close();
        } finally {
            for (WritableColumnVector v : out) {
                v.close();
            }
        }
    }

    // -- folding a batch --------------------------------------------------------------------------
    private void add(ColumnarBatch b) {
        int n = b.numRows();
        if (n == 0) {
            return;
        }
        if (gid.length < n) {
            gid = new int[n];
        }
        groupIds(b, n);
        for (int a = 0; a < aggs.length; a++) {
            AggPlan.Agg g = aggs[a];
            if (g.op == AggPlan.Op.COUNT_STAR) {
                long[] acc = lacc[a];
                for (int i = 0; i < n; i++) {
                    acc[gid[i]]++;
                }
                continue;
            }
            ColumnVector v = b.column(g.input);
            boolean nulls = v.hasNull();
            if (g.op == AggPlan.Op.COUNT) {
                long[] acc = lacc[a];
                for (int i = 0; i < n; i++) {
                    if (!nulls || !v.isNullAt(i)) {
                        acc[gid[i]]++;
                    }
                }
            } else if (g.num == AggPlan.Num.DOUBLE) {
                foldDoubles(a, g, v, nulls, n);
            } else {
                foldLongs(a, g, v, nulls, n);
            }
        }
    }

    private void foldLongs(int a, AggPlan.Agg g, ColumnVector v, boolean nulls, int n) {
        long[] x = longs(v, g.type, n);
        long[] acc = lacc[a];
        boolean[] s = seen[a];
        switch (g.op) {
            case SUM:
                if (plan.ansi) {
                    try {
                        for (int i = 0; i < n; i++) {
                            if (!nulls || !v.isNullAt(i)) {
                                int j = gid[i];
                                acc[j] = Math.addExact(acc[j], x[i]);
                                s[j] = true;
                            }
                        }
                    } catch (ArithmeticException e) {
                        throw new DisSourceError("SUM(" + g.column + ") over " + plan.table + " overflows a long "
                            + "(Spark's ANSI mode, spark.sql.ansi.enabled, raises on overflow: use try_sum to get "
                            + "null instead, or turn ANSI mode off for a wrapping sum)");
                    }
                } else {
                    for (int i = 0; i < n; i++) {
                        if (!nulls || !v.isNullAt(i)) {
                            int j = gid[i];
                            acc[j] += x[i];
                            s[j] = true;
                        }
                    }
                }
                break;
            case MIN:
                for (int i = 0; i < n; i++) {
                    if (!nulls || !v.isNullAt(i)) {
                        int j = gid[i];
                        if (!s[j] || x[i] < acc[j]) {
                            acc[j] = x[i];
                            s[j] = true;
                        }
                    }
                }
                break;
            case MAX:
                for (int i = 0; i < n; i++) {
                    if (!nulls || !v.isNullAt(i)) {
                        int j = gid[i];
                        if (!s[j] || x[i] > acc[j]) {
                            acc[j] = x[i];
                            s[j] = true;
                        }
                    }
                }
                break;
            default:
                throw new IllegalStateException(g.describe());
        }
    }

    /** Spark's order of doubles (SQLOrderingUtil.compareDoubles): NaN above all, -0.0 == 0.0. */
    static int compare(double x, double y) {
        return x == y ? 0 : Double.compare(x, y);
    }

    private void foldDoubles(int a, AggPlan.Agg g, ColumnVector v, boolean nulls, int n) {
        double[] x = doubles(v, g.type, n);
        double[] acc = dacc[a];
        boolean[] s = seen[a];
        switch (g.op) {
            case SUM:
                for (int i = 0; i < n; i++) {
                    if (!nulls || !v.isNullAt(i)) {
                        int j = gid[i];
                        acc[j] += x[i];
                        s[j] = true;
                    }
                }
                break;
            case MIN: // a new value replaces the kept one only when strictly smaller, as Spark's Least
                for (int i = 0; i < n; i++) {
                    if (!nulls || !v.isNullAt(i)) {
                        int j = gid[i];
                        if (!s[j] || compare(x[i], acc[j]) < 0) {
                            acc[j] = x[i];
                            s[j] = true;
                        }
                    }
                }
                break;
            case MAX:
                for (int i = 0; i < n; i++) {
                    if (!nulls || !v.isNullAt(i)) {
                        int j = gid[i];
                        if (!s[j] || compare(x[i], acc[j]) > 0) {
                            acc[j] = x[i];
                            s[j] = true;
                        }
                    }
                }
                break;
            default:
                throw new IllegalStateException(g.describe());
        }
    }

    private long[] longs(ColumnVector v, DataType t, int n) {
        lbuf = integers(v, t, n, lbuf);
        return lbuf;
    }

    /** Rows [0, n) of an integral (or timestamp) vector as longs, in {@code buf} when it is large
     *  enough (else a new array): the returned array. */
    static long[] integers(ColumnVector v, DataType t, int n, long[] buf) {
        long[] x = buf.length < n ? new long[n] : buf;
        if (t.equals(DataTypes.LongType) || t.equals(DataTypes.TimestampType)) {
            for (int i = 0; i < n; i++) {
                x[i] = v.getLong(i);
            }
        } else if (t.equals(DataTypes.IntegerType)) {
            for (int i = 0; i < n; i++) {
                x[i] = v.getInt(i);
            }
        } else if (t.equals(DataTypes.ShortType)) {
            for (int i = 0; i < n; i++) {
                x[i] = v.getShort(i);
            }
        } else if (t.equals(DataTypes.ByteType)) {
            for (int i = 0; i < n; i++) {
                x[i] = v.getByte(i);
            }
        } else {
            throw new IllegalStateException("not integral: " + t);
        }
        return x;
    }

    private double[] doubles(ColumnVector v, DataType t, int n) {
        if (dbuf.length < n) {
            dbuf = new double[n];
        }
        double[] x = dbuf;
        if (t.equals(DataTypes.DoubleType)) {
            for (int i = 0; i < n; i++) {
                x[i] = v.getDouble(i);
            }
        } else {
            for (int i = 0; i < n; i++) {
                x[i] = v.getFloat(i); // exact; the order of the floats is kept
            }
        }
        return x;
    }

    /** gid[0..n): each row's group, new groups created as they appear. */
    private void groupIds(ColumnarBatch b, int n) {
        int varying = -1;
        int nonConstant = 0;
        for (int j = 0; j < k; j++) {
            if (comps[j].length < n) {
                comps[j] = new int[n];
            }
            if (!keyCols[j].ids(b.column(keyCols[j].key.input), n, comps[j])) {
                varying = j;
                nonConstant++;
            }
        }
        if (nonConstant <= 1 && keyCols[varying < 0 ? 0 : varying].size() <= Math.max(n, 1 << 12)) {
            // every key but one is the same for the whole batch: a group per value of that one
            int v = varying < 0 ? 0 : varying;
            int[] c = comps[v];
            int[] memo = new int[keyCols[v].size() + 1];
            java.util.Arrays.fill(memo, -1);
            for (int i = 0; i < n; i++) {
                int m = memo[c[i]];
                if (m < 0) {
                    m = group(i);
                    memo[c[i]] = m;
                }
                gid[i] = m;
            }
            return;
        }
        for (int i = 0; i < n; i++) {
            gid[i] = group(i);
        }
    }

    /** The group of row i of the batch (by its key ids), created if new. */
    private int group(int i) {
        long g = comps[0][i];
        for (int j = 1; j < k; j++) {
            g = pairs[j].getOrAdd((g << 32) | comps[j][i]);
        }
        int before = final_.size();
        int id = final_.getOrAdd(g);
        if (id == before) {
            newGroup();
            for (int j = 0; j < k; j++) {
                groupComps[j][id] = comps[j][i];
            }
        }
        return id;
    }

    private void newGroup() {
        if (groups == capacity) {
            capacity *= 2;
            for (int j = 0; j < k; j++) {
                groupComps[j] = java.util.Arrays.copyOf(groupComps[j], capacity);
            }
            for (int a = 0; a < aggs.length; a++) {
                if (lacc[a] != null) {
                    lacc[a] = java.util.Arrays.copyOf(lacc[a], capacity);
                }
                if (dacc[a] != null) {
                    dacc[a] = java.util.Arrays.copyOf(dacc[a], capacity);
                }
                seen[a] = java.util.Arrays.copyOf(seen[a], capacity);
            }
        }
        groups++;
    }

    // -- emitting partial rows --------------------------------------------------------------------
    /** The next batch of partial rows into {@code out}; false when every group has gone out. */
    private boolean fill() {
        for (WritableColumnVector v : out) {
            v.reset();
        }
        int row = 0;
        while (row < cap && emitGroup < groups) {
            int g = emitGroup;
            for (int j = 0; j < k; j++) {
                keyCols[j].put(out[j], row, groupComps[j][g]);
            }
            boolean more = false;
            for (int a = 0; a < aggs.length; a++) {
                WritableColumnVector v = out[k + a];
                AggPlan.Agg ag = aggs[a];
                if (ag.op == AggPlan.Op.COUNT_STAR || ag.op == AggPlan.Op.COUNT) {
                    v.putLong(row, emitPart == 0 ? lacc[a][g] : 0L);
                } else if (ag.intSum()) {
                    if (emitPart == 0) {
                        rem[a] = seen[a][g] ? lacc[a][g] : 0L;
                    }
                    if ((emitPart == 0 && !seen[a][g]) || (emitPart > 0 && rem[a] == 0)) {
                        v.putNull(row);
                    } else {
                        long c = Math.max(Integer.MIN_VALUE, Math.min(Integer.MAX_VALUE, rem[a]));
                        rem[a] -= c;
                        v.putInt(row, (int) c);
                    }
                    more |= rem[a] != 0;
                } else if (emitPart > 0 || !seen[a][g]) {
                    v.putNull(row);
                } else if (ag.num == AggPlan.Num.DOUBLE) {
                    if (ag.type.equals(DataTypes.FloatType)) {
                        v.putFloat(row, (float) dacc[a][g]);
                    } else {
                        v.putDouble(row, dacc[a][g]);
                    }
                } else {
                    putLong(v, ag.type, row, lacc[a][g]);
                }
            }
            row++;
            if (more) {
                emitPart++;
            } else {
                emitPart = 0;
                emitGroup++;
            }
        }
        batch.setNumRows(row);
        return row > 0;
    }

    static void putLong(WritableColumnVector v, DataType t, int row, long x) {
        if (t.equals(DataTypes.LongType) || t.equals(DataTypes.TimestampType)) {
            v.putLong(row, x);
        } else if (t.equals(DataTypes.IntegerType)) {
            v.putInt(row, (int) x);
        } else if (t.equals(DataTypes.ShortType)) {
            v.putShort(row, (short) x);
        } else if (t.equals(DataTypes.ByteType)) {
            v.putByte(row, (byte) x);
        } else {
            throw new IllegalStateException("not integral: " + t);
        }
    }
}
