package disd.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * TLS and the bearer token, as the Python source's options give them: certificate paths (readable
 * where the tasks run), the token itself, and a host name to verify instead of the address's.
 */
final class Security implements Serializable {
    private static final long serialVersionUID = 1L;

    final String ca;
    final String cert;
    final String key;
    final String token;
    final String serverName;
    private transient SSLContext context;

    Security(String ca, String cert, String key, String token, String serverName) {
        this.ca = ca;
        this.cert = cert;
        this.key = key;
        this.token = token;
        this.serverName = serverName;
    }

    boolean tls() {
        return ca != null;
    }

    synchronized SSLContext sslContext() {
        if (context == null) {
            try {
                context = build();
            } catch (IOException | GeneralSecurityException e) {
                throw new DisSourceError("cannot use the TLS files (options 'ca', 'cert', 'key'): " + e, e);
            }
        }
        return context;
    }

    private SSLContext build() throws IOException, GeneralSecurityException {
        KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
        trust.load(null, null);
        int i = 0;
        for (Certificate c : certificates(ca)) {
            trust.setCertificateEntry("ca" + (i++), c);
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(trust);
        KeyManagerFactory kmf = null;
        if (cert != null) {
            KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
            ks.load(null, null);
            List<Certificate> chain = certificates(cert);
            ks.setKeyEntry("client", privateKey(key), new char[0], chain.toArray(new Certificate[0]));
            kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            kmf.init(ks, new char[0]);
        }
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(kmf == null ? null : kmf.getKeyManagers(), tmf.getTrustManagers(), null);
        return ctx;
    }

    private static List<Certificate> certificates(String path) throws IOException, GeneralSecurityException {
        byte[] pem = Files.readAllBytes(Paths.get(path));
        Collection<? extends Certificate> certs =
            CertificateFactory.getInstance("X.509").generateCertificates(new ByteArrayInputStream(pem));
        if (certs.isEmpty()) {
            throw new GeneralSecurityException("no certificate in " + path);
        }
        return new ArrayList<>(certs);
    }

    private static final Pattern PEM = Pattern.compile(
        "-----BEGIN ([A-Z ]+)-----([A-Za-z0-9+/=\\s]+)-----END \\1-----");

    /** A PEM private key: PKCS#8 ("PRIVATE KEY", RSA or EC) or PKCS#1 ("RSA PRIVATE KEY"). */
    static PrivateKey privateKey(String path) throws IOException, GeneralSecurityException {
        String text = new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.US_ASCII);
        Matcher m = PEM.matcher(text);
        while (m.find()) {
            String kind = m.group(1);
            byte[] der = Base64.getMimeDecoder().decode(m.group(2));
            if (kind.equals("PRIVATE KEY")) {
                for (String alg : new String[] {"RSA", "EC", "Ed25519"}) {
                    try {
                        return KeyFactory.getInstance(alg).generatePrivate(new PKCS8EncodedKeySpec(der));
                    } catch (GeneralSecurityException e) {
                        // try the next algorithm
                    }
                }
                throw new GeneralSecurityException("unsupported key algorithm in " + path);
            }
            if (kind.equals("RSA PRIVATE KEY")) {
                return KeyFactory.getInstance("RSA").generatePrivate(new PKCS8EncodedKeySpec(pkcs1ToPkcs8(der)));
            }
        }
        throw new GeneralSecurityException(path + " holds no unencrypted PEM private key (PKCS#8 or PKCS#1 RSA)");
    }

    /** Wrap a PKCS#1 RSAPrivateKey in a PKCS#8 PrivateKeyInfo. */
    private static byte[] pkcs1ToPkcs8(byte[] pkcs1) {
        byte[] algId = {0x30, 0x0d, 0x06, 0x09, 0x2a, (byte) 0x86, 0x48, (byte) 0x86, (byte) 0xf7, 0x0d, 0x01, 0x01,
            0x01, 0x05, 0x00};
        byte[] version = {0x02, 0x01, 0x00};
        byte[] octet = der(0x04, pkcs1);
        byte[] body = new byte[version.length + algId.length + octet.length];
        System.arraycopy(version, 0, body, 0, version.length);
        System.arraycopy(algId, 0, body, version.length, algId.length);
        System.arraycopy(octet, 0, body, version.length + algId.length, octet.length);
        return der(0x30, body);
    }

    private static byte[] der(int tag, byte[] content) {
        int n = content.length;
        byte[] len;
        if (n < 0x80) {
            len = new byte[] {(byte) n};
        } else if (n < 0x100) {
            len = new byte[] {(byte) 0x81, (byte) n};
        } else if (n < 0x10000) {
            len = new byte[] {(byte) 0x82, (byte) (n >> 8), (byte) n};
        } else {
            len = new byte[] {(byte) 0x83, (byte) (n >> 16), (byte) (n >> 8), (byte) n};
        }
        byte[] out = new byte[1 + len.length + n];
        out[0] = (byte) tag;
        System.arraycopy(len, 0, out, 1, len.length);
        System.arraycopy(content, 0, out, 1 + len.length, n);
        return out;
    }
}
