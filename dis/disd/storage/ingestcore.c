/* disd.storage.ingestcore: a location's write state in C, and the byte work of many locations'
 * chunks in one call that gives up the interpreter's lock once.
 *
 * Why C: at thousands of live locations a DIS takes thousands of small chunks a second, and the
 * Python path spent some 200 us of interpreter time on each (scan, decode into Arrow, plan,
 * encode, buffer, flush), so one interpreter could not carry them (docs/benchmarks-history.md,
 * "the limit").  Here a Multiplex request's chunks are scanned, checked, decoded, planned and appended
 * to their locations' buffers in one loop over plain C data, and their writes made in another
 * (docs/architecture.md, "The ingest path").
 *
 * WriteState(kinds, block_size)   a location's write state (disd.storage.writestate.WriteState's
 *                                 methods; PyWriteState is the same in Python, the reference)
 * ingest_batch(items) -> results  items: (state, data, base, start, file_name, same_source_file)
 *                                 results: (status, dirty, frames, kept, committed_delta, nbytes,
 *                                           abandoned, ends_without_start, restarts, rolled_back,
 *                                           committed_after); a location's chunks after one that
 *                                 was not taken are SKIPPED, left for the caller to send again
 * write_out(jobs) -> (failures, write_sizes, transient_opens)
 *                                 jobs: (state, files, flush), files[i] a pinned descriptor or
 *                                 (path, st_dev, st_ino) to open for the writes alone; failures[j]
 *                                 None or (file, op, errno, kind); write_sizes: counts per bucket
 *                                 of dis_write_size_bytes, then their sum
 *
 * WriteState.mark(), take_tail()   the rows a call appended, for a last-by state (ingesttail.c)
 * The caller holds each location's lock across both calls: no other thread touches a state
 * while its chunks are worked on (a state in a call refuses its own methods meanwhile). */
#include "ingeststate.h"


static const int WIDTH[T_COUNT] = {1, 1, 2, 4, 8, 4, 8, 2, 8, 4};

int dis_check_idle(State *s) {
    if (s->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the write state is in a call on another thread");
        return -1;
    }
    return 0;
}

static void State_dealloc(State *s) {
    if (s->core.files)
        for (int i = 0; i < s->core.nfiles; i++)
            free(s->core.files[i].buf);
    PyMem_Free(s->core.files);
    PyMem_Free(s->core.cols);
    Py_XDECREF(s->src_file);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int State_init(State *s, PyObject *args, PyObject *kw) {
    Py_buffer kinds;
    long long block;
    if (!PyArg_ParseTuple(args, "y*L", &kinds, &block))
        return -1;
    int ncols = (int)kinds.len, rc = -1;
    if (s->core.cols != NULL || block < 1) {
        PyErr_SetString(PyExc_ValueError, s->core.cols ? "already initialised" : "block_size must be positive");
        goto done;
    }
    dis_core *c = &s->core;
    c->cols = PyMem_Calloc((size_t)ncols + 1, sizeof *c->cols);
    c->files = PyMem_Calloc((size_t)ncols * 2 + 1, sizeof *c->files);
    if (!c->cols || !c->files) {
        PyErr_NoMemory();
        goto done;
    }
    c->ncols = ncols;
    c->null_bytes = (ncols + 7) / 8;
    int field = 1 + c->null_bytes, file = 0;
    for (int k = 0; k < ncols; k++) {
        int t = ((const unsigned char *)kinds.buf)[k];
        if (t >= T_COUNT) {
            PyErr_Format(PyExc_ValueError, "unknown column type code %d", t);
            goto done;
        }
        c->cols[k] = (dis_col){t, WIDTH[t], field, file};
        field += WIDTH[t];
        file += t == T_STRING ? 2 : 1;
        c->nstrings += t == T_STRING;
    }
    c->row_size = field;
    c->nfiles = file;
    for (int i = 0; i < file; i++)
        c->files[i].truncate = -1;
    c->block = block;
    Py_INCREF(Py_None);
    s->src_file = Py_None;
    rc = 0;
done:
    PyBuffer_Release(&kinds);
    return rc;
}

static PyObject *sizes_tuple(State *s, int committed) {
    PyObject *t = PyTuple_New(s->core.nfiles);
    for (int i = 0; t && i < s->core.nfiles; i++) {
        dis_file *f = &s->core.files[i];
        PyObject *v = PyLong_FromLongLong(committed ? f->committed : f->disk + f->len);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static int read_sizes(State *s, PyObject *seq_obj, int64_t *out) {
    PyObject *seq = PySequence_Fast(seq_obj, "sizes must be a sequence");
    if (!seq)
        return -1;
    int rc = -1;
    if (PySequence_Fast_GET_SIZE(seq) != s->core.nfiles) {
        PyErr_Format(PyExc_ValueError, "%d sizes expected", s->core.nfiles);
        goto done;
    }
    for (int i = 0; i < s->core.nfiles; i++) {
        out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (out[i] == -1 && PyErr_Occurred())
            goto done;
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

static int set_source(State *s, PyObject *v) {
    PyObject *file;
    long long off, skip;
    if (!PyArg_ParseTuple(v, "OLL;source is (file_name, offset, skip_rows)", &file, &off, &skip))
        return -1;
    Py_INCREF(file);
    Py_SETREF(s->src_file, file);
    s->core.src_offset = off;
    s->core.src_skip = skip;
    return 0;
}

/* reset(rows, sizes, source): everything at the checkpoint: nothing buffered, nothing to cut */
static PyObject *State_reset(State *s, PyObject *args) {
    long long rows;
    PyObject *sizes, *source;
    if (dis_check_idle(s) || !PyArg_ParseTuple(args, "LOO", &rows, &sizes, &source))
        return NULL;
    int64_t v[s->core.nfiles + 1];
    if (read_sizes(s, sizes, v) || set_source(s, source))
        return NULL;
    for (int i = 0; i < s->core.nfiles; i++) {
        dis_file *f = &s->core.files[i];
        f->disk = f->committed = f->mark = v[i];
        f->len = 0;
        f->truncate = -1;
    }
    s->core.written = s->core.committed = s->core.mark_rows = rows;
    s->core.txn_open = 0;
    Py_RETURN_NONE;
}

/* append(parts, rows): each file's bytes (one part a file), rows more written */
static PyObject *State_append(State *s, PyObject *args) {
    PyObject *parts_obj;
    long long rows;
    if (dis_check_idle(s) || !PyArg_ParseTuple(args, "OL", &parts_obj, &rows))
        return NULL;
    PyObject *parts = PySequence_Fast(parts_obj, "parts must be a sequence");
    if (!parts)
        return NULL;
    if (PySequence_Fast_GET_SIZE(parts) != s->core.nfiles) {
        Py_DECREF(parts);
        return PyErr_Format(PyExc_ValueError, "%d parts expected", s->core.nfiles);
    }
    Py_buffer views[s->core.nfiles + 1];
    int got = 0;
    PyObject *result = NULL;
    for (; got < s->core.nfiles; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(parts, got), &views[got], PyBUF_C_CONTIGUOUS) != 0)
            goto done;
    for (int i = 0; i < s->core.nfiles; i++)
        if (dis_reserve(&s->core.files[i], views[i].len) != 0) {
            PyErr_NoMemory();
            goto done;
        }
    for (int i = 0; i < s->core.nfiles; i++) {
        dis_file *f = &s->core.files[i];
        memcpy(f->buf + f->len, views[i].buf, (size_t)views[i].len);
        f->len += views[i].len;
    }
    s->core.written += rows;
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    Py_DECREF(parts);
    return result;
}

/* commit(rows, sizes): the committed rows and the files' sizes at them */
static PyObject *State_commit(State *s, PyObject *args) {
    long long rows;
    PyObject *sizes;
    if (dis_check_idle(s) || !PyArg_ParseTuple(args, "LO", &rows, &sizes))
        return NULL;
    int64_t v[s->core.nfiles + 1];
    if (read_sizes(s, sizes, v))
        return NULL;
    for (int i = 0; i < s->core.nfiles; i++)
        s->core.files[i].committed = v[i];
    s->core.committed = rows;
    Py_RETURN_NONE;
}

static PyObject *State_rollback(State *s, PyObject *unused) {
    if (dis_check_idle(s))
        return NULL;
    int64_t rolled = 0;
    dis_rollback(&s->core, &rolled);
    return PyLong_FromLongLong(rolled);
}

static PyObject *State_size(State *s, PyObject *arg) {
    long i = PyLong_AsLong(arg);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0 || i >= s->core.nfiles)
        return PyErr_Format(PyExc_IndexError, "no column file %ld", i);
    return PyLong_FromLongLong(s->core.files[i].disk + s->core.files[i].len);
}

static PyObject *State_sizes(State *s, PyObject *unused) { return sizes_tuple(s, 0); }
static PyObject *State_committed_sizes(State *s, PyObject *unused) { return sizes_tuple(s, 1); }

static PyObject *State_needs_io(State *s, PyObject *flush) {
    int fl = PyObject_IsTrue(flush);
    for (int i = 0; i < s->core.nfiles; i++)
        if (dis_has_writes(&s->core.files[i], s->core.block, fl))
            Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

typedef struct {
    PyObject *list;
    int file;
} collect_ctx;

static int collect(void *ctx, const char *p, int64_t n, int64_t offset) {
    collect_ctx *c = ctx;
    PyObject *t = Py_BuildValue("(iy#L)", c->file, p, (Py_ssize_t)n, (long long)offset);
    if (!t)
        return -1;
    int rc = PyList_Append(c->list, t);
    Py_DECREF(t);
    return rc;
}

/* take_io(flush) -> (truncates, writes): the cuts and writes due, as copies, the state advanced as
 * if they were made (for a file system that makes them itself, one call each) */
static PyObject *State_take_io(State *s, PyObject *flush) {
    if (dis_check_idle(s))
        return NULL;
    int fl = PyObject_IsTrue(flush);
    PyObject *cuts = PyList_New(0), *writes = PyList_New(0);
    if (!cuts || !writes)
        goto fail;
    for (int i = 0; i < s->core.nfiles; i++) {
        dis_file *f = &s->core.files[i];
        if (f->truncate >= 0) {
            PyObject *t = Py_BuildValue("(iL)", i, (long long)f->truncate);
            if (!t || PyList_Append(cuts, t)) {
                Py_XDECREF(t);
                goto fail;
            }
            Py_DECREF(t);
            f->truncate = -1;
        }
        collect_ctx ctx = {writes, i};
        int64_t n = dis_plan_writes(f, s->core.block, fl, collect, &ctx);
        if (n < 0)
            goto fail;
        dis_consumed(f, n, fl);
    }
    return Py_BuildValue("(NN)", cuts, writes);
fail:
    Py_XDECREF(cuts);
    Py_XDECREF(writes);
    return NULL;
}

/* -- chunks ------------------------------------------------------------------------------------ */

static PyObject *ingest_batch(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "items must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), parsed = 0;
    dis_item *items = PyMem_Calloc((size_t)count + 1, sizeof *items);
    Py_buffer *views = PyMem_Calloc((size_t)count + 1, sizeof *views);
    PyObject **names = PyMem_Calloc((size_t)count + 1, sizeof *names);
    State **states = PyMem_Calloc((size_t)count + 1, sizeof *states);
    PyObject *result = NULL;
    if (!items || !views || !names || !states) {
        PyErr_NoMemory();
        goto done;
    }
    for (; parsed < count; parsed++) {
        dis_item *it = &items[parsed];
        long long base, start;
        int same;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, parsed), "O!y*LLOp", &dis_StateType, &states[parsed],
                              &views[parsed], &base, &start, &names[parsed], &same))
            goto done;
        if (dis_check_idle(states[parsed]) || start < 0 || start > views[parsed].len) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "start is outside the chunk");
            PyBuffer_Release(&views[parsed]);
            goto done;
        }
        it->core = &states[parsed]->core;
        it->data = views[parsed].buf;
        it->len = views[parsed].len;
        it->base = base;
        it->start = start;
        it->same_source_file = same;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        states[k]->busy++;
        states[k]->core.stopped = 0;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count; k++) {
        dis_item *it = &items[k];
        if (it->core->stopped) {
            it->status = ING_SKIPPED;
            continue;
        }
        dis_ingest(it);
        if (it->status != ING_OK && it->status != ING_NO_FRAMES)
            it->core->stopped = 1; /* its later chunks wait for the reference to deal with this one */
        it->committed_after = it->core->committed;
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count; k++)
        states[k]->busy--;
    result = PyList_New(count);
    for (Py_ssize_t k = 0; result && k < count; k++) {
        dis_item *it = &items[k];
        if (it->source_moved) {
            Py_INCREF(names[k]);
            Py_SETREF(states[k]->src_file, names[k]);
        }
        PyObject *t = Py_BuildValue("(iiLLLLLLLLL)", it->status, it->dirty, (long long)it->frames,
                                    (long long)it->kept, (long long)it->committed_delta, (long long)it->nbytes,
                                    (long long)it->abandoned, (long long)it->ends_without_start,
                                    (long long)it->restarts, (long long)it->rolled_back,
                                    (long long)it->committed_after);
        if (!t) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, k, t);
    }
done:
    for (Py_ssize_t k = 0; k < parsed; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(items);
    PyMem_Free(views);
    PyMem_Free(names);
    PyMem_Free(states);
    Py_DECREF(seq);
    return result;
}

static PyObject *crc32c(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) != 0)
        return NULL;
    uint32_t v = dis_crc32c(0, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(v);
}

static PyObject *utf8_valid(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) != 0)
        return NULL;
    int v = dis_utf8_valid(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyBool_FromLong(v);
}

/* -- the type's attributes ------------------------------------------------------------------- */

static PyObject *get_written(State *s, void *c) { return PyLong_FromLongLong(s->core.written); }
static PyObject *get_committed(State *s, void *c) { return PyLong_FromLongLong(s->core.committed); }
static PyObject *get_txn(State *s, void *c) { return PyBool_FromLong(s->core.txn_open); }
static PyObject *get_nfiles(State *s, void *c) { return PyLong_FromLong(s->core.nfiles); }

static int set_txn(State *s, PyObject *v, void *c) {
    int t = v ? PyObject_IsTrue(v) : -1;
    if (t < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "txn_open cannot be deleted");
        return -1;
    }
    s->core.txn_open = t;
    return 0;
}

static PyObject *get_source(State *s, void *c) {
    return Py_BuildValue("(OLL)", s->src_file, (long long)s->core.src_offset, (long long)s->core.src_skip);
}

static int set_source_attr(State *s, PyObject *v, void *c) {
    if (!v) {
        PyErr_SetString(PyExc_TypeError, "source cannot be deleted");
        return -1;
    }
    return set_source(s, v);
}

static PyObject *get_buffered(State *s, void *c) {
    int64_t n = 0;
    for (int i = 0; i < s->core.nfiles; i++)
        n += s->core.files[i].len;
    return PyLong_FromLongLong(n);
}

static PyGetSetDef State_getset[] = {
    {"written_rows", (getter)get_written, NULL, "rows written (buffered or in the files)", NULL},
    {"committed_rows", (getter)get_committed, NULL, "rows committed", NULL},
    {"txn_open", (getter)get_txn, (setter)set_txn, "a transaction is open", NULL},
    {"source", (getter)get_source, (setter)set_source_attr, "(file_name, offset, skip_rows) of the resume point",
     NULL},
    {"nfiles", (getter)get_nfiles, NULL, "column files", NULL},
    {"buffered", (getter)get_buffered, NULL, "bytes buffered, not written yet", NULL},
    {NULL},
};

static PyMethodDef State_methods[] = {
    {"reset", (PyCFunction)State_reset, METH_VARARGS, "reset(rows, sizes, source)"},
    {"append", (PyCFunction)State_append, METH_VARARGS, "append(parts, rows)"},
    {"commit", (PyCFunction)State_commit, METH_VARARGS, "commit(rows, sizes)"},
    {"rollback", (PyCFunction)State_rollback, METH_NOARGS, "rollback() -> rows cut"},
    {"mark", dis_state_mark, METH_NOARGS, "mark(): the rows written so far are handed over (ingesttail.c)"},
    {"take_tail", dis_state_take_tail, METH_NOARGS, "take_tail() -> (first_row, rows, columns) or None (ingesttail.c)"},
    {"size", (PyCFunction)State_size, METH_O, "size(file) -> its size, buffered bytes included"},
    {"sizes", (PyCFunction)State_sizes, METH_NOARGS, "sizes() -> every file's size"},
    {"committed_sizes", (PyCFunction)State_committed_sizes, METH_NOARGS, "every file's size at the committed rows"},
    {"needs_io", (PyCFunction)State_needs_io, METH_O, "needs_io(flush) -> whether cuts or writes are due"},
    {"take_io", (PyCFunction)State_take_io, METH_O, "take_io(flush) -> (truncates, writes)"},
    {NULL},
};

PyTypeObject dis_StateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "disd.storage.ingestcore.WriteState",
    .tp_basicsize = sizeof(State),
    .tp_dealloc = (destructor)State_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A location's write state (see disd.storage.writestate)",
    .tp_methods = State_methods,
    .tp_getset = State_getset,
    .tp_init = (initproc)State_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"ingest_batch", ingest_batch, METH_O, "ingest_batch(items) -> results (see the source)"},
    {"write_out", dis_write_out, METH_O, "write_out(jobs) -> (failures, write_sizes, transient_opens)"},
    {"crc32c", crc32c, METH_O, "crc32c(data) -> the CRC32C of the bytes"},
    {"utf8_valid", utf8_valid, METH_O, "utf8_valid(data) -> whether the bytes are UTF-8"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ingestcore", "A location's write state and chunks' byte work in C (see the source).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_ingestcore(void) {
    if (PyType_Ready(&dis_StateType) < 0)
        return NULL;
    dis_crc32c(0, "", 0); /* the tables and the CPU check, made here under the interpreter's lock */
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&dis_StateType);
    if (PyModule_AddObject(m, "WriteState", (PyObject *)&dis_StateType) < 0) {
        Py_DECREF(&dis_StateType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "OK", ING_OK);
    PyModule_AddIntConstant(m, "NO_FRAMES", ING_NO_FRAMES);
    PyModule_AddIntConstant(m, "REFUSED", ING_REFUSED);
    PyModule_AddIntConstant(m, "REFERENCE", ING_REFERENCE);
    PyModule_AddIntConstant(m, "NOMEM", ING_NOMEM);
    PyModule_AddIntConstant(m, "SKIPPED", ING_SKIPPED);
    return m;
}
