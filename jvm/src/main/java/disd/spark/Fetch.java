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
    static final class Http extends Fetch {
        final DisHttp http;
        final String namespace;
        final String table;

        Http(DisHttp http, String namespace, String table) {
            this.http = http;
            this.namespace = namespace;
            this.table = table;
        }

        @Override
        Stream open(Dis.Location loc, String file, long start, long stop) {
            planned(loc, file, stop, namespace + "." + table);
            String pq = "/v1/read?namespace=" + DisHttp.q(namespace) + "&table=" + DisHttp.q(table)
                + "&internal_partition=" + DisHttp.q(loc.internalPartition) + "&column_partition="
                + DisHttp.q(loc.columnPartition) + "&file=" + DisHttp.q(file) + "&start=" + start + "&stop=" + stop;
            final DisHttp.Body body = http.open(pq, stop - start);
            return new Stream() {
                @Override
                public void read(byte[] dst, int off, int len) {
                    body.readFully(dst, off, len);
                }

                @Override
                public void close() {
                    body.close();
                }
            };
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
