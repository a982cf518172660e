package disd.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.aggregate.AggregateFunc;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.Count;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.expressions.aggregate.Max;
import org.apache.spark.sql.connector.expressions.aggregate.Min;
import org.apache.spark.sql.connector.expressions.aggregate.Sum;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * A partial aggregation pushed into the scan (docs/spark.md, "Aggregate pushdown"): the group
 * keys and aggregates of one query that this reader computes exactly, per input partition, over
 * the batches {@link ColumnarReader} decodes (so every null convention, schema version and
 * published size is the scan's own).  Spark aggregates the partial rows again, so a group may
 * appear in several rows of a partition: {@link AggReader} relies on that to bound its memory
 * and to carry an int column's sum, which Spark casts back to int, in int-sized pieces.
 *
 * <p>{@link #of} returns null for anything it does not compute exactly; the query then
 * aggregates in Spark as without pushdown.
 */
final class AggPlan implements Serializable {
    private static final long serialVersionUID = 1L;

    enum Op { COUNT_STAR, COUNT, SUM, MIN, MAX }

    /** How a value is held: integral and timestamp values as longs, float and double as doubles. */
    enum Num { LONG, DOUBLE, NONE }

    static final class Key implements Serializable {
        private static final long serialVersionUID = 1L;
        final int input;          // index in the input projection
        final boolean string;     // string or partition column; else integral
        final DataType type;

        Key(int input, boolean string, DataType type) {
            this.input = input;
            this.string = string;
            this.type = type;
        }
    }

    static final class Agg implements Serializable {
        private static final long serialVersionUID = 1L;
        final Op op;
        final int input;          // -1 for COUNT(*)
        final DataType type;      // the input's type (COUNT: any)
        final Num num;
        final String column;      // for messages

        Agg(Op op, int input, DataType type, Num num, String column) {
            this.op = op;
            this.input = input;
            this.type = type;
            this.num = num;
            this.column = column;
        }

        /** The partial's type: what Spark's final aggregate reads (a SUM's partial is cast to the
         *  column's own type by Spark, so an int column's sum goes out in int-sized pieces). */
        DataType outType() {
            switch (op) {
                case COUNT_STAR:
                case COUNT:
                    return DataTypes.LongType;
                default:
                    return type;
            }
        }

        boolean intSum() {
            return op == Op.SUM && type.equals(DataTypes.IntegerType);
        }

        String describe() {
            return op == Op.COUNT_STAR ? "COUNT(*)" : op.name() + "(" + column + ")";
        }
    }

    final Projection input;
    final List<Key> keys;
    final List<Agg> aggs;
    /** Spark's ANSI mode when the query was planned: an overflowing SUM of longs raises (else wraps). */
    final boolean ansi;
    final String table;

    private AggPlan(Projection input, List<Key> keys, List<Agg> aggs, boolean ansi) {
        this.input = input;
        this.keys = keys;
        this.aggs = aggs;
        this.ansi = ansi;
        this.table = input.table.key();
    }

    /** The plan for {@code a} over {@code full} (the table's outputs), or null when any part of it
     *  is not one this reader computes exactly. */
    static AggPlan of(Projection full, Aggregation a, boolean ansi) {
        if (a.groupByExpressions().length == 0) {
            // A global aggregate is left to Spark: its generated code already sums a column vector
            // about as fast as the reader would (measured: one column's sum pushed 0.11 s against
            // 0.09 s not pushed, 10 M rows), so pushing it adds risk and saves nothing.
            return null;
        }
        List<String> needed = new ArrayList<>();
        List<Projection.Output> keyOuts = new ArrayList<>();
        for (Expression e : a.groupByExpressions()) {
            Projection.Output o = column(full, e);
            if (o == null || !(o.isPartition() || o.type.equals(DataTypes.StringType) || integral(o.type))) {
                return null;
            }
            keyOuts.add(o);
            add(needed, o.name);
        }
        List<Object[]> specs = new ArrayList<>(); // {Op, Output or null}
        for (AggregateFunc f : a.aggregateExpressions()) {
            if (f instanceof CountStar) {
                specs.add(new Object[] {Op.COUNT_STAR, null});
                continue;
            }
            Op op;
            Expression arg;
            if (f instanceof Count) {
                if (((Count) f).isDistinct()) {
                    return null;
                }
                op = Op.COUNT;
                arg = ((Count) f).column();
            } else if (f instanceof Sum) {
                if (((Sum) f).isDistinct()) {
                    return null;
                }
                op = Op.SUM;
                arg = ((Sum) f).column();
            } else if (f instanceof Min) {
                op = Op.MIN;
                arg = ((Min) f).column();
            } else if (f instanceof Max) {
                op = Op.MAX;
                arg = ((Max) f).column();
            } else {
                return null; // AVG (Spark rewrites it as SUM and COUNT for a partial pushdown), others
            }
            Projection.Output o = column(full, arg);
            if (o == null || !supports(op, o)) {
                return null;
            }
            specs.add(new Object[] {op, o});
            add(needed, o.name);
        }
        if (specs.isEmpty()) {
            return null;
        }
        for (Object[] s : specs) {
            // SUM and COUNT of one long column may be Spark's rewrite of AVG, whose own sum is a
            // double that cannot overflow: a long SUM would raise (or wrap) where AVG does not
            Projection.Output o = (Projection.Output) s[1];
            if (s[0] == Op.SUM && o.type.equals(DataTypes.LongType)) {
                for (Object[] t : specs) {
                    if (t[0] == Op.COUNT && t[1] == o) {
                        return null;
                    }
                }
            }
        }
        List<StructField> fields = new ArrayList<>();
        for (String n : needed) {
            for (Projection.Output o : full.outputs) {
                if (o.name.equals(n)) {
                    fields.add(new StructField(o.name, o.type, o.nullable, Metadata.empty()));
                    break;
                }
            }
        }
        Projection in = full.prune(new StructType(fields.toArray(new StructField[0])));
        List<Key> keys = new ArrayList<>();
        for (Projection.Output o : keyOuts) {
            keys.add(new Key(needed.indexOf(o.name), o.isPartition() || o.type.equals(DataTypes.StringType), o.type));
        }
        List<Agg> aggs = new ArrayList<>();
        for (Object[] s : specs) {
            Op op = (Op) s[0];
            Projection.Output o = (Projection.Output) s[1];
            if (o == null) {
                aggs.add(new Agg(op, -1, DataTypes.LongType, Num.NONE, "*"));
            } else {
                Num num = op == Op.COUNT ? Num.NONE : floating(o.type) ? Num.DOUBLE : Num.LONG;
                aggs.add(new Agg(op, needed.indexOf(o.name), o.type, num, o.name));
            }
        }
        return new AggPlan(in, keys, aggs, ansi);
    }

    private static void add(List<String> names, String n) {
        if (!names.contains(n)) {
            names.add(n);
        }
    }

    /** The output a plain column reference names (exactly, else the one equal ignoring case). */
    private static Projection.Output column(Projection full, Expression e) {
        if (!(e instanceof NamedReference) || ((NamedReference) e).fieldNames().length != 1) {
            return null;
        }
        String name = ((NamedReference) e).fieldNames()[0];
        Projection.Output found = null;
        int n = 0;
        for (Projection.Output o : full.outputs) {
            if (o.name.equals(name)) {
                return o;
            }
            if (o.name.equalsIgnoreCase(name)) {
                found = o;
                n++;
            }
        }
        return n == 1 ? found : null;
    }

    /**
     * What is computed exactly as Spark would: COUNT of anything; SUM of int, long and double
     * (not byte/short, whose partials Spark would cast back to their own narrow type; not float,
     * whose partial sum Spark would cast back to float); MIN/MAX of integral, timestamp, float and
     * double columns (Spark's ordering: NaN above everything, -0.0 equal to 0.0, ties keep the first).
     */
    private static boolean supports(Op op, Projection.Output o) {
        DataType t = o.type;
        switch (op) {
            case COUNT:
                return true;
            case SUM:
                return !o.isPartition() && (t.equals(DataTypes.IntegerType) || t.equals(DataTypes.LongType)
                    || t.equals(DataTypes.DoubleType));
            case MIN:
            case MAX:
                return !o.isPartition() && (integral(t) || t.equals(DataTypes.TimestampType) || floating(t));
            default:
                return false;
        }
    }

    static boolean integral(DataType t) {
        return t.equals(DataTypes.ByteType) || t.equals(DataTypes.ShortType) || t.equals(DataTypes.IntegerType)
            || t.equals(DataTypes.LongType);
    }

    static boolean floating(DataType t) {
        return t.equals(DataTypes.FloatType) || t.equals(DataTypes.DoubleType);
    }

    /** Group keys (as the columns are named), then one field per aggregate, in Spark's order. */
    StructType schema() {
        List<StructField> f = new ArrayList<>();
        for (Key k : keys) {
            Projection.Output o = input.outputs.get(k.input);
            f.add(new StructField(o.name, o.type, o.nullable, Metadata.empty()));
        }
        java.util.Set<String> seen = new java.util.HashSet<>();
        for (Agg g : aggs) {
            String name = g.describe();
            for (int i = 2; !seen.add(name); i++) {
                name = g.describe() + "#" + i;
            }
            f.add(new StructField(name, g.outType(), g.op != Op.COUNT_STAR && g.op != Op.COUNT,
                Metadata.empty()));
        }
        return new StructType(f.toArray(new StructField[0]));
    }

    String describe() {
        StringBuilder sb = new StringBuilder("pushed aggregation [");
        for (int i = 0; i < aggs.size(); i++) {
            sb.append(i == 0 ? "" : ", ").append(aggs.get(i).describe());
        }
        sb.append("] group by [");
        for (int i = 0; i < keys.size(); i++) {
            sb.append(i == 0 ? "" : ", ").append(input.outputs.get(keys.get(i).input).name);
        }
        return sb.append(']').toString();
    }
}
