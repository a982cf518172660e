package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * A table's schema as the DIS reports it ({@code TableSchema.to_json()} of {@code disd.schema}):
 * columns with their types, the partition column, and its schema version.  A read presents one
 * version (the newest when it was loaded); locations written in other versions are read through
 * the projection the DIS's listing carries for them ({@link VersionProjection}).
 */
final class TableSchema implements Serializable {
    private static final long serialVersionUID = 1L;

    /** The column types of docs/storage-format.md: width in the .dat file and Spark type. */
    enum Kind {
        BOOL(1, DataTypes.BooleanType), BYTE(1, DataTypes.ByteType), SHORT(2, DataTypes.ShortType),
        INT(4, DataTypes.IntegerType), LONG(8, DataTypes.LongType), FLOAT(4, DataTypes.FloatType),
        DOUBLE(8, DataTypes.DoubleType), CHAR(2, DataTypes.StringType), STRING(0, DataTypes.StringType),
        TIMESTAMP(8, DataTypes.TimestampType);

        final int width;
        final transient DataType sparkType;

        Kind(int width, DataType sparkType) {
            this.width = width;
            this.sparkType = sparkType;
        }

        DataType spark() {
            return sparkType;
        }
    }

    static final class Column implements Serializable {
        private static final long serialVersionUID = 1L;
        final String name;
        final Kind kind;

        Column(String name, Kind kind) {
            this.name = name;
            this.kind = kind;
        }
    }

    final String namespace;
    final String table;
    final String partitionColumn;
    final List<Column> columns;
    final int version;

    TableSchema(String namespace, String table, String partitionColumn, List<Column> columns, int version) {
        this.namespace = namespace;
        this.table = table;
        this.partitionColumn = partitionColumn;
        this.columns = columns;
        this.version = version;
    }

    static TableSchema fromJson(String json) {
        try {
            return fromNode(DisHttp.JSON.readTree(json));
        } catch (IOException | RuntimeException e) {
            throw new DisSourceError("cannot read the table schema the DIS sent: " + e);
        }
    }

    /** One {@code canonical()} object of {@code disd.schema} (a {@code renamed_from} is the
     *  DIS's business: it resolves the projections). */
    static TableSchema fromNode(JsonNode n) {
        List<Column> cols = new ArrayList<>();
        for (JsonNode c : n.get("columns")) {
            cols.add(new Column(c.get("name").asText(), Kind.valueOf(c.get("type").asText().toUpperCase(Locale.ROOT))));
        }
        String pc = n.has("partition_column") ? n.get("partition_column").asText() : "Date";
        int version = n.has("version") ? n.get("version").asInt() : 1;
        return new TableSchema(n.get("namespace").asText(), n.get("table").asText(), pc, cols, version);
    }

    List<String> columnNames() {
        List<String> out = new ArrayList<>();
        for (Column c : columns) {
            out.add(c.name);
        }
        return out;
    }

    String key() {
        return namespace + "." + table;
    }

    Column column(String name) {
        for (Column c : columns) {
            if (c.name.equals(name)) {
                return c;
            }
        }
        return null;
    }

    /** Column names, then the partition column. */
    List<String> names() {
        List<String> out = new ArrayList<>();
        for (Column c : columns) {
            out.add(c.name);
        }
        out.add(partitionColumn);
        return out;
    }

    /** The exact name, else the one name equal to it without regard to case, else null. */
    static String lookup(List<String> names, String name) {
        if (names.contains(name)) {
            return name;
        }
        String found = null;
        int n = 0;
        for (String x : names) {
            if (x.equalsIgnoreCase(name)) {
                found = x;
                n++;
            }
        }
        return n == 1 ? found : null;
    }

    /** The table's columns then its partition column; or only {@code columns}, in that order. */
    StructType sparkSchema(List<String> wanted) {
        List<String> names = names();
        List<StructField> out = new ArrayList<>();
        if (wanted == null) {
            for (String n : names) {
                out.add(field(n));
            }
        } else {
            for (String w : wanted) {
                String m = lookup(names, w);
                if (m == null) {
                    throw new DisSourceError("option 'columns': " + key() + " has no column '" + w + "' (columns: "
                        + String.join(", ", names) + ")");
                }
                out.add(field(m));
            }
        }
        return new StructType(out.toArray(new StructField[0]));
    }

    private StructField field(String name) {
        if (name.equals(partitionColumn)) {
            return new StructField(name, DataTypes.StringType, false, Metadata.empty());
        }
        return new StructField(name, column(name).kind.spark(), true, Metadata.empty());
    }
}
