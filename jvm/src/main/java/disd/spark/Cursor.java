package disd.spark;

import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/** One output column of a slice: fills a vector with the next rows, into a reused byte buffer. */
abstract class Cursor {
    byte[] buf = new byte[0];

    abstract void fill(WritableColumnVector v, int n);

    abstract void close();

    byte[] buffer(int size) {
        buf = grown(buf, size);
        return buf;
    }

    /** {@code b}, or a new array in its place when it is shorter than {@code size} (grown by half
     *  at least, so that a slowly growing need does not allocate every batch). */
    static byte[] grown(byte[] b, int size) {
        return b.length >= size ? b : new byte[Math.max(size, b.length + (b.length >> 1))];
    }
}
