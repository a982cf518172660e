package disd.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Input partitions: which row ranges of which locations each task reads, cut and packed exactly
 * as the Python source does ({@code disd.spark.plan}): ranges are cut at multiples of a split
 * size (aligned to 65536 rows, so fixed-width columns split on 64 KiB block boundaries) and packed,
 * longest first, onto the least loaded of as many partitions as keep every core busy.
 */
final class Planner {
    private Planner() {
    }

    /** Rows [start, stop) of one location, with the sizes its files had when it was listed. */
    static final class Slice implements Serializable {
        private static final long serialVersionUID = 1L;
        final Dis.Location location;
        final long start;
        final long stop;

        Slice(Dis.Location location, long start, long stop) {
            this.location = location;
            this.start = start;
            this.stop = stop;
        }

        long rows() {
            return stop - start;
        }
    }

    /** What one task reads: slices of the locations of one table, each from the replica that
     *  listed it ({@code Location.replica}), any other replica of the set when that one fails. */
    static final class Part implements InputPartition {
        private static final long serialVersionUID = 1L;
        final int index;
        final List<Routing.Replica> replicas;  // the owner's replicas (one for a plain entry)
        final List<Slice> slices;

        Part(int index, List<Routing.Replica> replicas, List<Slice> slices) {
            this.index = index;
            this.replicas = replicas;
            this.slices = slices;
        }

        long rows() {
            long n = 0;
            for (Slice s : slices) {
                n += s.rows();
            }
            return n;
        }

        @Override
        public String toString() {
            StringBuilder sb = new StringBuilder("DisPartition(").append(index).append(':');
            for (Slice s : slices) {
                sb.append(' ').append(s.location.offsetKey()).append('[').append(s.start).append(':').append(s.stop)
                    .append(']');
            }
            return sb.append(')').toString();
        }
    }

    /** (split rows, number of partitions to aim for) for {@code total} rows. */
    static long[] splitSize(long total, long rowsPerPartition, int minPartitions) {
        if (total <= 0) {
            return new long[] {Math.max(1, rowsPerPartition), 0};
        }
        long n = Math.max(minPartitions, ceilDiv(total, rowsPerPartition));
        n = ceilDiv(n, minPartitions) * minPartitions;
        long split = ceilDiv(total, n);
        if (split > DisOptions.SPLIT_ALIGN_ROWS) {
            split = ceilDiv(split, DisOptions.SPLIT_ALIGN_ROWS) * DisOptions.SPLIT_ALIGN_ROWS;
        } else {
            split = Math.max(split, Math.min(DisOptions.SPLIT_ALIGN_ROWS, rowsPerPartition));
        }
        return new long[] {split, Math.max(1, ceilDiv(total, split))};
    }

    static long ceilDiv(long a, long b) {
        return -Math.floorDiv(-a, b);
    }

    static Part[] plan(List<Slice> ranges, List<Routing.Replica> replicas, long rowsPerPartition, int minPartitions) {
        replicas = new ArrayList<>(replicas);
        List<Slice> rs = new ArrayList<>();
        long total = 0;
        for (Slice r : ranges) {
            if (r.stop > r.start) {
                rs.add(r);
                total += r.rows();
            }
        }
        if (total == 0) {
            return new Part[0];
        }
        long[] sn = splitSize(total, rowsPerPartition, minPartitions);
        long split = sn[0];
        int n = (int) sn[1];
        List<long[]> pieces = new ArrayList<>(); // rows, range index, a, b
        for (int i = 0; i < rs.size(); i++) {
            Slice r = rs.get(i);
            long a = r.start;
            while (a < r.stop) {
                long b = Math.min(r.stop, (a / split + 1) * split);
                pieces.add(new long[] {b - a, i, a, b});
                a = b;
            }
        }
        pieces.sort(Comparator.<long[]>comparingLong(p -> -p[0]).thenComparingLong(p -> p[1])
            .thenComparingLong(p -> p[2]));
        List<List<long[]>> bins = new ArrayList<>();
        long[] loads = new long[n];
        for (int i = 0; i < n; i++) {
            bins.add(new ArrayList<>());
        }
        for (long[] p : pieces) {
            int j = 0;
            for (int k = 1; k < n; k++) {
                if (loads[k] < loads[j]) {
                    j = k;
                }
            }
            bins.get(j).add(p);
            loads[j] += p[0];
        }
        List<Part> out = new ArrayList<>();
        for (List<long[]> items : bins) {
            if (items.isEmpty()) {
                continue;
            }
            items.sort(Comparator.<long[]>comparingLong(p -> p[1]).thenComparingLong(p -> p[2]));
            List<Slice> slices = new ArrayList<>();
            for (long[] p : items) {
                slices.add(new Slice(rs.get((int) p[1]).location, p[2], p[3]));
            }
            out.add(new Part(out.size(), replicas, slices));
        }
        return out.toArray(new Part[0]);
    }
}
