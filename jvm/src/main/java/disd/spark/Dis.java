package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * What the driver asks the DIS that owns a table: its schema and its locations (published rows
 * and the column file sizes at that count), through the block endpoint.
 */
final class Dis {
    /** One location as listed: the sizes fix what a scan reads however far ingestion moves on. */
    static final class Location implements Serializable {
        private static final long serialVersionUID = 1L;
        final String internalPartition;
        final String columnPartition;
        final long rows;
        final TreeMap<String, Long> files;
        /** The schema version its rows are written in (0: not known, read as the newest). */
        final int version;

        Location(String internalPartition, String columnPartition, long rows, TreeMap<String, Long> files) {
            this(internalPartition, columnPartition, rows, files, 0);
        }

        Location(String internalPartition, String columnPartition, long rows, TreeMap<String, Long> files,
                 int version) {
            this.internalPartition = internalPartition;
            this.columnPartition = columnPartition;
            this.rows = rows;
            this.files = files;
            this.version = version;
        }

        /** The name of a location in streaming offsets. */
        String offsetKey() {
            return internalPartition + "/" + columnPartition;
        }
    }

    final DisOptions options;
    final Routing routing;

    Dis(DisOptions options) {
        this.options = options;
        this.routing = Routing.of(options);
    }

    DisHttp http(Routing.Instance inst) {
        return new DisHttp(inst.httpAddress, inst.address, options.hint(), options.security, options.timeoutS);
    }

    /** The owner of the table, or an error that lists the tables there are. */
    Routing.Instance owner() {
        Routing.Instance inst = routing.owner(options.namespace, options.table);
        if (inst == null) {
            throw unknownTable();
        }
        return inst;
    }

    private DisSourceError unknownTable() {
        TreeSet<String> known = new TreeSet<>();
        String shown;
        try {
            for (Routing.Instance i : routing.instances) {
                for (JsonNode t : http(i).json("/v1/tables").get("tables")) {
                    known.add(t.get("namespace").asText() + "." + t.get("table").asText());
                }
            }
            shown = known.isEmpty() ? "none" : String.join(", ", known);
        } catch (DisSourceError e) {
            shown = "?";
        }
        return new DisSourceError("unknown table " + options.namespace + "." + options.table + " at "
            + options.where() + " (tables there: " + shown + "); check options 'namespace' and 'table'");
    }

    /**
     * The table's newest schema carrying its earlier versions: the DIS's {@code versions_json}
     * (a DIS older than schema versions sends only {@code schema_json}); with option
     * {@code dbRoot}, also the versions the database's {@code schema.versions} record holds.
     */
    TableSchema schema() {
        Routing.Instance inst = owner();
        for (JsonNode t : http(inst).json("/v1/tables").get("tables")) {
            if (t.get("namespace").asText().equals(options.namespace) && t.get("table").asText().equals(options.table)) {
                JsonNode vj = t.get("versions_json");
                TableSchema s = vj != null && !vj.isNull() && !vj.asText().isEmpty()
                    ? TableSchema.fromHistoryJson(vj.asText(), "the DIS at " + inst.address + " sent")
                    : TableSchema.fromJson(t.get("schema_json").asText());
                return options.dbRoot == null ? s : SchemaVersions.withStoredHistory(options.dbRoot, s);
            }
        }
        throw unknownTable();
    }

    /**
     * The table's locations at its owner, as listed now, each with the schema version it is
     * written in: the DIS's {@code schema_version}; when the DIS does not say (0 or absent), with
     * option {@code dbRoot} the location's own {@code table.size}, else {@code newest}'s version.
     * A version {@code newest} does not know is an error here, on the driver.
     */
    List<Location> locations(TableSchema newest) {
        List<Location> out = new ArrayList<>();
        for (Location l : locations()) {
            int v = l.version;
            if (v <= 0 && options.dbRoot != null && l.rows > 0) {
                v = SchemaVersions.locationVersion(options.dbRoot, newest, l);
            }
            if (v <= 0) {
                v = newest.version;
            }
            newest.atVersion(v);
            out.add(v == l.version ? l : new Location(l.internalPartition, l.columnPartition, l.rows, l.files, v));
        }
        return out;
    }

    /** The table's locations at its owner, as listed now (versions as the DIS says them). */
    List<Location> locations() {
        Routing.Instance inst = owner();
        JsonNode n = http(inst).json("/v1/locations?namespace=" + DisHttp.q(options.namespace) + "&table="
            + DisHttp.q(options.table));
        List<Location> out = new ArrayList<>();
        for (JsonNode l : n.get("locations")) {
            if (!l.get("namespace").asText().equals(options.namespace) || !l.get("table").asText().equals(options.table)) {
                continue;
            }
            TreeMap<String, Long> files = new TreeMap<>();
            Iterator<Map.Entry<String, JsonNode>> it = l.get("files").properties().iterator();
            while (it.hasNext()) {
                Map.Entry<String, JsonNode> e = it.next();
                files.put(e.getKey(), e.getValue().asLong());
            }
            JsonNode sv = l.get("schema_version");
            out.add(new Location(l.get("internal_partition").asText(), l.get("column_partition").asText(),
                l.get("rows").asLong(), files, sv == null || sv.isNull() ? 0 : sv.asInt()));
        }
        return out;
    }
}
