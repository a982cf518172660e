package disd.spark;

import java.io.IOException;
import java.util.Iterator;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A batch read with a partial aggregation pushed into it ({@link AggPlan}): planned exactly as the
 * plain scan of the columns the aggregation needs ({@link DisScan}: the locations and their
 * published sizes listed once, the same partitions, the same {@code partitions} option), each task
 * returning partial rows instead of the rows themselves.  Batch reads only: Spark pushes
 * aggregates into batch scans, never into a stream's.
 */
final class AggScan implements Scan, Batch {
    final DisScan rows;
    final AggPlan plan;

    AggScan(DisScan rows, AggPlan plan) {
        this.rows = rows;
        this.plan = plan;
    }

    @Override
    public StructType readSchema() {
        return plan.schema();
    }

    @Override
    public String description() {
        return rows.description() + ", " + plan.describe();
    }

    @Override
    public ColumnarSupportMode columnarSupportMode() {
        return ColumnarSupportMode.SUPPORTED;
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    /** The plain scan's partitions: a grouped aggregate over no rows has no rows either. */
    @Override
    public InputPartition[] planInputPartitions() {
        return rows.planInputPartitions();
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new Factory(new ReadSpec(plan.input, rows.options, rows.offHeap), plan);
    }

    static final class Factory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        final ReadSpec spec;
        final AggPlan plan;

        Factory(ReadSpec spec, AggPlan plan) {
            this.spec = spec;
            this.plan = plan;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            ColumnarReader rows = new ColumnarReader(spec, (Planner.Part) partition);
            return new AggReader(plan, rows, spec.batchRows, spec.offHeap);
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            final PartitionReader<ColumnarBatch> batches = createColumnarReader(partition);
            return new PartitionReader<InternalRow>() {
                Iterator<InternalRow> it;
                InternalRow row;

                @Override
                public boolean next() throws IOException {
                    while (it == null || !it.hasNext()) {
                        if (!batches.next()) {
                            return false;
                        }
                        it = batches.get().rowIterator();
                    }
                    row = it.next();
                    return true;
                }

                @Override
                public InternalRow get() {
                    return row;
                }

                @Override
                public void close() throws IOException {
                    batches.close();
                }
            };
        }
    }
}
