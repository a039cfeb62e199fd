/* _C.Generator (torch's CPU generator: mt19937 + its state layout) and
 * _C.dist_sampler_indices.  The algorithms live in csrc/kernels/random.c;
 * this file converts arguments, fills caller-allocated int64 buffers with
 * the GIL released, and raises errors through pd_py_set_error.
 * pyddp/_random.py wraps the type in pyddp.Generator. */
#include "binding.h"

#include <math.h>
#include <pythread.h>

#include "../kernels/random.h"

/* torch's CPUGeneratorImplState (5056 bytes): the legacy THGeneratorState
 * (initial seed, left, seeded, next, 624 uint64 words, normal_x, normal_y,
 * normal_rho, normal_is_valid), then next_float_normal_sample and its valid
 * flag.  The normal-sample caches (bytes NORMAL_OFF..) are kept verbatim so
 * a state round-trips exactly; pyddp draws no normal samples. */
#define TORCH_STATE_SIZE 5056
#define OFF_SEED 0
#define OFF_LEFT 8
#define OFF_SEEDED 12
#define OFF_NEXT 16
#define OFF_WORDS 24
#define NORMAL_OFF (OFF_WORDS + 8 * PD_MT_N)
#define NORMAL_LEN (TORCH_STATE_SIZE - NORMAL_OFF)

/* Above this many elements the GIL is released while filling. */
#define NOGIL_MIN 4096

typedef struct {
    PyObject_HEAD
    pd_mt19937 mt;
    unsigned char normal[NORMAL_LEN];
    PyThread_type_lock lock;
} GeneratorObject;

static PyObject *
raise_status(pd_status st)
{
    /* The random kernels fail only with PD_EINVAL / PD_ENOMEM, which map
     * to built-in exceptions (no module state needed). */
    if (st == PD_ENOMEM) {
        return PyErr_NoMemory();
    }
    PyErr_SetString(st == PD_ETYPE ? PyExc_TypeError : PyExc_ValueError,
                    pd_errmsg());
    return NULL;
}

/* A Python int as torch's uint64 seed: first as unsigned, then, if it
 * overflowed, as a signed int64 reinterpreted in two's complement. */
static int
seed_of(PyObject *obj, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "seed must be an int, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(obj);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return -1;
        }
        PyErr_Clear();
        long long s = PyLong_AsLongLong(obj);
        if (s == -1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError,
                                "Overflow when unpacking long long");
            }
            return -1;
        }
        u = (unsigned long long)s;
    }
    *out = (uint64_t)u;
    return 0;
}

/* A writable C-contiguous int64 buffer of exactly count elements. */
static int
int64_out(PyObject *obj, const char *argname, Py_ssize_t count,
          Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                          PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a writable C-contiguous "
                     "int64 buffer, not %.100s", argname,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') {
        f++;
    }
    if (view->itemsize != 8 || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s must have dtype int64, got format "
                     "'%s' with itemsize %zd", argname,
                     view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    if (view->len / 8 != count) {
        PyErr_Format(PyExc_ValueError, "%s must have %zd elements, got %zd",
                     argname, count, view->len / 8);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void
gen_lock(GeneratorObject *self)
{
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static void
gen_unlock(GeneratorObject *self)
{
    PyThread_release_lock(self->lock);
}

/* ----------------------------------------------------------- Generator */

static PyObject *
Generator_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"seed", NULL};
    PyObject *seedobj = NULL;
    uint64_t seed = 67280421310721ull; /* torch's default_rng_seed_val */
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Generator", kwlist,
                                     &seedobj)) {
        return NULL;
    }
    if (seedobj != NULL && seed_of(seedobj, &seed) < 0) {
        return NULL;
    }
    GeneratorObject *self = (GeneratorObject *)tp->tp_alloc(tp, 0);
    if (self == NULL) {
        return NULL;
    }
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    pd_mt_seed(&self->mt, seed);
    memset(self->normal, 0, sizeof(self->normal));
    return (PyObject *)self;
}

static void
Generator_dealloc(PyObject *obj)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    PyTypeObject *tp = Py_TYPE(obj);
    if (self->lock != NULL) {
        PyThread_free_lock(self->lock);
    }
    tp->tp_free(obj);
    Py_DECREF(tp);
}

static PyObject *
Generator_manual_seed(PyObject *obj, PyObject *arg)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    uint64_t seed;
    if (seed_of(arg, &seed) < 0) {
        return NULL;
    }
    gen_lock(self);
    pd_mt_seed(&self->mt, seed);
    /* torch forgets cached normal samples on reseeding. */
    memset(self->normal, 0, sizeof(self->normal));
    gen_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *
Generator_initial_seed(PyObject *obj, PyObject *unused)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    return PyLong_FromUnsignedLongLong(self->mt.seed);
}

static void
put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static PyObject *
Generator_get_state(PyObject *obj, PyObject *unused)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    PyObject *b = PyBytes_FromStringAndSize(NULL, TORCH_STATE_SIZE);
    if (b == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(b);
    memset(p, 0, TORCH_STATE_SIZE);
    gen_lock(self);
    int32_t left = self->mt.left, seeded = self->mt.seeded ? 1 : 0;
    put_u64(p + OFF_SEED, self->mt.seed);
    memcpy(p + OFF_LEFT, &left, 4);
    memcpy(p + OFF_SEEDED, &seeded, 4);
    put_u64(p + OFF_NEXT, (uint64_t)self->mt.next);
    for (int i = 0; i < PD_MT_N; i++) {
        put_u64(p + OFF_WORDS + 8 * i, (uint64_t)self->mt.state[i]);
    }
    memcpy(p + NORMAL_OFF, self->normal, NORMAL_LEN);
    gen_unlock(self);
    return b;
}

static PyObject *
Generator_set_state(PyObject *obj, PyObject *arg)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "new_state must be a bytes-like "
                     "object (e.g. a uint8 array), not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    if (v.len != TORCH_STATE_SIZE) {
        PyErr_Format(PyExc_RuntimeError, "Expected a CPUGeneratorImplState "
                     "of size %d but found the input RNG state size to be "
                     "%zd", TORCH_STATE_SIZE, v.len);
        PyBuffer_Release(&v);
        return NULL;
    }
    const unsigned char *p = v.buf;
    pd_mt19937 mt;
    uint64_t next;
    int32_t left, seeded;
    memcpy(&mt.seed, p + OFF_SEED, 8);
    memcpy(&left, p + OFF_LEFT, 4);
    memcpy(&seeded, p + OFF_SEEDED, 4);
    memcpy(&next, p + OFF_NEXT, 8);
    mt.left = left;
    mt.seeded = seeded != 0;
    mt.next = (uint32_t)next;
    for (int i = 0; i < PD_MT_N; i++) {
        uint64_t w;
        memcpy(&w, p + OFF_WORDS + 8 * i, 8);
        mt.state[i] = (uint32_t)w;
    }
    if (!pd_mt_valid(&mt) || next > PD_MT_N) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_RuntimeError, "Invalid mt19937 state");
        return NULL;
    }
    gen_lock(self);
    self->mt = mt;
    memcpy(self->normal, p + NORMAL_OFF, NORMAL_LEN);
    gen_unlock(self);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

static PyObject *
Generator_random(PyObject *obj, PyObject *unused)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    gen_lock(self);
    uint32_t r = pd_mt_random(&self->mt);
    gen_unlock(self);
    return PyLong_FromUnsignedLong(r);
}

static PyObject *
Generator_random64(PyObject *obj, PyObject *unused)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    gen_lock(self);
    uint64_t r = pd_mt_random64(&self->mt);
    gen_unlock(self);
    return PyLong_FromUnsignedLongLong(r);
}

/* randperm_into(out): out (int64, n elements) = randperm(n). */
static PyObject *
Generator_randperm_into(PyObject *obj, PyObject *arg)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                        PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "out must be a writable C-contiguous "
                     "int64 buffer, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_ssize_t n = v.len / (v.itemsize > 0 ? v.itemsize : 1);
    PyBuffer_Release(&v);
    if (int64_out(arg, "out", n, &v) < 0) {
        return NULL;
    }
    gen_lock(self);
    if (n >= NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        pd_randperm(&self->mt, v.buf, (int64_t)n);
        Py_END_ALLOW_THREADS
    } else {
        pd_randperm(&self->mt, v.buf, (int64_t)n);
    }
    gen_unlock(self);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

/* randint_into(out, low, range): torch.randint(low, low + range). */
static PyObject *
Generator_randint_into(PyObject *obj, PyObject *args)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    PyObject *out;
    long long low;
    unsigned long long range;
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "OLK:randint_into", &out, &low, &range)) {
        return NULL;
    }
    if (range == 0) {
        PyErr_SetString(PyExc_ValueError, "randint: range must be >= 1");
        return NULL;
    }
    if (PyObject_GetBuffer(out, &v, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Py_ssize_t n = v.len / 8;
    PyBuffer_Release(&v);
    if (int64_out(out, "out", n, &v) < 0) {
        return NULL;
    }
    gen_lock(self);
    if (n >= NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        pd_randint(&self->mt, v.buf, (size_t)n, range, low);
        Py_END_ALLOW_THREADS
    } else {
        pd_randint(&self->mt, v.buf, (size_t)n, range, low);
    }
    gen_unlock(self);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

/* exponential_into(out float64, lambd) */
static PyObject *
Generator_exponential_into(PyObject *obj, PyObject *args)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    PyObject *out;
    double lambd;
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "Od:exponential_into", &out, &lambd)) {
        return NULL;
    }
    if (!(lambd > 0) || isinf(lambd)) {
        PyErr_Format(PyExc_ValueError, "exponential_ expects lambda > 0.0, "
                     "but found lambda=%g", lambd);
        return NULL;
    }
    if (PyObject_GetBuffer(out, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                        PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    if (v.itemsize != 8 || v.format == NULL || strchr(v.format, 'd') == NULL) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_TypeError, "out must be a writable "
                        "C-contiguous float64 buffer");
        return NULL;
    }
    gen_lock(self);
    Py_BEGIN_ALLOW_THREADS
    pd_exponential(&self->mt, v.buf, (size_t)(v.len / 8), lambd);
    Py_END_ALLOW_THREADS
    gen_unlock(self);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

/* multinomial_into(weights float64, out int64): with replacement. */
static PyObject *
Generator_multinomial_into(PyObject *obj, PyObject *args)
{
    GeneratorObject *self = (GeneratorObject *)obj;
    PyObject *wobj, *out;
    Py_buffer w, v;
    pd_status st;
    if (!PyArg_ParseTuple(args, "OO:multinomial_into", &wobj, &out)) {
        return NULL;
    }
    if (PyObject_GetBuffer(wobj, &w, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return NULL;
    }
    if (w.itemsize != 8 || w.format == NULL ||
        strchr(w.format, 'd') == NULL) {
        PyBuffer_Release(&w);
        PyErr_SetString(PyExc_TypeError, "weights must be a C-contiguous "
                        "float64 buffer");
        return NULL;
    }
    if (PyObject_GetBuffer(out, &v, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&w);
        return NULL;
    }
    Py_ssize_t n = v.len / 8;
    PyBuffer_Release(&v);
    if (int64_out(out, "out", n, &v) < 0) {
        PyBuffer_Release(&w);
        return NULL;
    }
    gen_lock(self);
    Py_BEGIN_ALLOW_THREADS
    st = pd_multinomial_replacement(&self->mt, w.buf, (int64_t)(w.len / 8),
                                    v.buf, (int64_t)n);
    Py_END_ALLOW_THREADS
    gen_unlock(self);
    PyBuffer_Release(&v);
    PyBuffer_Release(&w);
    if (st != PD_OK) {
        return raise_status(st);
    }
    Py_RETURN_NONE;
}

static PyMethodDef Generator_methods[] = {
    {"manual_seed", Generator_manual_seed, METH_O,
     "manual_seed(seed)\n\nReseed: the state from the low 32 bits of seed "
     "taken as uint64."},
    {"initial_seed", Generator_initial_seed, METH_NOARGS,
     "initial_seed() -> int\n\nThe seed last set (as uint64)."},
    {"get_state", Generator_get_state, METH_NOARGS,
     "get_state() -> bytes\n\nThe state in torch's 5056-byte layout."},
    {"set_state", Generator_set_state, METH_O,
     "set_state(state)\n\nRestore a state from get_state() (or torch's)."},
    {"random", Generator_random, METH_NOARGS,
     "random() -> int\n\nThe next 32-bit output."},
    {"random64", Generator_random64, METH_NOARGS,
     "random64() -> int\n\nTwo outputs as (first << 32) | second."},
    {"randperm_into", Generator_randperm_into, METH_O,
     "randperm_into(out)\n\nFill the int64 buffer out (n elements) with "
     "torch.randperm(n)."},
    {"randint_into", Generator_randint_into, METH_VARARGS,
     "randint_into(out, low, range)\n\nFill out with torch.randint(low, "
     "low + range)."},
    {"exponential_into", Generator_exponential_into, METH_VARARGS,
     "exponential_into(out, lambd)\n\nFill the float64 buffer out like "
     "Tensor.exponential_(lambd)."},
    {"multinomial_into", Generator_multinomial_into, METH_VARARGS,
     "multinomial_into(weights, out)\n\ntorch.multinomial(weights, "
     "len(out), replacement=True) for len(out) >= 2."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Generator_slots[] = {
    {Py_tp_new, Generator_new},
    {Py_tp_dealloc, Generator_dealloc},
    {Py_tp_methods, Generator_methods},
    {Py_tp_doc, "Generator(seed=67280421310721)\n\ntorch's CPU random "
                "generator (mt19937), bit for bit."},
    {0, NULL},
};

static PyType_Spec Generator_spec = {
    .name = "pyddp._C.Generator",
    .basicsize = sizeof(GeneratorObject),
    .flags = PD_TPFLAGS,
    .slots = Generator_slots,
};

/* ------------------------------------------------ module functions */

static PyObject *
dist_sampler_indices(PyObject *m, PyObject *args)
{
    long long len, nrep, rank;
    int shuffle, drop_last;
    PyObject *seedobj, *out;
    uint64_t seed;
    Py_buffer v;
    pd_status st;
    if (!PyArg_ParseTuple(args, "LLLpOpO:dist_sampler_indices", &len, &nrep,
                          &rank, &shuffle, &seedobj, &drop_last, &out)) {
        return NULL;
    }
    if (seed_of(seedobj, &seed) < 0) {
        return NULL;
    }
    if (len < 0 || nrep < 1 || rank < 0 || rank >= nrep) {
        PyErr_Format(PyExc_ValueError, "dist_sampler_indices: need len >= 0 "
                     "and 0 <= rank < num_replicas, got len=%lld, "
                     "num_replicas=%lld, rank=%lld", len, nrep, rank);
        return NULL;
    }
    int64_t ns = pd_dist_num_samples(len, nrep, drop_last);
    if (int64_out(out, "out", (Py_ssize_t)ns, &v) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    st = pd_dist_sampler_indices(len, nrep, rank, shuffle, seed, drop_last,
                                 v.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (st != PD_OK) {
        return raise_status(st);
    }
    Py_RETURN_NONE;
}

static PyObject *
dist_num_samples(PyObject *m, PyObject *args)
{
    long long len, nrep;
    int drop_last;
    if (!PyArg_ParseTuple(args, "LLp:dist_num_samples", &len, &nrep,
                          &drop_last)) {
        return NULL;
    }
    if (len < 0 || nrep < 1) {
        PyErr_Format(PyExc_ValueError, "dist_num_samples: need len >= 0 and "
                     "num_replicas >= 1, got %lld and %lld", len, nrep);
        return NULL;
    }
    return PyLong_FromLongLong(pd_dist_num_samples(len, nrep, drop_last));
}

static PyMethodDef random_functions[] = {
    {"dist_sampler_indices", dist_sampler_indices, METH_VARARGS,
     "dist_sampler_indices(len, num_replicas, rank, shuffle, seed, "
     "drop_last, out)\n\nFill out (int64, num_samples elements) with the "
     "indices torch's DistributedSampler yields for rank, seed including "
     "the epoch."},
    {"dist_num_samples", dist_num_samples, METH_VARARGS,
     "dist_num_samples(len, num_replicas, drop_last) -> int"},
    {NULL, NULL, 0, NULL},
};

int
pd_random_add_types(PyObject *m, pd_module_state *st)
{
    st->GeneratorType =
        (PyTypeObject *)PyType_FromModuleAndSpec(m, &Generator_spec, NULL);
    if (st->GeneratorType == NULL) {
        return -1;
    }
    if (PyModule_AddType(m, st->GeneratorType) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(m, random_functions);
}
