/* disd.storage.ingestcore: the byte work of a location's chunks, in C (see ingestcore.c for the
 * module and docs/architecture.md for why).  This header is what the two halves share: the
 * location's write state as plain C data (no Python object is touched while the interpreter's
 * lock is given up) and a chunk's work item.
 *
 * The rules are exactly those of the Python reference path, which stays the specification:
 *   frames          disd.binlog.format.scan_frames, then the chunk must end on a frame boundary
 *   rows            disd.binlog.format.decode_frames (a chunk's frames decoded as one batch)
 *   transactions    disd.storage.transactions.plan_transactions and Location.ingest (restarts,
 *                   skip_rows, abandoned transactions, commit positions)
 *   column bytes    disd.storage.columns.encode_fixed / encode_string
 * tests/storage/test_ingest_differential.py holds the two to the same files, records and acks.
 */
#ifndef DIS_INGESTCORE_H
#define DIS_INGESTCORE_H

#include <stddef.h>
#include <stdint.h>

/* column types, in the order the Python side numbers them (disd.storage.writestate.TYPE_CODES) */
enum { T_BOOL, T_BYTE, T_SHORT, T_INT, T_LONG, T_FLOAT, T_DOUBLE, T_CHAR, T_TIMESTAMP, T_STRING, T_COUNT };

#define FRAME_HEADER 16
#define MAX_FRAME_PAYLOAD (32u << 20)
#define NULL_BIT (UINT64_C(1) << 63)

typedef struct {
    int type;
    int width; /* of the field in the row record (a string's: its u32 length) */
    int field; /* byte offset of the field in the row record */
    int file;  /* its column file (a string's offsets file; its data file is the next one) */
} dis_col;

/* One column file: the bytes [disk, disk + len) are buffered, not written yet. */
typedef struct {
    int64_t disk;      /* the file's size as far as the writes made so far go */
    char *buf;
    int64_t len, cap;
    int64_t truncate;  /* a cut still to make before the next write (a rollback below disk), or -1 */
    int64_t committed; /* the file's size at the committed rows */
    int64_t mark;      /* the file's size at the core's mark_rows (ingesttail.c) */
} dis_file;

typedef struct {
    int ncols, nfiles, nstrings, null_bytes, row_size;
    dis_col *cols;
    dis_file *files;
    int64_t block;                   /* block_size_bytes: every write ends on a block boundary but a flush's */
    int64_t written, committed;      /* rows */
    int txn_open;
    int64_t src_offset, src_skip;    /* the resume point in the source file (its name is the Python side's) */
    int stopped;                     /* in a batch: a chunk of it was not taken, the later ones wait */
    int64_t mark_rows;               /* the rows before those a last-by state takes next (ingesttail.c);
                                      * a rollback below it moves it down to the committed rows */
} dis_core;

/* what became of a chunk */
enum {
    ING_OK = 0,        /* applied (perhaps nothing: no rows, or every row already committed) */
    ING_NO_FRAMES = 1, /* whole, and holds no frame: nothing to apply */
    ING_REFUSED = 2,   /* bad bytes: nothing applied; the reference path names the problem */
    ING_REFERENCE = 3, /* valid only as the reference decodes it (heaps that add up only across frames) */
    ING_NOMEM = 4,
    ING_SKIPPED = 5, /* after a chunk of the same location in the batch that was not taken: not looked at */
};

typedef struct {
    /* in */
    dis_core *core;
    const uint8_t *data;  /* the chunk */
    int64_t len;
    int64_t base;         /* the log offset of data[0] */
    int64_t start;        /* where its frames start in data (past the header of a file's first chunk) */
    int same_source_file; /* the chunk is of the file the resume point names */
    /* out */
    int status;
    int dirty;            /* rows taken or cut back: a flush has something to publish */
    int source_moved;     /* src_offset/src_skip now name a position in this chunk's file */
    int64_t frames;
    int64_t kept, committed_delta, nbytes;
    int64_t abandoned, ends_without_start, restarts, rolled_back;
    int64_t committed_after;  /* the location's committed rows after this chunk */
} dis_item;

uint32_t dis_crc32c(uint32_t crc, const void *buf, size_t len);
int dis_utf8_valid(const uint8_t *s, size_t n);
void dis_ingest(dis_item *it);
void dis_rollback(dis_core *c, int64_t *rolled);
int dis_reserve(dis_file *f, int64_t extra);

#endif
