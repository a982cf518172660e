package disd.spark;

import java.io.IOException;
import java.io.Reader;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Pattern;
import org.yaml.snakeyaml.LoaderOptions;
import org.yaml.snakeyaml.Yaml;
import org.yaml.snakeyaml.constructor.SafeConstructor;

/**
 * Which DIS owns which table ({@code config/routing.yaml}, {@code disd.routing}): the first
 * instance with a matching shell-style pattern over {@code <Namespace>.<Table>}.  An instance is
 * one DIS ({@code address}) or a replica set ({@code replicas: [{name, address, http_address}]}),
 * DISes that each hold a full copy of its tables.  Each replica's block endpoint is its
 * {@code http_address}, else its address's port + 1.  An instance may also list {@code proxies}
 * ({@code dis proxy}, same keys as a replica): a proxy serves the read side of a DIS, so this
 * reader lists and reads the instance's tables through its proxies' block endpoints
 * ({@link Instance#readReplicas}, failing over between them as between replicas) instead of the
 * DISes'.  The file is checked as {@code disd.routing.parse_routing} checks it, with the same
 * messages (naming the entry and key).
 */
final class Routing {
    /** One DIS of an instance: where its block endpoint is. */
    static final class Replica implements Serializable {
        private static final long serialVersionUID = 1L;
        final String name;
        final String address;      // its gRPC address, as users name it
        final String httpAddress;  // its block endpoint

        Replica(String name, String address, String httpAddress) {
            this.name = name;
            this.address = address;
            this.httpAddress = httpAddress;
        }
    }

    static final class Instance {
        final String name;
        final String address;      // the first replica's
        final String httpAddress;  // the first replica's
        final List<Pattern> tables;
        /** Every replica (one for a plain entry), in the routing file's order: the DISes. */
        final List<Replica> members;
        /** The entry's proxies (empty: none), in the routing file's order. */
        final List<Replica> proxies;
        /** Where this reader lists and reads the entry's tables: its proxies if any, else its members. */
        final List<Replica> readReplicas;

        Instance(String name, List<Replica> members, List<Pattern> tables) {
            this(name, members, tables, Collections.<Replica>emptyList());
        }

        Instance(String name, List<Replica> members, List<Pattern> tables, List<Replica> proxies) {
            this.name = name;
            this.address = members.get(0).address;
            this.httpAddress = members.get(0).httpAddress;
            this.tables = tables;
            this.members = Collections.unmodifiableList(new ArrayList<>(members));
            this.proxies = Collections.unmodifiableList(new ArrayList<>(proxies));
            this.readReplicas = this.proxies.isEmpty() ? this.members : this.proxies;
        }

        boolean owns(String namespace, String table) {
            String key = namespace + "." + table;
            for (Pattern p : tables) {
                if (p.matcher(key).matches()) {
                    return true;
                }
            }
            return false;
        }
    }

    final List<Instance> instances;

    private Routing(List<Instance> instances) {
        this.instances = instances;
    }

    static Routing of(DisOptions o) {
        if (o.routing == null) {
            String http = o.httpAddress != null ? o.httpAddress : DisHttp.defaultEndpoint(o.address);
            return new Routing(Collections.singletonList(new Instance(o.address,
                Collections.singletonList(new Replica(o.address, o.address, http)),
                Collections.singletonList(glob("*")))));
        }
        return load(o.routing);
    }

    /** A routing file, or an error: {@code option 'routing': cannot use F: F: <key>: <problem>}. */
    static Routing load(String path) {
        Object data;
        try (Reader r = Files.newBufferedReader(Paths.get(path), StandardCharsets.UTF_8)) {
            data = new Yaml(new SafeConstructor(new LoaderOptions())).load(r);
        } catch (IOException | RuntimeException e) {
            throw new DisSourceError("option 'routing': cannot use " + path + ": " + e.getMessage());
        }
        try {
            return parse(data, path);
        } catch (Problem p) {
            throw new DisSourceError("option 'routing': cannot use " + path + ": " + p.getMessage());
        }
    }

    /** A routing file's problem, as {@code disd.config.ConfigError} words it: "source: key: problem". */
    static final class Problem extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Problem(String source, String key, String problem) {
            super(source + ": " + key + ": " + problem);
        }
    }

    /** {@code disd.config.ConfigReader}: typed keys of one mapping, unknown keys refused. */
    private static final class Keys {
        final String source;
        final String prefix;
        final Map<Object, Object> data;
        final Set<String> used = new HashSet<>();

        @SuppressWarnings("unchecked")
        Keys(String source, Object data, String prefix) {
            this.source = source;
            this.prefix = prefix;
            if (data == null) {
                data = new LinkedHashMap<>();
            }
            if (!(data instanceof Map)) {
                String where = prefix.endsWith(".") ? prefix.substring(0, prefix.length() - 1) : prefix;
                throw new Problem(source, where.isEmpty() ? "<top>" : where, "must be a mapping");
            }
            this.data = (Map<Object, Object>) data;
        }

        String key(String name) {
            return prefix + name;
        }

        <T> T get(String name, Class<T> kind, T dflt) {
            used.add(name);
            Object v = data.get(name);
            if (v == null) {
                return dflt;
            }
            if (!kind.isInstance(v)) {
                throw new Problem(source, key(name), "must be " + (kind == String.class ? "str" : "list") + ", got "
                    + pyRepr(v));
            }
            return kind.cast(v);
        }

        /** Refuse a key no {@code get} asked for, offering the closest known key (as
         *  {@code ConfigReader.refuse_unknown}). */
        void finish() {
            TreeSet<String> unknown = new TreeSet<>();
            for (Object k : data.keySet()) {
                if (!used.contains(pyStr(k))) {
                    unknown.add(pyStr(k));
                }
            }
            if (!unknown.isEmpty()) {
                String name = unknown.first();
                TreeSet<String> known = new TreeSet<>(used);
                String close = Misspelt.closest(name, known);
                throw new Problem(source, key(name), "unknown key (" + (close != null ? "did you mean " + close + "?"
                    : "known keys: " + String.join(", ", known)) + ")");
            }
        }
    }

    /** {@code disd.routing.parse_routing}, check for check and message for message. */
    static Routing parse(Object data, String source) {
        Keys r = new Keys(source, data, "");
        List<?> raw = r.get("instances", List.class, null);
        r.finish();
        if (raw == null || raw.isEmpty()) {
            throw new Problem(source, "instances", "missing or empty");
        }
        List<Instance> out = new ArrayList<>();
        for (int i = 0; i < raw.size(); i++) {
            Keys ir = new Keys(source, raw.get(i), "instances[" + i + "].");
            String address = ir.get("address", String.class, null);
            List<?> rawReplicas = ir.get("replicas", List.class, null);
            if (address != null && rawReplicas != null) {
                throw new Problem(source, ir.key("replicas"), "give either 'address' (one DIS) or 'replicas', not both");
            }
            if (rawReplicas == null) {
                hostPort(source, ir.key("address"), address);
            } else if (rawReplicas.isEmpty()) {
                throw new Problem(source, ir.key("replicas"), "must list at least one {address: host:port}");
            }
            String name = ir.get("name", String.class, address != null && !address.isEmpty() ? address
                : "instances[" + i + "]");
            List<?> tables = ir.get("tables", List.class, Collections.singletonList("*"));
            List<Pattern> pats = new ArrayList<>();
            for (Object t : tables) {
                if (!(t instanceof String) || ((String) t).isEmpty()) {
                    throw new Problem(source, ir.key("tables"), "must be a list of <Namespace>.<Table> patterns");
                }
                pats.add(glob((String) t));
            }
            String http = ir.get("http_address", String.class, null);
            if (http != null && !http.contains(":")) {
                throw new Problem(source, ir.key("http_address"), "must be host:port");
            }
            if (rawReplicas != null && http != null) {
                throw new Problem(source, ir.key("http_address"), "goes on each replica of a replica set");
            }
            List<?> rawProxies = ir.get("proxies", List.class, null);
            if (rawProxies != null && rawProxies.isEmpty()) {
                throw new Problem(source, ir.key("proxies"),
                    "must list at least one {address: host:port} (leave the key out for none)");
            }
            ir.finish();
            List<Replica> members;
            if (rawReplicas != null) {
                members = replicas(source, "instances[" + i + "].replicas", rawReplicas);
            } else {
                members = Collections.singletonList(new Replica(name, address,
                    endpoint(source, ir.key("http_address"), http, ir.key("address"), address)));
            }
            List<Replica> proxies = Collections.emptyList();
            if (rawProxies != null) {
                Set<String> dises = new HashSet<>();
                for (Replica m : members) {
                    dises.add(m.address);
                }
                proxies = replicas(source, "instances[" + i + "].proxies", rawProxies, "proxy", dises);
            }
            out.add(new Instance(name, members, pats, proxies));
        }
        return new Routing(out);
    }

    private static List<Replica> replicas(String source, String where, List<?> raw) {
        return replicas(source, where, raw, "replica", Collections.<String>emptySet());
    }

    /** The {@code {name, address, http_address}} items of a replicas (or proxies) list; a proxy
     *  must not take one of the entry's DIS addresses ({@code dises}). */
    private static List<Replica> replicas(String source, String where, List<?> raw, String what, Set<String> dises) {
        List<Replica> out = new ArrayList<>();
        for (int j = 0; j < raw.size(); j++) {
            Keys rr = new Keys(source, raw.get(j), where + "[" + j + "].");
            String address = rr.get("address", String.class, null);
            String name = rr.get("name", String.class, address);
            String http = rr.get("http_address", String.class, null);
            rr.finish();
            hostPort(source, rr.key("address"), address);
            for (Replica r : out) {
                if (r.address.equals(address)) {
                    throw new Problem(source, rr.key("address"), address + " is already a " + what + " of this entry");
                }
            }
            if (dises.contains(address)) {
                throw new Problem(source, rr.key("address"),
                    address + " is a DIS of this entry; a proxy is a `dis proxy` at its own address");
            }
            if (http != null && !http.contains(":")) {
                throw new Problem(source, rr.key("http_address"), "must be host:port");
            }
            out.add(new Replica(name, address, endpoint(source, rr.key("http_address"), http, rr.key("address"),
                address)));
        }
        return out;
    }

    private static void hostPort(String source, String key, String address) {
        if (address == null || address.isEmpty() || !address.contains(":")) {
            throw new Problem(source, key, "must be host:port");
        }
    }

    /** The block endpoint: {@code http_address}, else the address's port + 1 (a port must be a number). */
    private static String endpoint(String source, String httpKey, String http, String addressKey, String address) {
        if (http != null) {
            if (!DisOptions.isHostPort(http)) {
                throw new Problem(source, httpKey, "must be host:port");
            }
            return http;
        }
        if (!DisOptions.isHostPort(address)) {
            throw new Problem(source, addressKey, "must be host:port");
        }
        return DisHttp.defaultEndpoint(address);
    }

    /** How Python's {@code str()} shows a mapping key (for "unknown key" messages). */
    static String pyStr(Object v) {
        if (v instanceof Boolean) {
            return (Boolean) v ? "True" : "False";
        }
        if (v == null) {
            return "None";
        }
        return v instanceof String ? (String) v : pyRepr(v);
    }

    /** How Python's {@code repr()} shows a YAML value (for "must be str, got ..." messages). */
    static String pyRepr(Object v) {
        if (v == null) {
            return "None";
        }
        if (v instanceof Boolean) {
            return (Boolean) v ? "True" : "False";
        }
        if (v instanceof String) {
            String s = (String) v;
            boolean dq = s.contains("'") && !s.contains("\"");
            char q = dq ? '"' : '\'';
            StringBuilder b = new StringBuilder().append(q);
            for (char c : s.toCharArray()) {
                if (c == '\\') {
                    b.append("\\\\");
                } else if (c == q) {
                    b.append('\\').append(c);
                } else if (c == '\n') {
                    b.append("\\n");
                } else if (c == '\t') {
                    b.append("\\t");
                } else if (c == '\r') {
                    b.append("\\r");
                } else {
                    b.append(c);
                }
            }
            return b.append(q).toString();
        }
        if (v instanceof List) {
            StringBuilder b = new StringBuilder("[");
            for (Object x : (List<?>) v) {
                b.append(b.length() > 1 ? ", " : "").append(pyRepr(x));
            }
            return b.append(']').toString();
        }
        if (v instanceof Map) {
            StringBuilder b = new StringBuilder("{");
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                b.append(b.length() > 1 ? ", " : "").append(pyRepr(e.getKey())).append(": ").append(pyRepr(e.getValue()));
            }
            return b.append('}').toString();
        }
        if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d)) {
                return "nan";
            }
            if (Double.isInfinite(d)) {
                return d > 0 ? "inf" : "-inf";
            }
            return d == Math.rint(d) && Math.abs(d) < 1e16 ? String.valueOf((long) d) + ".0" : String.valueOf(d);
        }
        return String.valueOf(v);
    }

    Instance owner(String namespace, String table) {
        for (Instance i : instances) {
            if (i.owns(namespace, table)) {
                return i;
            }
        }
        return null;
    }

    /** A shell-style pattern ({@code fnmatch.fnmatchcase}) as a regular expression. */
    static Pattern glob(String p) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < p.length(); i++) {
            char c = p.charAt(i);
            if (c == '*') {
                sb.append(".*");
            } else if (c == '?') {
                sb.append('.');
            } else if (c == '[') {
                int j = p.indexOf(']', i + 2);
                if (j < 0) {
                    sb.append("\\[");
                } else {
                    String set = p.substring(i + 1, j);
                    if (set.startsWith("!")) {
                        set = "^" + set.substring(1);
                    }
                    sb.append('[').append(set.replace("\\", "\\\\")).append(']');
                    i = j;
                }
            } else {
                sb.append(Pattern.quote(String.valueOf(c)));
            }
        }
        return Pattern.compile(sb.toString(), Pattern.DOTALL);
    }
}
