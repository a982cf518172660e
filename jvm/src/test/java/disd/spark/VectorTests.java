package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The JVM reader's rules against the shared test vectors (tests/vectors/README.md), the files the
 * Python tests read too (tests/test_vectors.py): routing files, source options, routing patterns,
 * the projections a listing carries, and column files read through a location's projection.
 *
 * <p>{@code java disd.spark.VectorTests <tests/vectors>} prints one JSON line,
 * {@code {"checked": {suite: cases}, "failures": [...]}}; tests/spark/test_jvm_units.py runs it
 * (so {@code make test} does) and fails on any failure.
 */
public final class VectorTests {
    private final Path dir;
    private final List<String> failures = new ArrayList<>();
    private final ObjectNode checked = DisHttp.JSON.createObjectNode();

    private VectorTests(Path dir) {
        this.dir = dir;
    }

    public static void main(String[] args) throws Exception {
        VectorTests t = new VectorTests(Paths.get(args[0]).toAbsolutePath().normalize());
        t.projections();
        t.columns();
        t.routing();
        t.options();
        t.globs();
        t.closest();
        ObjectNode out = DisHttp.JSON.createObjectNode();
        out.set("checked", t.checked);
        out.set("failures", DisHttp.JSON.valueToTree(t.failures));
        System.out.println(DisHttp.JSON.writeValueAsString(out));
    }

    private JsonNode load(String name) throws IOException {
        return DisHttp.JSON.readTree(Files.readAllBytes(dir.resolve(name)));
    }

    private void fail(String suite, String what, Object got, Object want) {
        failures.add(suite + ": " + what + ": got " + got + ", the vector says " + want);
    }

    // -- projections.json: every projection a listing may carry parses to what it says ------------
    private void projections() throws IOException {
        int n = 0;
        Iterator<Map.Entry<String, JsonNode>> chains = load("projections.json").properties().iterator();
        while (chains.hasNext()) {
            Map.Entry<String, JsonNode> chain = chains.next();
            for (JsonNode p : chain.getValue().get("projections")) {
                n++;
                String what = chain.getKey() + " " + p.get("stored_version") + " as " + p.get("presented_version");
                VersionProjection vp = VersionProjection.of(p, what);
                if (vp.storedVersion != p.get("stored_version").asInt()
                    || vp.presentedVersion != p.get("presented_version").asInt()) {
                    fail("projections", what, vp.storedVersion + "->" + vp.presentedVersion, p);
                }
                for (JsonNode c : p.get("columns")) {
                    VersionProjection.Stored s = vp.source(c.get("name").asText());
                    String got = s == null ? "null" : s.name + " " + s.kind.name().toLowerCase(java.util.Locale.ROOT);
                    String want = c.get("stored").isNull() ? "null"
                        : c.get("stored").asText() + " " + c.get("stored_type").asText();
                    if (!got.equals(want)) {
                        fail("projections", what + " column " + c.get("name"), got, want);
                    }
                }
            }
        }
        checked.put("projections", n);
    }

    // -- columns.json: column files read through the listing's projection --------------------------
    private void columns() throws IOException {
        int n = 0;
        String root = dir.resolve("columns").toString();
        for (JsonNode c : load("columns.json").get("cases")) {
            n++;
            String what = c.get("name").asText();
            try {
                Map<String, List<Object>> got = read(root, c);
                if (c.has("error")) {
                    fail("columns", what, "rows " + got, "an error naming " + c.get("error"));
                    continue;
                }
                compare(what, c, got);
            } catch (DisSourceError e) {
                if (!c.has("error") || !e.getMessage().contains(c.get("error").asText())) {
                    fail("columns", what, e.getMessage(), c.has("error") ? "an error naming " + c.get("error")
                        : "rows");
                }
            }
        }
        checked.put("columns", n);
    }

    /** The case's rows as this reader presents them: its ColumnarReader over the fixture's column
     *  files (option dbRoot), the location as its listing would carry it, in batches of 5 rows. */
    private static Map<String, List<Object>> read(String root, JsonNode c) {
        int presentedVersion = c.get("presented_version").asInt();
        TableSchema table = null;
        for (JsonNode v : c.get("versions")) {
            if (v.get("version").asInt() == presentedVersion) {
                table = TableSchema.fromNode(v);
            }
        }
        List<String> cols = new ArrayList<>();
        if (c.get("columns").isNull()) {
            cols.addAll(table.columnNames());
        } else {
            for (JsonNode x : c.get("columns")) {
                cols.add(x.asText());
            }
        }
        Projection projection = Projection.of(table, table.sparkSchema(cols));
        JsonNode key = c.get("location");
        Map<String, String> opts = new HashMap<>();
        opts.put("address", "127.0.0.1:1");
        opts.put("namespace", key.get(0).asText());
        opts.put("table", key.get(1).asText());
        opts.put("dbRoot", root);
        opts.put("batchRows", "5");
        DisOptions options = DisOptions.parse(opts);
        // the location and its version's projection as a listing (/v1/locations) carries them
        ObjectNode listed = DisHttp.JSON.createObjectNode();
        listed.put("internal_partition", key.get(2).asText());
        listed.put("column_partition", key.get(3).asText());
        listed.put("rows", c.get("rows").asLong());
        listed.set("files", c.get("files"));
        listed.put("schema_version", c.get("stored_version").asInt());
        ObjectNode p = DisHttp.JSON.createObjectNode();
        p.put("stored_version", c.get("stored_version").asInt());
        p.put("presented_version", presentedVersion);
        p.set("columns", c.get("projection"));
        Map<Integer, VersionProjection> projections = new TreeMap<>();
        projections.put(c.get("stored_version").asInt(), VersionProjection.of(p, "(vector)"));
        Dis.Location loc = Dis.location(listed, 0, projections, presentedVersion);
        Planner.Part part = new Planner.Part(0, Collections.singletonList(new Routing.Replica("h", "127.0.0.1:1",
            "127.0.0.1:2")), Collections.singletonList(new Planner.Slice(loc, c.get("start").asLong(),
            c.get("stop").asLong())));
        Map<String, List<Object>> out = new java.util.LinkedHashMap<>();
        for (Projection.Output o : projection.outputs) {
            out.put(o.name, new ArrayList<>());
        }
        ColumnarReader r = new ColumnarReader(new ReadSpec(projection, options, false), part);
        try {
            while (r.next()) {
                ColumnarBatch b = r.get();
                for (int i = 0; i < projection.outputs.size(); i++) {
                    Projection.Output o = projection.outputs.get(i);
                    ColumnVector v = b.column(i);
                    for (int row = 0; row < b.numRows(); row++) {
                        out.get(o.name).add(v.isNullAt(row) ? null : value(v, o.type, row));
                    }
                }
            }
        } finally {
            r.close();
        }
        return out;
    }

    private static Object value(ColumnVector v, DataType t, int row) {
        if (t.equals(DataTypes.BooleanType)) {
            return v.getBoolean(row);
        } else if (t.equals(DataTypes.ByteType)) {
            return (long) v.getByte(row);
        } else if (t.equals(DataTypes.ShortType)) {
            return (long) v.getShort(row);
        } else if (t.equals(DataTypes.IntegerType)) {
            return (long) v.getInt(row);
        } else if (t.equals(DataTypes.LongType) || t.equals(DataTypes.TimestampType)) {
            return v.getLong(row);
        } else if (t.equals(DataTypes.FloatType)) {
            return (double) v.getFloat(row);
        } else if (t.equals(DataTypes.DoubleType)) {
            return v.getDouble(row);
        }
        return v.getUTF8String(row).toString();
    }

    private void compare(String what, JsonNode c, Map<String, List<Object>> got) {
        JsonNode expect = c.get("expect");
        List<String> names = new ArrayList<>();
        expect.fieldNames().forEachRemaining(names::add);
        if (!names.equals(new ArrayList<>(got.keySet()))) {
            fail("columns", what + " columns", got.keySet(), names);
            return;
        }
        for (String name : names) {
            JsonNode want = expect.get(name);
            List<Object> values = got.get(name);
            String type = type(c, name);
            if (values.size() != want.size()) {
                fail("columns", what + " " + name + " rows", values.size(), want.size());
                continue;
            }
            for (int i = 0; i < values.size(); i++) {
                if (!same(type, values.get(i), want.get(i))) {
                    fail("columns", what + " " + name + "[" + i + "]", values.get(i), want.get(i));
                }
            }
        }
    }

    /** The presented type of column {@code name} in the case. */
    private static String type(JsonNode c, String name) {
        for (JsonNode p : c.get("projection")) {
            if (p.get("name").asText().equals(name)) {
                return p.get("type").asText();
            }
        }
        return "?";
    }

    /** A value read equals the vector's: floats bit for bit (NaN, the infinities and -0.0 spelled
     *  as strings), timestamps as the vector's nanoseconds truncated toward zero to microseconds. */
    static boolean same(String type, Object got, JsonNode want) {
        if (want.isNull() || got == null) {
            return want.isNull() && got == null;
        }
        switch (type) {
            case "float":
            case "double": {
                double g = (Double) got;
                if (want.isTextual()) {
                    switch (want.asText()) {
                        case "NaN":
                            return Double.isNaN(g);
                        case "Infinity":
                            return g == Double.POSITIVE_INFINITY;
                        case "-Infinity":
                            return g == Double.NEGATIVE_INFINITY;
                        case "-0.0":
                            return Double.doubleToRawLongBits(g) == Double.doubleToRawLongBits(-0.0);
                        default:
                            return false;
                    }
                }
                return Double.doubleToRawLongBits(g) == Double.doubleToRawLongBits(want.asDouble());
            }
            case "timestamp":
                return want.isIntegralNumber() && (Long) got == want.asLong() / 1000;
            case "bool":
                return want.isBoolean() && (Boolean) got == want.asBoolean();
            case "byte":
            case "short":
            case "int":
            case "long":
                return want.isIntegralNumber() && (Long) got == want.asLong();
            default:
                return want.isTextual() && got.equals(want.asText());
        }
    }

    // -- routing.json: routing files ---------------------------------------------------------------
    private void routing() throws IOException {
        int n = 0;
        Iterator<Map.Entry<String, JsonNode>> it = load("routing.json").properties().iterator();
        while (it.hasNext()) {
            Map.Entry<String, JsonNode> e = it.next();
            n++;
            String path = dir.resolve("routing").resolve(e.getKey()).toString();
            JsonNode want = e.getValue();
            Routing r;
            try {
                r = Routing.load(path);
            } catch (DisSourceError err) {
                String expected = want.has("error") ? "dis source: option 'routing': cannot use " + path + ": "
                    + want.get("error").asText().replace("{path}", path) : "no error";
                if (!err.getMessage().equals(expected)) {
                    fail("routing", e.getKey(), err.getMessage(), expected);
                }
                continue;
            }
            if (want.has("error")) {
                fail("routing", e.getKey(), "a routing", want.get("error"));
                continue;
            }
            ArrayNode instances = DisHttp.JSON.createArrayNode();
            for (Routing.Instance i : r.instances) {
                ObjectNode o = instances.addObject();
                o.put("name", i.name);
                o.set("members", replicas(i.members));
                o.set("read_replicas", replicas(i.readReplicas));
            }
            if (!instances.equals(want.get("instances"))) {
                fail("routing", e.getKey(), instances, want.get("instances"));
            }
            Iterator<Map.Entry<String, JsonNode>> owners = want.get("owners").properties().iterator();
            while (owners.hasNext()) {
                Map.Entry<String, JsonNode> o = owners.next();
                String[] t = o.getKey().split("\\.", 2);
                Routing.Instance owner = r.owner(t[0], t[1]);
                String got = owner == null ? null : owner.name;
                String expected = o.getValue().isNull() ? null : o.getValue().asText();
                if (got == null ? expected != null : !got.equals(expected)) {
                    fail("routing", e.getKey() + " owner of " + o.getKey(), got, expected);
                }
            }
        }
        checked.put("routing", n);
    }

    private static ArrayNode replicas(List<Routing.Replica> rs) {
        ArrayNode out = DisHttp.JSON.createArrayNode();
        for (Routing.Replica x : rs) {
            out.addArray().add(x.name).add(x.address).add(x.httpAddress);
        }
        return out;
    }

    // -- options.json: the source's options --------------------------------------------------------
    private void options() throws IOException {
        int n = 0;
        for (JsonNode c : load("options.json")) {
            n++;
            Map<String, String> o = new HashMap<>();
            c.get("options").properties().forEach(e -> o.put(e.getKey(), e.getValue().asText()));
            String what = c.get("options").toString();
            String error = c.has("jvm_error") ? c.get("jvm_error").asText()
                : c.has("error") ? c.get("error").asText() : null;
            DisOptions parsed;
            try {
                parsed = DisOptions.parse(o);
            } catch (DisSourceError e) {
                if (!e.getMessage().equals(error)) {
                    fail("options", what, e.getMessage(), error == null ? c.get("parsed") : error);
                }
                continue;
            }
            if (error != null) {
                fail("options", what, "accepted", error);
                continue;
            }
            ObjectNode got = DisHttp.JSON.createObjectNode();
            got.put("namespace", parsed.namespace);
            got.put("table", parsed.table);
            got.put("address", parsed.address);
            got.set("columns", DisHttp.JSON.valueToTree(parsed.columns));
            List<String> partitions = parsed.partitions == null ? null : new ArrayList<>(parsed.partitions);
            if (partitions != null) {
                Collections.sort(partitions);
            }
            got.set("partitions", DisHttp.JSON.valueToTree(partitions));
            got.put("rowsPerPartition", parsed.rowsPerPartition);
            got.put("timeout", parsed.timeoutS);
            got.put("retrySeconds", parsed.retryS);
            got.set("maxRowsPerTrigger", DisHttp.JSON.valueToTree(parsed.maxRowsPerTrigger));
            got.put("startingOffsets", parsed.startingOffsets);
            got.put("minPartitions", parsed.minPartitions);
            got.put("batchRows", parsed.batchRows);
            JsonNode want = c.get("parsed");
            Iterator<String> fields = want.fieldNames();
            while (fields.hasNext()) {
                String f = fields.next();
                JsonNode g = got.get(f);
                JsonNode w = want.get(f);
                boolean equal = g.isNumber() && w.isNumber() ? g.asDouble() == w.asDouble() : g.equals(w);
                if (!equal) {
                    fail("options", what + " " + f, g, w);
                }
            }
        }
        checked.put("options", n);
    }

    // -- closest.json: the known key a misspelt one is taken for ----------------------------------
    private void closest() throws IOException {
        int n = 0;
        for (JsonNode c : load("closest.json")) {
            n++;
            List<String> known = new ArrayList<>();
            c.get(1).forEach(k -> known.add(k.asText()));
            String got = Misspelt.closest(c.get(0).asText(), known);
            String want = c.get(2).isNull() ? null : c.get(2).asText();
            if (got == null ? want != null : !got.equals(want)) {
                fail("closest", c.get(0) + " among " + c.get(1), got, want);
            }
        }
        checked.put("closest", n);
    }

    // -- globs.json: routing patterns ----------------------------------------------------------------
    private void globs() throws IOException {
        int n = 0;
        for (JsonNode c : load("globs.json")) {
            n++;
            boolean got = Routing.glob(c.get(0).asText()).matcher(c.get(1).asText()).matches();
            if (got != c.get(2).asBoolean()) {
                fail("globs", c.get(0) + " ~ " + c.get(1), got, c.get(2));
            }
        }
        checked.put("globs", n);
    }
}
