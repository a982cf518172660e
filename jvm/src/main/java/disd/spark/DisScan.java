package disd.spark;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;

/**
 * One query's read: at planning the locations are listed once; their published row counts (and
 * the column file sizes at those counts) fix what the scan reads, however far ingestion moves on.
 */
final class DisScan implements Scan, Batch {
    final DisOptions options;
    final Projection projection;
    final PartitionFilters filters;
    final boolean offHeap;

    DisScan(DisOptions options, Projection projection, PartitionFilters filters, boolean offHeap) {
        this.options = options;
        this.projection = projection;
        this.filters = filters;
        this.offHeap = offHeap;
    }

    @Override
    public StructType readSchema() {
        return projection.sparkSchema();
    }

    @Override
    public String description() {
        return "dis " + projection.table.key() + " at " + options.where() + (options.dbRoot != null
            ? " (column files under " + options.dbRoot + ")" : "");
    }

    @Override
    public ColumnarSupportMode columnarSupportMode() {
        return ColumnarSupportMode.SUPPORTED;
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        return new DisStream(options, projection, offHeap);
    }

    @Override
    public InputPartition[] planInputPartitions() {
        Dis dis = new Dis(options);
        Routing.Instance owner = dis.owner();
        List<Planner.Slice> ranges = new ArrayList<>();
        for (Dis.Location l : dis.locations(projection.table)) {
            String cp = l.columnPartition;
            if (l.rows > 0 && (options.partitions == null || options.partitions.contains(cp)) && filters.admits(cp)) {
                ranges.add(new Planner.Slice(l, 0, l.rows));
            }
        }
        return Planner.plan(ranges, owner.readReplicas, options.rowsPerPartition, options.minPartitions);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new ReadSpec(projection, options, offHeap);
    }
}
