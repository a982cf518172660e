package disd.spark;

/**
 * The backoff of calls that ride out a DIS restart (option {@code retrySeconds}), as the Python
 * reader's ({@code disd.blocks}): 0.1 s, doubling up to 2 s, never past the deadline.
 */
final class Retry {
    static final long INITIAL_MS = 100;
    static final long MAX_MS = 2000;

    private Retry() {
    }

    /** Sleep {@code delayMs} (not past {@code deadline}, a System.nanoTime); the next delay. */
    static long sleep(long delayMs, long deadline) {
        long left = Math.max(0, (deadline - System.nanoTime()) / 1_000_000);
        try {
            Thread.sleep(Math.max(1, Math.min(delayMs, left)));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new DisSourceError("interrupted while waiting for a DIS to come back");
        }
        return Math.min(delayMs * 2, MAX_MS);
    }

    /** The last failure, saying how long it was tried (nothing added when it was not retried). */
    static DisSourceError gaveUp(DisSourceError e, double retryS) {
        String m = e.getMessage().startsWith("dis source: ") ? e.getMessage().substring(12) : e.getMessage();
        return new DisSourceError(false, retryS > 0 ? m + " (tried for " + seconds(retryS) + " s)" : m, e.getCause());
    }

    /** Seconds as Python's {@code :g} shows them (60, 1.5). */
    static String seconds(double s) {
        return s == Math.rint(s) && Math.abs(s) < 1e15 ? String.valueOf((long) s) : String.valueOf(s);
    }
}
