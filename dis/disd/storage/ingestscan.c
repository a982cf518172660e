/* The byte work of a chunk, without the interpreter: CRC32C, the frame scan, the row checks of the
 * decoder, the transaction plan and the column bytes appended to the location's buffers.  No
 * Python API here: everything runs with the interpreter's lock given up (ingestcore.c).
 *
 * Each step follows a Python function of the reference path, named above it; where the
 * reference decodes a chunk's frames as one batch (their heaps joined), so does this, and the
 * one case where that joining makes a difference to which bytes a string takes (heaps that add
 * up only across frames) is handed back to the reference (ING_REFERENCE) rather than copied. */
#include "ingestcore.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the row records and column files are little-endian: this code reads them in place"
#endif

/* -- CRC32C (Castagnoli): SSE4.2 when the CPU has it, else slicing-by-8 tables ---------------- */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc_soft(uint32_t crc, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^ crc_table[5][(w >> 16) & 0xFF] ^
              crc_table[4][(w >> 24) & 0xFF] ^ crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

/* Three streams of the CRC instruction at once hide its latency (one result every cycle instead
 * of every three); their CRCs are joined by shifting one over the zeros of the next block's
 * length: a linear map over GF(2), tabulated for the two block lengths used. */
#define CRC_LONG 8192
#define CRC_SHORT 256
static uint32_t crc_zeros_long[4][256], crc_zeros_short[4][256];

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1)
            sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* the operator that appends len zero bytes to a CRC (len a power of two, at least 1) */
static void crc_zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32], row = 1;
    odd[0] = 0x82F63B78u;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* 2 zero bits */
    gf2_square(odd, even); /* 4 zero bits */
    do {                   /* the first square makes one zero byte */
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0)
            return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void crc_zeros(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    crc_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 0; t < 4; t++)
            zeros[t][n] = gf2_times(op, n << (8 * t));
}

static uint32_t crc_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^ zeros[3][crc >> 24];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint64_t crc_three(uint64_t c0, const uint8_t *p, size_t block,
                                                            uint32_t zeros[4][256]) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t *end = p + block;
    for (; p < end; p += 8) {
        uint64_t w0, w1, w2;
        memcpy(&w0, p, 8);
        memcpy(&w1, p + block, 8);
        memcpy(&w2, p + 2 * block, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
    }
    c0 = crc_shift(zeros, (uint32_t)c0) ^ (uint32_t)c1;
    return crc_shift(zeros, (uint32_t)c0) ^ (uint32_t)c2;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hard(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n >= 3 * CRC_LONG) {
        c = crc_three(c, p, CRC_LONG, crc_zeros_long);
        p += 3 * CRC_LONG;
        n -= 3 * CRC_LONG;
    }
    while (n >= 3 * CRC_SHORT) {
        c = crc_three(c, p, CRC_SHORT, crc_zeros_short);
        p += 3 * CRC_SHORT;
        n -= 3 * CRC_SHORT;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
#define HAVE_CRC_HARD 1
#endif

static int crc_mode = -1; /* -1 unknown, 0 tables, 1 SSE4.2 */

uint32_t dis_crc32c(uint32_t crc, const void *buf, size_t len) {
    if (crc_mode < 0) { /* first use, made under the interpreter's lock by the module's init */
        crc_init();
        crc_zeros(crc_zeros_long, CRC_LONG);
        crc_zeros(crc_zeros_short, CRC_SHORT);
#ifdef HAVE_CRC_HARD
        crc_mode = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
        crc_mode = 0;
#endif
    }
    crc = ~crc;
#ifdef HAVE_CRC_HARD
    if (crc_mode == 1)
        return ~crc_hard(crc, buf, len);
#endif
    return ~crc_soft(crc, buf, len);
}

/* -- UTF-8, as Arrow's full validation of a string array checks each value ------------------- */

int dis_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) { /* a run of ASCII, 8 bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & UINT64_C(0x8080808080808080))) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int need;
        uint8_t lo = 0x80, hi = 0xBF; /* the range of the first continuation byte */
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c == 0xE0)
            need = 2, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
            need = 2;
        else if (c == 0xED)
            need = 2, hi = 0x9F; /* no surrogates */
        else if (c == 0xF0)
            need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3)
            need = 3;
        else if (c == 0xF4)
            need = 3, hi = 0x8F; /* nothing past U+10FFFF */
        else
            return 0;
        if ((size_t)need >= n - i)
            return 0; /* cut short */
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (int k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += (size_t)need + 1;
    }
    return 1;
}

/* -- the location's buffers ------------------------------------------------------------------- */

int dis_reserve(dis_file *f, int64_t extra) {
    if (f->len + extra <= f->cap)
        return 0;
    int64_t cap = f->cap ? f->cap : 256;
    while (cap < f->len + extra)
        cap *= 2;
    char *b = realloc(f->buf, (size_t)cap);
    if (b == NULL)
        return -1;
    f->buf = b;
    f->cap = cap;
    return 0;
}

/* Location._rollback_locked / ColumnFileWriter.truncate_to: every file cut back to its committed
 * size (a cut below what is written already is made before the next write). */
void dis_rollback(dis_core *c, int64_t *rolled) {
    if (rolled)
        *rolled += c->written - c->committed;
    int below_mark = c->committed < c->mark_rows; /* rows taken since the mark are cut: so is the mark */
    if (below_mark)
        c->mark_rows = c->committed;
    for (int i = 0; i < c->nfiles; i++) {
        dis_file *f = &c->files[i];
        if (below_mark)
            f->mark = f->committed;
        if (f->committed >= f->disk) {
            f->len = f->committed - f->disk;
        } else {
            f->truncate = f->truncate < 0 || f->committed < f->truncate ? f->committed : f->truncate;
            f->disk = f->committed;
            f->len = 0;
        }
    }
    c->written = c->committed;
    c->txn_open = 0;
}

/* -- a chunk ------------------------------------------------------------------------------------ */

typedef struct {
    int64_t start, end, rows; /* offsets in the chunk; the frame's rows */
} frame_t;

typedef struct {
    frame_t *v;
    int64_t n, cap;
} frames_t;

static int push_frame(frames_t *fs, int64_t start, int64_t end, int64_t rows) {
    if (fs->n == fs->cap) {
        int64_t cap = fs->cap ? fs->cap * 2 : 16;
        frame_t *v = realloc(fs->v, (size_t)cap * sizeof *v);
        if (v == NULL)
            return -1;
        fs->v = v;
        fs->cap = cap;
    }
    fs->v[fs->n++] = (frame_t){start, end, rows};
    return 0;
}

static uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* scan_frames, then "the chunk ends on a frame boundary": 0 when the chunk is whole frames that
 * pass their checks, 1 when not (corrupt, torn, or not ending on a boundary), -1 out of memory. */
static int scan(const dis_core *c, const uint8_t *d, int64_t n, int64_t p, frames_t *fs) {
    for (;;) {
        if (n - p < FRAME_HEADER)
            return n > p; /* a torn tail is not a chunk's end */
        uint32_t plen = u32_at(d + p), rows = u32_at(d + p + 4), pcrc = u32_at(d + p + 8), hcrc = u32_at(d + p + 12);
        if (dis_crc32c(0, d + p, 12) != hcrc)
            return 1; /* corrupt, or a zero-filled (torn) tail: either way no boundary here */
        if (plen > MAX_FRAME_PAYLOAD || (uint64_t)rows * (uint64_t)c->row_size > plen)
            return 1;
        int64_t end = p + FRAME_HEADER + plen;
        if (end > n)
            return 1;
        if (dis_crc32c(0, d + p + FRAME_HEADER, plen) != pcrc)
            return 1;
        if (push_frame(fs, p, end, rows) != 0)
            return -1;
        p = end;
    }
}

static int is_null(const uint8_t *rec, int col) { return (rec[1 + (col >> 3)] >> (col & 7)) & 1; }

/* Some row of the ``rows`` records at rec has a null bit set. */
static int frame_has_nulls(const dis_core *c, const uint8_t *rec, int64_t rows) {
    uint8_t acc = 0;
    for (int b = 0; b < c->null_bytes; b++)
        for (int64_t r = 0; r < rows; r++)
            acc |= rec[r * c->row_size + 1 + b];
    return acc != 0;
}

/* No byte of the n bytes at s has its top bit set: ASCII, so any of its ranges is UTF-8. */
static int all_ascii(const uint8_t *s, int64_t n) {
    uint64_t acc = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        acc |= w;
    }
    for (; i < n; i++)
        acc |= s[i];
    return !(acc & UINT64_C(0x8080808080808080));
}

/* _decode_records' checks: flags, string lengths against the heap, null strings of no length,
 * UTF-8.  ING_OK, ING_REFUSED or ING_REFERENCE; ``flags`` gets every row's flag, ``heap_bytes``
 * the heaps' total. */
static int check_rows(const dis_core *c, const uint8_t *d, const frames_t *fs, int64_t n, uint8_t *flags,
                      int64_t *heap_bytes) {
    int max_flag = 0;
    uint64_t lens_total = 0, heap_total = 0;
    int per_frame_ok = 1;
    int64_t row = 0;
    for (int64_t f = 0; f < fs->n; f++) {
        const uint8_t *rec = d + fs->v[f].start + FRAME_HEADER;
        int64_t heap = fs->v[f].end - fs->v[f].start - FRAME_HEADER - fs->v[f].rows * c->row_size;
        uint64_t frame_lens = 0;
        int64_t rows = fs->v[f].rows, rs = c->row_size;
        /* column by column (a strided pass each) rather than row by row over every column */
        for (int64_t r = 0; r < rows; r++) {
            uint8_t fl = rec[r * rs];
            flags[row + r] = fl;
            if (fl > max_flag)
                max_flag = fl;
        }
        row += rows;
        if (c->nstrings) {
            int nulls = frame_has_nulls(c, rec, rows);
            for (int k = 0; k < c->ncols; k++) {
                if (c->cols[k].type != T_STRING)
                    continue;
                const uint8_t *at = rec + c->cols[k].field;
                for (int64_t r = 0; r < rows; r++)
                    frame_lens += u32_at(at + r * rs);
                if (nulls)
                    for (int64_t r = 0; r < rows; r++)
                        if (u32_at(at + r * rs) && is_null(rec + r * rs, k))
                            return ING_REFUSED; /* a null value with a non-zero length */
            }
        }
        if (frame_lens != (uint64_t)heap)
            per_frame_ok = 0;
        lens_total += frame_lens;
        heap_total += (uint64_t)heap;
    }
    *heap_bytes = (int64_t)heap_total;
    if (n && max_flag > 3)
        return ING_REFUSED;
    if (c->nstrings == 0)
        return ING_OK; /* without strings the heap is not read */
    if ((c->nstrings == 1 || n) && lens_total != heap_total)
        return ING_REFUSED;
    if (!n)
        return ING_OK;
    if (!per_frame_ok || heap_total >= (UINT64_C(1) << 31))
        return ING_REFERENCE;
    for (int64_t f = 0; f < fs->n; f++) { /* each value's bytes lie in its own frame's heap */
        const uint8_t *rec = d + fs->v[f].start + FRAME_HEADER;
        const uint8_t *heap = rec + fs->v[f].rows * c->row_size;
        if (all_ascii(heap, fs->v[f].end - (heap - d)))
            continue;
        for (int64_t r = 0; r < fs->v[f].rows; r++, rec += c->row_size) {
            for (int k = 0; k < c->ncols; k++) {
                if (c->cols[k].type != T_STRING)
                    continue;
                uint32_t len = u32_at(rec + c->cols[k].field);
                if (!dis_utf8_valid(heap, len))
                    return ING_REFUSED;
                heap += len;
            }
        }
    }
    return ING_OK;
}

/* plan_transactions, a row at a time: keep[i] for the rows [skip, n) of the chunk. */
typedef struct {
    int rollback_open, open_at_end;
    int64_t last_commit, abandoned, ends_without_start, dropped;
} plan_t;

static plan_t plan(const uint8_t *flags, int64_t m, int in_txn, uint8_t *keep) {
    plan_t p = {0, 0, -1, 0, 0, 0};
    int64_t begin = -1;
    memset(keep, 1, (size_t)m);
    for (int64_t i = 0; i < m; i++) {
        uint8_t f = flags[i];
        if (in_txn && (f == 1 || f == 3)) { /* a Start or SingleRow abandons the open transaction */
            p.abandoned++;
            if (begin < 0)
                p.rollback_open = 1;
            int64_t from = begin < 0 ? 0 : begin;
            memset(keep + from, 0, (size_t)(i - from));
            p.dropped += i - from;
            in_txn = 0;
        }
        if (f == 1) {
            in_txn = 1;
            begin = i;
        } else if (!in_txn) {
            p.last_commit = i;
            if (f == 2)
                p.ends_without_start++;
        } else if (f == 2) {
            in_txn = 0;
            p.last_commit = i;
        }
    }
    p.open_at_end = in_txn;
    return p;
}

static const uint8_t SENTINEL[T_COUNT][8] = {
    [T_BOOL] = {0xFF},
    [T_BYTE] = {0x80},
    [T_SHORT] = {0x00, 0x80},
    [T_INT] = {0x00, 0x00, 0x00, 0x80},
    [T_LONG] = {0, 0, 0, 0, 0, 0, 0, 0x80},
    [T_FLOAT] = {0xFF, 0xFF, 0x7F, 0xFF}, /* -FLT_MAX */
    [T_DOUBLE] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xEF, 0xFF}, /* -DBL_MAX */
    [T_CHAR] = {0xFF, 0xFF},
    [T_TIMESTAMP] = {0, 0, 0, 0, 0, 0, 0, 0x80},
};

static inline void put(dis_file *f, const uint8_t *src, int width) {
    char *dst = f->buf + f->len;
    switch (width) { /* fixed sizes: copies the compiler inlines */
    case 1: *dst = (char)*src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    default: memcpy(dst, src, 8); break;
    }
    f->len += width;
}

/* encode_fixed / encode_string of one row, appended (room reserved by the caller); returns the
 * heap after the row's strings */
static const uint8_t *append_row(dis_core *c, const uint8_t *rec, const uint8_t *heap) {
    int any_null = 0;
    for (int b = 0; b < c->null_bytes; b++)
        any_null |= rec[1 + b];
    for (int k = 0; k < c->ncols; k++) {
        const dis_col *col = &c->cols[k];
        dis_file *f = &c->files[col->file];
        int null = any_null && is_null(rec, k);
        if (col->type == T_STRING) {
            uint32_t len = u32_at(rec + col->field);
            dis_file *dat = f + 1;
            memcpy(dat->buf + dat->len, heap, len);
            dat->len += len;
            heap += len;
            uint64_t end = (uint64_t)(dat->disk + dat->len) | (null ? NULL_BIT : 0);
            memcpy(f->buf + f->len, &end, 8);
            f->len += 8;
        } else if (null) {
            put(f, SENTINEL[col->type], col->width);
        } else if (col->type == T_BOOL) {
            f->buf[f->len++] = rec[col->field] != 0;
        } else {
            put(f, rec + col->field, col->width);
        }
    }
    return heap;
}

/* append_row for every row of a frame, one column at a time: for a frame whose rows are all
 * kept, hold no null and at most one string column (so the frame's heap is that column's bytes
 * in row order, which check_rows saw add up); room reserved by the caller. */
static void append_frame(dis_core *c, const uint8_t *rec, int64_t rows, const uint8_t *heap, int64_t heap_len) {
    int64_t rs = c->row_size;
    for (int k = 0; k < c->ncols; k++) {
        const dis_col *col = &c->cols[k];
        dis_file *f = &c->files[col->file];
        const uint8_t *src = rec + col->field;
        char *dst = f->buf + f->len;
        switch (col->type == T_STRING ? -1 : col->type == T_BOOL ? 0 : col->width) {
        case -1: {
            dis_file *dat = f + 1;
            uint64_t end = (uint64_t)(dat->disk + dat->len);
            for (int64_t r = 0; r < rows; r++) {
                end += u32_at(src + r * rs);
                memcpy(dst + 8 * r, &end, 8);
            }
            memcpy(dat->buf + dat->len, heap, (size_t)heap_len);
            dat->len += heap_len;
            f->len += 8 * rows;
            continue;
        }
        case 0:
            for (int64_t r = 0; r < rows; r++)
                dst[r] = src[r * rs] != 0;
            break;
        case 1:
            for (int64_t r = 0; r < rows; r++)
                dst[r] = (char)src[r * rs];
            break;
        case 2:
            for (int64_t r = 0; r < rows; r++)
                memcpy(dst + 2 * r, src + r * rs, 2);
            break;
        case 4:
            for (int64_t r = 0; r < rows; r++)
                memcpy(dst + 4 * r, src + r * rs, 4);
            break;
        default:
            for (int64_t r = 0; r < rows; r++)
                memcpy(dst + 8 * r, src + r * rs, 8);
            break;
        }
        f->len += rows * (col->type == T_BOOL ? 1 : col->width);
    }
}

static int64_t row_string_bytes(const dis_core *c, const uint8_t *rec) {
    int64_t s = 0;
    for (int k = 0; k < c->ncols; k++)
        if (c->cols[k].type == T_STRING)
            s += u32_at(rec + c->cols[k].field);
    return s;
}

/* Location.ingest after the decode: restart at the resume point, skip_rows, the plan, the rows
 * kept appended, the commit and its source position. */
static int apply(dis_item *it, const frames_t *fs, int64_t n, const uint8_t *flags, int64_t heap_bytes) {
    dis_core *c = it->core;
    const uint8_t *d = it->data;
    if (n == 0)
        return ING_OK;
    int64_t skip = 0;
    if (it->same_source_file && it->base + fs->v[0].start == c->src_offset) {
        /* the sender (re)starts at the resume point: what is past it and not committed is resent */
        if (c->txn_open || c->written != c->committed) {
            it->restarts = 1;
            dis_rollback(c, &it->rolled_back);
            it->dirty = 1;
        }
        skip = c->src_skip < n ? c->src_skip : n;
        if (skip == n)
            return ING_OK;
    }
    int64_t m = n - skip;
    uint8_t *keep = malloc((size_t)m);
    if (!keep)
        return ING_NOMEM;
    plan_t p = plan(flags + skip, m, c->txn_open, keep);
    it->abandoned = p.abandoned;
    it->ends_without_start = p.ends_without_start;
    /* room for the kept rows (their strings at most the heaps), so nothing below can fail half way */
    int64_t kept = m - p.dropped;
    for (int k = 0; k < c->ncols; k++) {
        const dis_col *col = &c->cols[k];
        int fail = col->type == T_STRING
                       ? dis_reserve(&c->files[col->file], kept * 8) || dis_reserve(&c->files[col->file + 1], heap_bytes)
                       : dis_reserve(&c->files[col->file], kept * col->width);
        if (fail) {
            free(keep);
            return ING_NOMEM;
        }
    }
    if (p.rollback_open)
        dis_rollback(c, &it->rolled_back);
    int64_t before = c->written, upto = 0, done_rows = 0, row = 0;
    int64_t commit_frame = -1, commit_first = 0; /* the frame of the last committing row, its first row */
    for (int64_t f = 0; f < fs->n; f++) {
        const uint8_t *rec = d + fs->v[f].start + FRAME_HEADER;
        const uint8_t *heap = rec + fs->v[f].rows * c->row_size;
        int64_t first = row, rows = fs->v[f].rows, i0 = row - skip;
        if (rows && i0 >= 0 && c->nstrings <= 1 && (p.last_commit < i0 || p.last_commit >= i0 + rows - 1) &&
            memchr(keep + i0, 0, (size_t)rows) == NULL && !frame_has_nulls(c, rec, rows)) {
            append_frame(c, rec, rows, heap, fs->v[f].end - fs->v[f].start - FRAME_HEADER - rows * c->row_size);
            row += rows;
            done_rows += rows;
            if (p.last_commit == i0 + rows - 1) {
                upto = done_rows;
                commit_frame = f;
                commit_first = first;
                for (int k = 0; k < c->nfiles; k++)
                    c->files[k].committed = c->files[k].disk + c->files[k].len;
            }
            continue;
        }
        for (int64_t r = 0; r < rows; r++, row++, rec += c->row_size) {
            int64_t i = row - skip;
            if (i < 0 || !keep[i]) {
                if (c->nstrings)
                    heap += row_string_bytes(c, rec);
                continue;
            }
            heap = append_row(c, rec, heap);
            done_rows++;
            if (i == p.last_commit) {
                upto = done_rows;
                commit_frame = f;
                commit_first = first;
                for (int k = 0; k < c->nfiles; k++)
                    c->files[k].committed = c->files[k].disk + c->files[k].len;
            }
        }
    }
    free(keep);
    c->written += kept;
    it->kept = kept;
    it->nbytes = fs->v[fs->n - 1].end - fs->v[0].start;
    if (p.last_commit >= 0) {
        int64_t now = before + upto;
        it->committed_delta = now - c->committed;
        c->committed = now;
        /* _position: just past the frame when the row is its last, else the frame and its rows done */
        int64_t at = p.last_commit + skip;
        const frame_t *fr = &fs->v[commit_frame];
        if (at == commit_first + fr->rows - 1) {
            c->src_offset = it->base + fr->end;
            c->src_skip = 0;
        } else {
            c->src_offset = it->base + fr->start;
            c->src_skip = at - commit_first + 1;
        }
        it->source_moved = 1;
    }
    c->txn_open = p.open_at_end;
    it->dirty = 1;
    return ING_OK;
}

void dis_ingest(dis_item *it) {
    frames_t fs = {NULL, 0, 0};
    uint8_t *flags = NULL;
    int s = scan(it->core, it->data, it->len, it->start, &fs);
    if (s != 0) {
        it->status = s < 0 ? ING_NOMEM : ING_REFUSED;
        goto done;
    }
    it->frames = fs.n;
    if (fs.n == 0) {
        it->status = ING_NO_FRAMES;
        goto done;
    }
    int64_t n = 0, heap_bytes = 0;
    for (int64_t f = 0; f < fs.n; f++)
        n += fs.v[f].rows;
    flags = malloc((size_t)n + 1);
    if (!flags) {
        it->status = ING_NOMEM;
        goto done;
    }
    it->status = check_rows(it->core, it->data, &fs, n, flags, &heap_bytes);
    if (it->status == ING_OK)
        it->status = apply(it, &fs, n, flags, heap_bytes);
done:
    free(fs.v);
    free(flags);
}
