package disd.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.CompositeReadLimit;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.ReadMinRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * Micro-batches of new rows, with the Python source's offsets: {@code {"<internal>/<column
 * partition>": rows}}, each location's published row count (absent: 0).  A micro-batch from
 * offset A to B reads rows [A[k], B[k]) of each location k, so batches neither overlap nor leave
 * gaps, and a query restarted from its checkpoint replays exactly the batch it had planned.
 */
final class DisStream implements MicroBatchStream, SupportsTriggerAvailableNow {
    /** Row counts per location, as JSON with sorted keys. */
    static final class DisOffset extends Offset {
        final TreeMap<String, Long> rows;

        DisOffset(Map<String, Long> rows) {
            this.rows = new TreeMap<>(rows);
        }

        @Override
        public String json() {
            try {
                return DisHttp.JSON.writeValueAsString(rows);
            } catch (JsonProcessingException e) {
                throw new IllegalStateException(e);
            }
        }

        static DisOffset parse(String json) {
            TreeMap<String, Long> m = new TreeMap<>();
            try {
                JsonNode n = DisHttp.JSON.readTree(json);
                Iterator<Map.Entry<String, JsonNode>> it = n.properties().iterator();
                while (it.hasNext()) {
                    Map.Entry<String, JsonNode> e = it.next();
                    m.put(e.getKey(), e.getValue().asLong());
                }
            } catch (JsonProcessingException e) {
                throw new DisSourceError("not a dis streaming offset: " + json);
            }
            return new DisOffset(m);
        }
    }

    final DisOptions options;
    final Projection projection;
    final boolean offHeap;
    private Map<String, Long> target;

    DisStream(DisOptions options, Projection projection, boolean offHeap) {
        this.options = options;
        this.projection = projection;
        this.offHeap = offHeap;
    }

    /** What every replica of the table's owner publishes now; while none can be reached (a
     *  restart), asked again for up to option 'retrySeconds'. */
    private Dis.Listing listing() {
        return new Dis(options).listing(projection.table.version);
    }

    private boolean wanted(String key) {
        if (options.partitions == null) {
            return true;
        }
        return options.partitions.contains(key.substring(key.indexOf('/') + 1));
    }

    /**
     * Per location, the most rows a replica has published.  A replica behind another (or one that
     * restarted and has not yet re-ingested rows) may list fewer than an offset already covers;
     * offsets still never move back ({@link #admit} starts from the previous offset).
     */
    private Map<String, Long> available() {
        Map<String, Long> out = new TreeMap<>();
        for (Map.Entry<String, Long> e : listing().mostRows().entrySet()) {
            if (e.getValue() > 0 && wanted(e.getKey())) {
                out.put(e.getKey(), e.getValue());
            }
        }
        return out;
    }

    private static Map<String, Long> rows(Offset o) {
        if (o == null) {
            return new TreeMap<>();
        }
        return o instanceof DisOffset ? ((DisOffset) o).rows : DisOffset.parse(o.json()).rows;
    }

    @Override
    public Offset initialOffset() {
        return new DisOffset(options.startingOffsets.equals("latest") ? available() : new TreeMap<>());
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return options.maxRowsPerTrigger != null ? ReadLimit.maxRows(options.maxRowsPerTrigger) : ReadLimit.allAvailable();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        target = available();
    }

    @Override
    public Offset latestOffset() {
        return latestOffset(null, ReadLimit.allAvailable());
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
        Map<String, Long> avail = available();
        if (target != null) {
            Map<String, Long> capped = new TreeMap<>();
            for (Map.Entry<String, Long> e : avail.entrySet()) {
                capped.put(e.getKey(), Math.min(e.getValue(), target.getOrDefault(e.getKey(), 0L)));
            }
            avail = capped;
        }
        Map<String, Long> s = rows(start);
        Map<String, Long> end = admit(s, avail, limit);
        if (start != null && end.equals(new TreeMap<>(s))) {
            return start;
        }
        return new DisOffset(end);
    }

    @Override
    public Offset reportLatestOffset() {
        return new DisOffset(available());
    }

    /** The end offset of the next micro-batch: every location's rows up to {@code available}
     *  (never below {@code start}), at most the limit's rows in all, shared evenly. */
    static Map<String, Long> admit(Map<String, Long> start, Map<String, Long> available, ReadLimit limit) {
        Map<String, Long> pending = new TreeMap<>();
        for (Map.Entry<String, Long> e : available.entrySet()) {
            pending.put(e.getKey(), Math.max(0, e.getValue() - start.getOrDefault(e.getKey(), 0L)));
        }
        List<ReadLimit> limits = new ArrayList<>();
        if (limit instanceof CompositeReadLimit) {
            for (ReadLimit l : ((CompositeReadLimit) limit).getReadLimits()) {
                limits.add(l);
            }
        } else if (limit != null) {
            limits.add(limit);
        }
        for (ReadLimit l : limits) {
            if (l instanceof ReadMinRows) {
                long sum = 0;
                for (long v : pending.values()) {
                    sum += v;
                }
                if (sum < ((ReadMinRows) l).minRows()) {
                    pending.clear();
                }
            }
        }
        for (ReadLimit l : limits) {
            if (l instanceof ReadMaxRows) {
                pending = waterFill(pending, ((ReadMaxRows) l).maxRows());
            }
        }
        TreeMap<String, Long> end = new TreeMap<>(start);
        for (Map.Entry<String, Long> e : pending.entrySet()) {
            if (e.getValue() > 0) {
                end.put(e.getKey(), end.getOrDefault(e.getKey(), 0L) + e.getValue());
            }
        }
        end.values().removeIf(v -> v <= 0);
        return end;
    }

    /** Share {@code budget} rows: each location an equal share, what one cannot use to the others. */
    static Map<String, Long> waterFill(Map<String, Long> pending, long budget) {
        Map<String, Long> alloc = new TreeMap<>();
        List<String> keys = new ArrayList<>();
        for (Map.Entry<String, Long> e : pending.entrySet()) {
            alloc.put(e.getKey(), 0L);
            if (e.getValue() > 0) {
                keys.add(e.getKey());
            }
        }
        long remaining = Math.max(0, budget);
        while (!keys.isEmpty() && remaining > 0) {
            long share = Math.max(1, remaining / keys.size());
            List<String> next = new ArrayList<>();
            for (String k : keys) {
                if (remaining == 0) {
                    break;
                }
                long give = Math.min(Math.min(share, pending.get(k) - alloc.get(k)), remaining);
                alloc.put(k, alloc.get(k) + give);
                remaining -= give;
                if (alloc.get(k) < pending.get(k)) {
                    next.add(k);
                }
            }
            keys = next;
        }
        return alloc;
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        Map<String, Long> s = rows(start);
        Map<String, long[]> wanted = new TreeMap<>();
        for (Map.Entry<String, Long> e : rows(end).entrySet()) {
            long a = s.getOrDefault(e.getKey(), 0L);
            if (e.getValue() > a) {
                wanted.put(e.getKey(), new long[] {a, e.getValue()});
            }
        }
        if (wanted.isEmpty()) {
            return new InputPartition[0];
        }
        long deadline = System.nanoTime() + (long) (Math.max(options.timeoutS, options.retryS) * 1e9);
        Dis dis = new Dis(options);
        Map<String, Dis.Location> snaps = new TreeMap<>();
        while (true) {
            // The query's version and columns are fixed when it starts (Spark fixes a stream's
            // schema): a location of a version the DIS admitted since is read through the
            // listing's projection of it onto the query's version.
            Dis.Listing listing = dis.listing(projection.table.version);
            Map<String, Long> most = listing.mostRows();
            String shortKey = null;
            long have = 0;
            long need = 0;
            for (Map.Entry<String, long[]> e : wanted.entrySet()) {
                // read from a replica that has published the batch's end (the preferred one if it has)
                Dis.Location l = listing.pick(e.getKey(), e.getValue()[1]);
                if (l == null) {
                    shortKey = e.getKey();
                    have = most.getOrDefault(e.getKey(), 0L);
                    need = e.getValue()[1];
                    break;
                }
                snaps.put(e.getKey(), dis.readable(l, projection.table));
            }
            if (shortKey == null) {
                break;
            }
            if (System.nanoTime() > deadline) {
                throw new DisSourceError("location " + options.namespace + "." + options.table + " " + shortKey
                    + " has " + have + " published rows but the offset being read needs " + need + " (did the DIS "
                    + "lose unflushed rows and not yet re-ingest them?); waited as long as options 'retrySeconds' and 'timeout' allow");
            }
            try {
                Thread.sleep(200);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new DisSourceError("interrupted while waiting for rows to be published again");
            }
        }
        List<Planner.Slice> ranges = new ArrayList<>();
        for (Map.Entry<String, long[]> e : wanted.entrySet()) {
            ranges.add(new Planner.Slice(snaps.get(e.getKey()), e.getValue()[0], e.getValue()[1]));
        }
        return Planner.plan(ranges, dis.owner().readReplicas, options.rowsPerPartition, options.minPartitions);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new ReadSpec(projection, options, offHeap);
    }

    @Override
    public Offset deserializeOffset(String json) {
        return DisOffset.parse(json);
    }

    @Override
    public void commit(Offset end) {
    }

    @Override
    public void stop() {
    }
}
