package disd.spark;

import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * The options of {@code spark.read.format("dis")} for the JVM reader: the Python source's
 * ({@code disd.spark.options}), validated with the same messages, plus {@code reader} and
 * {@code httpAddress}.  Option names are case-insensitive.
 */
final class DisOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    /** Rows per input partition before a location is split. */
    static final long DEFAULT_ROWS_PER_PARTITION = 8L << 20;
    /** Rows per ColumnarBatch: 64 K rows keep every fixed-width column on 64 KiB block boundaries. */
    static final int DEFAULT_BATCH_ROWS = 1 << 16;
    /** Split points are multiples of this many rows. */
    static final long SPLIT_ALIGN_ROWS = 1L << 16;

    static final Set<String> KNOWN = new TreeSet<>(Arrays.asList(
        "address", "routing", "namespace", "table", "path", "columns", "partitions",
        "rowsperpartition", "minpartitions", "batchrows", "timeout", "retryseconds",
        "ca", "cert", "key", "token", "tokenfile", "servername",
        "maxrowspertrigger", "startingoffsets", "dbroot", "source", "view", "reader", "httpaddress",
        "pushaggregates"));

    final String namespace;
    final String table;
    final String address;       // host:port of the DIS's gRPC service (what users name)
    final String httpAddress;   // host:port of its block endpoint; null: the address's port + 1
    final String routing;       // a routing YAML (absolute path)
    final List<String> columns; // null: all
    final Set<String> partitions; // null: all
    final long rowsPerPartition;
    final int minPartitions;
    final int batchRows;
    final double timeoutS;
    /** How long load(), planning, streaming offsets and task reads ride out an unreachable DIS (option retrySeconds). */
    final double retryS;
    final Security security;
    final Long maxRowsPerTrigger;
    final String startingOffsets;
    final String dbRoot;
    /** Whether batch queries may push partial aggregates into the scan (option pushAggregates). */
    final boolean pushAggregates;

    private DisOptions(Map<String, String> o) {
        String source = o.get("source");
        if (source != null && !source.trim().isEmpty()) {
            String v = source.trim().toLowerCase(Locale.ROOT);
            if (!v.equals("intraday") && !v.equals("historical") && !v.equals("all")) {
                throw new DisSourceError("option 'source' must be one of intraday, historical, all; got '" + source
                    + "'");
            }
        }
        if (str(o, "schemas") != null) {
            throw new DisSourceError("option 'schemas' is for reading column files without a DIS; the DIS at "
                + "'address'/'routing' knows the schema");
        }
        Set<String> unknown = new TreeSet<>(o.keySet());
        unknown.removeAll(KNOWN);
        if (!unknown.isEmpty()) {
            throw new DisSourceError("unknown option '" + unknown.iterator().next() + "'; the options are: address, "
                + "routing, namespace, table, columns, partitions, rowsPerPartition, minPartitions, batchRows, "
                + "timeout, retrySeconds, ca, cert, key, token, tokenFile, serverName, maxRowsPerTrigger, startingOffsets, "
                + "dbRoot, source, view, reader, httpAddress, pushAggregates");
        }
        String addr = str(o, "address");
        String rout = str(o, "routing");
        if (addr != null && rout != null) {
            throw new DisSourceError("give either option 'address' (host:port) or option 'routing' (a routing YAML "
                + "file), not both");
        }
        if (addr == null && rout == null) {
            throw new DisSourceError("option 'address' (host:port of a DIS) or option 'routing' (a routing YAML file) "
                + "is required");
        }
        if (addr != null && !isHostPort(addr)) {
            throw new DisSourceError("option 'address' must be host:port, got '" + addr + "'");
        }
        if (rout != null && !Files.isRegularFile(Paths.get(rout))) {
            throw new DisSourceError("option 'routing': no such file '" + rout + "'");
        }
        String http = str(o, "httpaddress");
        if (http != null && !isHostPort(http)) {
            throw new DisSourceError("option 'httpAddress' must be host:port, got '" + http + "'");
        }
        if (http != null && rout != null) {
            throw new DisSourceError("option 'httpAddress' goes with option 'address'; in a routing file give each "
                + "instance's 'http_address'");
        }
        address = addr;
        httpAddress = http;
        routing = rout == null ? null : Paths.get(rout).toAbsolutePath().normalize().toString();

        String ns = strOr(o, "namespace", "");
        String tb = strOr(o, "table", "");
        String path = strOr(o, "path", "");
        if (!path.isEmpty() && tb.isEmpty()) {
            if (!path.contains(".")) {
                throw new DisSourceError("load('" + path + "'): give the table as '<Namespace>.<Table>'");
            }
            if (ns.isEmpty()) {
                int i = path.indexOf('.');
                ns = path.substring(0, i);
                tb = path.substring(i + 1);
            } else {
                tb = path;
            }
        } else if (!tb.isEmpty() && ns.isEmpty() && tb.contains(".")) {
            int i = tb.indexOf('.');
            ns = tb.substring(0, i);
            tb = tb.substring(i + 1);
        }
        if (ns.isEmpty() || tb.isEmpty()) {
            throw new DisSourceError("options 'namespace' and 'table' are required (or table '<Namespace>.<Table>')");
        }
        namespace = ns;
        table = tb;

        List<String> cols = list(o.get("columns"));
        if (cols != null) {
            if (cols.isEmpty()) {
                throw new DisSourceError("option 'columns' is empty; list column names separated by commas");
            }
            Set<String> seen = new TreeSet<>();
            Set<String> dup = new TreeSet<>();
            for (String c : cols) {
                if (!seen.add(c)) {
                    dup.add(c);
                }
            }
            if (!dup.isEmpty()) {
                throw new DisSourceError("option 'columns' names '" + dup.iterator().next() + "' twice");
            }
        }
        columns = cols;
        List<String> parts = list(o.get("partitions"));
        if (parts != null && parts.isEmpty()) {
            throw new DisSourceError("option 'partitions' is empty; list partition values (e.g. dates) separated by "
                + "commas");
        }
        partitions = parts == null ? null : new LinkedHashSet<>(parts);

        String t = str(o, "timeout");
        double ts = 30.0;
        if (t != null) {
            String v = t.endsWith("s") ? t.substring(0, t.length() - 1) : t;
            try {
                ts = Double.parseDouble(v);
            } catch (NumberFormatException e) {
                throw new DisSourceError("option 'timeout' must be seconds, got '" + t + "'");
            }
            if (!(ts > 0)) {
                throw new DisSourceError("option 'timeout' must be positive, got '" + t + "'");
            }
        }
        timeoutS = ts;

        String r = str(o, "retryseconds");
        double rs = 60.0;
        if (r != null) {
            String v = r.endsWith("s") ? r.substring(0, r.length() - 1) : r;
            try {
                rs = Double.parseDouble(v);
            } catch (NumberFormatException e) {
                throw new DisSourceError("option 'retrySeconds' must be seconds, got '" + r + "'");
            }
            if (!(rs >= 0)) {
                throw new DisSourceError("option 'retrySeconds' must be 0 or more, got '" + r + "'");
            }
        }
        retryS = rs;

        String token = nonEmpty(o.get("token"));
        String tokenFile = nonEmpty(o.get("tokenfile"));
        if (token != null && tokenFile != null) {
            throw new DisSourceError("give either option 'token' or option 'tokenFile', not both");
        }
        if (tokenFile != null) {
            try {
                token = new String(Files.readAllBytes(Paths.get(tokenFile)), StandardCharsets.UTF_8).trim();
            } catch (IOException e) {
                throw new DisSourceError("option 'tokenFile': cannot read '" + tokenFile + "': " + strerror(e));
            }
        }
        for (String name : new String[] {"ca", "cert", "key"}) {
            String p = nonEmpty(o.get(name));
            if (p != null && !Files.isRegularFile(Paths.get(p))) {
                throw new DisSourceError("option '" + name + "': no such file '" + p + "'");
            }
        }
        if ((o.get("cert") == null) != (o.get("key") == null)) {
            throw new DisSourceError("options 'cert' and 'key' go together (a client certificate and its key)");
        }
        if (nonEmpty(o.get("cert")) != null && nonEmpty(o.get("ca")) == null) {
            throw new DisSourceError("option 'cert' needs option 'ca' (TLS)");
        }
        security = new Security(abs(nonEmpty(o.get("ca"))), abs(nonEmpty(o.get("cert"))), abs(nonEmpty(o.get("key"))),
            token, nonEmpty(o.get("servername")));

        String so = strOr(o, "startingoffsets", "earliest").toLowerCase(Locale.ROOT);
        if (!so.equals("earliest") && !so.equals("latest")) {
            throw new DisSourceError("option 'startingOffsets' must be 'earliest' or 'latest', got '"
                + o.get("startingoffsets") + "'");
        }
        startingOffsets = so;

        String root = str(o, "dbroot");
        if (root != null) {
            if (!Files.isDirectory(Paths.get(root, "Intraday"))) {
                throw new DisSourceError("option 'dbRoot': '" + root + "' is not a DIS database root (no Intraday/ in "
                    + "it)");
            }
            try {
                root = Paths.get(root).toRealPath().toString();
            } catch (IOException e) {
                root = Paths.get(root).toAbsolutePath().normalize().toString();
            }
        }
        dbRoot = root;

        rowsPerPartition = integer(o, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION, 1);
        minPartitions = (int) integer(o, "minPartitions", Runtime.getRuntime().availableProcessors(), 1);
        batchRows = (int) Math.min(integer(o, "batchRows", DEFAULT_BATCH_ROWS, 1), 1 << 24);
        Long mr = null;
        if (str(o, "maxrowspertrigger") != null) {
            mr = integer(o, "maxRowsPerTrigger", 0, 1);
        }
        maxRowsPerTrigger = mr;

        String pa = strOr(o, "pushaggregates", "true").toLowerCase(Locale.ROOT);
        if (!pa.equals("true") && !pa.equals("false")) {
            throw new DisSourceError("option 'pushAggregates' must be true or false, got '" + o.get("pushaggregates")
                + "'");
        }
        pushAggregates = pa.equals("true");
    }

    /** Validate the options Spark passed (names in any case). */
    static DisOptions parse(Map<String, String> options) {
        Map<String, String> lower = new HashMap<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            lower.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        return new DisOptions(lower);
    }

    /** "address X" or "routing F", for messages. */
    String where() {
        return routing != null ? "routing " + routing : "address " + address;
    }

    String hint() {
        return routing != null ? "check option 'routing' and that every DIS in it runs"
            : "check option 'address' and that `dis serve` runs there";
    }

    // -- helpers ----------------------------------------------------------------------------------
    static boolean isHostPort(String s) {
        int i = s.lastIndexOf(':');
        if (i <= 0 || i == s.length() - 1) {
            return false;
        }
        for (char c : s.substring(i + 1).toCharArray()) {
            if (c < '0' || c > '9') {
                return false;
            }
        }
        return true;
    }

    /** Why a file could not be read, in the words of the system's error (as Python's
     *  {@code OSError.strerror} gives them to the Python reader's messages). */
    static String strerror(IOException e) {
        if (e instanceof NoSuchFileException) {
            return "No such file or directory";
        }
        if (e instanceof AccessDeniedException) {
            return "Permission denied";
        }
        if (e instanceof FileSystemException && ((FileSystemException) e).getReason() != null) {
            return ((FileSystemException) e).getReason();
        }
        return e.getMessage();
    }

    private static String abs(String p) {
        return p == null ? null : Paths.get(p).toAbsolutePath().normalize().toString();
    }

    private static String nonEmpty(String v) {
        return v == null || v.isEmpty() ? null : v;
    }

    private static String str(Map<String, String> o, String name) {
        String v = o.get(name);
        if (v == null) {
            return null;
        }
        v = v.trim();
        return v.isEmpty() ? null : v;
    }

    private static String strOr(Map<String, String> o, String name, String dflt) {
        String v = str(o, name);
        return v == null ? dflt : v;
    }

    static List<String> list(String raw) {
        if (raw == null) {
            return null;
        }
        List<String> out = new ArrayList<>();
        for (String x : raw.split(",", -1)) {
            String t = x.trim();
            if (!t.isEmpty()) {
                out.add(t);
            }
        }
        return out;
    }

    private static long integer(Map<String, String> o, String name, long dflt, long minimum) {
        String raw = o.get(name.toLowerCase(Locale.ROOT));
        if (raw == null || raw.trim().isEmpty()) {
            return dflt;
        }
        long v;
        try {
            v = Long.parseLong(raw.trim().replace("_", ""));
        } catch (NumberFormatException e) {
            throw new DisSourceError("option '" + name + "' must be an integer, got '" + raw + "'");
        }
        if (v < minimum) {
            throw new DisSourceError("option '" + name + "' must be at least " + minimum + ", got " + v);
        }
        return v;
    }
}
