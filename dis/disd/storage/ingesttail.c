/* The rows a chunk appended, handed to a location's last-by state as Arrow buffers (the write
 * state's mark() and take_tail(); storage.ingest calls them around ingest_batch).
 *
 * Why: a last-by state's update needs the rows each publish adds.  Reading them back from the
 * column files, or decoding the chunk a second time in Python, cost more than the compiled
 * ingest itself; but the bytes the compiled path just appended are still in the write state's
 * buffers (writes are made after the batch's byte work), in the column files' layout.  So the
 * location marks where its rows end before the call, and takes the rows past the mark after
 * it: fixed-width columns as their bytes (a null is its sentinel, as in the file: the last-by
 * update treats it as null), a bool column as Arrow's bits and validity, a string column as
 * Arrow's 32-bit offsets, validity and data.  A rollback below the mark moves it down to the
 * committed rows (dis_rollback), so what is taken is exactly the rows the call left written
 * past the rows already handed over (their first row says where they start). */
#include "ingeststate.h"

#include <string.h>

static void mark(dis_core *c) {
    c->mark_rows = c->written;
    for (int i = 0; i < c->nfiles; i++)
        c->files[i].mark = c->files[i].disk + c->files[i].len;
}

/* the bytes [f->mark, end of f) as they sit in the buffer, or NULL when some were written out */
static const char *marked(const dis_file *f, int64_t *n) {
    if (f->mark < f->disk || f->mark > f->disk + f->len)
        return NULL;
    *n = f->disk + f->len - f->mark;
    return f->buf ? f->buf + (f->mark - f->disk) : ""; /* (no buffer yet: no bytes) */
}

static PyObject *bitmap(int64_t n) { return PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((n + 7) / 8)); }

/* (validity or None, null_count, values, None) of a fixed-width column's n rows */
static PyObject *fixed_column(const dis_col *col, const char *p, int64_t n) {
    if (col->type != T_BOOL)
        return Py_BuildValue("(OiNO)", Py_None, 0, PyBytes_FromStringAndSize(p, (Py_ssize_t)(n * col->width)),
                             Py_None);
    PyObject *valid = bitmap(n), *vals = bitmap(n);
    if (!valid || !vals) {
        Py_XDECREF(valid);
        Py_XDECREF(vals);
        return NULL;
    }
    uint8_t *v = (uint8_t *)PyBytes_AS_STRING(valid), *b = (uint8_t *)PyBytes_AS_STRING(vals);
    memset(v, 0, (size_t)(n + 7) / 8);
    memset(b, 0, (size_t)(n + 7) / 8);
    int64_t nulls = 0;
    for (int64_t i = 0; i < n; i++) { /* stored: 0 false, 1 true, 0xFF null (decode_fixed) */
        int8_t x = (int8_t)p[i];
        nulls += x < 0;
        v[i >> 3] |= (uint8_t)((x >= 0) << (i & 7));
        b[i >> 3] |= (uint8_t)((x > 0) << (i & 7));
    }
    if (!nulls)
        Py_SETREF(valid, Py_NewRef(Py_None));
    return Py_BuildValue("(NLNO)", valid, (long long)nulls, vals, Py_None);
}

/* (validity or None, null_count, offsets, data) of a string column's n rows: its offsets file's
 * entries (each the end of its value, with the null bit) and its data file's bytes; None when the
 * data do not fit 32-bit offsets */
static PyObject *string_column(const char *p, const dis_file *dat, int64_t n) {
    int64_t len;
    const char *data = marked(dat, &len);
    if (!data || len >= ((int64_t)1 << 31))
        Py_RETURN_NONE;
    PyObject *valid = bitmap(n), *ends = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * (n + 1)));
    PyObject *bytes = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    if (!valid || !ends || !bytes) {
        Py_XDECREF(valid);
        Py_XDECREF(ends);
        Py_XDECREF(bytes);
        return NULL;
    }
    uint8_t *v = (uint8_t *)PyBytes_AS_STRING(valid);
    int32_t *o = (int32_t *)PyBytes_AS_STRING(ends);
    memset(v, 0, (size_t)(n + 7) / 8);
    o[0] = 0;
    int64_t nulls = 0, last = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t e;
        memcpy(&e, p + 8 * i, 8);
        int64_t end = (int64_t)(e & ~NULL_BIT) - dat->mark;
        if (end < last || end > len) { /* (never, for bytes this module appended) */
            Py_DECREF(valid);
            Py_DECREF(ends);
            Py_DECREF(bytes);
            Py_RETURN_NONE;
        }
        o[i + 1] = (int32_t)(last = end);
        int null = (e & NULL_BIT) != 0;
        nulls += null;
        v[i >> 3] |= (uint8_t)(!null << (i & 7));
    }
    if (!nulls)
        Py_SETREF(valid, Py_NewRef(Py_None));
    return Py_BuildValue("(NLNN)", valid, (long long)nulls, ends, bytes);
}

/* take_tail() -> (first_row, rows, columns) or None: the rows past the mark, one tuple a column
 * (see above); None when they are not all in the buffers.  The mark moves past them either way. */
static PyObject *take_tail(dis_core *c) {
    int64_t first = c->mark_rows, n = c->written - first;
    PyObject *cols = n >= 0 ? PyList_New(c->ncols) : NULL, *result = NULL;
    if (n < 0)
        goto unusable;
    if (!cols)
        return NULL;
    for (int k = 0; k < c->ncols; k++) {
        const dis_col *col = &c->cols[k];
        const dis_file *f = &c->files[col->file];
        int64_t len;
        const char *p = marked(f, &len);
        if (!p || len != n * (col->type == T_STRING ? 8 : col->width))
            goto unusable;
        PyObject *t = col->type == T_STRING ? string_column(p, f + 1, n) : fixed_column(col, p, n);
        if (!t)
            goto done;
        PyList_SET_ITEM(cols, k, t);
        if (t == Py_None)
            goto unusable;
    }
    result = Py_BuildValue("(LLO)", (long long)first, (long long)n, cols);
    goto done;
unusable:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(cols);
    mark(c);
    return result;
}

PyObject *dis_state_mark(PyObject *self, PyObject *unused) {
    if (dis_check_idle((State *)self))
        return NULL;
    mark(&((State *)self)->core);
    Py_RETURN_NONE;
}

PyObject *dis_state_take_tail(PyObject *self, PyObject *unused) {
    if (dis_check_idle((State *)self))
        return NULL;
    return take_tail(&((State *)self)->core);
}
