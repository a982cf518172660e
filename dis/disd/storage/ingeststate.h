/* The write state's Python type, shared by the module's two halves: ingestcore.c (the type, its
 * methods, ingest_batch) and ingestwrite.c (the writes: write_out, and the write plan the type's
 * take_io uses). */
#ifndef DIS_INGESTSTATE_H
#define DIS_INGESTSTATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ingestcore.h"

typedef struct {
    PyObject_HEAD
    dis_core core;
    PyObject *src_file; /* the resume point's file name, or None */
    int busy;           /* in an ingest_batch or write_out call */
} State;

extern PyTypeObject dis_StateType;

/* -1 with an exception set when the state is in a call on another thread */
int dis_check_idle(State *s);

/* The writes of one file's buffer, as the block rule makes them: up to the next block boundary,
 * then whole blocks; with ``flush`` the rest too.  ``emit(ctx, bytes, n, offset)`` each; returns
 * the bytes consumed, or -1 when ``emit`` failed. */
typedef int (*dis_emit_fn)(void *ctx, const char *p, int64_t n, int64_t offset);
int64_t dis_plan_writes(const dis_file *f, int64_t block, int flush, dis_emit_fn emit, void *ctx);
int dis_has_writes(const dis_file *f, int64_t block, int flush);
/* n bytes written: dropped from the buffer, whose room is given back unless a sender that is
 * behind (no flush) keeps filling it */
void dis_consumed(dis_file *f, int64_t n, int flush);

PyObject *dis_write_out(PyObject *self, PyObject *arg);

/* ingesttail.c: the write state's mark() and take_tail(), the rows past the mark for a last-by state */
PyObject *dis_state_mark(PyObject *self, PyObject *unused);
PyObject *dis_state_take_tail(PyObject *self, PyObject *unused);

#endif
