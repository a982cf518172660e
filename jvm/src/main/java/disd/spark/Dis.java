package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * What the driver asks the DIS that owns a table (every replica of its routing entry): its schema
 * and its locations (published rows and the column file sizes at that count), through the block
 * endpoint.  A DIS that cannot be reached is asked again for up to option {@code retrySeconds}.
 */
final class Dis {
    /** One location as listed: the sizes fix what a scan reads however far ingestion moves on. */
    static final class Location implements Serializable {
        private static final long serialVersionUID = 1L;
        final String internalPartition;
        final String columnPartition;
        final long rows;
        final TreeMap<String, Long> files;
        /** The schema version its rows are written in (0: not known, read as the presented one). */
        final int version;
        /** The replica (index into the owner's readReplicas) that listed it: where a task reads it. */
        final int replica;
        /** How its version reads as the presented one, from the listing (null: it is written in
         *  the presented version, read as it is). */
        final VersionProjection projection;

        Location(String internalPartition, String columnPartition, long rows, TreeMap<String, Long> files) {
            this(internalPartition, columnPartition, rows, files, 0, 0, null);
        }

        Location(String internalPartition, String columnPartition, long rows, TreeMap<String, Long> files,
                 int version, int replica, VersionProjection projection) {
            this.internalPartition = internalPartition;
            this.columnPartition = columnPartition;
            this.rows = rows;
            this.files = files;
            this.version = version;
            this.replica = replica;
            this.projection = projection;
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

    DisHttp http(Routing.Replica r) {
        return new DisHttp(r.httpAddress, r.address, options.hint(), options.security, options.timeoutS);
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
                known.addAll(firstAnswer(i.readReplicas, h -> {
                    TreeSet<String> names = new TreeSet<>();
                    for (JsonNode t : h.json("/v1/tables").get("tables")) {
                        names.add(t.get("namespace").asText() + "." + t.get("table").asText());
                    }
                    return names;
                }));
            }
            shown = known.isEmpty() ? "none" : String.join(", ", known);
        } catch (DisSourceError e) {
            shown = "?";
        }
        return new DisSourceError("unknown table " + options.namespace + "." + options.table + " at "
            + options.where() + " (tables there: " + shown + "); check options 'namespace' and 'table'");
    }

    /** What the first replica that answers says (in the routing's order), or the last failure. */
    private <T> T firstAnswer(List<Routing.Replica> replicas, java.util.function.Function<DisHttp, T> ask) {
        DisSourceError last = null;
        for (Routing.Replica r : replicas) {
            try {
                return ask.apply(http(r));
            } catch (DisSourceError e) {
                if (!e.unreachable) {
                    throw e;
                }
                last = e;
            }
        }
        throw last;
    }

    /**
     * {@code call}, again with backoff while every DIS it asks is unreachable (a restart) or
     * answers 503, for up to option {@code retrySeconds}; then the failure, saying how long it was
     * tried.  Refusals that stay (a bad token, a TLS handshake, an unknown table) fail at once.
     */
    static <T> T retrying(double retryS, java.util.function.Supplier<T> call) {
        long deadline = 0;
        long delayMs = Retry.INITIAL_MS;
        while (true) {
            try {
                return call.get();
            } catch (DisSourceError e) {
                if (!e.unreachable) {
                    throw e;
                }
                long now = System.nanoTime();
                if (deadline == 0) {
                    deadline = now + (long) (retryS * 1e9);
                }
                if (now - deadline >= 0) {
                    throw Retry.gaveUp(e, retryS);
                }
                delayMs = Retry.sleep(delayMs, deadline);
            }
        }
    }

    /**
     * The table's newest schema (the DIS's {@code schema_json}), asked of the owner's replicas in
     * order until one that knows the table answers.
     */
    TableSchema schema() {
        Routing.Instance inst = owner();
        TableSchema s = retrying(options.retryS, () -> {
            DisSourceError last = null;
            for (Routing.Replica r : inst.readReplicas) {
                JsonNode tables;
                try {
                    tables = http(r).json("/v1/tables").get("tables");
                } catch (DisSourceError e) {
                    if (!e.unreachable) {
                        throw e;
                    }
                    last = e;
                    continue;
                }
                for (JsonNode t : tables) {
                    if (t.get("namespace").asText().equals(options.namespace)
                        && t.get("table").asText().equals(options.table)) {
                        return TableSchema.fromJson(t.get("schema_json").asText());
                    }
                }
            }
            if (last != null) {
                throw last; // a replica that did not answer may know the table: ask again
            }
            return null;
        });
        if (s == null) {
            throw unknownTable();
        }
        return s;
    }

    /**
     * The table's locations, as listed now, each from the replica a task is to read it from (see
     * {@link Listing#pick}), with the schema version it is written in and the listing's
     * projection of that version onto {@code presented}'s ({@link #readable}).
     */
    List<Location> locations(TableSchema presented) {
        Listing listing = listing(presented.version);
        List<Location> out = new ArrayList<>();
        for (String key : listing.keys()) {
            out.add(readable(listing.pick(key, 0), presented));
        }
        return out;
    }

    /**
     * {@code l}, once it is known to be readable as {@code presented}: written in that version
     * (or in one the DIS did not say: 0), or with the listing's projection of its version.  A
     * DIS older than projections sends none: such a location is an error here, on the driver,
     * that says what to do.
     */
    Location readable(Location l, TableSchema presented) {
        if (l.version > 0 && l.version != presented.version && l.projection == null) {
            throw new DisSourceError(presented.key() + " location " + l.offsetKey() + " is written in schema version "
                + l.version + ", and the listing of " + options.where() + " says nothing of how it reads as version "
                + presented.version + " (a DIS older than this reader: upgrade it, or read with option reader "
                + "'python')");
        }
        return l;
    }

    /**
     * What every replica of the owner publishes now, its locations' versions read as version
     * {@code presented}: each is asked at once; the listing is what those that answered said.
     * While none answers (a restart) it is asked again, with backoff, for up to option
     * {@code retrySeconds}.  A replica that has not answered a short while after
     * the first one did is left out (it is down or slow: no location is read from it).
     */
    Listing listing(int presented) {
        Routing.Instance inst = owner();
        String pq = "/v1/locations?namespace=" + DisHttp.q(options.namespace) + "&table=" + DisHttp.q(options.table)
            + "&version=" + presented;
        return retrying(options.retryS, () -> {
            List<Routing.Replica> members = inst.readReplicas; // its proxies, if it lists any
            List<Map<String, Location>> per = new ArrayList<>();
            DisSourceError failure = null;
            if (members.size() == 1) {
                per.add(parse(http(members.get(0)).json(pq), 0, presented));
                return new Listing(per);
            }
            List<CompletableFuture<Map<String, Location>>> asks = new ArrayList<>();
            for (int i = 0; i < members.size(); i++) {
                final int r = i;
                asks.add(CompletableFuture.supplyAsync(() -> parse(http(members.get(r)).json(pq), r, presented), ASKS));
            }
            long graceNs = (long) (Math.min(options.timeoutS, LATE_REPLICA_S) * 1e9);
            long until = System.nanoTime() + (long) (options.timeoutS * 1e9) + 1_000_000_000L;
            boolean any = false;
            while (true) {
                boolean all = true;
                for (CompletableFuture<Map<String, Location>> f : asks) {
                    if (!f.isDone()) {
                        all = false;
                    } else if (!f.isCompletedExceptionally() && !any) {
                        any = true;
                        until = Math.min(until, System.nanoTime() + graceNs);
                    }
                }
                if (all || System.nanoTime() - until >= 0) {
                    break;
                }
                try {
                    Thread.sleep(5);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new DisSourceError("interrupted while listing " + options.namespace + "." + options.table);
                }
            }
            any = false;
            for (CompletableFuture<Map<String, Location>> f : asks) {
                Map<String, Location> m = null;
                if (!f.isDone()) {
                    f.cancel(true);
                } else {
                    try {
                        m = f.join();
                        any = true;
                    } catch (CompletionException | CancellationException e) {
                        Throwable c = e.getCause() != null ? e.getCause() : e;
                        if (c instanceof DisSourceError && !((DisSourceError) c).unreachable) {
                            throw (DisSourceError) c;
                        }
                        failure = c instanceof DisSourceError ? (DisSourceError) c : new DisSourceError(true,
                            "listing " + options.namespace + "." + options.table + ": " + c, c);
                    }
                }
                per.add(m);
            }
            if (!any) {
                throw failure != null ? failure : new DisSourceError(true, "no replica of " + inst.name + " answered "
                    + "within option 'timeout' — " + options.hint(), null);
            }
            return new Listing(per);
        });
    }

    /** Seconds the other replicas may still take once one has answered a listing. */
    static final double LATE_REPLICA_S = 2.0;
    private static final ExecutorService ASKS = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "dis-listing");
        t.setDaemon(true);
        return t;
    });

    /** One replica's {@code /v1/locations} answer, by offset key, each location with the
     *  answer's projection of its version onto {@code presented} (none for that version itself). */
    private Map<String, Location> parse(JsonNode n, int replica, int presented) {
        Map<Integer, VersionProjection> projections = new TreeMap<>();
        JsonNode ps = n.get("projections");
        if (ps != null) {
            for (JsonNode p : ps) {
                if (p.get("namespace").asText().equals(options.namespace)
                    && p.get("table").asText().equals(options.table)
                    && p.get("presented_version").asInt() == presented) {
                    VersionProjection vp = VersionProjection.of(p, "in the listing of " + options.where());
                    projections.put(vp.storedVersion, vp);
                }
            }
        }
        Map<String, Location> out = new TreeMap<>();
        for (JsonNode l : n.get("locations")) {
            if (!l.get("namespace").asText().equals(options.namespace) || !l.get("table").asText().equals(options.table)) {
                continue;
            }
            Location loc = location(l, replica, projections, presented);
            out.put(loc.offsetKey(), loc);
        }
        return out;
    }

    static Location location(JsonNode l, int replica, Map<Integer, VersionProjection> projections, int presented) {
        TreeMap<String, Long> files = new TreeMap<>();
        Iterator<Map.Entry<String, JsonNode>> it = l.get("files").properties().iterator();
        while (it.hasNext()) {
            Map.Entry<String, JsonNode> e = it.next();
            files.put(e.getKey(), e.getValue().asLong());
        }
        JsonNode sv = l.get("schema_version");
        int version = sv == null || sv.isNull() ? 0 : sv.asInt();
        return new Location(l.get("internal_partition").asText(), l.get("column_partition").asText(),
            l.get("rows").asLong(), files, version, replica,
            version == 0 || version == presented ? null : projections.get(version));
    }

    /**
     * The owner's replicas' listings (null: that replica did not answer).  Each location has a
     * stable preferred replica among those that listed it (a hash of its key), so the locations
     * of a table spread over the replicas and the same location goes to the same replica from
     * one listing to the next while the same replicas are up.
     */
    static final class Listing {
        final List<Map<String, Location>> perReplica;

        Listing(List<Map<String, Location>> perReplica) {
            this.perReplica = perReplica;
        }

        Set<String> keys() {
            Set<String> out = new TreeSet<>();
            for (Map<String, Location> m : perReplica) {
                if (m != null) {
                    out.addAll(m.keySet());
                }
            }
            return out;
        }

        /** Per location, the most rows any replica has published (what a stream may read up to). */
        Map<String, Long> mostRows() {
            Map<String, Long> out = new TreeMap<>();
            for (Map<String, Location> m : perReplica) {
                if (m != null) {
                    for (Location l : m.values()) {
                        out.merge(l.offsetKey(), l.rows, Math::max);
                    }
                }
            }
            return out;
        }

        /**
         * The location as listed by the replica to read it from: its preferred replica when that
         * one has published at least {@code rows} rows, else the next (in the routing's order,
         * wrapping) that has; null when none has.
         */
        Location pick(String key, long rows) {
            List<Location> listed = new ArrayList<>();
            for (Map<String, Location> m : perReplica) {
                Location l = m == null ? null : m.get(key);
                if (l != null) {
                    listed.add(l);
                }
            }
            if (listed.isEmpty()) {
                return null;
            }
            int first = Math.floorMod(spread(key), listed.size());
            for (int i = 0; i < listed.size(); i++) {
                Location l = listed.get((first + i) % listed.size());
                if (l.rows >= rows) {
                    return l;
                }
            }
            return null;
        }

        /** A well-mixed hash of a location's key (String.hashCode alone differs little between keys). */
        static int spread(String key) {
            long h = key.hashCode() * 0x9E3779B97F4A7C15L;
            return (int) (h ^ (h >>> 32));
        }
    }
}
