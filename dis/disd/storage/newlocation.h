/* disd.storage.newlocation's two halves share these: a failure's record, an opened column file,
 * and the helpers both make their calls with (newlocation.c: one location; newlocations.c: many). */
#ifndef DIS_NEWLOCATION_H
#define DIS_NEWLOCATION_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <sys/types.h>

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

int dis_fail(failure_t *f, const char *op, const char *path);
int dis_join(char *out, const char *dir, const char *name, failure_t *f);
int dis_fsync_dir(const char *path, failure_t *f);
void dis_parent_of(const char *path, char *out);
/* Opens (creating) each file of ``names`` in ``dir``: 0 with every ``out`` filled, or -1 with every
 * descriptor it opened closed and its ``out`` entry's fd set to -1 (never to be closed again). */
int dis_open_files(const char *dir, char **names, Py_ssize_t count, opened_t *out, failure_t *f);
PyObject *dis_create_many(PyObject *self, PyObject *args);

#endif
