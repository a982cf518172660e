package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.zip.CRC32C;

/**
 * Schema versions in the JVM reader, as {@code disd.schemaversions} defines them
 * (docs/schema-versions.md): a read presents the table's newest version; a location's rows are
 * decoded in the version the location was written in and each newest column is read from its
 * origin there (renamed: the old name's file; added since: all null; widened: the old width,
 * converted exactly).  {@link #stepOrigins} and {@link #origins} mirror {@code step_origins} and
 * {@code origins} rule for rule, so both readers present the same rows.
 *
 * <p>With option {@code dbRoot} the column files themselves say which version they hold: the
 * table's {@code schema.versions} record and each location's {@code table.size}
 * ({@code schema_version}, or, in a record written before versions, the version whose columns'
 * fingerprint equals the record's).
 */
final class SchemaVersions {
    private SchemaVersions() {
    }

    /** For each column of {@code newer}, the column of {@code older} it comes from (null: added). */
    static Map<String, String> stepOrigins(TableSchema older, TableSchema newer) {
        Set<String> oldNames = new HashSet<>(older.columnNames());
        Map<String, String> found = new LinkedHashMap<>();
        Set<String> taken = new HashSet<>();
        for (TableSchema.Column c : newer.columns) {
            if (c.renamedFrom != null && oldNames.contains(c.renamedFrom)) {
                found.put(c.name, c.renamedFrom);
                taken.add(c.renamedFrom);
            }
        }
        Map<String, String> out = new LinkedHashMap<>();
        for (TableSchema.Column c : newer.columns) {
            if (found.containsKey(c.name)) {
                out.put(c.name, found.get(c.name));
            } else {
                out.put(c.name, oldNames.contains(c.name) && !taken.contains(c.name) ? c.name : null);
            }
        }
        return out;
    }

    /**
     * For each column of {@code newest}, its name in {@code version} of the table (null: the
     * column did not exist then), composed step by step through every known version between.
     */
    static Map<String, String> origins(TableSchema newest, int version) {
        List<TableSchema> chain = new ArrayList<>(newest.versions.subMap(version, true, newest.version, true).values());
        if (chain.isEmpty() || chain.get(0).version != version) {
            newest.atVersion(version); // the error naming the known versions
        }
        Map<String, String> current = new LinkedHashMap<>();
        for (String c : chain.get(chain.size() - 1).columnNames()) {
            current.put(c, c);
        }
        for (int i = chain.size() - 1; i > 0; i--) {
            Map<String, String> step = stepOrigins(chain.get(i - 1), chain.get(i));
            for (Map.Entry<String, String> e : current.entrySet()) {
                e.setValue(e.getValue() == null ? null : step.get(e.getValue()));
            }
        }
        Map<String, String> out = new LinkedHashMap<>();
        for (String c : newest.columnNames()) {
            out.put(c, current.get(c));
        }
        return out;
    }

    /**
     * For each column of {@code schema}, the column of {@code version} of the table its values
     * are read from (null: none, all null), as {@code disd.blocks.version_projection}: for an
     * older (or the same) version its {@link #origins}; for a newer one (a streaming query whose
     * schema was fixed before the table moved on) the column each of {@code schema}'s columns
     * became there — renamed forward, null when a later version dropped it (a column added since
     * is no column's source).
     */
    static Map<String, String> sources(TableSchema schema, int version) {
        if (version <= schema.version) {
            return origins(schema, version);
        }
        TableSchema newer = schema.atVersion(version).withHistory(new ArrayList<>(schema.versions.values()));
        Map<String, String> back = new HashMap<>();
        for (Map.Entry<String, String> e : origins(newer, schema.version).entrySet()) {
            if (e.getValue() != null) {
                back.put(e.getValue(), e.getKey());
            }
        }
        Map<String, String> out = new LinkedHashMap<>();
        for (String c : schema.columnNames()) {
            out.put(c, back.get(c));
        }
        return out;
    }

    /**
     * {@code TableSchema.fingerprint} of {@code disd.schema}: the first 16 bytes (hex) of the
     * SHA-256 of {@code json.dumps([[name, type], ...], separators=(",", ":"))}.
     */
    static String fingerprint(TableSchema s) {
        StringBuilder sb = new StringBuilder("[");
        for (int i = 0; i < s.columns.size(); i++) {
            TableSchema.Column c = s.columns.get(i);
            sb.append(i == 0 ? "[" : ",[");
            pyJsonString(sb, c.name);
            sb.append(',');
            pyJsonString(sb, c.kind.name().toLowerCase(java.util.Locale.ROOT));
            sb.append(']');
        }
        sb.append(']');
        try {
            byte[] d = MessageDigest.getInstance("SHA-256").digest(sb.toString().getBytes(StandardCharsets.UTF_8));
            StringBuilder hex = new StringBuilder(32);
            for (int i = 0; i < 16; i++) {
                hex.append(Character.forDigit((d[i] >> 4) & 0xF, 16)).append(Character.forDigit(d[i] & 0xF, 16));
            }
            return hex.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A string as Python's {@code json.dumps} writes it (ensure_ascii). */
    static void pyJsonString(StringBuilder sb, String v) {
        sb.append('"');
        for (int i = 0; i < v.length(); i++) {
            char ch = v.charAt(i);
            switch (ch) {
                case '"':
                    sb.append("\\\"");
                    break;
                case '\\':
                    sb.append("\\\\");
                    break;
                case '\n':
                    sb.append("\\n");
                    break;
                case '\r':
                    sb.append("\\r");
                    break;
                case '\t':
                    sb.append("\\t");
                    break;
                case '\b':
                    sb.append("\\b");
                    break;
                case '\f':
                    sb.append("\\f");
                    break;
                default:
                    if (ch < 0x20 || ch > 0x7E) {
                        sb.append(String.format("\\u%04x", (int) ch));
                    } else {
                        sb.append(ch);
                    }
            }
        }
        sb.append('"');
    }

    // -- the column files' own record of versions -------------------------------------------------
    /** Line 2 of a checksummed record ({@code disd.records}): magic, JSON body, crc32c. */
    static JsonNode readRecord(Path path, String magic, int maxBytes) {
        byte[] data;
        try {
            if (Files.size(path) > maxBytes) {
                throw new DisSourceError(path + ": larger than " + maxBytes + " bytes, not a " + magic + " record");
            }
            data = Files.readAllBytes(path);
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            throw new DisSourceError("option 'dbRoot': cannot read " + path + ": " + e.getMessage());
        }
        String text = new String(data, StandardCharsets.UTF_8);
        String[] lines = text.split("\n", -1);
        if (lines.length < 3 || !lines[0].startsWith(magic + " ")) {
            throw new DisSourceError(path + ": not a " + magic + " record (first line '"
                + (lines.length > 0 ? lines[0] : "") + "')");
        }
        if (!lines[0].equals(magic + " 1")) {
            throw new DisSourceError(path + ": " + lines[0] + " is a newer format than this reader knows (" + magic
                + " 1); upgrade the dis-spark jar");
        }
        byte[] body = lines[1].getBytes(StandardCharsets.UTF_8);
        CRC32C crc = new CRC32C();
        crc.update(body, 0, body.length);
        if (!lines[2].equals(String.format("crc32c %08x", crc.getValue()))) {
            throw new DisSourceError(path + ": checksum mismatch (the record is damaged)");
        }
        try {
            return DisHttp.JSON.readTree(body);
        } catch (IOException e) {
            throw new DisSourceError(path + ": not JSON: " + e.getMessage());
        }
    }

    static Path tableDir(String dbRoot, String namespace, String table) {
        return Paths.get(dbRoot, "Intraday", namespace, table);
    }

    /** {@code newest} carrying the versions stored in {@code <dbRoot>/Intraday/<Ns>/<Table>/schema.versions}
     *  that it does not know already (as {@code with_stored_history}). */
    static TableSchema withStoredHistory(String dbRoot, TableSchema newest) {
        Path p = tableDir(dbRoot, newest.namespace, newest.table).resolve("schema.versions");
        JsonNode body = readRecord(p, "DISVERSIONS", 16 << 20);
        if (body == null) {
            return newest;
        }
        List<TableSchema> stored = new ArrayList<>();
        try {
            for (JsonNode v : body.get("versions")) {
                stored.add(TableSchema.fromNode(v));
            }
        } catch (RuntimeException e) {
            throw new DisSourceError(p + ": schema versions record unreadable: " + e);
        }
        List<TableSchema> more = new ArrayList<>();
        TableSchema top = newest;
        for (TableSchema s : stored) {
            if (!newest.versions.containsKey(s.version)) {
                more.add(s);
                if (s.version > top.version) {
                    top = s;
                }
            }
        }
        if (more.isEmpty()) {
            return newest;
        }
        List<TableSchema> all = new ArrayList<>(newest.versions.values());
        all.addAll(more);
        return top.withHistory(all);
    }

    /**
     * The version a location's {@code table.size} records: its {@code schema_version}; in a record
     * written before versions, the newest version whose fingerprint is the record's.  0 when the
     * location has no {@code table.size} yet (it holds no rows).
     */
    static int locationVersion(String dbRoot, TableSchema newest, Dis.Location loc) {
        Path dir = tableDir(dbRoot, newest.namespace, newest.table).resolve(loc.internalPartition)
            .resolve(loc.columnPartition).resolve(newest.table);
        Path p = dir.resolve("table.size");
        JsonNode rec = readRecord(p, "DISCKPT", 1 << 20);
        if (rec == null) {
            return 0;
        }
        int v = rec.has("schema_version") ? rec.get("schema_version").asInt() : 0;
        if (v > 0) {
            return v;
        }
        String fp = rec.has("fingerprint") ? rec.get("fingerprint").asText() : "";
        for (TableSchema s : newest.versions.descendingMap().values()) {
            if (fingerprint(s).equals(fp)) {
                return s.version;
            }
        }
        throw new DisSourceError(newest.key() + "/" + loc.offsetKey() + ": " + p + " was written for schema fingerprint "
            + fp + ", which no known version of the table has (versions " + newest.versions.keySet() + ")");
    }
}
