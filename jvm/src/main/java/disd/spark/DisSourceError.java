package disd.spark;

/**
 * A failure a user can act on: a bad option, an unreachable DIS, an unknown table or column, a
 * column file that is not what the DIS published.  The message starts with "dis source: " and
 * names the option to fix, as the Python source's {@code DisSourceError} does.
 */
public class DisSourceError extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public DisSourceError(String message) {
        this(false, message, null);
    }

    public DisSourceError(String message, Throwable cause) {
        this(false, message, cause);
    }

    /** True when the DIS could not be reached or a connection broke: worth trying again later. */
    final boolean unreachable;

    DisSourceError(boolean unreachable, String message, Throwable cause) {
        super("dis source: " + message, cause);
        this.unreachable = unreachable;
    }
}
