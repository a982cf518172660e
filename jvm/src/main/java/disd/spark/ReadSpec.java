package disd.spark;

import java.io.IOException;
import java.util.Iterator;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Everything a task needs besides its slices (the reader factory Spark ships to executors):
 * the output columns, the security settings, how long reads ride out a DIS restart or failure
 * ({@code retrySeconds}), the batch size, {@code dbRoot} for local reads and
 * which column vectors to fill (Spark's own choice, {@code spark.sql.columnVector.offheap.enabled},
 * so the JVM's generated code sees the same vector class as for Parquet).
 */
final class ReadSpec implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    final Projection projection;
    final Security security;
    final double timeoutS;
    /** How long a read rides out its DIS's restart or failure (option retrySeconds). */
    final double retryS;
    final int batchRows;
    final String dbRoot;
    final boolean offHeap;
    final String hint;

    ReadSpec(Projection projection, DisOptions o, boolean offHeap) {
        this.projection = projection;
        this.security = o.security;
        this.timeoutS = o.timeoutS;
        this.retryS = o.retryS;
        this.batchRows = o.batchRows;
        this.dbRoot = o.dbRoot;
        this.offHeap = offHeap;
        this.hint = o.hint();
    }

    Fetch fetch(Planner.Part part) {
        TableSchema t = projection.table;
        if (dbRoot != null) {
            return new Fetch.Local(dbRoot, t.namespace, t.table, part.replicas.get(0).address);
        }
        DisHttp[] replicas = new DisHttp[part.replicas.size()];
        for (int i = 0; i < replicas.length; i++) {
            Routing.Replica r = part.replicas.get(i);
            replicas[i] = new DisHttp(r.httpAddress, r.address, hint, security, timeoutS);
        }
        return new Fetch.Http(replicas, t.namespace, t.table, retryS);
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
        return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        return new ColumnarReader(this, (Planner.Part) partition);
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
        final ColumnarReader batches = new ColumnarReader(this, (Planner.Part) partition);
        return new PartitionReader<InternalRow>() {
            Iterator<InternalRow> rows;
            InternalRow row;

            @Override
            public boolean next() throws IOException {
                while (rows == null || !rows.hasNext()) {
                    if (!batches.next()) {
                        return false;
                    }
                    rows = batches.get().rowIterator();
                }
                row = rows.next();
                return true;
            }

            @Override
            public InternalRow get() {
                return row;
            }

            @Override
            public void close() {
                batches.close();
            }
        };
    }
}
