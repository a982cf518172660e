/* disd.kafka.rdbatch: a batch of Kafka messages out of librdkafka into a few flat buffers, without a
 * Python object a message.
 *
 * Why C: confluent-kafka's Consumer.consume makes a Python Message object of every message while
 * it holds the interpreter's lock; in a fetch process that was half of its CPU (docs/kafka.md,
 * "Fetch processes").  Here the batch is taken with librdkafka's own call
 * (rd_kafka_consume_batch_queue on the consumer's queue) and its payloads are copied, grouped by
 * partition, into one buffer the JSON reader or the binary-log decoder reads as it is, with the
 * partitions, offsets, timestamps and keys as arrays; then the messages are destroyed.
 *
 * How librdkafka is reached: confluent-kafka's extension has loaded it already (its wheel bundles
 * it).  bind() opens that same file again (RTLD_NOLOAD: only if it is loaded) and looks up the
 * functions below, declared here from librdkafka's public, stable ABI (rdkafka.h).  The client
 * (rd_kafka_t) is read from the confluent-kafka Consumer: the first field after PyObject_HEAD of its
 * Handle, followed by the callbacks, `initiated` and the thread-state key its callbacks use.  That
 * layout is private, so disd.kafka.batchread calls this module only for the confluent-kafka
 * versions it was checked against, and check() proves it on each consumer: librdkafka's opaque of
 * that rd_kafka_t is the Consumer itself (confluent-kafka sets it so), and the key is created and
 * unset.
 *
 * The callbacks (the logger, commit results, errors) run as in Consumer.consume: librdkafka calls
 * them from inside rd_kafka_consume_batch_queue, and confluent-kafka's callbacks take the
 * interpreter's lock back through the CallState they find under that thread-state key.  This
 * module sets one the same way (same layout), so they work unchanged, and an exception a
 * callback raised is raised here, after the batch's messages are destroyed.
 *
 * bind(path, consumer_type) -> None
 * check(consumer) -> None           ValueError naming what does not match
 * consume(consumer, max, timeout_ms, linger_ms, wait_first, sep, keys, timestamps) -> tuple
 *   see rdbatch.pyi
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

/* -- librdkafka's public ABI (rdkafka.h) ------------------------------------------------------ */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_message_s {
    int err; /* rd_kafka_resp_err_t: non-zero for an error event */
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

static rd_kafka_queue_t *(*queue_get_consumer)(rd_kafka_t *);
static void (*queue_destroy)(rd_kafka_queue_t *);
static ssize_t (*consume_batch_queue)(rd_kafka_queue_t *, int, rd_kafka_message_t **, size_t);
static void (*message_destroy)(rd_kafka_message_t *);
static const char *(*message_errstr)(const rd_kafka_message_t *);
static int64_t (*message_timestamp)(const rd_kafka_message_t *, int *);
static const char *(*topic_name)(const rd_kafka_topic_t *);
static void *(*kafka_opaque)(const rd_kafka_t *);
static int (*last_error)(void);
static const char *(*err2str)(int);

/* -- confluent-kafka's private layout (src/confluent_kafka/src/confluent_kafka.h) ------------ */
typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    PyObject *error_cb;
    PyObject *throttle_cb;
    PyObject *stats_cb;
    int initiated;
    Py_tss_t tlskey;
    /* more fields, not read */
} HandlePrefix;

typedef struct {
    PyThreadState *thread_state;
    int crashed;
    PyObject *exception_value;
} CallState;

static PyObject *consumer_type; /* confluent_kafka.cimpl.Consumer */

static PyObject *bind(PyObject *self, PyObject *args) {
    const char *path;
    PyObject *type;
    if (!PyArg_ParseTuple(args, "sO!", &path, &PyType_Type, &type))
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError, "librdkafka %s is not loaded: %s", path, why ? why : "?");
        return NULL;
    }
#define SYM(var, name)                                                                                       \
    do {                                                                                                     \
        *(void **)(&var) = dlsym(lib, name);                                                                 \
        if (var == NULL) {                                                                                   \
            PyErr_Format(PyExc_OSError, "librdkafka %s has no %s", path, name);                              \
            return NULL;                                                                                     \
        }                                                                                                    \
    } while (0)
    SYM(queue_get_consumer, "rd_kafka_queue_get_consumer");
    SYM(queue_destroy, "rd_kafka_queue_destroy");
    SYM(consume_batch_queue, "rd_kafka_consume_batch_queue");
    SYM(message_destroy, "rd_kafka_message_destroy");
    SYM(message_errstr, "rd_kafka_message_errstr");
    SYM(message_timestamp, "rd_kafka_message_timestamp");
    SYM(topic_name, "rd_kafka_topic_name");
    SYM(kafka_opaque, "rd_kafka_opaque");
    SYM(last_error, "rd_kafka_last_error");
    SYM(err2str, "rd_kafka_err2str");
#undef SYM
    /* the handle stays open: the library is confluent-kafka's, loaded for the process's life */
    Py_XSETREF(consumer_type, Py_NewRef(type));
    Py_RETURN_NONE;
}

/* The consumer's handle, checked; NULL with an exception set when it is not usable. */
static HandlePrefix *handle_of(PyObject *consumer) {
    if (consumer_type == NULL || queue_get_consumer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rdbatch.bind() was not called");
        return NULL;
    }
    int is = PyObject_IsInstance(consumer, consumer_type);
    if (is < 0)
        return NULL;
    if (!is) {
        PyErr_Format(PyExc_TypeError, "not a confluent_kafka Consumer: %R", Py_TYPE(consumer));
        return NULL;
    }
    HandlePrefix *h = (HandlePrefix *)consumer;
    if (h->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Consumer closed");
        return NULL;
    }
    return h;
}

static PyObject *check(PyObject *self, PyObject *consumer) {
    HandlePrefix *h = handle_of(consumer);
    if (h == NULL)
        return NULL;
    if (kafka_opaque(h->rk) != (void *)consumer)
        return PyErr_Format(PyExc_ValueError, "the consumer's client is not where this module reads it "
                                              "(librdkafka's opaque is not the Consumer)");
    if (!PyThread_tss_is_created(&h->tlskey))
        return PyErr_Format(PyExc_ValueError, "the consumer's thread-state key is not where this module reads it");
    if (PyThread_tss_get(&h->tlskey) != NULL)
        return PyErr_Format(PyExc_ValueError, "the consumer's thread-state key is set outside a call");
    Py_RETURN_NONE;
}

/* Writes count (n) of values of n messages, grouped by partition in ascending order and in the
 * order consumed within one; runs without the interpreter's lock. */
typedef struct {
    rd_kafka_message_t **msgs; /* the messages without error events */
    Py_ssize_t n;
    const char *sep;
    Py_ssize_t seplen;
    char *data;
    int64_t *starts, *ends, *offsets, *timestamps;
    uint8_t *flags;
    int32_t *partitions;
    char *key_data;
    int32_t *key_offsets;
    uint8_t *key_valid;
} fill_t;

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* 0, or -1 when out of memory */
static int fill(fill_t *f) {
    Py_ssize_t n = f->n, np = 0;
    int32_t *uniq = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    Py_ssize_t *next = NULL, *order = malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    if (uniq == NULL || order == NULL)
        goto oom;
    for (Py_ssize_t i = 0; i < n; i++) /* runs of one partition: a new one at a change only */
        if (i == 0 || f->msgs[i]->partition != f->msgs[i - 1]->partition)
            uniq[np++] = f->msgs[i]->partition;
    qsort(uniq, (size_t)np, sizeof *uniq, cmp_i32);
    Py_ssize_t u = 0;
    for (Py_ssize_t i = 0; i < np; i++)
        if (u == 0 || uniq[u - 1] != uniq[i])
            uniq[u++] = uniq[i];
    np = u;
    next = calloc((size_t)np + 1, sizeof *next);
    if (next == NULL)
        goto oom;
    Py_ssize_t last = 0;
    int32_t *group = (int32_t *)f->partitions; /* scratch: each message's group, overwritten below */
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t p = f->msgs[i]->partition;
        if (uniq[last] != p)
            last = (int32_t *)bsearch(&p, uniq, (size_t)np, sizeof *uniq, cmp_i32) - uniq;
        group[i] = (int32_t)last;
        next[last + 1]++;
    }
    for (Py_ssize_t g = 0; g < np; g++)
        next[g + 1] += next[g];
    for (Py_ssize_t i = 0; i < n; i++)
        order[next[group[i]]++] = i;

    int64_t pos = 0;
    int32_t kpos = 0;
    if (f->key_offsets)
        f->key_offsets[0] = 0;
    if (f->key_valid)
        memset(f->key_valid, 0, (size_t)(n + 7) / 8);
    for (Py_ssize_t k = 0; k < n; k++) {
        const rd_kafka_message_t *m = f->msgs[order[k]];
        uint8_t flag = m->payload == NULL ? 1 : 0;
        f->starts[k] = pos;
        if (m->len) {
            memcpy(f->data + pos, m->payload, m->len);
            if (f->seplen && (memchr(m->payload, '\n', m->len) || memchr(m->payload, '\r', m->len)))
                flag |= 2;
        }
        pos += (int64_t)m->len;
        f->ends[k] = pos;
        if (f->seplen) {
            memcpy(f->data + pos, f->sep, (size_t)f->seplen);
            pos += f->seplen;
        }
        f->flags[k] = flag;
        f->partitions[k] = m->partition;
        f->offsets[k] = m->offset;
        if (f->timestamps) {
            int tstype;
            f->timestamps[k] = message_timestamp(m, &tstype);
        }
        if (f->key_offsets) {
            if (m->key != NULL) {
                memcpy(f->key_data + kpos, m->key, m->key_len);
                kpos += (int32_t)m->key_len;
                f->key_valid[k >> 3] |= (uint8_t)(1u << (k & 7));
            }
            f->key_offsets[k + 1] = kpos;
        }
    }
    free(uniq);
    free(order);
    free(next);
    return 0;
oom:
    free(uniq);
    free(order);
    free(next);
    return -1;
}

static PyObject *new_bytes(Py_ssize_t size, char **buf) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (b != NULL)
        *buf = PyBytes_AS_STRING(b);
    return b;
}

static PyObject *consume(PyObject *self, PyObject *args) {
    PyObject *consumer;
    Py_ssize_t max;
    int timeout_ms, linger_ms, wait_first, want_keys, want_ts;
    const char *sep;
    Py_ssize_t seplen;
    if (!PyArg_ParseTuple(args, "Oniipy#pp", &consumer, &max, &timeout_ms, &linger_ms, &wait_first, &sep, &seplen,
                          &want_keys, &want_ts))
        return NULL;
    if (max < 1 || max > 1000000)
        return PyErr_Format(PyExc_ValueError, "max must be between 1 and 1000000, not %zd", max);
    if (seplen > 1)
        return PyErr_Format(PyExc_ValueError, "sep must be at most one byte");
    HandlePrefix *h = handle_of(consumer);
    if (h == NULL)
        return NULL;
    rd_kafka_queue_t *q = queue_get_consumer(h->rk);
    if (q == NULL) /* a client without a consumer group has no consumer queue */
        return PyErr_Format(PyExc_RuntimeError, "the consumer has no consumer queue (no group.id?)");
    rd_kafka_message_t **msgs = PyMem_Malloc(sizeof(rd_kafka_message_t *) * (size_t)max);
    if (msgs == NULL) {
        queue_destroy(q);
        return PyErr_NoMemory();
    }

    /* as confluent-kafka's Consumer.consume: the lock given up, a CallState for the callbacks */
    CallState cs = {NULL, 0, NULL};
    cs.thread_state = PyEval_SaveThread();
    PyThread_tss_set(&h->tlskey, &cs);
    ssize_t n = consume_batch_queue(q, wait_first ? timeout_ms : 0, msgs, wait_first ? 1 : (size_t)max);
    int err = n < 0 ? last_error() : 0;
    if (n > 0 && wait_first && max > 1) {
        ssize_t more = consume_batch_queue(q, linger_ms, msgs + n, (size_t)max - 1);
        if (more > 0)
            n += more;
    }
    PyThread_tss_set(&h->tlskey, NULL);
    PyEval_RestoreThread(cs.thread_state);
    queue_destroy(q);
    if (n < 0) {
        PyMem_Free(msgs);
        return PyErr_Format(PyExc_RuntimeError, "rd_kafka_consume_batch_queue: %s", err2str(err));
    }
    PyObject *result = NULL, *errors = NULL, *data = NULL, *starts = NULL, *ends = NULL, *flags = NULL,
             *partitions = NULL, *offsets = NULL, *timestamps = NULL, *key_data = NULL, *key_offsets = NULL,
             *key_valid = NULL;
    rd_kafka_message_t **ok = NULL; /* the messages without error events */
    if (cs.crashed) { /* a callback raised: its exception, as Consumer.consume does */
        if (cs.exception_value != NULL)
            PyErr_SetObject((PyObject *)Py_TYPE(cs.exception_value), cs.exception_value);
        Py_CLEAR(cs.exception_value);
        goto done;
    }
    if (PyErr_CheckSignals() < 0)
        goto done;

    /* error events apart, as tuples; the messages' sizes */
    fill_t f = {0};
    ok = PyMem_Malloc(sizeof(rd_kafka_message_t *) * (size_t)(n ? n : 1));
    if (ok == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    f.msgs = ok;
    f.sep = sep;
    f.seplen = seplen;
    errors = PyList_New(0);
    if (errors == NULL)
        goto done;
    Py_ssize_t good = 0, nbytes = 0, nkeys = 0;
    for (ssize_t i = 0; i < n; i++) {
        rd_kafka_message_t *m = msgs[i];
        if (m->err) {
            PyObject *e = Py_BuildValue("(zinis)", m->rkt ? topic_name(m->rkt) : NULL, (int)m->partition,
                                        (Py_ssize_t)m->offset, m->err, message_errstr(m));
            if (e == NULL || PyList_Append(errors, e) < 0) {
                Py_XDECREF(e);
                goto done;
            }
            Py_DECREF(e);
            continue;
        }
        ok[good++] = m;
        nbytes += (Py_ssize_t)m->len + seplen;
        nkeys += m->key ? (Py_ssize_t)m->key_len : 0;
    }
    if (nkeys > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a batch's keys exceed 2 GiB");
        goto done;
    }
    f.n = good;
    if ((data = new_bytes(nbytes, &f.data)) == NULL ||
        (starts = new_bytes(good * 8, (char **)&f.starts)) == NULL ||
        (ends = new_bytes(good * 8, (char **)&f.ends)) == NULL ||
        (flags = new_bytes(good, (char **)&f.flags)) == NULL ||
        (partitions = new_bytes(good * 4, (char **)&f.partitions)) == NULL ||
        (offsets = new_bytes(good * 8, (char **)&f.offsets)) == NULL)
        goto done;
    if (want_ts && (timestamps = new_bytes(good * 8, (char **)&f.timestamps)) == NULL)
        goto done;
    if (want_keys && ((key_data = new_bytes(nkeys, &f.key_data)) == NULL ||
                      (key_offsets = new_bytes((good + 1) * 4, (char **)&f.key_offsets)) == NULL ||
                      (key_valid = new_bytes((good + 7) / 8, (char **)&f.key_valid)) == NULL))
        goto done;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fill(&f);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_BuildValue("(nOOOOOOOOOOO)", (Py_ssize_t)n, data, starts, ends, flags, partitions, offsets,
                           timestamps ? timestamps : Py_None, key_data ? key_data : Py_None,
                           key_offsets ? key_offsets : Py_None, key_valid ? key_valid : Py_None, errors);
done:
    Py_BEGIN_ALLOW_THREADS
    for (ssize_t i = 0; i < n; i++)
        message_destroy(msgs[i]);
    Py_END_ALLOW_THREADS
    PyMem_Free(msgs);
    PyMem_Free(ok);
    Py_XDECREF(errors);
    Py_XDECREF(data);
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    Py_XDECREF(flags);
    Py_XDECREF(partitions);
    Py_XDECREF(offsets);
    Py_XDECREF(timestamps);
    Py_XDECREF(key_data);
    Py_XDECREF(key_offsets);
    Py_XDECREF(key_valid);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(path, consumer_type): librdkafka's functions, from the loaded library at path"},
    {"check", check, METH_O, "check(consumer): ValueError unless the consumer's layout is the one this module reads"},
    {"consume", consume, METH_VARARGS,
     "consume(consumer, max, timeout_ms, linger_ms, wait_first, sep, keys, timestamps): a batch as flat buffers"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rdbatch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_rdbatch(void) { return PyModule_Create(&module); }
