/* disd.storage.lastbyindex: the hash table of a last-by state's keys, kept between publishes.
 *
 * Why C: a publish's update has to find, for every row it absorbs, the state's slot of the row's
 * key (or give a new key the next slot).  Arrow keeps no hash table between calls, so the Python
 * path (disd.storage.lastbykeys.ArrowKeys) hashes the state's keys again at every publish and
 * goes through dictionary_encode's chunks; here one table lives as long as the state and each
 * row costs one hash, one probe of a table of 32-bit entries and one comparison with the key it
 * finds, all outside the interpreter's lock.
 *
 * The index holds no key bytes: an entry is the slot of a key (its row in the state) and a tag
 * of its hash.  The key itself is compared where it lives: in the state's key columns (slots
 * below the state's size) or in the batch (the row where a new key first appeared).  So the
 * index costs 4 bytes an entry, at most 0.8 of its entries used (5 to 10 bytes a key), and is
 * told the state's and the batch's key columns at every call.  For one string key column a large
 * batch first puts the state's keys in a table of its own (keyrec_t) or in records (slotrec_t),
 * both freed when the call returns.
 *
 * Keys: one or more columns, each given as Arrow buffers (validity or None, values or int32
 * offsets, string data or None, the array's offset).  A row's key is null in a column when its
 * validity bit is clear or (a fixed-width column) its value's bytes equal the column's null
 * sentinel, as a read of the column files makes it null.  Two keys are equal when each column is
 * null in both or holds the same bytes in both (floats compared by their bits, as Arrow's
 * dictionary_encode does), except that a column declared "float" treats every NaN as one value
 * (as the multi-column reference, which joins the columns' string forms, does).
 *
 * KeyIndex(columns, *, hash_bits=64)
 *                                columns: ((kind, width, sentinel bytes or None), ...); hash_bits:
 *                                the bits of each hash kept, fewer only in tests, so that keys share
 *                                positions and tags and every comparison is made
 *                                kind 0 fixed-width, 1 float (every NaN equal), 2 bool (bits),
 *                                3 string (int32 offsets)
 * KeyIndex.update(state, k, batch, n, max_keys) -> (total, changed, rows)
 *     state: the key columns of the state's k rows (slot order); batch: the n new rows as
 *     chunks ((rows, key columns), ...), read in place (rows count across the chunks).
 *     Slots of new keys follow k in order of first appearance.  changed: the slots the batch
 *     touched, ascending, and rows: the batch's last row of each (both int64 bytes).  When total
 *     exceeds max_keys, changed and rows are None and the index is emptied.  An index whose
 *     size differs from k first rebuilds itself from the state's columns.
 * KeyIndex.clear()               forget every key (the next update rebuilds from the state)
 * KeyIndex.nbytes, len(KeyIndex) the memory it holds; its keys
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

enum { KIND_FIXED = 0, KIND_FLOAT = 1, KIND_BOOL = 2, KIND_STRING = 3 };
/* How a call hashes and compares its rows: one string column, one fixed-width column, or any
 * columns (one function each, so that the common keys take no branch on the column's kind). */
enum { MODE_STRING = 0, MODE_FIXED = 1, MODE_ANY = 2 };
#define MIN_BITS 4
#define MAX_BITS 31
/* Rows between hashing a row (and prefetching its table entry) and probing for it: the probe's
 * entry is then mostly in the cache.  (Prefetching the key the entry names too, in further
 * stages, cost more instructions than it saved waits.) */
#define AHEAD 16
#define RING 32 /* (a power of two above AHEAD) */
/* A string key's state is read as records (slotrec_t) when the batch has at least 1/REC_RATIO
 * as many rows as the state has keys: their pass over the state pays for itself. */
#define REC_RATIO 4
/* ... and in a table of the call's own (keyrec_t) when the batch has at least as many rows as the
 * state has keys: its fill (hashing every state key) then costs less than it saves. */
#define KT_RATIO 1
/* (and at most this many keys: its positions and slots fit 32 bits with room to spare) */
#define KT_MAX_KEYS (1 << 26)

typedef struct {
    int kind;
    int width;
    int has_sentinel;
    uint64_t sentinel; /* the value's bytes, zero-extended */
} colspec_t;

typedef struct {
    const uint8_t *valid;
    const uint8_t *values;
    const uint8_t *data;
    Py_ssize_t values_len, data_len, offset;
} colview_t;

typedef struct {
    PyObject_HEAD
    int ncols;
    colspec_t *spec;
    uint32_t *table;
    int bits;
    int64_t count;
    int busy;
    uint64_t hash_mask; /* the bits of a hash kept: all but in tests (KeyIndex(hash_bits=...)) */
} KeyIndex;

/* One call: where its keys live (the state's columns for slots < k, the batch's for the new
 * keys, at the row where each first appeared) and each slot's last row in the batch. */
typedef struct {
    const KeyIndex *ix;
    const colview_t *state;
    const colview_t *chunks; /* the batch's chunks' columns, ncols a chunk */
    const colview_t *batch;  /* the chunk being read: its columns */
    int32_t chunk;           /* its number */
    int64_t base;            /* the batch row of its first row */
    int64_t k;
    int32_t *first;       /* where slot k + i first appeared: its row in its chunk, */
    int32_t *first_chunk; /* and its chunk, for ``room`` new keys */
    int32_t *last;        /* the batch's last row of each slot (-1: untouched), k + room of them */
    uint64_t *hashes;     /* the hash of slot k + i, for ``room`` new keys: a grown table places them
                           * without reading and hashing their bytes again */
    struct slotrec *newrec; /* one string key column: slot k + i's key as a record (its length and
                             * first 8 bytes), for ``room`` new keys: a row compares with a key new in
                             * this batch by one read, not by its first row's chunk, offsets and bytes */
    int64_t room;
    int bad; /* a string offset out of its buffer */
    struct slotrec *rec; /* one string key column: the state's keys as records (or NULL) */
    struct keyrec *kt;   /* one string key column: the state's keys in a table of the call's (or NULL) */
    int kt_bits;
} source_t;

/* One string key column, a large batch: each state slot's key as a record built for the call
 * (a sequential pass over the state's column), so that a row's comparison and its last-row note
 * are one random read of one cache line instead of three (the slot's offsets, its bytes, its
 * note).  bytes: the key's bytes when it has at most 8 (zero-extended, as short_bytes), else its
 * first 8; len: its length, -1 for null; last: the batch's last row of the slot (-1: untouched),
 * copied into ``last`` after the pass.  Only for the call: held between publishes it would add
 * 12 bytes to every key. */
typedef struct slotrec {
    uint64_t bytes;
    int32_t len;
    int32_t last;
} slotrec_t;

/* One string key column, a large batch: the state's keys in a hash table of the call's own, at most
 * half full, each entry the key itself (packed: pack_key) and its slot, so that a row finds a
 * state key with one random read, prefetched from its hash alone, instead of a table entry and
 * then (once the entry is read) the slot's record.  slot: the slot + 1 (0: empty), KT_LONG set for a
 * key of 8 bytes or more (compared in full where it lives).  12 bytes an entry: a state of
 * 100,000 keys takes 3 MiB, below the DIS's 4 MiB mmap threshold (disd.allocator), so the call's
 * table comes from the heap, not from fresh pages.  Freed when the call returns. */
typedef struct __attribute__((packed, aligned(4))) keyrec {
    uint64_t packed;
    uint32_t slot;
} keyrec_t;
#define KT_LONG 0x80000000u
#define NULL_PACKED (0xffULL << 56)

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE uint64_t fmix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static ALWAYS_INLINE uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static const uint64_t LOW_BYTES[9] = {0,
                                      0xffULL,
                                      0xffffULL,
                                      0xffffffULL,
                                      0xffffffffULL,
                                      0xffffffffffULL,
                                      0xffffffffffffULL,
                                      0xffffffffffffffULL,
                                      0xffffffffffffffffULL};

/* The bytes of a string of at most 8 bytes as one number (little-endian, zero-extended): for a
 * given length, equal numbers are equal bytes.  One 8-byte load where the buffer (ending at end)
 * has room for it, which is all but its last few strings. */
static ALWAYS_INLINE uint64_t short_bytes(const uint8_t *p, size_t n, const uint8_t *end) {
    uint64_t v = 0;
    if (__builtin_expect(p + 8 <= end, 1)) {
        memcpy(&v, p, 8);
        return v & LOW_BYTES[n];
    }
    for (size_t j = 0; j < n; j++)
        v |= (uint64_t)p[j] << (8 * j);
    return v;
}

/* A key's bytes and length as one number: a key of at most 7 bytes, its bytes with its length in
 * the top byte (equal numbers: equal keys); null, 0xff in the top byte (no key of at most 7 bytes
 * has that); a longer key, its first 8 bytes (equal numbers say only that those agree). */
static ALWAYS_INLINE uint64_t pack_key(uint64_t bytes, int64_t len) {
    if (len < 0)
        return NULL_PACKED;
    return len < 8 ? bytes | ((uint64_t)len << 56) : bytes;
}

static uint64_t hash_long(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)n * 0xc2b2ae3d27d4eb4fULL);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = rotl(h ^ (v * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t v = 0;
        memcpy(&v, p, n);
        h = rotl(h ^ (v * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL;
    }
    return fmix(h);
}

/* A string's hash when its first bytes (``short_bytes`` of up to 8) are loaded already. */
static ALWAYS_INLINE uint64_t hash_loaded(uint64_t bytes, const uint8_t *p, size_t n) {
    return n <= 8 ? fmix(bytes ^ ((uint64_t)n * 0x9e3779b97f4a7c15ULL)) : hash_long(p, n);
}

static ALWAYS_INLINE uint64_t hash_str(const uint8_t *p, size_t n, const uint8_t *end) {
    return n <= 8 ? hash_loaded(short_bytes(p, n, end), p, n) : hash_long(p, n);
}

static ALWAYS_INLINE int eq_str(const uint8_t *a, const uint8_t *a_end, const uint8_t *b, const uint8_t *b_end,
                                size_t n) {
    if (n <= 8)
        return short_bytes(a, n, a_end) == short_bytes(b, n, b_end);
    return memcmp(a, b, n) == 0;
}

static ALWAYS_INLINE uint64_t load_fixed(const uint8_t *q, int width) {
    switch (width) {
    case 1:
        return *q;
    case 2: {
        uint16_t v;
        memcpy(&v, q, 2);
        return v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, q, 4);
        return v;
    }
    default: {
        uint64_t v;
        memcpy(&v, q, 8);
        return v;
    }
    }
}

#define NULL_HASH 0x5bd1e9955bd1e995ULL
#define NAN_HASH 0x7ff8000000000000ULL

static ALWAYS_INLINE int bit(const uint8_t *bits, Py_ssize_t p) { return (bits[p >> 3] >> (p & 7)) & 1; }

/* A string value's bytes (p is the physical row); 0 with s->bad set when its offsets are out of
 * its data. */
static ALWAYS_INLINE int str_at(source_t *s, const colview_t *v, Py_ssize_t p, const uint8_t **at, size_t *len) {
    int32_t a, b;
    memcpy(&a, v->values + 4 * p, 4);
    memcpy(&b, v->values + 4 * (p + 1), 4);
    if (a < 0 || b < a || b > v->data_len) {
        s->bad = 1;
        return 0;
    }
    *at = v->data + a;
    *len = (size_t)(b - a);
    return 1;
}

static ALWAYS_INLINE int fixed_null(const colspec_t *c, const colview_t *v, Py_ssize_t p, uint64_t value) {
    return (v->valid && !bit(v->valid, p)) || (c->has_sentinel && value == c->sentinel);
}

static ALWAYS_INLINE int float_nan(const colspec_t *c, uint64_t value) {
    if (c->width == 8) {
        double d;
        memcpy(&d, &value, 8);
        return d != d;
    }
    uint32_t w = (uint32_t)value;
    float f;
    memcpy(&f, &w, 4);
    return f != f;
}

/* One column's value of physical row p. */
static ALWAYS_INLINE uint64_t col_hash(source_t *s, const colspec_t *c, const colview_t *v, Py_ssize_t p, int kind) {
    if (kind == KIND_STRING) {
        const uint8_t *at;
        size_t len;
        if (v->valid && !bit(v->valid, p))
            return NULL_HASH;
        return str_at(s, v, p, &at, &len) ? hash_str(at, len, v->data + v->data_len) : 0;
    }
    if (kind == KIND_BOOL) {
        if (v->valid && !bit(v->valid, p))
            return NULL_HASH;
        return fmix(0x100 + (uint64_t)bit(v->values, p));
    }
    uint64_t x = load_fixed(v->values + p * c->width, c->width);
    if (fixed_null(c, v, p, x))
        return NULL_HASH;
    if (kind == KIND_FLOAT && float_nan(c, x))
        return NAN_HASH;
    return fmix(x ^ 0x2545f4914f6cdd1dULL);
}

static ALWAYS_INLINE int col_equal(source_t *s, const colspec_t *c, const colview_t *v, Py_ssize_t p,
                                   const colview_t *w, Py_ssize_t q, int kind) {
    if (kind == KIND_STRING || kind == KIND_BOOL) {
        int nv = v->valid && !bit(v->valid, p), nw = w->valid && !bit(w->valid, q);
        if (nv || nw)
            return nv && nw;
        if (kind == KIND_BOOL)
            return bit(v->values, p) == bit(w->values, q);
        const uint8_t *a, *b;
        size_t la, lb;
        if (!str_at(s, v, p, &a, &la) || !str_at(s, w, q, &b, &lb))
            return 0;
        return la == lb && eq_str(a, v->data + v->data_len, b, w->data + w->data_len, la);
    }
    uint64_t x = load_fixed(v->values + p * c->width, c->width), y = load_fixed(w->values + q * c->width, c->width);
    int nv = fixed_null(c, v, p, x), nw = fixed_null(c, w, q, y);
    if (nv || nw)
        return nv && nw;
    if (kind == KIND_FLOAT && float_nan(c, x))
        return float_nan(c, y);
    return x == y;
}

static ALWAYS_INLINE uint64_t key_hash_all(source_t *s, const colview_t *cols, Py_ssize_t row, int mode) {
    const KeyIndex *ix = s->ix;
    if (mode == MODE_STRING)
        return col_hash(s, &ix->spec[0], &cols[0], cols[0].offset + row, KIND_STRING);
    if (mode == MODE_FIXED)
        return col_hash(s, &ix->spec[0], &cols[0], cols[0].offset + row, KIND_FIXED);
    uint64_t h = 0x243f6a8885a308d3ULL;
    for (int i = 0; i < ix->ncols; i++)
        h = fmix(rotl(h, 17) ^ col_hash(s, &ix->spec[i], &cols[i], cols[i].offset + row, ix->spec[i].kind));
    return h;
}

/* A key's hash, as the index keeps it (hash_mask). */
static ALWAYS_INLINE uint64_t key_hash(source_t *s, const colview_t *cols, Py_ssize_t row, int mode) {
    return key_hash_all(s, cols, row, mode) & s->ix->hash_mask;
}

static ALWAYS_INLINE int key_equal(source_t *s, const colview_t *a, Py_ssize_t ra, const colview_t *b, Py_ssize_t rb,
                                   int mode) {
    const KeyIndex *ix = s->ix;
    if (mode == MODE_STRING)
        return col_equal(s, &ix->spec[0], &a[0], a[0].offset + ra, &b[0], b[0].offset + rb, KIND_STRING);
    if (mode == MODE_FIXED)
        return col_equal(s, &ix->spec[0], &a[0], a[0].offset + ra, &b[0], b[0].offset + rb, KIND_FIXED);
    for (int i = 0; i < ix->ncols; i++)
        if (!col_equal(s, &ix->spec[i], &a[i], a[i].offset + ra, &b[i], b[i].offset + rb, ix->spec[i].kind))
            return 0;
    return 1;
}

/* The columns and row of a slot's key. */
static ALWAYS_INLINE const colview_t *slot_key(const source_t *s, int64_t slot, Py_ssize_t *row) {
    if (slot < s->k) {
        *row = (Py_ssize_t)slot;
        return s->state;
    }
    *row = (Py_ssize_t)s->first[slot - s->k];
    return s->chunks + (size_t)s->first_chunk[slot - s->k] * (size_t)s->ix->ncols;
}

static ALWAYS_INLINE uint32_t tag_of(uint64_t h, int bits) { return ((uint32_t)(h >> 32)) >> bits; }

/* Put a slot known not to be in the table (a rehash, a rebuild from unique keys). */
static ALWAYS_INLINE void place(uint32_t *table, int bits, uint64_t h, int64_t slot) {
    uint32_t mask = (1u << bits) - 1, pos = (uint32_t)h & mask;
    while (table[pos])
        pos = (pos + 1) & mask;
    table[pos] = (tag_of(h, bits) << bits) | (uint32_t)(slot + 1);
}

/* The table sized for ``keys`` keys (at most 0.8 of its entries used), emptied. */
static int reset_table(KeyIndex *ix, int64_t keys) {
    int bits = MIN_BITS;
    while (bits < MAX_BITS && keys + 1 > ((int64_t)1 << bits) - ((int64_t)1 << bits) / 5)
        bits++;
    uint32_t *table = calloc((size_t)1 << bits, sizeof *table);
    if (table == NULL)
        return 0;
    free(ix->table);
    ix->table = table;
    ix->bits = bits;
    ix->count = 0;
    return 1;
}

static void clear_table(KeyIndex *ix) {
    free(ix->table);
    ix->table = NULL;
    ix->bits = 0;
    ix->count = 0;
}

/* Double the table, hashing every key again where it lives; 0 when out of memory. */
static ALWAYS_INLINE int grow(KeyIndex *ix, source_t *s, int mode) {
    if (ix->bits >= MAX_BITS)
        return 0;
    int bits = ix->bits + 1;
    uint32_t *table = calloc((size_t)1 << bits, sizeof *table);
    if (table == NULL)
        return 0;
    for (int64_t slot = 0; slot < s->k && slot < ix->count; slot++)
        place(table, bits, key_hash(s, s->state, (Py_ssize_t)slot, mode), slot);
    for (int64_t slot = s->k; slot < ix->count; slot++)
        place(table, bits, s->hashes[slot - s->k], slot);
    free(ix->table);
    ix->table = table;
    ix->bits = bits;
    return 1;
}

/* Room for twice as many new keys (``first``, ``hashes`` and ``last`` grown; they start small, so that a
 * batch of known keys allocates little); 0 when out of memory. */
static int more_room(source_t *s) {
    int64_t room = 2 * s->room;
    int32_t *first = realloc(s->first, (size_t)room * sizeof *first);
    if (first == NULL)
        return 0;
    s->first = first;
    first = realloc(s->first_chunk, (size_t)room * sizeof *first);
    if (first == NULL)
        return 0;
    s->first_chunk = first;
    uint64_t *hashes = realloc(s->hashes, (size_t)room * sizeof *hashes);
    if (hashes == NULL)
        return 0;
    s->hashes = hashes;
    struct slotrec *newrec = realloc(s->newrec, (size_t)room * sizeof *newrec);
    if (newrec == NULL)
        return 0;
    s->newrec = newrec;
    int32_t *last = realloc(s->last, (size_t)(s->k + room) * sizeof *last);
    if (last == NULL)
        return 0;
    memset(last + s->k + s->room, 0xff, (size_t)(room - s->room) * sizeof *last);
    s->last = last;
    s->room = room;
    return 1;
}

/* A new key, batch row i's (hash h), at the empty entry pos: the next slot, recorded in first[];
 * -1 when out of memory. */
static ALWAYS_INLINE int64_t add(KeyIndex *ix, source_t *s, Py_ssize_t i, uint64_t h, uint32_t pos, uint32_t tag,
                                 int mode) {
    int bits = ix->bits;
    int64_t slot = ix->count;
    if (slot - s->k == s->room && !more_room(s))
        return -1;
    s->hashes[slot - s->k] = h;
    s->first[slot - s->k] = (int32_t)i;
    s->first_chunk[slot - s->k] = s->chunk;
    ix->count++;
    if (ix->count > ((int64_t)1 << bits) - ((int64_t)1 << bits) / 5) { /* (grow places the new key too) */
        if (!grow(ix, s, mode)) {
            ix->count--;
            return -1;
        }
        return slot;
    }
    ix->table[pos] = (tag << bits) | (uint32_t)(slot + 1);
    return slot;
}

/* A batch row's string key, read once: when it is hashed ahead of its probe. */
typedef struct {
    uint64_t h;
    const uint8_t *at;
    size_t len;
    int null;
    uint64_t bytes; /* its first 8 bytes, zero-extended (as slotrec_t's) */
} strkey_t;

static ALWAYS_INLINE void read_strkey(source_t *s, Py_ssize_t i, strkey_t *out) {
    const colview_t *v = &s->batch[0];
    Py_ssize_t p = v->offset + i;
    out->null = v->valid && !bit(v->valid, p);
    if (out->null) {
        out->h = NULL_HASH & s->ix->hash_mask;
        return;
    }
    if (!str_at(s, v, p, &out->at, &out->len)) {
        out->h = 0;
        out->len = 0;
        out->bytes = 0;
        return;
    }
    const uint8_t *end = v->data + v->data_len;
    out->bytes = short_bytes(out->at, out->len < 8 ? out->len : 8, end);
    out->h = hash_loaded(out->bytes, out->at, out->len) & s->ix->hash_mask;
}

/* A new slot's key (one string column) as its record. */
static ALWAYS_INLINE void note_new(source_t *s, int64_t slot, const strkey_t *key) {
    slotrec_t *r = &s->newrec[slot - s->k];
    r->bytes = key->null ? 0 : key->bytes;
    r->len = key->null ? -1 : (int32_t)key->len;
    r->last = -1;
}

/* Whether slot ``slot`` holds batch row i's key, compared column by column. */
static ALWAYS_INLINE int slot_equal(source_t *s, Py_ssize_t i, int64_t slot, int mode) {
    Py_ssize_t row;
    const colview_t *cols = slot_key(s, slot, &row);
    return key_equal(s, s->batch, i, cols, row, mode);
}

/* Whether slot ``slot`` holds the one string column's key read ahead as ``key``. */
static ALWAYS_INLINE int strkey_equal(source_t *s, const strkey_t *key, int64_t slot) {
    if (slot >= s->k) { /* a key new in this batch: its record first */
        const slotrec_t *r = &s->newrec[slot - s->k];
        if (r->len < 0 || key->null)
            return r->len < 0 && key->null;
        if ((size_t)r->len != key->len || r->bytes != key->bytes)
            return 0;
        if (key->len <= 8)
            return 1;
    }
    Py_ssize_t row;
    const colview_t *v = slot_key(s, slot, &row);
    Py_ssize_t p = v->offset + row;
    int null = v->valid && !bit(v->valid, p);
    if (null || key->null)
        return null && key->null;
    const uint8_t *at;
    size_t len;
    return str_at(s, v, p, &at, &len) && len == key->len &&
           eq_str(key->at, s->batch[0].data + s->batch[0].data_len, at, v->data + v->data_len, len);
}

/* The slot of batch row i's key (hash h); a new slot when it is not there; -1 when out of
 * memory.  ``key``: for one string column, the row's key as read ahead (compared as read),
 * else NULL (compared column by column, as ``mode`` says). */
static ALWAYS_INLINE int64_t find_or_add(KeyIndex *ix, source_t *s, Py_ssize_t i, uint64_t h, const strkey_t *key,
                                         int mode) {
    int bits = ix->bits;
    uint32_t mask = (1u << bits) - 1, tag = tag_of(h, bits), pos = (uint32_t)h & mask;
    for (;;) {
        uint32_t e = ix->table[pos];
        if (e == 0)
            break;
        if ((e >> bits) == tag) {
            int64_t slot = (int64_t)(e & mask) - 1;
            if (key != NULL ? strkey_equal(s, key, slot) : slot_equal(s, i, slot, mode))
                return slot;
        }
        pos = (pos + 1) & mask;
    }
    int64_t slot = add(ix, s, i, h, pos, tag, mode);
    if (key != NULL && slot >= 0)
        note_new(s, slot, key);
    return slot;
}

/* Whether state slot ``slot`` (below k) holds ``key``, by its record. */
static ALWAYS_INLINE int rec_equal(source_t *s, const strkey_t *key, int64_t slot) {
    const slotrec_t *r = &s->rec[slot];
    if (r->len < 0 || key->null)
        return r->len < 0 && key->null;
    if ((size_t)r->len != key->len || r->bytes != key->bytes)
        return 0;
    return key->len <= 8 || strkey_equal(s, key, slot);
}

/* As find_or_add for one string column with the state's keys as records: the slot of the key,
 * its last row noted (in its record below k, else in ``last``). */
static ALWAYS_INLINE int64_t find_or_add_rec(KeyIndex *ix, source_t *s, Py_ssize_t i, const strkey_t *key) {
    int bits = ix->bits;
    uint32_t mask = (1u << bits) - 1, tag = tag_of(key->h, bits), pos = (uint32_t)key->h & mask;
    for (;;) {
        uint32_t e = ix->table[pos];
        if (e == 0)
            break;
        if ((e >> bits) == tag) {
            int64_t slot = (int64_t)(e & mask) - 1;
            if (slot < s->k) {
                if (rec_equal(s, key, slot)) {
                    s->rec[slot].last = (int32_t)(s->base + i);
                    return slot;
                }
            } else if (strkey_equal(s, key, slot)) {
                s->last[slot] = (int32_t)(s->base + i);
                return slot;
            }
        }
        pos = (pos + 1) & mask;
    }
    int64_t slot = add(ix, s, i, key->h, pos, tag, MODE_STRING);
    if (slot >= 0) {
        note_new(s, slot, key);
        s->last[slot] = (int32_t)(s->base + i);
    }
    return slot;
}

/* As find_or_add for one string column with the state's keys in the call's table (s->kt): the slot
 * of the key, its last row noted in ``last``; a key the state lacks is looked up in the index. */
static ALWAYS_INLINE int64_t find_or_add_kt(KeyIndex *ix, source_t *s, Py_ssize_t i, const strkey_t *key) {
    uint32_t kmask = (1u << s->kt_bits) - 1, pos = (uint32_t)key->h & kmask;
    uint64_t want = key->null ? NULL_PACKED : pack_key(key->bytes, (int64_t)key->len);
    uint32_t is_long = !key->null && key->len >= 8 ? KT_LONG : 0;
    for (;;) {
        const keyrec_t *r = &s->kt[pos];
        uint32_t e = r->slot;
        if (e == 0)
            break;
        if (r->packed == want && (e & KT_LONG) == is_long) {
            int64_t slot = (int64_t)(e & ~KT_LONG) - 1;
            if (!is_long || strkey_equal(s, key, slot)) {
                s->last[slot] = (int32_t)(s->base + i);
                return slot;
            }
        }
        pos = (pos + 1) & kmask;
    }
    int64_t slot = find_or_add(ix, s, i, key->h, key, MODE_STRING);
    if (slot >= 0)
        s->last[slot] = (int32_t)(s->base + i);
    return slot;
}

/* Every batch row's key of one string column: its slot, and each slot's last row (in the slot's
 * record when the call keeps records, else in ``last``); 0 when out of memory.  The one test of
 * ``s->rec`` a row is the same every row: the compiler moves it out of the loop. */
static int run_string(KeyIndex *ix, source_t *s, Py_ssize_t n) {
    strkey_t ring[RING];
    for (Py_ssize_t i = 0; i < n && i < AHEAD; i++)
        read_strkey(s, i, &ring[i % RING]);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            strkey_t *ahead = &ring[(i + AHEAD) % RING];
            read_strkey(s, i + AHEAD, ahead);
            if (s->kt != NULL)
                __builtin_prefetch(&s->kt[(uint32_t)ahead->h & ((1u << s->kt_bits) - 1)]);
            else
                __builtin_prefetch(&ix->table[(uint32_t)ahead->h & ((1u << ix->bits) - 1)]);
        }
        strkey_t *key = &ring[i % RING];
        if (s->kt != NULL) {
            if (find_or_add_kt(ix, s, i, key) < 0)
                return 0;
        } else if (s->rec != NULL) {
            if (find_or_add_rec(ix, s, i, key) < 0)
                return 0;
        } else {
            int64_t slot = find_or_add(ix, s, i, key->h, key, MODE_STRING);
            if (slot < 0)
                return 0;
            s->last[slot] = (int32_t)(s->base + i);
        }
    }
    return 1;
}

/* Every batch row's key (of one fixed-width column, or any columns): its slot, and each slot's
 * last row in ``last``; 0 when out of memory. */
static ALWAYS_INLINE int run(KeyIndex *ix, source_t *s, Py_ssize_t n, int mode) {
    uint64_t ring[RING];
    for (Py_ssize_t i = 0; i < n && i < AHEAD; i++)
        ring[i % RING] = key_hash(s, s->batch, i, mode);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            uint64_t h = key_hash(s, s->batch, i + AHEAD, mode);
            ring[(i + AHEAD) % RING] = h;
            __builtin_prefetch(&ix->table[(uint32_t)h & ((1u << ix->bits) - 1)]);
        }
        int64_t slot = find_or_add(ix, s, i, ring[i % RING], NULL, mode);
        if (slot < 0)
            return 0;
        s->last[slot] = (int32_t)(s->base + i);
    }
    return 1;
}

static int run_any(KeyIndex *ix, source_t *s, Py_ssize_t n, int mode) {
    switch (mode) {
    case MODE_STRING:
        return run_string(ix, s, n);
    case MODE_FIXED:
        return run(ix, s, n, MODE_FIXED);
    default:
        return run(ix, s, n, MODE_ANY);
    }
}

/* The table rebuilt from the state's k keys (unique: no comparison); 0 when out of memory. */
static int rebuild(KeyIndex *ix, source_t *s, int mode) {
    if (!reset_table(ix, s->k))
        return 0;
    for (int64_t slot = 0; slot < s->k; slot++) {
        uint64_t h = mode == MODE_STRING ? key_hash(s, s->state, (Py_ssize_t)slot, MODE_STRING)
                   : mode == MODE_FIXED  ? key_hash(s, s->state, (Py_ssize_t)slot, MODE_FIXED)
                                         : key_hash(s, s->state, (Py_ssize_t)slot, MODE_ANY);
        place(ix->table, ix->bits, h, slot);
        ix->count++;
    }
    return 1;
}

/* The state's k keys as records (one string column), each untouched. */
static void fill_records(source_t *s) {
    const colview_t *v = &s->state[0];
    const uint8_t *end = v->data + v->data_len;
    for (int64_t slot = 0; slot < s->k; slot++) {
        Py_ssize_t p = v->offset + (Py_ssize_t)slot;
        slotrec_t *r = &s->rec[slot];
        const uint8_t *at;
        size_t len;
        r->last = -1;
        r->bytes = 0;
        r->len = -1;
        if (v->valid && !bit(v->valid, p))
            continue;
        if (!str_at(s, v, p, &at, &len))
            continue; /* (s->bad set: the call fails) */
        r->len = (int32_t)len;
        r->bytes = short_bytes(at, len < 8 ? len : 8, end);
    }
}

/* The call's table of the state's k keys (one string column; unique keys: no comparison). */
static void fill_kt(source_t *s) {
    const colview_t *v = &s->state[0];
    const uint8_t *end = v->data + v->data_len;
    uint32_t kmask = (1u << s->kt_bits) - 1;
    enum { BLOCK = 16 };
    uint64_t hs[BLOCK], packed[BLOCK];
    uint32_t flags[BLOCK];
    memset(s->kt, 0, ((size_t)kmask + 1) * sizeof *s->kt);
    for (int64_t first = 0; first < s->k; first += BLOCK) {
        int64_t m = s->k - first < BLOCK ? s->k - first : BLOCK;
        for (int64_t j = 0; j < m; j++) { /* hashed, their entries prefetched, */
            Py_ssize_t p = v->offset + (Py_ssize_t)(first + j);
            const uint8_t *at;
            size_t len;
            flags[j] = 0;
            if (v->valid && !bit(v->valid, p)) {
                hs[j] = NULL_HASH;
                packed[j] = NULL_PACKED;
            } else if (!str_at(s, v, p, &at, &len)) {
                return; /* (s->bad set: the call fails) */
            } else {
                uint64_t bytes = short_bytes(at, len < 8 ? len : 8, end);
                hs[j] = hash_loaded(bytes, at, len);
                packed[j] = pack_key(bytes, (int64_t)len);
                flags[j] = len >= 8 ? KT_LONG : 0;
            }
            hs[j] &= s->ix->hash_mask;
            __builtin_prefetch(&s->kt[(uint32_t)hs[j] & kmask], 1);
        }
        for (int64_t j = 0; j < m; j++) { /* then placed */
            uint32_t pos = (uint32_t)hs[j] & kmask;
            while (s->kt[pos].slot)
                pos = (pos + 1) & kmask;
            s->kt[pos].packed = packed[j];
            s->kt[pos].slot = (uint32_t)(first + j + 1) | flags[j];
        }
    }
}

/* -- arguments ---------------------------------------------------------------------------- */

typedef struct {
    Py_buffer bufs[3];
    int held[3];
} colbufs_t;

static void release(colbufs_t *b, int ncols) {
    for (int i = 0; i < ncols; i++)
        for (int j = 0; j < 3; j++)
            if (b[i].held[j])
                PyBuffer_Release(&b[i].bufs[j]);
}

/* Each key column of ``arg`` as a view of ``rows`` rows, its buffers' sizes checked. */
static int parse_columns(const KeyIndex *ix, PyObject *arg, Py_ssize_t rows, colview_t *views, colbufs_t *bufs,
                         const char *what) {
    PyObject *seq = PySequence_Fast(arg, "key columns must be a sequence");
    if (seq == NULL)
        return 0;
    int ok = 0;
    if (PySequence_Fast_GET_SIZE(seq) != ix->ncols) {
        PyErr_Format(PyExc_ValueError, "%s: %zd key columns given, the index has %d", what,
                     PySequence_Fast_GET_SIZE(seq), ix->ncols);
        goto done;
    }
    for (int i = 0; i < ix->ncols; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *objs[3];
        Py_ssize_t offset;
        const colspec_t *c = &ix->spec[i];
        colview_t *v = &views[i];
        memset(v, 0, sizeof *v);
        if (!PyArg_ParseTuple(item, "OOOn;a key column is (validity, values, data, offset)", &objs[0], &objs[1],
                              &objs[2], &offset))
            goto done;
        if (offset < 0) {
            PyErr_Format(PyExc_ValueError, "%s: column %d has a negative offset", what, i);
            goto done;
        }
        for (int j = 0; j < 3; j++) {
            if (objs[j] == Py_None)
                continue;
            if (PyObject_GetBuffer(objs[j], &bufs[i].bufs[j], PyBUF_SIMPLE) < 0)
                goto done;
            bufs[i].held[j] = 1;
        }
        if (!bufs[i].held[1]) {
            PyErr_Format(PyExc_ValueError, "%s: column %d has no values buffer", what, i);
            goto done;
        }
        Py_ssize_t end = offset + rows, need;
        v->offset = offset;
        v->values = bufs[i].bufs[1].buf;
        v->values_len = bufs[i].bufs[1].len;
        if (bufs[i].held[0]) {
            v->valid = bufs[i].bufs[0].buf;
            if (bufs[i].bufs[0].len < (end + 7) / 8) {
                PyErr_Format(PyExc_ValueError, "%s: column %d's validity is too short", what, i);
                goto done;
            }
        }
        if (c->kind == KIND_STRING) {
            need = rows ? 4 * (end + 1) : 0;
            v->data = (const uint8_t *)""; /* no data buffer: every value is empty or null */
            if (bufs[i].held[2]) {
                v->data = bufs[i].bufs[2].buf;
                v->data_len = bufs[i].bufs[2].len;
            }
        } else {
            need = c->kind == KIND_BOOL ? (end + 7) / 8 : end * c->width;
        }
        if (v->values_len < need) {
            PyErr_Format(PyExc_ValueError, "%s: column %d's values are too short for %zd rows", what, i, rows);
            goto done;
        }
    }
    ok = 1;
done:
    Py_DECREF(seq);
    return ok;
}

/* -- the type --------------------------------------------------------------------------------- */

static int KeyIndex_init(KeyIndex *self, PyObject *args, PyObject *kwds) {
    PyObject *columns;
    int hash_bits = 64;
    static char *kwlist[] = {"columns", "hash_bits", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$i", kwlist, &columns, &hash_bits))
        return -1;
    if (hash_bits < 0 || hash_bits > 64) {
        PyErr_SetString(PyExc_ValueError, "hash_bits is 0 to 64");
        return -1;
    }
    PyObject *seq = PySequence_Fast(columns, "columns must be a sequence of (kind, width, sentinel)");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > 64) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "a key has 1 to 64 columns");
        return -1;
    }
    colspec_t *spec = PyMem_Calloc((size_t)n, sizeof *spec);
    if (spec == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sentinel;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiO;a key column is (kind, width, sentinel)",
                              &spec[i].kind, &spec[i].width, &sentinel))
            goto fail;
        int k = spec[i].kind, w = spec[i].width;
        int ok = (k == KIND_FIXED && (w == 1 || w == 2 || w == 4 || w == 8)) || (k == KIND_FLOAT && (w == 4 || w == 8)) ||
                 ((k == KIND_BOOL || k == KIND_STRING) && w == 0);
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "key column %zd: kind %d with width %d is not a key column", i, k, w);
            goto fail;
        }
        if (sentinel != Py_None) {
            char *b;
            Py_ssize_t len;
            if (PyBytes_AsStringAndSize(sentinel, &b, &len) < 0)
                goto fail;
            if (len != w || k == KIND_BOOL || k == KIND_STRING) {
                PyErr_Format(PyExc_ValueError, "key column %zd: a sentinel of %zd bytes for width %d", i, len, w);
                goto fail;
            }
            spec[i].sentinel = load_fixed((const uint8_t *)b, w);
            spec[i].has_sentinel = 1;
        }
    }
    Py_DECREF(seq);
    PyMem_Free(self->spec);
    clear_table(self);
    self->spec = spec;
    self->ncols = (int)n;
    self->hash_mask = hash_bits == 64 ? ~0ULL : (1ULL << hash_bits) - 1;
    return 0;
fail:
    Py_DECREF(seq);
    PyMem_Free(spec);
    return -1;
}

static void KeyIndex_dealloc(KeyIndex *self) {
    clear_table(self);
    PyMem_Free(self->spec);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *KeyIndex_update(KeyIndex *self, PyObject *args) {
    PyObject *state_arg, *batch_arg;
    Py_ssize_t k, n;
    long long max_keys;
    if (!PyArg_ParseTuple(args, "OnOnL", &state_arg, &k, &batch_arg, &n, &max_keys))
        return NULL;
    if (self->spec == NULL) {
        PyErr_SetString(PyExc_ValueError, "KeyIndex was not initialized");
        return NULL;
    }
    if (k < 0 || n < 0 || n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "row counts must be at least 0, and a batch below 2**31 rows");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "KeyIndex.update called while another update runs");
        return NULL;
    }
    self->busy = 1; /* (from here every exit goes through done) */
    int ncols = self->ncols;
    int mode = ncols > 1 ? MODE_ANY
             : self->spec[0].kind == KIND_STRING ? MODE_STRING
             : self->spec[0].kind == KIND_FIXED  ? MODE_FIXED
                                                 : MODE_ANY;
    PyObject *chunks = PySequence_Fast(batch_arg, "the batch must be a sequence of (rows, key columns) chunks");
    if (chunks == NULL) {
        self->busy = 0;
        return NULL;
    }
    Py_ssize_t nchunks = PySequence_Fast_GET_SIZE(chunks), total_rows = 0;
    colview_t *views = PyMem_Calloc((size_t)(1 + nchunks) * (size_t)ncols, sizeof *views);
    colbufs_t *bufs = PyMem_Calloc((size_t)(1 + nchunks) * (size_t)ncols, sizeof *bufs);
    Py_ssize_t *lengths = PyMem_Calloc((size_t)nchunks + 1, sizeof *lengths);
    source_t src = {self, NULL, NULL, NULL, 0, 0, (int64_t)k, NULL, NULL, NULL, NULL, NULL, n < 1024 ? 1 + n : 1024, 0, NULL, NULL, 0};
    PyObject *result = NULL, *slots = NULL, *rows = NULL;
    if (views == NULL || bufs == NULL || lengths == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (!parse_columns(self, state_arg, k, views, bufs, "state"))
        goto done;
    for (Py_ssize_t c = 0; c < nchunks; c++) {
        PyObject *cols;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(chunks, c), "nO;a chunk is (rows, key columns)", &lengths[c],
                              &cols))
            goto done;
        if (lengths[c] < 0 || !parse_columns(self, cols, lengths[c], views + (1 + c) * ncols, bufs + (1 + c) * ncols,
                                             "batch"))
            goto done;
        total_rows += lengths[c];
    }
    if (total_rows != n) {
        PyErr_Format(PyExc_ValueError, "the batch's chunks hold %zd rows, not %zd", total_rows, n);
        goto done;
    }
    src.state = views;
    src.chunks = views + ncols;
    src.first = malloc((size_t)src.room * sizeof *src.first);
    src.first_chunk = malloc((size_t)src.room * sizeof *src.first_chunk);
    src.last = malloc((size_t)(k + src.room) * sizeof *src.last);
    src.hashes = malloc((size_t)src.room * sizeof *src.hashes);
    src.newrec = malloc((size_t)src.room * sizeof *src.newrec);
    if (src.first == NULL || src.first_chunk == NULL || src.last == NULL || src.hashes == NULL || src.newrec == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (mode == MODE_STRING && k > 0 && (int64_t)n >= (int64_t)k * KT_RATIO && k <= KT_MAX_KEYS) {
        int kb = MIN_BITS;
        while (((int64_t)1 << kb) < 2 * (int64_t)k)
            kb++;
        src.kt_bits = kb;
        src.kt = malloc(((size_t)1 << kb) * sizeof *src.kt);
        if (src.kt == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    } else if (mode == MODE_STRING && k > 0 && (int64_t)n * REC_RATIO >= (int64_t)k) {
        src.rec = malloc((size_t)k * sizeof *src.rec);
        if (src.rec == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    int ok = 1;
    int64_t touched = 0;
    Py_BEGIN_ALLOW_THREADS
    memset(src.last, 0xff, (size_t)(k + src.room) * sizeof *src.last);
    if (src.rec != NULL)
        fill_records(&src);
    if (src.kt != NULL)
        fill_kt(&src);
    if (self->count != (int64_t)k || self->table == NULL) /* not this state's keys: rebuilt from them */
        ok = rebuild(self, &src, mode);
    for (Py_ssize_t c = 0; ok && c < nchunks; c++) {
        src.batch = src.chunks + c * ncols;
        src.chunk = (int32_t)c;
        ok = run_any(self, &src, lengths[c], mode);
        src.base += lengths[c];
    }
    if (ok && !src.bad && src.rec != NULL)
        for (int64_t slot = 0; slot < k; slot++)
            src.last[slot] = src.rec[slot].last;
    if (ok && !src.bad)
        for (int64_t slot = 0; slot < self->count; slot++)
            touched += src.last[slot] >= 0;
    Py_END_ALLOW_THREADS
    int64_t total = self->count;
    if (!ok || src.bad) {
        clear_table(self);
        if (src.bad)
            PyErr_SetString(PyExc_ValueError, "a string key's offsets point outside its data");
        else
            PyErr_NoMemory();
        goto done;
    }
    if (total > max_keys) {
        clear_table(self); /* the state stays as it was: the next update rebuilds from it */
        result = Py_BuildValue("(LOO)", (long long)total, Py_None, Py_None);
        goto done;
    }
    slots = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(touched * 8));
    rows = slots ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(touched * 8)) : NULL;
    if (rows == NULL) {
        clear_table(self);
        goto done;
    }
    int64_t *out_slots = (int64_t *)PyBytes_AS_STRING(slots), *out_rows = (int64_t *)PyBytes_AS_STRING(rows);
    Py_BEGIN_ALLOW_THREADS
    for (int64_t slot = 0, j = 0; slot < total; slot++)
        if (src.last[slot] >= 0) {
            out_slots[j] = slot;
            out_rows[j++] = src.last[slot];
        }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(LOO)", (long long)total, slots, rows);
done:
    self->busy = 0;
    Py_XDECREF(slots);
    Py_XDECREF(rows);
    if (bufs)
        release(bufs, (int)((1 + nchunks) * ncols)); /* (held flags say which) */
    Py_DECREF(chunks);
    PyMem_Free(views);
    PyMem_Free(bufs);
    PyMem_Free(lengths);
    free(src.first);
    free(src.first_chunk);
    free(src.last);
    free(src.hashes);
    free(src.newrec);
    free(src.rec);
    free(src.kt);
    return result;
}

static PyObject *KeyIndex_clear(KeyIndex *self, PyObject *Py_UNUSED(ignored)) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "KeyIndex.clear called while an update runs");
        return NULL;
    }
    clear_table(self);
    Py_RETURN_NONE;
}

static PyObject *KeyIndex_nbytes(KeyIndex *self, void *Py_UNUSED(closure)) {
    size_t table = self->table ? ((size_t)1 << self->bits) * sizeof(uint32_t) : 0;
    return PyLong_FromSize_t(sizeof *self + (size_t)self->ncols * sizeof(colspec_t) + table);
}

static Py_ssize_t KeyIndex_len(KeyIndex *self) { return (Py_ssize_t)self->count; }

static PyMethodDef KeyIndex_methods[] = {
    {"update", (PyCFunction)KeyIndex_update, METH_VARARGS,
     "update(state, k, batch, n, max_keys) -> (total, changed, rows): see the module's source"},
    {"clear", (PyCFunction)KeyIndex_clear, METH_NOARGS, "Forget every key; the next update rebuilds from the state."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef KeyIndex_getset[] = {
    {"nbytes", (getter)KeyIndex_nbytes, NULL, "bytes the index holds (its table and itself)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods KeyIndex_as_sequence = {.sq_length = (lenfunc)KeyIndex_len};

static PyTypeObject KeyIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "disd.storage.lastbyindex.KeyIndex",
    .tp_doc = "The hash table of a last-by state's keys (see the module's source).",
    .tp_basicsize = sizeof(KeyIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KeyIndex_init,
    .tp_dealloc = (destructor)KeyIndex_dealloc,
    .tp_methods = KeyIndex_methods,
    .tp_getset = KeyIndex_getset,
    .tp_as_sequence = &KeyIndex_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "lastbyindex",
    .m_doc = "The hash table of a last-by state's keys, kept between publishes (see the source).", .m_size = -1,
};

PyMODINIT_FUNC PyInit_lastbyindex(void) {
    if (PyType_Ready(&KeyIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&KeyIndexType);
    if (PyModule_AddObject(m, "KeyIndex", (PyObject *)&KeyIndexType) < 0) {
        Py_DECREF(&KeyIndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
