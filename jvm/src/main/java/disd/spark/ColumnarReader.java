package disd.spark;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.Dictionary;
import org.apache.spark.sql.execution.vectorized.OffHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A task: the slices of one input partition as ColumnarBatches of at most {@code batchRows} rows
 * (cut at multiples of it, so fixed-width reads stay on 64 KiB block boundaries).  Each column of a
 * slice is one range of its file, read in order into a reused array, copied into the column vector
 * in bulk and then scanned for the DIS's null sentinels (docs/storage-format.md).  The vectors are
 * reused from batch to batch, as Spark's own Parquet reader does; the partition column is a
 * constant vector per slice.
 *
 * <p>A location written in another schema version than the one the read presents is read
 * through the projection the DIS's listing carries for its version ({@link VersionProjection}):
 * each output column from its stored column's file (a renamed one: its stored name), converted
 * from the stored width where it differs ({@link FixedCursor}: widened exactly, or, for a
 * streaming query older than the rows, narrowed back after a range check per batch that fails
 * with a message to restart the query), or all null where the version has no such column
 * ({@link NullCursor}).  Every column is filled into the same vector class, so the generated code
 * that reads the batches sees one implementation.
 */
final class ColumnarReader implements PartitionReader<ColumnarBatch> {
    private final ReadSpec spec;
    private final Planner.Part part;
    private final List<Projection.Output> outputs;
    private final ColumnVector[] vectors;
    private final ColumnarBatch batch;
    private final Cursor[] cursors;
    private Fetch fetch;
    private int sliceIndex = -1;
    private Planner.Slice slice;
    private long pos;
    /** Per stored schema version: for each output, the column it is read from (null: none). */
    private final Map<Integer, VersionProjection.Stored[]> stored = new HashMap<>();

    ColumnarReader(ReadSpec spec, Planner.Part part) {
        this.spec = spec;
        this.part = part;
        this.outputs = spec.projection.outputs;
        int cap = spec.batchRows;
        vectors = new ColumnVector[outputs.size()];
        cursors = new Cursor[outputs.size()];
        for (int i = 0; i < vectors.length; i++) {
            Projection.Output o = outputs.get(i);
            if (o.isPartition()) {
                vectors[i] = new ConstantColumnVector(cap, DataTypes.StringType);
            } else {
                vectors[i] = spec.offHeap ? new OffHeapColumnVector(cap, o.type) : new OnHeapColumnVector(cap, o.type);
            }
        }
        batch = new ColumnarBatch(vectors);
    }

    @Override
    public boolean next() {
        while (slice == null || pos >= slice.stop) {
            if (!advance()) {
                return false;
            }
        }
        long a = pos;
        long b = Math.min(slice.stop, (a / spec.batchRows + 1) * spec.batchRows);
        int n = (int) (b - a);
        for (int i = 0; i < vectors.length; i++) {
            if (cursors[i] != null) {
                WritableColumnVector v = (WritableColumnVector) vectors[i];
                v.reset();
                cursors[i].fill(v, n);
            }
        }
        batch.setNumRows(n);
        pos = b;
        return true;
    }

    private boolean advance() {
        closeCursors();
        if (++sliceIndex >= part.slices.size()) {
            slice = null;
            return false;
        }
        if (fetch == null) {
            fetch = spec.fetch(part);
        }
        slice = part.slices.get(sliceIndex);
        pos = slice.start;
        fetch.check(slice.location);
        VersionProjection.Stored[] cols = storedColumns(slice.location);
        for (int i = 0; i < vectors.length; i++) {
            Projection.Output o = outputs.get(i);
            VersionProjection.Stored c = cols[i];
            if (o.isPartition()) {
                ((ConstantColumnVector) vectors[i]).setUtf8String(UTF8String.fromString(slice.location.columnPartition));
            } else if (c == null) {
                cursors[i] = NullCursor.INSTANCE;
            } else if (c.kind == TableSchema.Kind.STRING) {
                cursors[i] = new StringCursor(fetch, slice, c.name);
            } else {
                cursors[i] = new FixedCursor(fetch, slice, c.name, c.kind, o.type, o.kind, spec.projection.table.key(),
                    o.source);
            }
        }
        return true;
    }

    /** The stored column each output reads in {@code loc}: its own, or, for a location in
     *  another version, the one the listing's projection names. */
    private VersionProjection.Stored[] storedColumns(Dis.Location loc) {
        VersionProjection p = loc.projection;
        int key = p == null ? 0 : p.storedVersion;
        VersionProjection.Stored[] cols = stored.get(key);
        if (cols == null) {
            cols = new VersionProjection.Stored[outputs.size()];
            for (int i = 0; i < cols.length; i++) {
                Projection.Output o = outputs.get(i);
                if (!o.isPartition()) {
                    cols[i] = p == null ? new VersionProjection.Stored(o.source, o.kind) : p.source(o.source);
                }
            }
            stored.put(key, cols);
        }
        return cols;
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    /** The dictionary of output {@code i}'s vector in the current batch, when it has one (the
     *  slice's string dictionary, or the one of single characters). */
    Dictionary dictionary(int i) {
        Cursor c = cursors[i];
        if (c instanceof StringCursor) {
            return ((StringCursor) c).dict;
        }
        return c instanceof FixedCursor ? CharDictionary.INSTANCE : null;
    }

    private void closeCursors() {
        for (int i = 0; i < cursors.length; i++) {
            if (cursors[i] != null) {
                cursors[i].close();
                cursors[i] = null;
            }
        }
    }

    @Override
    public void close() {
        try {
            closeCursors();
        } finally {
            if (fetch != null) {
                fetch.close();
                fetch = null;
            }
            for (ColumnVector v : vectors) {
                v.close();
            }
        }
    }
}
