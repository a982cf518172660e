package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.sources.Not;
import org.apache.spark.sql.sources.Or;
import org.apache.spark.sql.sources.StringStartsWith;

/**
 * Unit tests of the reader's pure parts, driven by tests/spark/test_jvm_units.py: cases come in
 * as JSON on stdin, answers go out as JSON on stdout, and pytest compares them with the Python
 * reader's own functions (planning, admission control) or with expected values (partition
 * pruning, client keys).  The rules both readers share by file (routing, options, column files,
 * projections) are {@link VectorTests}'.
 */
public final class Probe {
    private Probe() {
    }

    public static void main(String[] args) throws Exception {
        InputStream in = System.in;
        JsonNode req = DisHttp.JSON.readTree(in);
        ObjectNode out = DisHttp.JSON.createObjectNode();
        out.set("plan", plans(req.get("plan")));
        out.set("admit", admits(req.get("admit")));
        out.set("filters", filters(req.get("filters")));
        ArrayNode keys = DisHttp.JSON.createArrayNode();
        for (JsonNode k : req.get("keys")) {
            try {
                keys.add(Security.privateKey(k.asText()).getAlgorithm());
            } catch (Exception e) {
                keys.add("error: " + e.getMessage());
            }
        }
        out.set("keys", keys);
        if (req.has("readable")) {
            out.set("readable", readable(req.get("readable")));
        }
        System.out.println(DisHttp.JSON.writeValueAsString(out));
    }

    /** Each case: {"ranges": [[key, start, stop], ...], "rpp": n, "min": n} -> [[[key, a, b], ...], ...]. */
    static ArrayNode plans(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (JsonNode c : cases) {
            List<Planner.Slice> ranges = new ArrayList<>();
            for (JsonNode r : c.get("ranges")) {
                String[] k = r.get(0).asText().split("/");
                Dis.Location loc = new Dis.Location(k[0], k[1], r.get(2).asLong(), new TreeMap<>());
                ranges.add(new Planner.Slice(loc, r.get(1).asLong(), r.get(2).asLong()));
            }
            ArrayNode parts = DisHttp.JSON.createArrayNode();
            for (Planner.Part p : Planner.plan(ranges,
                java.util.Collections.singletonList(new Routing.Replica("h:0", "h:0", "h:1")), c.get("rpp").asLong(), c.get("min").asInt())) {
                ArrayNode slices = DisHttp.JSON.createArrayNode();
                for (Planner.Slice s : p.slices) {
                    slices.add(DisHttp.JSON.createArrayNode().add(s.location.offsetKey()).add(s.start).add(s.stop));
                }
                parts.add(slices);
            }
            res.add(parts);
        }
        return res;
    }

    /** Each case: {"version": v, "presented": p, "projection": whether the listing carried one}
     *  -> "ok" when planning may read the location as version p, else the error's message. */
    static ArrayNode readable(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        Map<String, String> o = new java.util.HashMap<>();
        o.put("address", "127.0.0.1:22021");
        o.put("namespace", "Market");
        o.put("table", "Trade");
        Dis dis = new Dis(DisOptions.parse(o));
        for (JsonNode c : cases) {
            int presented = c.get("presented").asInt();
            TableSchema schema = new TableSchema("Market", "Trade", "Date", java.util.Collections.singletonList(
                new TableSchema.Column("Price", TableSchema.Kind.DOUBLE)), presented);
            VersionProjection p = null;
            if (c.get("projection").asBoolean()) {
                ObjectNode n = DisHttp.JSON.createObjectNode();
                n.put("stored_version", c.get("version").asInt());
                n.put("presented_version", presented);
                n.putArray("columns").addObject().put("name", "Price").put("type", "double").put("stored", "Px")
                    .put("stored_type", "float");
                p = VersionProjection.of(n, "(case)");
            }
            Dis.Location loc = new Dis.Location("feed1", "2026-11-22", 10, new TreeMap<>(), c.get("version").asInt(), 0,
                p);
            try {
                dis.readable(loc, schema);
                res.add("ok");
            } catch (DisSourceError e) {
                res.add(e.getMessage());
            }
        }
        return res;
    }

    /** Each case: {"start": {...}, "available": {...}, "max": n or null, "min": n or null}. */
    static ArrayNode admits(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (JsonNode c : cases) {
            ReadLimit limit = ReadLimit.allAvailable();
            if (!c.get("max").isNull()) {
                limit = ReadLimit.maxRows(c.get("max").asLong());
            } else if (!c.get("min").isNull()) {
                limit = ReadLimit.minRows(c.get("min").asLong(), 1000);
            }
            Map<String, Long> end = DisStream.admit(longs(c.get("start")), longs(c.get("available")), limit);
            res.add(DisHttp.JSON.valueToTree(end));
        }
        return res;
    }

    static Map<String, Long> longs(JsonNode n) {
        Map<String, Long> m = new TreeMap<>();
        Iterator<Map.Entry<String, JsonNode>> it = n.properties().iterator();
        while (it.hasNext()) {
            Map.Entry<String, JsonNode> e = it.next();
            m.put(e.getKey(), e.getValue().asLong());
        }
        return m;
    }

    /** Fixed cases of partition pruning: which of the values each filter set admits. */
    static ArrayNode filters(JsonNode values) {
        Filter[][] sets = {
            {new EqualTo("Date", "2026-11-23")},
            {new In("Date", new Object[] {"2026-11-23", "2030-01-01"})},
            {new GreaterThan("Date", "2026-11-22")},
            {new LessThanOrEqual("Date", "2026-11-22")},
            {new Not(new EqualTo("Date", "2026-11-22"))},
            {new Or(new EqualTo("Date", "2026-11-22"), new EqualTo("Size", 1))},  // maybe: kept
            {new Or(new EqualTo("Date", "2026-11-22"), new StringStartsWith("Date", "2026-11-2"))},
            {new EqualTo("Size", 1)},  // not about the partition column
            {new EqualTo("Date", 5)},  // not a string: maybe
            {new EqualTo("Date", "2026-11-22"), new EqualTo("Date", "2026-11-23")},
        };
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (Filter[] set : sets) {
            PartitionFilters pf = new PartitionFilters("Date");
            pf.offer(set);
            ArrayNode admitted = DisHttp.JSON.createArrayNode();
            for (JsonNode v : values) {
                if (pf.admits(v.asText())) {
                    admitted.add(v.asText());
                }
            }
            res.add(admitted);
        }
        return res;
    }
}
