package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.Serializable;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;

/**
 * How rows stored in one schema version of a table read as the version a read presents: for each
 * presented column, the stored column it comes from and that column's stored type, or none (the
 * column is null in every row).  The DIS resolves it by the rules of docs/schema-versions.md
 * ({@code disd.schemaversions}, their one implementation) and sends it with each listing
 * ({@code /v1/locations}, {@code projections}); this reader only applies it: a renamed column is
 * read from its stored name's file, a widened one converted exactly from its stored width, one
 * narrowed back (a streaming query older than the rows) range-checked ({@link FixedCursor}).
 */
final class VersionProjection implements Serializable {
    private static final long serialVersionUID = 1L;

    /** A stored column: its name in the stored version's files and its type there. */
    static final class Stored implements Serializable {
        private static final long serialVersionUID = 1L;
        final String name;
        final TableSchema.Kind kind;

        Stored(String name, TableSchema.Kind kind) {
            this.name = name;
            this.kind = kind;
        }
    }

    final int storedVersion;
    final int presentedVersion;
    /** Presented column -> its stored column (null: none). */
    private final Map<String, Stored> columns;

    private VersionProjection(int storedVersion, int presentedVersion, Map<String, Stored> columns) {
        this.storedVersion = storedVersion;
        this.presentedVersion = presentedVersion;
        this.columns = columns;
    }

    /**
     * One entry of a listing's {@code projections}: {@code stored_version},
     * {@code presented_version} and {@code columns} ({@code [{name, type, stored, stored_type}]},
     * {@code stored} null for none).  {@code where} names the listing in errors.
     */
    static VersionProjection of(JsonNode p, String where) {
        try {
            Map<String, Stored> cols = new LinkedHashMap<>();
            for (JsonNode c : p.get("columns")) {
                JsonNode stored = c.get("stored");
                cols.put(c.get("name").asText(), stored == null || stored.isNull() || stored.asText().isEmpty() ? null
                    : new Stored(stored.asText(),
                        TableSchema.Kind.valueOf(c.get("stored_type").asText().toUpperCase(Locale.ROOT))));
            }
            return new VersionProjection(p.get("stored_version").asInt(), p.get("presented_version").asInt(), cols);
        } catch (RuntimeException e) {
            throw new DisSourceError("cannot read a schema version projection " + where + ": " + e + " in " + p);
        }
    }

    /** The stored column {@code column} (a presented one) is read from; null: none, all null. */
    Stored source(String column) {
        if (!columns.containsKey(column)) {
            throw new DisSourceError("the projection of schema version " + storedVersion + " onto version "
                + presentedVersion + " does not present column '" + column + "' (it presents "
                + String.join(", ", columns.keySet()) + ")");
        }
        return columns.get(column);
    }
}
