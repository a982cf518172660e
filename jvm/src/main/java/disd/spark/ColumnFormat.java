package disd.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * The bytes of column files (docs/storage-format.md): little-endian views of fixed-width values,
 * the null sentinels of float and double, and the null bit of a string's end offset.
 */
final class ColumnFormat {
    private ColumnFormat() {
    }

    static final VarHandle SHORTS = MethodHandles.byteArrayViewVarHandle(short[].class, ByteOrder.LITTLE_ENDIAN);
    static final VarHandle INTS = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);
    static final VarHandle LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    /** Whether this machine is little-endian: Spark's bulk puts then take the file's bytes as they are. */
    static final boolean LE = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;
    /** A string's end offset without its null bit (bit 63). */
    static final long MASK = 0x7FFF_FFFF_FFFF_FFFFL;
    static final int FLOAT_NULL = Float.floatToIntBits(-Float.MAX_VALUE);
    static final long DOUBLE_NULL = Double.doubleToLongBits(-Double.MAX_VALUE);
}
