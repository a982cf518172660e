package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.HashMap;
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
 * reader's own functions (planning, admission control, option errors) or with expected values.
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
        out.set("options", options(req.get("options")));
        out.set("glob", globs(req.get("glob")));
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
        if (req.has("versions")) {
            out.set("versions", versions(req.get("versions")));
        }
        if (req.has("routing")) {
            out.set("routing", routings(req.get("routing")));
        }
        if (req.has("readRouting")) {
            out.set("readRouting", readRoutings(req.get("readRouting")));
        }
        if (req.has("stored")) {
            out.set("stored", stored(req.get("stored")));
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

    /** Each case: a {@code history_json()} -> for each version, {"origins": {...}, "fingerprint": "...",
     *  "sources": {each version: what a query in this version reads from it}}, or the error's message. */
    static ArrayNode versions(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (JsonNode c : cases) {
            ObjectNode r = DisHttp.JSON.createObjectNode();
            try {
                TableSchema newest = TableSchema.fromHistoryJson(c.asText(), "(case)");
                for (TableSchema s : newest.versions.values()) {
                    ObjectNode v = DisHttp.JSON.createObjectNode();
                    v.set("origins", DisHttp.JSON.valueToTree(SchemaVersions.origins(newest, s.version)));
                    v.put("fingerprint", SchemaVersions.fingerprint(s));
                    // a query (a stream) whose schema is this version, reading each version's rows
                    TableSchema query = s.withHistory(new ArrayList<>(newest.versions.values()));
                    ObjectNode sources = DisHttp.JSON.createObjectNode();
                    for (int w : newest.versions.keySet()) {
                        sources.set(String.valueOf(w), DisHttp.JSON.valueToTree(SchemaVersions.sources(query, w)));
                    }
                    v.set("sources", sources);
                    r.set(String.valueOf(s.version), v);
                }
            } catch (DisSourceError e) {
                r.put("error", e.getMessage());
            }
            res.add(r);
        }
        return res;
    }

    /** Each case: {"dbRoot", "schema_json" (what a DIS without versions sends), "locations": [[ip, cp]]}
     *  -> {"versions": [the versions known with the database's record], "locations": [version, or
     *  "error: ..."]}, or {"error": ...}. */
    static ArrayNode stored(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (JsonNode c : cases) {
            ObjectNode r = DisHttp.JSON.createObjectNode();
            try {
                String root = c.get("dbRoot").asText();
                TableSchema newest = SchemaVersions.withStoredHistory(root,
                    TableSchema.fromJson(c.get("schema_json").asText()));
                r.set("versions", DisHttp.JSON.valueToTree(newest.versions.keySet()));
                ArrayNode locs = DisHttp.JSON.createArrayNode();
                for (JsonNode l : c.get("locations")) {
                    try {
                        locs.add(SchemaVersions.locationVersion(root, newest,
                            new Dis.Location(l.get(0).asText(), l.get(1).asText(), 1, new TreeMap<>())));
                    } catch (DisSourceError e) {
                        locs.add("error: " + e.getMessage());
                    }
                }
                r.set("locations", locs);
            } catch (DisSourceError e) {
                r.put("error", e.getMessage());
            }
            res.add(r);
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

    /** Each case: options -> the error message, or "ok". */
    static ArrayNode options(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (JsonNode c : cases) {
            Map<String, String> o = new HashMap<>();
            Iterator<Map.Entry<String, JsonNode>> it = c.properties().iterator();
            while (it.hasNext()) {
                Map.Entry<String, JsonNode> e = it.next();
                o.put(e.getKey(), e.getValue().asText());
            }
            try {
                DisOptions.parse(o);
                res.add("ok");
            } catch (DisSourceError e) {
                res.add(e.getMessage());
            }
        }
        return res;
    }

    /** Each case: a routing file -> [[name, [[replica name, address, http_address], ...]], ...], or
     *  the error's message. */
    static ArrayNode routings(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (JsonNode c : cases) {
            try {
                ArrayNode insts = DisHttp.JSON.createArrayNode();
                for (Routing.Instance i : Routing.load(c.asText()).instances) {
                    ArrayNode members = DisHttp.JSON.createArrayNode();
                    for (Routing.Replica r : i.members) {
                        members.add(DisHttp.JSON.createArrayNode().add(r.name).add(r.address).add(r.httpAddress));
                    }
                    insts.add(DisHttp.JSON.createArrayNode().add(i.name).add(members));
                }
                res.add(insts);
            } catch (DisSourceError e) {
                res.add(e.getMessage());
            }
        }
        return res;
    }

    /** Each case: a routing file -> [[instance name, [[name, address, block endpoint] of its
     *  readReplicas]], ...] (where the reader lists and reads), or the error's message. */
    static ArrayNode readRoutings(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (JsonNode c : cases) {
            try {
                ArrayNode insts = DisHttp.JSON.createArrayNode();
                for (Routing.Instance i : Routing.load(c.asText()).instances) {
                    ArrayNode rs = DisHttp.JSON.createArrayNode();
                    for (Routing.Replica r : i.readReplicas) {
                        rs.add(DisHttp.JSON.createArrayNode().add(r.name).add(r.address).add(r.httpAddress));
                    }
                    insts.add(DisHttp.JSON.createArrayNode().add(i.name).add(rs));
                }
                res.add(insts);
            } catch (DisSourceError e) {
                res.add(e.getMessage());
            }
        }
        return res;
    }

    /** Each case: [pattern, name] -> matches. */
    static ArrayNode globs(JsonNode cases) {
        ArrayNode res = DisHttp.JSON.createArrayNode();
        for (JsonNode c : cases) {
            res.add(Routing.glob(c.get(0).asText()).matcher(c.get(1).asText()).matches());
        }
        return res;
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
