/* disd.storage.newlocation: a new location's directory, checkpoint record and column files in
 * one call that holds the interpreter's lock only while it reads its arguments and builds its
 * answer.
 *
 * Why C: a new location is some thirty file-system calls (mkdir and an fsync of each parent that
 * gained an entry, table.size written, fsynced, renamed and its directory fsynced, five column
 * files created and opened).  Made from Python, each of them gives up the interpreter's lock and
 * waits to take it back; when other threads of the DIS are decoding chunks, that wait is up to a
 * switch interval every time and two thread switches at best, so a burst of new locations spent
 * most of the DIS's time handing the lock around (docs/benchmarks.md, "new locations in one
 * call").  Here the lock is given up once for all of them.
 *
 * The calls and their order are exactly those of the Python path it replaces (disd.storage.fsio's
 * make_dirs, checkpoint.write_record, and an open + fstat per column file); docs/storage-format.md
 * says why the order makes a crash at any point safe.
 *
 * create(path, temp_name, record_name, record, file_names) -> (fresh, opened) | (None, failure)
 *   path        absolute path of the location directory
 *   fresh       False when ``path`` already existed (or another thread made it meanwhile):
 *               nothing but the missing parents was made, and the caller opens it the usual way
 *   opened      ((fd, st_dev, st_ino), ...) of the column files, in the order of ``file_names``
 *   failure     (op, errno, path): the call that failed; every descriptor opened is closed again
 *
 * create_many(locations) -> [(fresh, opened) | (None, failure), ...]
 *   locations   ((path, temp_name, record_name, record, file_names, keep), ...)
 *   keep        False: each column file is closed once created (opened holds -1 for its fd)
 *   Many new locations (a day's start) in one call, each step for all of them before the next:
 *   every missing directory made, then each parent that gained entries fsynced once (not once
 *   an entry); every record written, then each fsynced, renamed, and its directory fsynced;
 *   then the column files.  Each location's own order is create's (its directories and their
 *   parents' fsyncs, then its record, durable, then its files), so the durability rules are
 *   create's; a failure stops only the locations it concerns (docs/storage-format.md, "A new
 *   location").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 64
#define MAX_FILES 1024

typedef struct {
    const char *op;
    int err;
    char path[PATH_MAX];
} failure_t;

typedef struct {
    int fd;
    dev_t dev;
    ino_t ino;
} opened_t;

static int fail(failure_t *f, const char *op, const char *path) {
    f->op = op;
    f->err = errno;
    snprintf(f->path, sizeof f->path, "%s", path);
    return -1;
}

static int join(char *out, const char *dir, const char *name, failure_t *f) {
    int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= PATH_MAX) {
        errno = ENAMETOOLONG;
        return fail(f, "open", dir);
    }
    return 0;
}

static int fsync_dir(const char *path, failure_t *f) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return fail(f, "fsync_dir", path);
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return fail(f, "fsync_dir", path);
    }
    close(fd);
    return 0;
}

/* The parent of ``path`` (absolute, no trailing slash) into ``out``. */
static void parent_of(const char *path, char *out) {
    const char *slash = strrchr(path, '/');
    size_t n = slash == NULL || slash == path ? 1 : (size_t)(slash - path);
    memcpy(out, path, n);
    out[n] = '\0';
}

/* make_dirs: create ``path`` and its missing parents, each parent that gained an entry fsynced.
 * 1 when ``path`` itself was made by this call, 0 when it existed, -1 on failure. */
static int make_dirs(const char *path, failure_t *f) {
    size_t ends[MAX_DEPTH];
    int missing = 0;
    char buf[PATH_MAX], parent[PATH_MAX];
    struct stat st;
    size_t len = strlen(path);
    if (len == 0 || len >= PATH_MAX || path[0] != '/') {
        errno = EINVAL;
        return fail(f, "mkdir", path);
    }
    memcpy(buf, path, len + 1);
    for (;;) {
        buf[len] = '\0';
        if (stat(buf, &st) == 0)
            break;
        if (errno != ENOENT)
            return fail(f, "stat", buf);
        if (missing == MAX_DEPTH) {
            errno = ENAMETOOLONG;
            return fail(f, "mkdir", path);
        }
        ends[missing++] = len;
        char *slash = strrchr(buf, '/');
        if (slash == NULL || slash == buf)
            break;
        len = (size_t)(slash - buf);
    }
    int created = 0;
    memcpy(buf, path, strlen(path) + 1);
    for (int i = missing - 1; i >= 0; i--) {
        char saved = buf[ends[i]];
        buf[ends[i]] = '\0';
        if (mkdir(buf, 0755) == 0) {
            created = i == 0;
        } else if (errno != EEXIST) {
            return fail(f, "mkdir", buf);
        }
        parent_of(buf, parent);
        if (fsync_dir(parent, f) != 0)
            return -1;
        buf[ends[i]] = saved;
    }
    return created;
}

static int write_record(const char *dir, const char *temp_name, const char *record_name,
                        const char *data, size_t size, failure_t *f) {
    char tmp[PATH_MAX], dst[PATH_MAX];
    if (join(tmp, dir, temp_name, f) != 0 || join(dst, dir, record_name, f) != 0)
        return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return fail(f, "open", tmp);
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            errno = e;
            return fail(f, "pwrite", tmp);
        }
        done += (size_t)n;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return fail(f, "fsync", tmp);
    }
    if (close(fd) != 0)
        return fail(f, "close", tmp);
    if (rename(tmp, dst) != 0)
        return fail(f, "rename", tmp);
    return fsync_dir(dir, f);
}

static int open_files(const char *dir, char **names, Py_ssize_t count, opened_t *out, failure_t *f) {
    char p[PATH_MAX];
    struct stat st;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (join(p, dir, names[i], f) != 0)
            goto undo;
        int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            fail(f, "open", p);
            goto undo;
        }
        if (fstat(fd, &st) != 0) {
            int e = errno;
            close(fd);
            errno = e;
            fail(f, "fstat", p);
            goto undo;
        }
        out[i].fd = fd;
        out[i].dev = st.st_dev;
        out[i].ino = st.st_ino;
        continue;
    undo:
        while (i-- > 0)
            close(out[i].fd);
        return -1;
    }
    return 0;
}

static PyObject *create(PyObject *self, PyObject *args) {
    PyObject *path_obj, *temp_obj, *record_name_obj, *names_obj;
    Py_buffer record;
    if (!PyArg_ParseTuple(args, "O&O&O&y*O", PyUnicode_FSConverter, &path_obj, PyUnicode_FSConverter,
                          &temp_obj, PyUnicode_FSConverter, &record_name_obj, &record, &names_obj))
        return NULL;
    PyObject *result = NULL, *names_seq = NULL;
    PyObject **name_bytes = NULL;
    char **names = NULL;
    opened_t *opened = NULL;
    Py_ssize_t count = 0, converted = 0;

    names_seq = PySequence_Fast(names_obj, "file_names must be a sequence");
    if (names_seq == NULL)
        goto done;
    count = PySequence_Fast_GET_SIZE(names_seq);
    if (count > MAX_FILES) {
        PyErr_SetString(PyExc_ValueError, "too many column files");
        goto done;
    }
    name_bytes = PyMem_Calloc((size_t)count + 1, sizeof *name_bytes);
    names = PyMem_Calloc((size_t)count + 1, sizeof *names);
    opened = PyMem_Calloc((size_t)count + 1, sizeof *opened);
    if (name_bytes == NULL || names == NULL || opened == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; converted < count; converted++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(names_seq, converted), &name_bytes[converted]))
            goto done;
        names[converted] = PyBytes_AS_STRING(name_bytes[converted]);
    }

    failure_t failure;
    int made = 0, status = 0;
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS
    made = make_dirs(path, &failure);
    if (made == 1) {
        status = write_record(path, PyBytes_AS_STRING(temp_obj), PyBytes_AS_STRING(record_name_obj),
                              (const char *)record.buf, (size_t)record.len, &failure);
        if (status == 0)
            status = open_files(path, names, count, opened, &failure);
    }
    Py_END_ALLOW_THREADS

    if (made < 0 || status < 0) {
        result = Py_BuildValue("(O(siO&))", Py_None, failure.op, failure.err, PyUnicode_DecodeFSDefault,
                               failure.path);
        goto done;
    }
    if (made == 0) {
        result = Py_BuildValue("(O())", Py_False);
        goto done;
    }
    PyObject *files = PyTuple_New(count);
    if (files == NULL)
        goto close_all;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = Py_BuildValue("(iKK)", opened[i].fd, (unsigned long long)opened[i].dev,
                                       (unsigned long long)opened[i].ino);
        if (item == NULL) {
            Py_DECREF(files);
            goto close_all;
        }
        PyTuple_SET_ITEM(files, i, item);
    }
    result = Py_BuildValue("(ON)", Py_True, files);
    if (result != NULL)
        goto done;
close_all:
    for (Py_ssize_t i = 0; i < count; i++)
        close(opened[i].fd);
done:
    if (name_bytes != NULL) {
        for (Py_ssize_t i = 0; i < converted; i++)
            Py_XDECREF(name_bytes[i]);
    }
    PyMem_Free(name_bytes);
    PyMem_Free(names);
    PyMem_Free(opened);
    Py_XDECREF(names_seq);
    PyBuffer_Release(&record);
    Py_DECREF(path_obj);
    Py_DECREF(temp_obj);
    Py_DECREF(record_name_obj);
    return result;
}

/* -- many locations ------------------------------------------------------------------------- */

/* The waits of a phase (fsyncs, file creations) overlap on a few threads: a burst's hundreds of
 * fsyncs, one after another, would take hundreds of disk round trips; side by side the file
 * system commits them together.  The work of each index is done by exactly one thread. */
#define PHASE_THREADS 8

typedef struct {
    void (*fn)(void *ctx, Py_ssize_t i);
    void *ctx;
    Py_ssize_t n, first, step;
} slice_t;

static void *run_slice(void *arg) {
    slice_t *s = arg;
    for (Py_ssize_t i = s->first; i < s->n; i += s->step)
        s->fn(s->ctx, i);
    return NULL;
}

static void parallel_for(Py_ssize_t n, void (*fn)(void *, Py_ssize_t), void *ctx) {
    int threads = n < PHASE_THREADS ? (int)n : PHASE_THREADS;
    pthread_t tid[PHASE_THREADS];
    slice_t slices[PHASE_THREADS];
    int started = 0;
    for (int t = 1; t < threads; t++) {
        slices[t] = (slice_t){fn, ctx, n, t, threads};
        if (pthread_create(&tid[t], NULL, run_slice, &slices[t]) != 0)
            break;
        started = t;
    }
    /* this thread takes slice 0 and whatever slices no thread could be started for */
    for (int t = 0; t < threads; t++)
        if (t == 0 || t > started) {
            slice_t own = {fn, ctx, n, t, threads};
            run_slice(&own);
        }
    for (int t = 1; t <= started; t++)
        pthread_join(tid[t], NULL);
}

typedef struct {
    char *path, *tmp, *dst;     /* the location directory, its temp record and record */
    const char *record;
    size_t record_len;
    char **names;
    Py_ssize_t count;
    int keep;
    int fresh;                  /* its directory was made by this call */
    int failed;
    failure_t failure;
    int rec_fd;
    opened_t *opened;
} loc_t;

typedef struct {
    char *path;   /* a directory that gained an entry */
    int err;      /* its fsync's errno, or 0 */
} parent_t;

static int cmp_parent(const void *a, const void *b) {
    return strcmp(((const parent_t *)a)->path, ((const parent_t *)b)->path);
}

static void fail_loc(loc_t *l, const char *op, int err, const char *path) {
    if (l->failed)
        return;
    l->failed = 1;
    l->failure.op = op;
    l->failure.err = err;
    snprintf(l->failure.path, sizeof l->failure.path, "%s", path);
}

/* The directories of every location: missing ones made top-down (``made`` gets the parent of
 * each one made, ``made_by`` its location), the location fresh when its own was made here. */
static void make_all_dirs(loc_t *locs, Py_ssize_t n, parent_t *made, Py_ssize_t *made_by, Py_ssize_t *nmade) {
    char buf[PATH_MAX];
    struct stat st;
    for (Py_ssize_t i = 0; i < n; i++) {
        loc_t *l = &locs[i];
        size_t ends[MAX_DEPTH], len = strlen(l->path);
        int missing = 0;
        if (len == 0 || len >= PATH_MAX || l->path[0] != '/') {
            fail_loc(l, "mkdir", EINVAL, l->path);
            continue;
        }
        memcpy(buf, l->path, len + 1);
        for (;;) {
            buf[len] = '\0';
            if (stat(buf, &st) == 0)
                break;
            if (errno != ENOENT) {
                fail_loc(l, "stat", errno, buf);
                break;
            }
            if (missing == MAX_DEPTH) {
                fail_loc(l, "mkdir", ENAMETOOLONG, l->path);
                break;
            }
            ends[missing++] = len;
            char *slash = strrchr(buf, '/');
            if (slash == NULL || slash == buf)
                break;
            len = (size_t)(slash - buf);
        }
        if (l->failed)
            continue;
        memcpy(buf, l->path, strlen(l->path) + 1);
        for (int k = missing - 1; k >= 0 && !l->failed; k--) {
            char saved = buf[ends[k]];
            buf[ends[k]] = '\0';
            if (mkdir(buf, 0755) == 0) {
                l->fresh = k == 0;
            } else if (errno != EEXIST) {
                fail_loc(l, "mkdir", errno, buf);
            }
            if (!l->failed) { /* its parent gained an entry (or another's mkdir made it: fsynced too) */
                char parent[PATH_MAX];
                parent_of(buf, parent);
                made[*nmade].path = strdup(parent);
                made[*nmade].err = 0;
                made_by[*nmade] = i;
                if (made[*nmade].path == NULL)
                    fail_loc(l, "mkdir", ENOMEM, buf);
                else
                    ++*nmade;
            }
            buf[ends[k]] = saved;
        }
    }
}

static void sync_one_parent(void *ctx, Py_ssize_t k) {
    parent_t *p = &((parent_t *)ctx)[k];
    failure_t f;
    if (fsync_dir(p->path, &f) != 0)
        p->err = f.err ? f.err : EIO;
}

static void sync_parents(loc_t *locs, parent_t *made, Py_ssize_t *made_by, Py_ssize_t nmade) {
    parent_t *uniq = malloc(sizeof *uniq * (size_t)(nmade + 1));
    if (uniq == NULL) {
        for (Py_ssize_t k = 0; k < nmade; k++)
            fail_loc(&locs[made_by[k]], "fsync_dir", ENOMEM, made[k].path);
        return;
    }
    memcpy(uniq, made, sizeof *uniq * (size_t)nmade);
    qsort(uniq, (size_t)nmade, sizeof *uniq, cmp_parent);
    Py_ssize_t u = 0;
    for (Py_ssize_t k = 0; k < nmade; k++)
        if (u == 0 || strcmp(uniq[u - 1].path, uniq[k].path) != 0)
            uniq[u++] = uniq[k];
    parallel_for(u, sync_one_parent, uniq);
    for (Py_ssize_t k = 0; k < nmade; k++) {
        parent_t *p = bsearch(&made[k], uniq, (size_t)u, sizeof *uniq, cmp_parent);
        if (p != NULL && p->err)
            fail_loc(&locs[made_by[k]], "fsync_dir", p->err, p->path);
    }
    free(uniq);
}

static void sync_record(void *ctx, Py_ssize_t i) {
    loc_t *l = &((loc_t *)ctx)[i];
    if (l->rec_fd < 0)
        return;
    if (!l->failed && fsync(l->rec_fd) != 0)
        fail_loc(l, "fsync", errno, l->tmp);
    if (close(l->rec_fd) != 0)
        fail_loc(l, "close", errno, l->tmp);
    l->rec_fd = -1;
}

static void sync_location_dir(void *ctx, Py_ssize_t i) {
    loc_t *l = &((loc_t *)ctx)[i];
    failure_t f;
    if (l->fresh && !l->failed && fsync_dir(l->path, &f) != 0)
        fail_loc(l, "fsync_dir", f.err, l->path);
}

static void write_records(loc_t *locs, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) { /* every temp record written ... */
        loc_t *l = &locs[i];
        if (!l->fresh || l->failed)
            continue;
        l->rec_fd = open(l->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (l->rec_fd < 0) {
            fail_loc(l, "open", errno, l->tmp);
            continue;
        }
        size_t done = 0;
        while (done < l->record_len) {
            ssize_t k = pwrite(l->rec_fd, l->record + done, l->record_len - done, (off_t)done);
            if (k < 0) {
                if (errno == EINTR)
                    continue;
                fail_loc(l, "pwrite", errno, l->tmp);
                break;
            }
            done += (size_t)k;
        }
    }
    parallel_for(n, sync_record, locs); /* ... then each fsynced and closed ... */
    for (Py_ssize_t i = 0; i < n; i++) { /* ... renamed over the record ... */
        loc_t *l = &locs[i];
        if (l->fresh && !l->failed && rename(l->tmp, l->dst) != 0)
            fail_loc(l, "rename", errno, l->tmp);
    }
    parallel_for(n, sync_location_dir, locs); /* ... and its directory fsynced */
}

static void open_location_files(void *ctx, Py_ssize_t i) {
    loc_t *l = &((loc_t *)ctx)[i];
    if (!l->fresh || l->failed)
        return;
    failure_t f;
    if (open_files(l->path, l->names, l->count, l->opened, &f) != 0) {
        fail_loc(l, f.op, f.err, f.path);
        return;
    }
    if (!l->keep)
        for (Py_ssize_t k = 0; k < l->count; k++) {
            close(l->opened[k].fd);
            l->opened[k].fd = -1;
        }
}

static PyObject *create_many(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "locations must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), parsed = 0, nmade = 0;
    loc_t *locs = PyMem_Calloc((size_t)n + 1, sizeof *locs);
    PyObject **keep_alive = PyMem_Calloc((size_t)n * 4 + 1, sizeof *keep_alive);
    Py_buffer *records = PyMem_Calloc((size_t)n + 1, sizeof *records);
    parent_t *made = PyMem_Calloc((size_t)n * MAX_DEPTH + 1, sizeof *made);
    Py_ssize_t *made_by = PyMem_Calloc((size_t)n * MAX_DEPTH + 1, sizeof *made_by);
    PyObject *result = NULL;
    if (!locs || !keep_alive || !records || !made || !made_by) {
        PyErr_NoMemory();
        goto done;
    }
    for (; parsed < n; parsed++) {
        loc_t *l = &locs[parsed];
        PyObject *path, *tmp, *dst, *names_obj;
        l->rec_fd = -1;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, parsed), "O&O&O&y*Op", PyUnicode_FSConverter, &path,
                              PyUnicode_FSConverter, &tmp, PyUnicode_FSConverter, &dst, &records[parsed], &names_obj,
                              &l->keep))
            goto done;
        keep_alive[parsed * 4] = path;
        keep_alive[parsed * 4 + 1] = tmp;
        keep_alive[parsed * 4 + 2] = dst;
        PyObject *names = PySequence_Fast(names_obj, "file_names must be a sequence");
        if (names == NULL) {
            parsed++; /* its record is released with the others */
            goto done;
        }
        keep_alive[parsed * 4 + 3] = names;
        l->count = PySequence_Fast_GET_SIZE(names);
        l->names = PyMem_Calloc((size_t)l->count + 1, sizeof *l->names);
        l->opened = PyMem_Calloc((size_t)l->count + 1, sizeof *l->opened);
        if (l->count > MAX_FILES || !l->names || !l->opened) {
            PyErr_SetString(PyExc_ValueError, "too many column files, or no memory");
            parsed++; /* its record is released with the others */
            goto done;
        }
        for (Py_ssize_t k = 0; k < l->count; k++) {
            PyObject *item = PySequence_Fast_GET_ITEM(names, k);
            if (!PyBytes_Check(item)) {
                PyErr_SetString(PyExc_TypeError, "file names must be bytes (os.fsencode)");
                parsed++;
                goto done;
            }
            l->names[k] = PyBytes_AS_STRING(item);
        }
        char tmp_path[PATH_MAX], dst_path[PATH_MAX];
        failure_t f;
        const char *dir = PyBytes_AS_STRING(path);
        if (join(tmp_path, dir, PyBytes_AS_STRING(tmp), &f) != 0 || join(dst_path, dir, PyBytes_AS_STRING(dst), &f) != 0) {
            PyErr_SetString(PyExc_ValueError, "path too long");
            parsed++; /* its record is released with the others */
            goto done;
        }
        l->path = strdup(dir);
        l->tmp = strdup(tmp_path);
        l->dst = strdup(dst_path);
        l->record = records[parsed].buf;
        l->record_len = (size_t)records[parsed].len;
        if (!l->path || !l->tmp || !l->dst) {
            PyErr_NoMemory();
            parsed++; /* its record is released with the others */
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    make_all_dirs(locs, n, made, made_by, &nmade);
    sync_parents(locs, made, made_by, nmade);
    write_records(locs, n);
    parallel_for(n, open_location_files, locs);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        loc_t *l = &locs[i];
        PyObject *v;
        if (l->failed) {
            for (Py_ssize_t k = 0; k < l->count; k++)
                if (l->opened[k].fd > 0)
                    close(l->opened[k].fd);
            v = Py_BuildValue("(O(siO&))", Py_None, l->failure.op, l->failure.err, PyUnicode_DecodeFSDefault,
                              l->failure.path);
        } else if (!l->fresh) {
            v = Py_BuildValue("(O())", Py_False);
        } else {
            PyObject *files = PyTuple_New(l->count);
            for (Py_ssize_t k = 0; files && k < l->count; k++) {
                PyObject *item = Py_BuildValue("(iKK)", l->opened[k].fd, (unsigned long long)l->opened[k].dev,
                                               (unsigned long long)l->opened[k].ino);
                if (!item) {
                    Py_CLEAR(files);
                    break;
                }
                PyTuple_SET_ITEM(files, k, item);
            }
            v = files ? Py_BuildValue("(ON)", Py_True, files) : NULL;
        }
        if (v == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, v);
    }
done:
    for (Py_ssize_t k = 0; k < nmade; k++)
        free(made[k].path);
    for (Py_ssize_t i = 0; locs && i < parsed; i++) {
        free(locs[i].path);
        free(locs[i].tmp);
        free(locs[i].dst);
        PyMem_Free(locs[i].names);
        PyMem_Free(locs[i].opened);
        PyBuffer_Release(&records[i]);
    }
    for (Py_ssize_t k = 0; keep_alive && k < n * 4; k++)
        Py_XDECREF(keep_alive[k]);
    PyMem_Free(locs);
    PyMem_Free(keep_alive);
    PyMem_Free(records);
    PyMem_Free(made);
    PyMem_Free(made_by);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"create_many", create_many, METH_O,
     "create_many(((path, temp_name, record_name, record, file_names, keep), ...)) -> [create's answer, ...]"},
    {"create", create, METH_VARARGS,
     "create(path, temp_name, record_name, record, file_names) -> (fresh, opened) or (None, (op, errno, path))"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "newlocation",
    "A new location's directories, checkpoint record and column files in one call (see the source).", -1,
    methods,
};

PyMODINIT_FUNC PyInit_newlocation(void) { return PyModule_Create(&module); }
