package disd.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The reader's output: for each field of the schema Spark reads, the DIS column it comes from (or
 * the partition column) and the Spark type to fill.  Plain values only: it travels with the tasks.
 */
final class Projection implements Serializable {
    private static final long serialVersionUID = 1L;

    static final class Output implements Serializable {
        private static final long serialVersionUID = 1L;
        final String name;              // the name Spark asked for
        final String source;            // the DIS column, or the partition column
        final TableSchema.Kind kind;    // null for the partition column
        final DataType type;            // what the vector holds
        final boolean nullable;

        Output(String name, String source, TableSchema.Kind kind, DataType type, boolean nullable) {
            this.name = name;
            this.source = source;
            this.kind = kind;
            this.type = type;
            this.nullable = nullable;
        }

        boolean isPartition() {
            return kind == null;
        }
    }

    final TableSchema table;
    final List<Output> outputs;

    private Projection(TableSchema table, List<Output> outputs) {
        this.table = table;
        this.outputs = outputs;
    }

    /**
     * Match a schema (the source's own, a user's, or the columns a query needs) to the table.
     * Returns null when a field asks for a type this reader does not convert to (the Python
     * source casts with Arrow; the caller hands such reads to it).
     */
    static Projection of(TableSchema table, StructType schema) {
        List<String> names = table.names();
        List<Output> out = new ArrayList<>();
        for (StructField f : schema.fields()) {
            String src = TableSchema.lookup(names, f.name());
            if (src == null) {
                throw new DisSourceError("schema field '" + f.name() + "' is not a column of " + table.key()
                    + " (columns: " + String.join(", ", names) + ")");
            }
            TableSchema.Kind kind = src.equals(table.partitionColumn) ? null : table.column(src).kind;
            DataType natural = kind == null ? DataTypes.StringType : kind.spark();
            if (!f.dataType().equals(natural) && !converts(kind, f.dataType())) {
                return null;
            }
            out.add(new Output(f.name(), src, kind, f.dataType(), f.nullable()));
        }
        if (out.isEmpty() && schema.fields().length > 0) {
            throw new DisSourceError("the schema has no fields");
        }
        return new Projection(table, out);
    }

    /** Exact widenings the reader does itself (Arrow's safe casts give the same values). */
    static boolean converts(TableSchema.Kind kind, DataType to) {
        if (kind == null) {
            return false;
        }
        switch (kind) {
            case BYTE:
                return to.equals(DataTypes.ShortType) || to.equals(DataTypes.IntegerType)
                    || to.equals(DataTypes.LongType) || to.equals(DataTypes.FloatType) || to.equals(DataTypes.DoubleType);
            case SHORT:
                return to.equals(DataTypes.IntegerType) || to.equals(DataTypes.LongType)
                    || to.equals(DataTypes.FloatType) || to.equals(DataTypes.DoubleType);
            case INT:
                return to.equals(DataTypes.LongType) || to.equals(DataTypes.DoubleType);
            case FLOAT:
                return to.equals(DataTypes.DoubleType);
            default:
                return false;
        }
    }

    StructType sparkSchema() {
        List<StructField> f = new ArrayList<>();
        for (Output o : outputs) {
            f.add(new StructField(o.name, o.type, o.nullable, org.apache.spark.sql.types.Metadata.empty()));
        }
        return new StructType(f.toArray(new StructField[0]));
    }

    /** The outputs Spark still needs (by name), in the order of {@code required}. */
    Projection prune(StructType required) {
        List<Output> out = new ArrayList<>();
        for (StructField f : required.fields()) {
            for (Output o : outputs) {
                if (o.name.equals(f.name())) {
                    out.add(o);
                    break;
                }
            }
        }
        return new Projection(table, out);
    }

    /** The partition column's name as this output spells it (the table's when not read). */
    String partitionName() {
        for (Output o : outputs) {
            if (o.isPartition()) {
                return o.name;
            }
        }
        return table.partitionColumn;
    }
}
