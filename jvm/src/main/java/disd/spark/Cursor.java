package disd.spark;

import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/** One output column of a slice: fills a vector with the next rows, into a reused byte buffer. */
abstract class Cursor {
    byte[] buf = new byte[0];

    abstract void fill(WritableColumnVector v, int n);

    abstract void close();

    byte[] buffer(int size) {
        if (buf.length < size) {
            buf = new byte[Math.max(size, buf.length + (buf.length >> 1))];
        }
        return buf;
    }
}
