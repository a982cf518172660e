package disd.spark;

import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.AccessDeniedException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.HashMap;
import java.util.Map;

/**
 * Where a task's bytes come from: ranges of column files, read in order.  Over the network each
 * range is one response of the DIS's block endpoint; with option {@code dbRoot} it is the file
 * itself, read with positional reads (never memory-mapped: a live file may be cut back by a
 * recovery while it is read, which would kill the executor with SIGBUS).  Either way nothing past
 * the size the DIS published at planning is read, and a file shorter than that is an error.
 */
abstract class Fetch implements Closeable {
    /** Bytes of one range, in order. */
    interface Stream extends Closeable {
        void read(byte[] dst, int off, int len);

        @Override
        void close();
    }

    abstract Stream open(Dis.Location loc, String file, long start, long stop);

    /** Before a slice is read (even when no column of it is: a count): is the location there? */
    void check(Dis.Location loc) {
    }

    /** A small range, whole. */
    byte[] small(Dis.Location loc, String file, long start, long stop) {
        byte[] b = new byte[(int) (stop - start)];
        try (Stream s = open(loc, file, start, stop)) {
            s.read(b, 0, b.length);
        }
        return b;
    }

    static long planned(Dis.Location loc, String file, long stop, String table) {
        Long size = loc.files.get(file);
        if (size == null) {
            throw new DisSourceError(table + "/" + loc.offsetKey() + ": the DIS listed no column file " + file);
        }
        if (stop > size) {
            throw new DisSourceError(table + "/" + loc.offsetKey() + ": reading bytes up to " + stop + " of " + file
                + ", " + size + " were published");
        }
        return size;
    }

    @Override
    public abstract void close();

    // -- over the network -------------------------------------------------------------------------
    /**
     * Ranges from the block endpoints of the owner's replicas.  A range is read from the replica
     * that listed its location.  When that read fails because its DIS went away (refused, reset,
     * timed out, 503) or serves fewer bytes than were published (416: it restarted and has not
     * yet re-ingested them), the rest of the range is read from a replica that says (its
     * {@code /v1/locations}) it has published at least the range's end: another replica, or the
     * same one once it is back.  Replicas' files are byte-identical for the same rows, so the
     * bytes continue exactly.  After option {@code retrySeconds} without one, the read fails
     * saying how long it tried.  Refusals (token, TLS) fail at once.
     */
    static final class Http extends Fetch {
        final DisHttp[] replicas;
        final String namespace;
        final String table;
        final double retryS;
        /** Per location, the replica its reads moved to after a failure (later ranges go there first). */
        private final Map<String, Integer> moved = new HashMap<>();

        Http(DisHttp[] replicas, String namespace, String table, double retryS) {
            this.replicas = replicas;
            this.namespace = namespace;
            this.table = table;
            this.retryS = retryS;
        }

        @Override
        Stream open(Dis.Location loc, String file, long start, long stop) {
            planned(loc, file, stop, namespace + "." + table);
            return new Resuming(loc, file, start, stop);
        }

        String pathQuery(Dis.Location loc, String file, long start, long stop) {
            return "/v1/read?namespace=" + DisHttp.q(namespace) + "&table=" + DisHttp.q(table)
                + "&internal_partition=" + DisHttp.q(loc.internalPartition) + "&column_partition="
                + DisHttp.q(loc.columnPartition) + "&file=" + DisHttp.q(file) + "&start=" + start + "&stop=" + stop;
        }

        /** One range: a response body, reopened from where it broke on a replica that has the bytes. */
        final class Resuming implements Stream {
            final Dis.Location loc;
            final String file;
            final long stop;
            long pos;            // the next byte to hand out
            DisHttp.Body body;   // serves [bodyStart, stop); null: to be reopened
            long bodyStart;
            int replica;
            long deadline;       // set at the first failure
            long delayMs = Retry.INITIAL_MS;
            DisSourceError last;

            Resuming(Dis.Location loc, String file, long start, long stop) {
                this.loc = loc;
                this.file = file;
                this.pos = start;
                this.stop = stop;
                Integer m = moved.get(loc.offsetKey());
                this.replica = m != null ? m : Math.min(loc.replica, replicas.length - 1);
                if (stop > start) {
                    try {
                        body = replicas[replica].open(pathQuery(loc, file, start, stop), stop - start);
                        bodyStart = start;
                    } catch (DisSourceError e) {
                        failed(e);
                    }
                }
            }

            @Override
            public void read(byte[] dst, int off, int len) {
                if (pos + len > stop) {
                    throw new DisSourceError("reading past the end of a range of " + file);
                }
                int done = 0;
                while (done < len) {
                    if (body == null) {
                        reopen();
                    }
                    try {
                        body.readFully(dst, off + done, len - done);
                        pos += len - done;
                        done = len;
                    } catch (DisSourceError e) {
                        long reached = bodyStart + (body.length - body.remaining);
                        done += (int) (reached - pos);
                        pos = reached;
                        body.close();
                        body = null;
                        failed(e);
                    }
                }
            }

            private void failed(DisSourceError e) {
                if (!e.unreachable) {
                    throw e;
                }
                last = e;
                if (deadline == 0) {
                    deadline = System.nanoTime() + (long) (retryS * 1e9);
                }
            }

            /** [pos, stop) from the first replica (this one first, then the others in order) that
             *  has published at least {@code stop} bytes of the file, waiting with backoff. */
            private void reopen() {
                while (true) {
                    for (int i = 0; i < replicas.length; i++) {
                        int r = (replica + i) % replicas.length;
                        DisHttp h = replicas[r];
                        try {
                            long size = h.published(namespace, table, loc.internalPartition, loc.columnPartition,
                                file);
                            if (size < stop) {
                                last = new DisSourceError(true, namespace + "." + table + "/" + loc.offsetKey() + ": "
                                    + file + ": bytes up to " + stop + " are needed, the DIS at " + h.disName
                                    + " publishes " + Math.max(0, size) + " (it restarted and has not yet re-ingested "
                                    + "them?)", null);
                                continue;
                            }
                            body = h.open(pathQuery(loc, file, pos, stop), stop - pos);
                            bodyStart = pos;
                            deadline = 0; // a later failure gets its own retrySeconds
                            delayMs = Retry.INITIAL_MS;
                            if (r != replica) {
                                replica = r;
                                moved.put(loc.offsetKey(), r);
                            }
                            return;
                        } catch (DisSourceError e) {
                            failed(e);
                        }
                    }
                    if (System.nanoTime() - deadline >= 0) {
                        throw Retry.gaveUp(last, retryS);
                    }
                    delayMs = Retry.sleep(delayMs, deadline);
                }
            }

            @Override
            public void close() {
                if (body != null) {
                    body.close();
                    body = null;
                }
            }
        }

        @Override
        public void close() {
        }
    }

    // -- the column files themselves --------------------------------------------------------------
    static final class Local extends Fetch {
        final String dbRoot;
        final String namespace;
        final String table;
        final String disName;
        private final Map<Path, FileChannel> open = new HashMap<>();

        Local(String dbRoot, String namespace, String table, String disName) {
            this.dbRoot = dbRoot;
            this.namespace = namespace;
            this.table = table;
            this.disName = disName;
        }

        Path path(Dis.Location loc, String file) {
            if (file.isEmpty() || file.contains("/") || file.equals(".") || file.equals("..")) {
                throw new DisSourceError(namespace + "." + table + "/" + loc.offsetKey() + ": refusing column file name '"
                    + file + "'");
            }
            return Paths.get(dbRoot, "Intraday", namespace, table, loc.internalPartition, loc.columnPartition, table, file);
        }

        @Override
        void check(Dis.Location loc) {
            Path dir = Paths.get(dbRoot, "Intraday", namespace, table, loc.internalPartition, loc.columnPartition, table);
            if (!java.nio.file.Files.isDirectory(dir)) {
                throw new DisSourceError("option 'dbRoot': cannot open " + dir + ": No such file or directory (dbRoot "
                    + "must be the DIS's database root as seen from every executor)");
            }
        }

        @Override
        Stream open(Dis.Location loc, String file, long start, long stop) {
            planned(loc, file, stop, namespace + "." + table);
            final Path p = path(loc, file);
            FileChannel ch = open.get(p);
            if (ch == null) {
                try {
                    ch = FileChannel.open(p, StandardOpenOption.READ);
                } catch (NoSuchFileException e) {
                    throw new DisSourceError("option 'dbRoot': cannot open " + p + ": No such file or directory (dbRoot "
                        + "must be the DIS's database root as seen from every executor)");
                } catch (AccessDeniedException e) {
                    throw new DisSourceError("option 'dbRoot': cannot open " + p + ": Permission denied (dbRoot must "
                        + "be the DIS's database root as seen from every executor)");
                } catch (IOException e) {
                    throw new DisSourceError("option 'dbRoot': cannot open " + p + ": " + e.getMessage() + " (dbRoot "
                        + "must be the DIS's database root as seen from every executor)");
                }
                open.put(p, ch);
            }
            final FileChannel channel = ch;
            return new Stream() {
                long pos = start;

                @Override
                public void read(byte[] dst, int off, int len) {
                    ByteBuffer bb = ByteBuffer.wrap(dst, off, len);
                    try {
                        while (bb.hasRemaining()) {
                            int n = channel.read(bb, pos);
                            if (n < 0) {
                                // Shorter than published: not this DIS's root, or the DIS recovered to an
                                // earlier checkpoint after the scan was planned.
                                throw new DisSourceError(namespace + "." + table + "/" + loc.offsetKey() + ": " + p
                                    + " holds " + pos + " bytes, the DIS published " + stop + "; is option 'dbRoot' "
                                    + "the root of the DIS at " + disName + "?");
                            }
                            pos += n;
                        }
                    } catch (IOException e) {
                        throw new DisSourceError("reading " + p + ": " + e, e);
                    }
                }

                @Override
                public void close() {
                }
            };
        }

        @Override
        public void close() {
            for (FileChannel ch : open.values()) {
                try {
                    ch.close();
                } catch (IOException ignored) {
                    // read-only
                }
            }
            open.clear();
        }
    }
}
