/* The writes of compiled write states (disd.storage.ingestcore.write_out; storage.writeout):
 * every due cut and write of many locations in one call that gives up the interpreter's lock
 * once.  A file with a pinned descriptor is written on it; one without (its descriptor reclaimed:
 * more column files than max_open_files) is opened for its writes alone, its identity (device,
 * inode) checked as a reopen checks it, and closed again.  Each write is as the block rule makes
 * it (dis_plan_writes), pwrite until whole; write sizes are counted for dis_write_size_bytes. */
#include "ingeststate.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* -- writes ------------------------------------------------------------------------------------ */

/* The writes of one file's buffer, as ColumnFileWriter made them: up to the next block boundary,
 * then whole blocks; with ``flush`` the rest too.  Calls ``emit(at, bytes, offset)`` for each;
 * returns the bytes consumed, or -1 when ``emit`` failed. */

int64_t dis_plan_writes(const dis_file *f, int64_t block, int flush, dis_emit_fn emit, void *ctx) {
    int64_t pos = 0, disk = f->disk;
    for (;;) {
        int64_t limit = block - disk % block;
        if (f->len - pos < limit)
            break;
        if (emit(ctx, f->buf + pos, limit, disk) != 0)
            return -1;
        pos += limit;
        disk += limit;
    }
    if (flush && pos < f->len) {
        if (emit(ctx, f->buf + pos, f->len - pos, disk) != 0)
            return -1;
        pos = f->len;
    }
    return pos;
}

int dis_has_writes(const dis_file *f, int64_t block, int flush) {
    return f->truncate >= 0 || (flush ? f->len > 0 : f->len >= block - f->disk % block);
}

void dis_consumed(dis_file *f, int64_t n, int flush) {
    int64_t filled = f->len; /* what the buffer held for these writes */
    memmove(f->buf, f->buf + n, (size_t)(f->len - n));
    f->len -= n;
    f->disk += n;
    /* Give back what a big chunk needed.  Not while its sender is behind (no flush) and the fill
     * just written used a quarter of it or more: the next big chunk would grow it again, each of
     * its pages faulted in afresh; once the sender has caught up (a flush), or the fills no longer
     * use it, it goes back, so an idle location does not hold a big chunk's room. */
    int busy = !flush && filled >= f->cap / 4;
    if (f->cap > (INT64_C(1) << 17) && f->len < f->cap / 4 && !busy) {
        int64_t cap = 256;
        while (cap < f->len)
            cap *= 2;
        char *b = realloc(f->buf, (size_t)cap);
        if (b) {
            f->buf = b;
            f->cap = cap;
        }
    }
}

#define BUCKETS 9
static const int64_t BOUNDS[BUCKETS - 1] = {1, 16, 256, 1024, 4096, 16384, 32768, 65536};

typedef struct {
    int fd;
    const char *op;
    int err;
    int64_t sizes[BUCKETS];
    int64_t sum;
} write_ctx;

static int pwrite_whole(void *ctx, const char *p, int64_t n, int64_t offset) {
    write_ctx *w = ctx;
    int64_t total = n;
    while (n > 0) {
        ssize_t k = pwrite(w->fd, p, (size_t)n, (off_t)offset);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            w->op = "pwrite";
            w->err = errno;
            return -1;
        }
        p += k;
        n -= k;
        offset += k;
    }
    int b = 0;
    while (b < BUCKETS - 1 && total > BOUNDS[b])
        b++;
    w->sizes[b]++;
    w->sum += total;
    return 0;
}

typedef struct {
    State *state;
    int flush;
    int *fds;                       /* a pinned descriptor, or -1: open the file for the writes */
    const char **paths;
    unsigned long long *dev, *ino;
    /* out */
    int failed_file, kind, err;     /* kind: 0 an OS error, 1 the file is gone, 2 replaced */
    const char *op;
} job_t;

static void run_job(job_t *j, write_ctx *w, int64_t *transient) {
    dis_core *c = &j->state->core;
    j->failed_file = -1;
    for (int i = 0; i < c->nfiles; i++) {
        dis_file *f = &c->files[i];
        if (!dis_has_writes(f, c->block, j->flush))
            continue;
        int fd = j->fds[i], own = 0;
        w->err = 0;
        if (fd < 0) {
            fd = open(j->paths[i], O_RDWR | O_CLOEXEC);
            if (fd < 0) {
                j->op = "open", j->err = errno, j->kind = errno == ENOENT ? 1 : 0, j->failed_file = i;
                return;
            }
            own = 1;
            ++*transient;
            struct stat st;
            if (fstat(fd, &st) != 0) {
                j->op = "fstat", j->err = errno, j->kind = 0, j->failed_file = i;
                close(fd);
                return;
            }
            if ((unsigned long long)st.st_dev != j->dev[i] || (unsigned long long)st.st_ino != j->ino[i]) {
                j->op = "open", j->err = 0, j->kind = 2, j->failed_file = i;
                close(fd);
                return;
            }
        }
        if (f->truncate >= 0) {
            if (ftruncate(fd, (off_t)f->truncate) != 0) {
                j->op = "ftruncate", j->err = errno, j->kind = 0, j->failed_file = i;
                if (own)
                    close(fd);
                return;
            }
            f->truncate = -1;
        }
        w->fd = fd;
        int64_t n = dis_plan_writes(f, c->block, j->flush, pwrite_whole, w);
        if (own)
            close(fd);
        if (n < 0) {
            j->op = w->op, j->err = w->err, j->kind = 0, j->failed_file = i;
            return;
        }
        dis_consumed(f, n, j->flush);
    }
}

PyObject *dis_write_out(PyObject *self, PyObject *arg) {
    PyObject *jobs_seq = PySequence_Fast(arg, "jobs must be a sequence of (state, files, flush)");
    if (!jobs_seq)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(jobs_seq), parsed = 0;
    job_t *jobs = PyMem_Calloc((size_t)count + 1, sizeof *jobs);
    PyObject *result = NULL;
    if (!jobs) {
        PyErr_NoMemory();
        goto done;
    }
    for (; parsed < count; parsed++) {
        job_t *j = &jobs[parsed];
        PyObject *files, *flush;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(jobs_seq, parsed), "O!OO", &dis_StateType, &j->state, &files,
                              &flush))
            goto done;
        if (dis_check_idle(j->state))
            goto done;
        int n = j->state->core.nfiles;
        if (!PyTuple_Check(files) || PyTuple_GET_SIZE(files) != n) {
            PyErr_Format(PyExc_ValueError, "files must be a tuple of %d", n);
            goto done;
        }
        j->flush = PyObject_IsTrue(flush);
        j->fds = PyMem_Calloc((size_t)n + 1, sizeof *j->fds);
        j->paths = PyMem_Calloc((size_t)n + 1, sizeof *j->paths);
        j->dev = PyMem_Calloc((size_t)n + 1, sizeof *j->dev);
        j->ino = PyMem_Calloc((size_t)n + 1, sizeof *j->ino);
        if (!j->fds || !j->paths || !j->dev || !j->ino) {
            PyErr_NoMemory();
            goto done;
        }
        for (int i = 0; i < n; i++) {
            PyObject *f = PyTuple_GET_ITEM(files, i);
            if (f == Py_None) {
                j->fds[i] = -2; /* not needed: the file has nothing to write (checked below) */
            } else if (PyLong_Check(f)) {
                j->fds[i] = (int)PyLong_AsLong(f);
            } else if (!PyArg_ParseTuple(f, "yKK;a file is a descriptor or (path, st_dev, st_ino)", &j->paths[i],
                                         &j->dev[i], &j->ino[i])) {
                goto done;
            } else {
                j->fds[i] = -1;
            }
            if (j->fds[i] == -2 && dis_has_writes(&j->state->core.files[i], j->state->core.block, j->flush)) {
                PyErr_Format(PyExc_ValueError, "file %d has writes due and no descriptor", i);
                goto done;
            }
        }
    }
    write_ctx w = {0};
    int64_t transient = 0;
    for (Py_ssize_t k = 0; k < count; k++)
        jobs[k].state->busy++;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count; k++)
        run_job(&jobs[k], &w, &transient);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count; k++)
        jobs[k].state->busy--;
    PyObject *failures = PyList_New(count), *sizes = PyTuple_New(BUCKETS + 1);
    if (!failures || !sizes) {
        Py_XDECREF(failures);
        Py_XDECREF(sizes);
        goto done;
    }
    for (int b = 0; b < BUCKETS; b++)
        PyTuple_SET_ITEM(sizes, b, PyLong_FromLongLong(w.sizes[b]));
    PyTuple_SET_ITEM(sizes, BUCKETS, PyLong_FromLongLong(w.sum));
    for (Py_ssize_t k = 0; k < count; k++) {
        job_t *j = &jobs[k];
        PyObject *v = j->failed_file < 0 ? (Py_INCREF(Py_None), Py_None)
                                         : Py_BuildValue("(isii)", j->failed_file, j->op, j->err, j->kind);
        PyList_SET_ITEM(failures, k, v);
    }
    result = Py_BuildValue("(NNL)", failures, sizes, (long long)transient);
done:
    for (Py_ssize_t k = 0; k < count && jobs; k++) {
        PyMem_Free(jobs[k].fds);
        PyMem_Free(jobs[k].paths);
        PyMem_Free(jobs[k].dev);
        PyMem_Free(jobs[k].ino);
    }
    PyMem_Free(jobs);
    Py_DECREF(jobs_seq);
    return result;
}

