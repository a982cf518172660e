/* disd.storage.newlocation: a new location's directory, checkpoint record and column files in
 * one call that holds the interpreter's lock only while it reads its arguments and builds its
 * answer.
 *
 * Why C: a new location is some thirty file-system calls (mkdir and an fsync of each parent that
 * gained an entry, table.size written, fsynced, renamed and its directory fsynced, five column
 * files created and opened).  Made from Python, each of them gives up the interpreter's lock and
 * waits to take it back; when other threads of the DIS are decoding chunks, that wait is up to a
 * switch interval every time and two thread switches at best, so a burst of new locations spent
 * most of the DIS's time handing the lock around (docs/benchmarks-history.md, "new locations in
 * one call").  Here the lock is given up once for all of them.
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
 * create_many(locations, at_once=8) -> [(fresh, opened) | (None, failure), ...]
 *   locations   ((path, temp_name, record_name, record, file_names, keep), ...)
 *   keep        False: each column file is closed once created (opened holds -1 for its fd)
 *   at_once     locations whose column files are created at the same time (on that many
 *               threads, at most 8): what bounds the descriptors the call holds
 *   Many new locations (a day's start) in one call, each step for all of them before the next:
 *   every missing directory made, then each parent that gained entries fsynced once (not once
 *   an entry); every record written, then each fsynced, renamed, and its directory fsynced;
 *   then the column files.  Each location's own order is create's (its directories and their
 *   parents' fsyncs, then its record, durable, then its files), so the durability rules are
 *   create's; a failure stops only the locations it concerns (docs/storage-format.md, "A new
 *   location").
 */
#include "newlocation.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dis_fail(failure_t *f, const char *op, const char *path) {
    f->op = op;
    f->err = errno;
    snprintf(f->path, sizeof f->path, "%s", path);
    return -1;
}

int dis_join(char *out, const char *dir, const char *name, failure_t *f) {
    int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= PATH_MAX) {
        errno = ENAMETOOLONG;
        return dis_fail(f, "open", dir);
    }
    return 0;
}

int dis_fsync_dir(const char *path, failure_t *f) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dis_fail(f, "fsync_dir", path);
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return dis_fail(f, "fsync_dir", path);
    }
    close(fd);
    return 0;
}

/* The parent of ``path`` (absolute, no trailing slash) into ``out``. */
void dis_parent_of(const char *path, char *out) {
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
        return dis_fail(f, "mkdir", path);
    }
    memcpy(buf, path, len + 1);
    for (;;) {
        buf[len] = '\0';
        if (stat(buf, &st) == 0)
            break;
        if (errno != ENOENT)
            return dis_fail(f, "stat", buf);
        if (missing == MAX_DEPTH) {
            errno = ENAMETOOLONG;
            return dis_fail(f, "mkdir", path);
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
            return dis_fail(f, "mkdir", buf);
        }
        dis_parent_of(buf, parent);
        if (dis_fsync_dir(parent, f) != 0)
            return -1;
        buf[ends[i]] = saved;
    }
    return created;
}

static int write_record(const char *dir, const char *temp_name, const char *record_name,
                        const char *data, size_t size, failure_t *f) {
    char tmp[PATH_MAX], dst[PATH_MAX];
    if (dis_join(tmp, dir, temp_name, f) != 0 || dis_join(dst, dir, record_name, f) != 0)
        return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return dis_fail(f, "open", tmp);
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            errno = e;
            return dis_fail(f, "pwrite", tmp);
        }
        done += (size_t)n;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return dis_fail(f, "fsync", tmp);
    }
    if (close(fd) != 0)
        return dis_fail(f, "close", tmp);
    if (rename(tmp, dst) != 0)
        return dis_fail(f, "rename", tmp);
    return dis_fsync_dir(dir, f);
}

int dis_open_files(const char *dir, char **names, Py_ssize_t count, opened_t *out, failure_t *f) {
    char p[PATH_MAX];
    struct stat st;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (dis_join(p, dir, names[i], f) != 0)
            goto undo;
        int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            dis_fail(f, "open", p);
            goto undo;
        }
        if (fstat(fd, &st) != 0) {
            int e = errno;
            close(fd);
            errno = e;
            dis_fail(f, "fstat", p);
            goto undo;
        }
        out[i].fd = fd;
        out[i].dev = st.st_dev;
        out[i].ino = st.st_ino;
        continue;
    undo: /* each descriptor closed once, and forgotten: its number may be another file's next */
        while (i-- > 0) {
            close(out[i].fd);
            out[i].fd = -1;
        }
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
            status = dis_open_files(path, names, count, opened, &failure);
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

static PyMethodDef methods[] = {
    {"create_many", dis_create_many, METH_VARARGS,
     "create_many(((path, temp_name, record_name, record, file_names, keep), ...), at_once=8) -> [create's answer, ...]"},
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
