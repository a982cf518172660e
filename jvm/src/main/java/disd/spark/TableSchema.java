package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.TreeMap;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * A table's schema as the DIS reports it ({@code TableSchema.to_json()} of {@code disd.schema}):
 * columns with their types, and the partition column; its version, each column's
 * {@code renamed_from}, and (for the newest version a read presents) the table's earlier
 * versions, which {@link SchemaVersions} uses to read locations written in them.
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
        final String renamedFrom; // null: not renamed in this version

        Column(String name, Kind kind) {
            this(name, kind, null);
        }

        Column(String name, Kind kind, String renamedFrom) {
            this.name = name;
            this.kind = kind;
            this.renamedFrom = renamedFrom;
        }
    }

    final String namespace;
    final String table;
    final String partitionColumn;
    final List<Column> columns;
    final int version;
    /** Every version of the table this schema knows, itself included (each without history). */
    final TreeMap<Integer, TableSchema> versions;

    TableSchema(String namespace, String table, String partitionColumn, List<Column> columns) {
        this(namespace, table, partitionColumn, columns, 1, Collections.emptyList());
    }

    TableSchema(String namespace, String table, String partitionColumn, List<Column> columns, int version,
                List<TableSchema> earlier) {
        this.namespace = namespace;
        this.table = table;
        this.partitionColumn = partitionColumn;
        this.columns = columns;
        this.version = version;
        this.versions = new TreeMap<>();
        for (TableSchema e : earlier) {
            if (e.version != version) {
                versions.put(e.version, e.withoutHistory());
            }
        }
        versions.put(version, this);
    }

    private TableSchema withoutHistory() {
        return versions.size() == 1 ? this
            : new TableSchema(namespace, table, partitionColumn, columns, version, Collections.emptyList());
    }

    /** This schema carrying {@code earlier} versions (as {@code TableSchema.with_history}). */
    TableSchema withHistory(List<TableSchema> earlier) {
        List<TableSchema> all = new ArrayList<>(versions.values());
        all.addAll(earlier);
        return new TableSchema(namespace, table, partitionColumn, columns, version, all);
    }

    /**
     * This schema (its version and columns unchanged) also knowing every version {@code other}
     * knows: how a streaming query, whose schema is fixed when it starts, learns versions the DIS
     * admitted since, so it can read their locations in its own columns.
     */
    TableSchema knowing(TableSchema other) {
        for (Integer v : other.versions.keySet()) {
            if (!versions.containsKey(v)) {
                return withHistory(new ArrayList<>(other.versions.values()));
            }
        }
        return this;
    }

    static TableSchema fromJson(String json) {
        try {
            return fromNode(DisHttp.JSON.readTree(json));
        } catch (IOException | RuntimeException e) {
            throw new DisSourceError("cannot read the table schema the DIS sent: " + e);
        }
    }

    /** One {@code canonical()} object of {@code disd.schema}. */
    static TableSchema fromNode(JsonNode n) {
        List<Column> cols = new ArrayList<>();
        for (JsonNode c : n.get("columns")) {
            JsonNode rf = c.get("renamed_from");
            cols.add(new Column(c.get("name").asText(), Kind.valueOf(c.get("type").asText().toUpperCase(Locale.ROOT)),
                rf == null || rf.isNull() || rf.asText().isEmpty() ? null : rf.asText()));
        }
        String pc = n.has("partition_column") ? n.get("partition_column").asText() : "Date";
        int version = n.has("version") ? n.get("version").asInt() : 1;
        return new TableSchema(n.get("namespace").asText(), n.get("table").asText(), pc, cols, version,
            Collections.emptyList());
    }

    /** The newest of a {@code history_json()} list (oldest first), carrying the others. */
    static TableSchema fromHistoryJson(String json, String where) {
        List<TableSchema> all = new ArrayList<>();
        try {
            JsonNode n = DisHttp.JSON.readTree(json);
            if (n == null || !n.isArray() || n.size() == 0) {
                throw new IllegalArgumentException("not a non-empty list of schemas");
            }
            for (JsonNode s : n) {
                all.add(fromNode(s));
            }
        } catch (IOException | RuntimeException e) {
            throw new DisSourceError("cannot read the table's schema versions " + where + ": " + e);
        }
        TableSchema newest = all.get(0);
        for (TableSchema s : all) {
            if (s.version > newest.version) {
                newest = s;
            }
        }
        return newest.withHistory(all);
    }

    /** The table's schema in {@code v}; an error naming the known versions otherwise. */
    TableSchema atVersion(int v) {
        TableSchema s = versions.get(v);
        if (s == null) {
            throw new DisSourceError(key() + " has no version " + v + " (known versions: "
                + String.join(", ", versions.keySet().stream().map(String::valueOf).toArray(String[]::new))
                + "); restart the query to pick up versions the DIS admitted since it started");
        }
        return s;
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
