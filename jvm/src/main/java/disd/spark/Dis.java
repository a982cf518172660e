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

        Location(String internalPartition, String columnPartition, long rows, TreeMap<String, Long> files) {
            this.internalPartition = internalPartition;
            this.columnPartition = columnPartition;
            this.rows = rows;
            this.files = files;
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

    TableSchema schema() {
        Routing.Instance inst = owner();
        for (JsonNode t : http(inst).json("/v1/tables").get("tables")) {
            if (t.get("namespace").asText().equals(options.namespace) && t.get("table").asText().equals(options.table)) {
                return TableSchema.fromJson(t.get("schema_json").asText());
            }
        }
        throw unknownTable();
    }

    /** The table's locations at its owner, as listed now. */
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
            out.add(new Location(l.get("internal_partition").asText(), l.get("column_partition").asText(),
                l.get("rows").asLong(), files));
        }
        return out;
    }
}
