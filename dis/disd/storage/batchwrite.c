/* disd.storage.batchwrite: several positional writes, to several descriptors, in one call that
 * holds the interpreter's lock only while it reads its arguments.
 *
 * Why C: a location's flush writes each of its column files' buffered bytes, one pwrite per file
 * (five for a table of four columns with a string).  Made from Python, each pwrite gives up the
 * interpreter's lock and waits to take it back; with a Multiplex call's reader flushing a
 * caught-up location after every chunk while other threads decode, that wait is two thread
 * switches at best, per file, per flush (docs/benchmarks-history.md, "a location's flush in one
 * call").
 * Here the lock is given up once for all of them.
 *
 * The calls are exactly those of the Python path it replaces (disd.storage.fsio.pwrite_all's
 * composition): for each write in order, pwrite until every byte is written (a short write goes
 * on from where it stopped, EINTR is retried), and nothing after a write that failed.
 *
 * pwrite_all(writes) -> (done, errno)
 *   writes  a sequence of (fd, bytes-like, offset)
 *   done    how many writes were completed, in order
 *   errno   0 when every write was completed; else the errno of write ``done``, of which some
 *           bytes may have been written
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <unistd.h>

typedef struct {
    int fd;
    Py_buffer data;
    long long offset;
} write_t;

static PyObject *pwrite_all(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "writes must be a sequence of (fd, data, offset)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), parsed = 0;
    PyObject *result = NULL;
    write_t *writes = PyMem_Calloc((size_t)count + 1, sizeof *writes);
    if (writes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; parsed < count; parsed++) {
        write_t *w = &writes[parsed];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, parsed), "iy*L;a write is (fd, data, offset)", &w->fd,
                              &w->data, &w->offset))
            goto done;
        if (w->offset < 0) {
            PyBuffer_Release(&w->data);
            PyErr_SetString(PyExc_ValueError, "a write's offset must not be negative");
            goto done;
        }
    }

    Py_ssize_t completed = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; completed < count; completed++) {
        const char *p = writes[completed].data.buf;
        size_t left = (size_t)writes[completed].data.len;
        off_t at = (off_t)writes[completed].offset;
        while (left > 0) {
            ssize_t n = pwrite(writes[completed].fd, p, left, at);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                err = errno;
                break;
            }
            p += n;
            left -= (size_t)n;
            at += n;
        }
        if (err)
            break;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(ni)", completed, err);

done:
    for (Py_ssize_t i = 0; i < parsed; i++)
        PyBuffer_Release(&writes[i].data);
    PyMem_Free(writes);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"pwrite_all", pwrite_all, METH_O, "pwrite_all(writes) -> (done, errno); writes: ((fd, data, offset), ...)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "batchwrite",
    "Several positional writes in one call outside the interpreter's lock (see the source).", -1, methods,
};

PyMODINIT_FUNC PyInit_batchwrite(void) { return PyModule_Create(&module); }
