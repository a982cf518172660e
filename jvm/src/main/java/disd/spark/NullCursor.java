package disd.spark;

import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/** A column its location's version does not have (the listing's projection says none): every
 *  row null. */
final class NullCursor extends Cursor {
    static final NullCursor INSTANCE = new NullCursor();

    @Override
    void fill(WritableColumnVector v, int n) {
        v.setDictionary(null);
        v.putNulls(0, n);
    }

    @Override
    void close() {
    }
}
