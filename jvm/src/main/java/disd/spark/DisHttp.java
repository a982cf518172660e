package disd.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ConnectException;
import java.net.InetSocketAddress;
import java.net.NoRouteToHostException;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.net.URLEncoder;
import java.net.UnknownHostException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/**
 * The client of a DIS's block endpoint ({@code disd.server.blockhttp}): HTTP/1.1 over a plain
 * or TLS socket of the JDK, with the bearer token.  A range read is one response body that the
 * reader consumes as it fills batches; finished connections are kept for the next request to the
 * same endpoint (per JVM, so the tasks of an executor share them).
 *
 * <p>Why sockets and not {@code java.net.http.HttpClient}: the reader needs the host name it
 * verifies to differ from the address it connects to (option {@code serverName}, as gRPC's
 * target-name override), and reads a body straight into its own arrays; both are a few lines
 * with an {@code SSLSocket} and awkward with HttpClient.
 */
final class DisHttp {
    static final ObjectMapper JSON = new ObjectMapper();
    private static final Map<String, ArrayDeque<Conn>> IDLE = new ConcurrentHashMap<>();
    private static final long IDLE_MS = 30_000;
    private static final int MAX_IDLE = 16;

    final String endpoint;  // host:port of the block endpoint
    final String disName;   // the DIS as the user named it (its gRPC address), for messages
    final String hint;      // what to check when it cannot be reached
    final Security security;
    final int timeoutMs;
    private final String host;
    private final int port;
    private final String poolKey;

    DisHttp(String endpoint, String disName, String hint, Security security, double timeoutS) {
        this.endpoint = endpoint;
        this.disName = disName;
        this.hint = hint;
        this.security = security;
        this.timeoutMs = (int) Math.max(1, Math.min(Integer.MAX_VALUE, timeoutS * 1000));
        int i = endpoint.lastIndexOf(':');
        String h = endpoint.substring(0, i);
        if (h.startsWith("[") && h.endsWith("]")) {
            h = h.substring(1, h.length() - 1);
        }
        this.host = h;
        this.port = Integer.parseInt(endpoint.substring(i + 1));
        this.poolKey = endpoint + "|" + security.tls() + "|" + security.ca + "|" + security.cert + "|"
            + security.serverName + "|" + (security.token == null ? 0 : security.token.hashCode());
    }

    /** The block endpoint of a DIS at {@code address} (gRPC): its port + 1 unless given. */
    static String defaultEndpoint(String address) {
        int i = address.lastIndexOf(':');
        return address.substring(0, i + 1) + (Integer.parseInt(address.substring(i + 1)) + 1);
    }

    static String q(String v) {
        return URLEncoder.encode(v, StandardCharsets.UTF_8);
    }

    // -- requests ---------------------------------------------------------------------------------
    JsonNode json(String pathQuery) {
        Body b = open(pathQuery, -1);
        try {
            byte[] data = b.readAll();
            return JSON.readTree(data);
        } catch (IOException e) {
            throw failure(e);
        } finally {
            b.close();
        }
    }

    /** The body of a GET; {@code expected} bytes (checked) unless negative. */
    Body open(String pathQuery, long expected) {
        for (int attempt = 0; ; attempt++) {
            // The retry goes on a new connection: after a DIS restart every kept one is dead, and
            // taking another from the pool would fail the same way.
            Conn c = attempt == 0 ? take() : null;
            boolean reused = c != null;
            try {
                if (c == null) {
                    c = connect();
                }
                c.request(pathQuery, security.token, endpoint);
                Body body = c.response(this);
                if (body.status != 200) {
                    String msg = body.errorMessage();
                    body.close();
                    throw httpError(body.status, msg);
                }
                if (expected >= 0 && body.length != expected) {
                    body.close();
                    throw new DisSourceError("DIS at " + disName + " sent " + body.length + " bytes for " + pathQuery
                        + ", " + expected + " were asked");
                }
                return body;
            } catch (IOException e) {
                if (c != null) {
                    c.closeQuietly();
                }
                if (reused && attempt == 0) {
                    // A kept connection the DIS had closed meanwhile (a restart closes them all):
                    // drop the others kept for it and try once more on a new one.
                    drain();
                    continue;
                }
                throw failure(e);
            }
        }
    }

    /**
     * An error answer.  503 (a location closed or in error, as while a DIS shuts down or recovers)
     * and 416 (fewer bytes published than asked: a DIS that restarted and has not yet re-ingested
     * rows it had published) are worth asking again; the others stay.
     */
    private DisSourceError httpError(int status, String msg) {
        if (status == 401 || status == 403) {
            return new DisSourceError("DIS at " + disName + " refused the credentials: " + msg
                + " — check options 'token'/'tokenFile', 'ca', 'cert' and 'key'");
        }
        return new DisSourceError(status == 503 || status == 416, "DIS at " + disName + ": " + msg + " (HTTP " + status
            + ")", null);
    }

    /** Whether a TLS failure is the connection breaking (the DIS went away mid-handshake or
     *  mid-response: retry) rather than a refusal (an alert, an untrusted certificate: stays). */
    static boolean brokenNotRefused(SSLException e) {
        String m = String.valueOf(e.getMessage()).toLowerCase(Locale.ROOT);
        if (m.contains("alert") || m.contains("certificate") || m.contains("pkix") || m.contains("unrecognized")
            || m.contains("protocol")) {
            return false;
        }
        for (Throwable c = e.getCause(); c != null; c = c.getCause()) {
            if (c instanceof java.net.SocketException || c instanceof EOFException
                || c instanceof SocketTimeoutException) {
                return true;
            }
        }
        return m.contains("connection reset") || m.contains("broken pipe") || m.contains("remote host terminated");
    }

    DisSourceError failure(IOException e) {
        if (e instanceof SSLException && brokenNotRefused((SSLException) e)) {
            return new DisSourceError(true, "DIS at " + disName + " (block endpoint " + endpoint + "): " + e, e);
        }
        if (e instanceof SSLException) {
            return new DisSourceError("DIS at " + disName + " refused the credentials: TLS with its block endpoint "
                + endpoint + " failed: " + e.getMessage() + " — check options 'ca', 'cert', 'key' and 'serverName'", e);
        }
        if (e instanceof ConnectException || e instanceof UnknownHostException || e instanceof NoRouteToHostException
            || (e instanceof SocketTimeoutException && e.getMessage() != null && e.getMessage().contains("connect"))) {
            return new DisSourceError(true, "DIS at " + disName + " is unreachable: its block endpoint " + endpoint + ": "
                + e.getMessage() + " — " + hint + " (and that its server.http_port is " + port
                + ", or give option 'httpAddress')", e);
        }
        return new DisSourceError(true, "DIS at " + disName + " (block endpoint " + endpoint + "): " + e, e);
    }

    // -- connections ------------------------------------------------------------------------------
    private Conn connect() throws IOException {
        Socket s = new Socket();
        try {
            s.connect(new InetSocketAddress(host, port), timeoutMs);
            s.setSoTimeout(timeoutMs);
            s.setTcpNoDelay(true);
            s.setReceiveBufferSize(1 << 20);
            if (security.tls()) {
                String name = security.serverName != null ? security.serverName : host;
                SSLSocket ss = (SSLSocket) security.sslContext().getSocketFactory().createSocket(s, name, port, true);
                SSLParameters p = ss.getSSLParameters();
                p.setEndpointIdentificationAlgorithm("HTTPS");
                ss.setSSLParameters(p);
                ss.startHandshake();
                return new Conn(ss);
            }
            return new Conn(s);
        } catch (IOException | RuntimeException e) {
            try {
                s.close();
            } catch (IOException ignored) {
                // already failing
            }
            throw e;
        }
    }

    /** Close the connections kept for this endpoint. */
    private void drain() {
        ArrayDeque<Conn> q = IDLE.get(poolKey);
        if (q == null) {
            return;
        }
        synchronized (q) {
            while (!q.isEmpty()) {
                q.pollFirst().closeQuietly();
            }
        }
    }

    /**
     * The size of {@code file} this DIS publishes now for a location ({@code /v1/locations}), or
     * -1 when it does not list the location or the file.  Asked before a read moves to this DIS:
     * a read never asks for bytes the DIS did not say it published.
     */
    long published(String namespace, String table, String internalPartition, String columnPartition, String file) {
        JsonNode n = json("/v1/locations?namespace=" + q(namespace) + "&table=" + q(table));
        for (JsonNode l : n.get("locations")) {
            if (l.get("namespace").asText().equals(namespace) && l.get("table").asText().equals(table)
                && l.get("internal_partition").asText().equals(internalPartition)
                && l.get("column_partition").asText().equals(columnPartition)) {
                JsonNode size = l.get("files").get(file);
                return size == null ? -1 : size.asLong();
            }
        }
        return -1;
    }

    private Conn take() {
        ArrayDeque<Conn> q = IDLE.get(poolKey);
        if (q == null) {
            return null;
        }
        long now = System.currentTimeMillis();
        synchronized (q) {
            while (!q.isEmpty()) {
                Conn c = q.pollLast();
                if (now - c.idleSince < IDLE_MS) {
                    return c;
                }
                c.closeQuietly();
            }
        }
        return null;
    }

    private void give(Conn c) {
        ArrayDeque<Conn> q = IDLE.computeIfAbsent(poolKey, k -> new ArrayDeque<>());
        long now = System.currentTimeMillis();
        c.idleSince = now;
        synchronized (q) {
            while (!q.isEmpty() && now - q.peekFirst().idleSince >= IDLE_MS) {
                q.pollFirst().closeQuietly(); // the DIS would drop it soon anyway (60 s)
            }
            if (q.size() < MAX_IDLE) {
                q.addLast(c);
                return;
            }
        }
        c.closeQuietly();
    }

    static final class Conn {
        final Socket socket;
        final BufferedInputStream in;
        final OutputStream out;
        long idleSince;

        Conn(Socket s) throws IOException {
            socket = s;
            in = new BufferedInputStream(s.getInputStream(), 1 << 16);
            out = s.getOutputStream();
        }

        void request(String pathQuery, String token, String hostHeader) throws IOException {
            StringBuilder sb = new StringBuilder(256);
            sb.append("GET ").append(pathQuery).append(" HTTP/1.1\r\nHost: ").append(hostHeader).append("\r\n");
            if (token != null) {
                sb.append("Authorization: Bearer ").append(token).append("\r\n");
            }
            sb.append("\r\n");
            out.write(sb.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
        }

        Body response(DisHttp owner) throws IOException {
            String status = line();
            if (status == null) {
                throw new EOFException("connection closed before a response");
            }
            String[] parts = status.split(" ", 3);
            if (parts.length < 2 || !parts[0].startsWith("HTTP/1.")) {
                throw new IOException("not an HTTP response: " + status);
            }
            int code = Integer.parseInt(parts[1]);
            long length = -1;
            boolean close = false;
            for (String h = line(); h != null && !h.isEmpty(); h = line()) {
                int i = h.indexOf(':');
                if (i < 0) {
                    continue;
                }
                String name = h.substring(0, i).trim().toLowerCase(Locale.ROOT);
                String value = h.substring(i + 1).trim();
                if (name.equals("content-length")) {
                    length = Long.parseLong(value);
                } else if (name.equals("connection") && value.equalsIgnoreCase("close")) {
                    close = true;
                }
            }
            if (length < 0) {
                throw new IOException("response without Content-Length");
            }
            return new Body(owner, this, code, length, close);
        }

        private String line() throws IOException {
            ByteArrayOutputStream b = new ByteArrayOutputStream(64);
            while (true) {
                int c = in.read();
                if (c < 0) {
                    return b.size() == 0 ? null : b.toString(StandardCharsets.ISO_8859_1);
                }
                if (c == '\n') {
                    String s = b.toString(StandardCharsets.ISO_8859_1);
                    return s.endsWith("\r") ? s.substring(0, s.length() - 1) : s;
                }
                b.write(c);
                if (b.size() > 65536) {
                    throw new IOException("header line too long");
                }
            }
        }

        void closeQuietly() {
            try {
                socket.close();
            } catch (IOException ignored) {
                // closing
            }
        }
    }

    /** One response body: read it in order; closing it early drops the connection. */
    static final class Body implements Closeable {
        final DisHttp owner;
        final Conn conn;
        final int status;
        final long length;
        final boolean closeAfter;
        long remaining;
        private boolean closed;

        Body(DisHttp owner, Conn conn, int status, long length, boolean closeAfter) {
            this.owner = owner;
            this.conn = conn;
            this.status = status;
            this.length = length;
            this.remaining = length;
            this.closeAfter = closeAfter;
        }

        /** Exactly {@code len} bytes of the body into {@code dst}. */
        void readFully(byte[] dst, int off, int len) {
            if (len > remaining) {
                throw new DisSourceError("reading past the end of a response from the DIS at " + owner.disName);
            }
            InputStream in = conn.in;
            int got = 0;
            try {
                while (got < len) {
                    int n = in.read(dst, off + got, len - got);
                    if (n < 0) {
                        throw new EOFException("the DIS at " + owner.disName + " closed the connection after "
                            + (length - remaining + got) + " of " + length + " bytes (a read that failed on its side, "
                            + "see its log)");
                    }
                    got += n;
                }
            } catch (IOException e) {
                closed = true;
                conn.closeQuietly();
                throw owner.failure(e);
            } finally {
                remaining -= got;
            }
        }

        byte[] readAll() {
            if (length > Integer.MAX_VALUE - 16) {
                throw new DisSourceError("response too large");
            }
            byte[] b = new byte[(int) length];
            readFully(b, 0, b.length);
            return b;
        }

        String errorMessage() {
            try {
                byte[] b = readAll();
                JsonNode n = JSON.readTree(b);
                return n.has("error") ? n.get("error").asText() : new String(b, StandardCharsets.UTF_8);
            } catch (IOException | RuntimeException e) {
                return "HTTP " + status;
            }
        }

        @Override
        public void close() {
            if (closed) {
                return;
            }
            closed = true;
            if (remaining == 0 && !closeAfter) {
                owner.give(conn);
            } else {
                conn.closeQuietly();
            }
        }
    }
}
