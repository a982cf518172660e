package disd.spark;

import java.io.IOException;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;
import org.yaml.snakeyaml.LoaderOptions;
import org.yaml.snakeyaml.Yaml;
import org.yaml.snakeyaml.constructor.SafeConstructor;

/**
 * Which DIS owns which table ({@code config/routing.yaml}, {@code disd.routing}): the first
 * instance with a matching shell-style pattern over {@code <Namespace>.<Table>}.  Each instance's
 * block endpoint is its {@code http_address}, else its address's port + 1.
 */
final class Routing {
    static final class Instance {
        final String name;
        final String address;
        final String httpAddress;
        final List<Pattern> tables;

        Instance(String name, String address, String httpAddress, List<Pattern> tables) {
            this.name = name;
            this.address = address;
            this.httpAddress = httpAddress;
            this.tables = tables;
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
            return new Routing(Collections.singletonList(
                new Instance(o.address, o.address, http, Collections.singletonList(glob("*")))));
        }
        return load(o.routing);
    }

    @SuppressWarnings("unchecked")
    static Routing load(String path) {
        Object data;
        try (Reader r = Files.newBufferedReader(Paths.get(path), StandardCharsets.UTF_8)) {
            data = new Yaml(new SafeConstructor(new LoaderOptions())).load(r);
        } catch (IOException | RuntimeException e) {
            throw new DisSourceError("option 'routing': cannot use " + path + ": " + e.getMessage());
        }
        Object raw = data instanceof Map ? ((Map<String, Object>) data).get("instances") : null;
        if (!(raw instanceof List) || ((List<?>) raw).isEmpty()) {
            throw new DisSourceError("option 'routing': cannot use " + path + ": instances: missing or empty");
        }
        List<Instance> out = new ArrayList<>();
        int i = 0;
        for (Object item : (List<Object>) raw) {
            String where = "instances[" + i++ + "]";
            if (!(item instanceof Map)) {
                throw new DisSourceError("option 'routing': cannot use " + path + ": " + where + ": must be a mapping");
            }
            Map<String, Object> m = (Map<String, Object>) item;
            Object address = m.get("address");
            if (!(address instanceof String) || !DisOptions.isHostPort((String) address)) {
                throw new DisSourceError("option 'routing': cannot use " + path + ": " + where + ".address: must be "
                    + "host:port");
            }
            Object http = m.get("http_address");
            if (http != null && (!(http instanceof String) || !DisOptions.isHostPort((String) http))) {
                throw new DisSourceError("option 'routing': cannot use " + path + ": " + where + ".http_address: "
                    + "must be host:port");
            }
            List<Pattern> pats = new ArrayList<>();
            Object tables = m.get("tables");
            if (tables == null) {
                pats.add(glob("*"));
            } else if (tables instanceof List) {
                for (Object t : (List<Object>) tables) {
                    pats.add(glob(String.valueOf(t)));
                }
            } else {
                throw new DisSourceError("option 'routing': cannot use " + path + ": " + where + ".tables: must be a "
                    + "list of <Namespace>.<Table> patterns");
            }
            String a = (String) address;
            Object name = m.get("name");
            out.add(new Instance(name == null ? a : String.valueOf(name), a,
                http != null ? (String) http : DisHttp.defaultEndpoint(a), pats));
        }
        return new Routing(out);
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
