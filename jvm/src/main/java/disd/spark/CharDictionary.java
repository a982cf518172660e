package disd.spark;

/** Every UTF-16 code unit's one-character UTF-8 string, the code unit being the id. */
final class CharDictionary extends BytesDictionary {
    static final CharDictionary INSTANCE = new CharDictionary();
    private final byte[][] utf8 = new byte[1 << 16][];

    @Override
    public byte[] decodeToBinary(int id) {
        byte[] b = utf8[id];
        if (b == null) {
            int c = id >= 0xD800 && id <= 0xDFFF ? 0xFFFD : id;
            b = new String(new char[] {(char) c}).getBytes(java.nio.charset.StandardCharsets.UTF_8);
            utf8[id] = b;
        }
        return b;
    }
}
