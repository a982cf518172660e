/* disd.binlog.rowencode: the payload of a frame (row records, then the heap) from Arrow columns,
 * in one pass per column and one over the strings, outside the interpreter's lock.
 *
 * Why C: the logger's writer thread encodes every row an application logs.  The numpy encoder
 * (disd.binlog.format.encode_rows_numpy) fills a structured array field by field, gathers the
 * strings row by row with an Arrow take over every string column laid end to end, and copies
 * the records and the heap into the payload: several passes and copies of every byte, all
 * holding the interpreter's lock the application's threads need.  This writes each byte once.
 *
 * The bytes are exactly the numpy encoder's (docs/binlog-format.md): a record is the row's flag,
 * its null bitmap (bit i of byte i / 8: column i is null), then each column's field in schema
 * order, little-endian: a fixed-width value as it is held (a null as 0), a bool as one byte 0 or
 * 1 (a null as 0), a string as the u32 byte length of its value (a null as 0).  The heap holds
 * the UTF-8 bytes of every non-null string, row by row, the string columns of a row in schema
 * order.
 *
 * encode(flags, columns, row_size) -> bytes
 *   flags    bytes-like, one u8 per row (n rows)
 *   columns  ((kind, width, validity or None, values, data or None, offset), ...) in schema
 *            order; kind 0 fixed-width (width 1, 2, 4 or 8), 1 bool (bits), 2 string (int32
 *            offsets); each of n rows from ``offset``
 *   row_size the record's size the caller's layout says (checked)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

enum { KIND_FIXED = 0, KIND_BOOL = 1, KIND_STRING = 2 };

typedef struct {
    int kind, width;
    const uint8_t *valid, *values, *data;
    Py_ssize_t offset, data_len;
    Py_ssize_t field; /* the field's offset in a record */
    Py_buffer bufs[3];
    int held[3];
} column_t;

static inline int is_null(const column_t *c, Py_ssize_t i) {
    Py_ssize_t p = c->offset + i;
    return c->valid != NULL && !((c->valid[p >> 3] >> (p & 7)) & 1);
}

static inline void span(const column_t *c, Py_ssize_t i, int32_t *a, int32_t *b) {
    memcpy(a, c->values + 4 * (c->offset + i), 4);
    memcpy(b, c->values + 4 * (c->offset + i + 1), 4);
}

static void release(column_t *cols, Py_ssize_t ncols) {
    for (Py_ssize_t i = 0; i < ncols; i++)
        for (int j = 0; j < 3; j++)
            if (cols[i].held[j])
                PyBuffer_Release(&cols[i].bufs[j]);
}

static PyObject *encode(PyObject *self, PyObject *args) {
    Py_buffer flags;
    PyObject *columns_arg;
    Py_ssize_t row_size;
    if (!PyArg_ParseTuple(args, "y*On", &flags, &columns_arg, &row_size))
        return NULL;
    PyObject *seq = PySequence_Fast(columns_arg, "columns must be a sequence");
    if (seq == NULL) {
        PyBuffer_Release(&flags);
        return NULL;
    }
    Py_ssize_t n = flags.len, ncols = PySequence_Fast_GET_SIZE(seq), null_bytes = (ncols + 7) / 8;
    column_t *cols = PyMem_Calloc((size_t)ncols + 1, sizeof *cols);
    Py_ssize_t *strings = PyMem_Calloc((size_t)ncols + 1, sizeof *strings);
    PyObject *out = NULL;
    if (cols == NULL || strings == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t field = 1 + null_bytes;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        column_t *c = &cols[i];
        PyObject *objs[3];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiOOOn;a column is (kind, width, validity, values, data, offset)",
                              &c->kind, &c->width, &objs[0], &objs[1], &objs[2], &c->offset))
            goto done;
        int w = c->kind == KIND_FIXED ? c->width : c->kind == KIND_BOOL ? 1 : 4;
        if ((c->kind == KIND_FIXED && w != 1 && w != 2 && w != 4 && w != 8) || c->kind < 0 || c->kind > 2 ||
            c->offset < 0) {
            PyErr_Format(PyExc_ValueError, "column %zd: kind %d, width %d, offset %zd", i, c->kind, c->width, c->offset);
            goto done;
        }
        for (int j = 0; j < 3; j++) {
            if (objs[j] == Py_None)
                continue;
            if (PyObject_GetBuffer(objs[j], &c->bufs[j], PyBUF_SIMPLE) < 0)
                goto done;
            c->held[j] = 1;
        }
        Py_ssize_t end = c->offset + n;
        Py_ssize_t need = c->kind == KIND_FIXED ? end * w : c->kind == KIND_BOOL ? (end + 7) / 8 : 4 * (end + 1);
        if (n > 0 && (!c->held[1] || c->bufs[1].len < need || (c->held[0] && c->bufs[0].len < (end + 7) / 8))) {
            PyErr_Format(PyExc_ValueError, "column %zd's buffers are too short for %zd rows", i, n);
            goto done;
        }
        c->valid = c->held[0] ? c->bufs[0].buf : NULL;
        c->values = c->held[1] ? c->bufs[1].buf : NULL;
        c->data = c->held[2] ? c->bufs[2].buf : (const uint8_t *)"";
        c->data_len = c->held[2] ? c->bufs[2].len : 0;
        c->field = field;
        c->width = w;
        field += w;
    }
    if (field != row_size) {
        PyErr_Format(PyExc_ValueError, "the columns make records of %zd bytes, the layout's are %zd", field, row_size);
        goto done;
    }
    /* the heap's size, the strings' offsets checked against their data on the way */
    Py_ssize_t heap = 0;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        const column_t *c = &cols[i];
        if (c->kind != KIND_STRING)
            continue;
        for (Py_ssize_t r = 0; r < n; r++) {
            int32_t a, b;
            span(c, r, &a, &b);
            if (a < 0 || b < a || b > c->data_len) {
                PyErr_Format(PyExc_ValueError, "column %zd, row %zd: string offsets out of the data", i, r);
                goto done;
            }
            if (!is_null(c, r))
                heap += b - a;
        }
    }
    Py_ssize_t nstrings = 0;
    for (Py_ssize_t i = 0; i < ncols; i++)
        if (cols[i].kind == KIND_STRING)
            strings[nstrings++] = i;
    out = PyBytes_FromStringAndSize(NULL, n * row_size + heap);
    if (out == NULL)
        goto done;
    uint8_t *rec = (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *fl = flags.buf;
    Py_BEGIN_ALLOW_THREADS
    memset(rec, 0, (size_t)(n * row_size));
    for (Py_ssize_t r = 0; r < n; r++)
        rec[r * row_size] = fl[r];
    for (Py_ssize_t i = 0; i < ncols; i++) { /* one column at a time: its fields and null bits */
        const column_t *c = &cols[i];
        uint8_t *f = rec + c->field, bitmask = (uint8_t)(1u << (i & 7));
        uint8_t *nb = rec + 1 + i / 8;
        if (c->kind == KIND_FIXED) { /* (a loop per width: each copy a single move) */
            const uint8_t *v = c->values + c->offset * c->width;
            switch (c->width) {
            case 1:
                for (Py_ssize_t r = 0; r < n; r++, f += row_size)
                    *f = v[r];
                break;
            case 2:
                for (Py_ssize_t r = 0; r < n; r++, f += row_size)
                    memcpy(f, v + 2 * r, 2);
                break;
            case 4:
                for (Py_ssize_t r = 0; r < n; r++, f += row_size)
                    memcpy(f, v + 4 * r, 4);
                break;
            default:
                for (Py_ssize_t r = 0; r < n; r++, f += row_size)
                    memcpy(f, v + 8 * r, 8);
            }
        } else if (c->kind == KIND_BOOL) {
            for (Py_ssize_t r = 0; r < n; r++, f += row_size) {
                Py_ssize_t p = c->offset + r;
                *f = (c->values[p >> 3] >> (p & 7)) & 1;
            }
        } else {
            for (Py_ssize_t r = 0; r < n; r++, f += row_size) {
                int32_t a, b;
                span(c, r, &a, &b);
                uint32_t len = (uint32_t)(b - a);
                memcpy(f, &len, 4);
            }
        }
        if (c->valid != NULL) /* nulls: their bit set, their field 0 */
            for (Py_ssize_t r = 0; r < n; r++)
                if (is_null(c, r)) {
                    nb[r * row_size] |= bitmask;
                    memset(rec + r * row_size + c->field, 0, (size_t)c->width);
                }
    }
    uint8_t *h = rec + n * row_size, *h_end = h + heap;
    if (nstrings == 1 && cols[strings[0]].valid == NULL && n > 0) { /* one string column, no nulls: */
        const column_t *c = &cols[strings[0]]; /* its bytes are the heap, in one piece */
        int32_t a, end;
        memcpy(&a, c->values + 4 * c->offset, 4);
        memcpy(&end, c->values + 4 * (c->offset + n), 4);
        memcpy(h, c->data + a, (size_t)(end - a));
    } else
        for (Py_ssize_t r = 0; r < n; r++) /* the heap: row by row */
            for (Py_ssize_t j = 0; j < nstrings; j++) {
                const column_t *c = &cols[strings[j]];
                if (is_null(c, r))
                    continue;
                int32_t a, b;
                span(c, r, &a, &b);
                size_t len = (size_t)(b - a);
                if (len <= 16 && h + 16 <= h_end && a + 16 <= c->data_len) { /* short: two 8-byte moves */
                    uint64_t x[2];                                              /* (the next string overwrites */
                    memcpy(x, c->data + a, 16);                                 /* what passes this one) */
                    memcpy(h, x, 16);
                } else
                    memcpy(h, c->data + a, len);
                h += len;
            }
    Py_END_ALLOW_THREADS
done:
    if (cols)
        release(cols, ncols);
    PyMem_Free(cols);
    PyMem_Free(strings);
    Py_DECREF(seq);
    PyBuffer_Release(&flags);
    return out;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS, "encode(flags, columns, row_size) -> bytes: a frame's payload (see the source)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "rowencode",
    .m_doc = "A frame's payload from Arrow columns in one pass (see the source).", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit_rowencode(void) { return PyModule_Create(&module); }
