package disd.spark;

import org.apache.spark.sql.execution.vectorized.Dictionary;

/** A dictionary of string values, which Spark decodes only to bytes: the numeric decodings,
 *  which Spark never asks of a string column, refuse. */
abstract class BytesDictionary implements Dictionary {
    @Override
    public final int decodeToInt(int id) {
        throw new UnsupportedOperationException();
    }

    @Override
    public final long decodeToLong(int id) {
        throw new UnsupportedOperationException();
    }

    @Override
    public final float decodeToFloat(int id) {
        throw new UnsupportedOperationException();
    }

    @Override
    public final double decodeToDouble(int id) {
        throw new UnsupportedOperationException();
    }
}
