/* disd.storage.newlocation.create_many: many new locations (a day's start, a burst) in one call
 * that gives up the interpreter's lock once, each step for all of them before the next (see
 * newlocation.c's head for the contract, docs/storage-format.md "A new location" for the order). */
#include "newlocation.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


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

/* records open at once, at most (they count against the process's descriptors) */
#define RECORD_GROUP 64

static void parallel_for(Py_ssize_t n, void (*fn)(void *, Py_ssize_t), void *ctx, int most) {
    int threads = n < most ? (int)n : most;
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
                dis_parent_of(buf, parent);
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
    if (dis_fsync_dir(p->path, &f) != 0)
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
    parallel_for(u, sync_one_parent, uniq, PHASE_THREADS);
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
    if (l->fresh && !l->failed && dis_fsync_dir(l->path, &f) != 0)
        fail_loc(l, "fsync_dir", f.err, l->path);
}

/* Every record of a group handed to the disk before any is fsynced: a journaling file system
 * (ext4) allocates a file's blocks when its writeback starts, so that the first fsync's journal
 * commit then covers all of the group's records and the other fsyncs find theirs committed.
 * Started one fsync at a time instead, each record's allocation joins the transaction after
 * the one being committed, and the group costs about one commit per thread's turn.  Only a
 * start (no wait, no error consumed): each record's own fsync still waits for it and reports. */
static void start_writeback(loc_t *locs, Py_ssize_t m) {
#ifdef SYNC_FILE_RANGE_WRITE
    for (Py_ssize_t i = 0; i < m; i++)
        if (locs[i].rec_fd >= 0 && !locs[i].failed)
            (void)sync_file_range(locs[i].rec_fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#else
    (void)locs;
    (void)m;
#endif
}

/* every temp record written, then each fsynced and closed (a group at a time, so that at most
 * RECORD_GROUP are open at once), then each renamed over the record, then its directory fsynced */
static void write_records(loc_t *locs, Py_ssize_t n) {
    for (Py_ssize_t g = 0; g < n; g += RECORD_GROUP) {
        Py_ssize_t m = n - g < RECORD_GROUP ? n - g : RECORD_GROUP;
        for (Py_ssize_t i = g; i < g + m; i++) {
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
        start_writeback(locs + g, m);
        parallel_for(m, sync_record, locs + g, PHASE_THREADS);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        loc_t *l = &locs[i];
        if (l->fresh && !l->failed && rename(l->tmp, l->dst) != 0)
            fail_loc(l, "rename", errno, l->tmp);
    }
    parallel_for(n, sync_location_dir, locs, PHASE_THREADS);
}

static void open_location_files(void *ctx, Py_ssize_t i) {
    loc_t *l = &((loc_t *)ctx)[i];
    if (!l->fresh || l->failed)
        return;
    failure_t f;
    if (dis_open_files(l->path, l->names, l->count, l->opened, &f) != 0) {
        fail_loc(l, f.op, f.err, f.path);
        return;
    }
    if (!l->keep)
        for (Py_ssize_t k = 0; k < l->count; k++) {
            close(l->opened[k].fd);
            l->opened[k].fd = -1;
        }
}

PyObject *dis_create_many(PyObject *self, PyObject *args) {
    PyObject *arg;
    int files_threads = PHASE_THREADS; /* locations whose column files are being made at once */
    if (!PyArg_ParseTuple(args, "O|i", &arg, &files_threads))
        return NULL;
    if (files_threads < 1)
        files_threads = 1;
    if (files_threads > PHASE_THREADS)
        files_threads = PHASE_THREADS;
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
        for (Py_ssize_t k = 0; k < l->count; k++)
            l->opened[k].fd = -1; /* none open: a failed location closes only descriptors it holds */
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
        if (dis_join(tmp_path, dir, PyBytes_AS_STRING(tmp), &f) != 0 || dis_join(dst_path, dir, PyBytes_AS_STRING(dst), &f) != 0) {
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
    parallel_for(n, open_location_files, locs, files_threads);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        loc_t *l = &locs[i];
        PyObject *v;
        if (l->failed) {
            /* dis_open_files closed (and forgot) what it opened before it failed; closing those
             * numbers again here would close whatever another file was given them meanwhile
             * (this call's other threads, or the DIS's) */
            for (Py_ssize_t k = 0; k < l->count; k++)
                if (l->opened[k].fd >= 0)
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

