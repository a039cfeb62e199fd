/* pyddp._C: fused multi-tensor optimizer steps (kernels/optim.h).
 *
 * adam_step / sgd_step take one parameter group as parallel lists of
 * arrays, check every array (dtype, C-contiguity, writability, element
 * count) before touching any, then run the whole group in one call with the
 * GIL released.  pyddp/optim/_functional.py is the Python caller.
 */
#include "binding.h"

#include "../kernels/optim.h"

#define PARAM_BITS (PD_F16_BIT | PD_BF16_BIT | PD_F32_BIT)

/* Everything one call holds: the views and the C tensor descriptions. */
typedef struct group_views {
    Py_ssize_t n;
    pd_fview *params, *grads, *s0, *s1, *s2, *masters;
    pd_fview found;
    pd_optim_tensor *t;
} group_views;

static void
group_release(group_views *g)
{
    pd_py_fviews_release(g->params, g->n);
    pd_py_fviews_release(g->grads, g->n);
    pd_py_fviews_release(g->s0, g->n);
    pd_py_fviews_release(g->s1, g->n);
    pd_py_fviews_release(g->s2, g->n);
    pd_py_fviews_release(g->masters, g->n);
    pd_py_fview_release(&g->found);
    PyMem_RawFree(g->t);
}

/* masters: None, or a sequence of float32 arrays / None (one per param). */
static pd_fview *
get_masters(PyObject *seq, Py_ssize_t n, const char *fn)
{
    PyObject *fast = PySequence_Fast(seq, "");
    if (fast == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "%s: masters must be None or a list of float32 arrays "
                     "or None, got %.100s", fn, Py_TYPE(seq)->tp_name);
        return NULL;
    }
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError,
                     "%s: masters has %zd entries, expected %zd (one per "
                     "parameter)", fn, PySequence_Fast_GET_SIZE(fast), n);
        Py_DECREF(fast);
        return NULL;
    }
    pd_fview *v = PyMem_RawCalloc(n > 0 ? (size_t)n : 1, sizeof(pd_fview));
    if (v == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (item == Py_None) {
            continue;
        }
        if (pd_py_fview_get(item, fn, "masters", i, 1, PD_F32_BIT, &v[i]) <
            0) {
            pd_py_fviews_release(v, i);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    return v;
}

static int
check_count(const pd_fview *v, Py_ssize_t i, size_t want, const char *fn,
            const char *name)
{
    if (v->held && v->count != want) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s[%zd] has %zu elements but params[%zd] has %zu",
                     fn, name, i, v->count, i, want);
        return -1;
    }
    return 0;
}

/* The arrays of one parameter are read and written through restrict
 * pointers in one loop: none may share memory with another. */
static int
check_disjoint(const group_views *g, Py_ssize_t i, const char *fn,
               const char *n0, const char *n1, const char *n2)
{
    const pd_fview *v[6] = {&g->params[i], &g->grads[i],
                            g->s0 ? &g->s0[i] : NULL,
                            g->s1 ? &g->s1[i] : NULL,
                            g->s2 ? &g->s2[i] : NULL,
                            g->masters ? &g->masters[i] : NULL};
    const char *names[6] = {"params", "grads", n0, n1, n2, "masters"};
    for (int a = 0; a < 6; a++) {
        if (v[a] == NULL || !v[a]->held || v[a]->nbytes == 0) {
            continue;
        }
        const char *alo = v[a]->ptr, *ahi = alo + v[a]->nbytes;
        for (int b = a + 1; b < 6; b++) {
            if (v[b] == NULL || !v[b]->held || v[b]->nbytes == 0) {
                continue;
            }
            const char *blo = v[b]->ptr, *bhi = blo + v[b]->nbytes;
            if (alo < bhi && blo < ahi) {
                PyErr_Format(PyExc_ValueError,
                             "%s: %s[%zd] and %s[%zd] share memory", fn,
                             names[a], i, names[b], i);
                return -1;
            }
        }
    }
    return 0;
}

/* Views of params, grads, the state lists (s*_obj == NULL or None: absent)
 * and masters; the tensor table g->t filled in.  Returns 0 or -1. */
static int
group_get(group_views *g, const char *fn, PyObject *params, PyObject *grads,
          const char *n0, PyObject *s0, const char *n1, PyObject *s1,
          const char *n2, PyObject *s2, PyObject *masters,
          PyObject *found_obj)
{
    memset(g, 0, sizeof(*g));
    Py_ssize_t n = 0, k = 0;
    g->params = pd_py_fviews_get(params, -1, fn, "params", 1, PARAM_BITS, &n);
    if (g->params == NULL) {
        return -1;
    }
    g->n = n;
    g->grads = pd_py_fviews_get(grads, n, fn, "grads", 0, PARAM_BITS, &k);
    if (g->grads == NULL) {
        return -1;
    }
    if (s0 != NULL && s0 != Py_None) {
        g->s0 = pd_py_fviews_get(s0, n, fn, n0, 1, PD_F32_BIT, &k);
        if (g->s0 == NULL) {
            return -1;
        }
    }
    if (s1 != NULL && s1 != Py_None) {
        g->s1 = pd_py_fviews_get(s1, n, fn, n1, 1, PD_F32_BIT, &k);
        if (g->s1 == NULL) {
            return -1;
        }
    }
    if (s2 != NULL && s2 != Py_None) {
        g->s2 = pd_py_fviews_get(s2, n, fn, n2, 1, PD_F32_BIT, &k);
        if (g->s2 == NULL) {
            return -1;
        }
    }
    if (masters != Py_None) {
        g->masters = get_masters(masters, n, fn);
        if (g->masters == NULL) {
            return -1;
        }
    }
    float *flag;
    if (pd_py_found_inf(found_obj, fn, &g->found, &flag) < 0) {
        return -1;
    }
    g->t = PyMem_RawCalloc(n > 0 ? (size_t)n : 1, sizeof(pd_optim_tensor));
    if (g->t == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t c = g->params[i].count;
        pd_optim_tensor *t = &g->t[i];
        if (check_count(&g->grads[i], i, c, fn, "grads") < 0 ||
            (g->s0 && check_count(&g->s0[i], i, c, fn, n0) < 0) ||
            (g->s1 && check_count(&g->s1[i], i, c, fn, n1) < 0) ||
            (g->s2 && check_count(&g->s2[i], i, c, fn, n2) < 0) ||
            (g->masters && check_count(&g->masters[i], i, c, fn, "masters") <
                               0)) {
            return -1;
        }
        t->param = g->params[i].ptr;
        t->param_dtype = g->params[i].dt;
        t->grad = g->grads[i].ptr;
        t->grad_dtype = g->grads[i].dt;
        t->count = c;
        t->master = (g->masters && g->masters[i].held)
                        ? (float *)g->masters[i].ptr
                        : NULL;
        t->state0 = g->s0 ? (float *)g->s0[i].ptr : NULL;
        t->state1 = g->s1 ? (float *)g->s1[i].ptr : NULL;
        t->state2 = g->s2 ? (float *)g->s2[i].ptr : NULL;
        if (check_disjoint(g, i, fn, n0, n1, n2) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A per-parameter sequence of numbers (steps) or of flags. */
static int
get_doubles(PyObject *seq, Py_ssize_t n, const char *fn, const char *name,
            pd_optim_tensor *t, int as_flag)
{
    PyObject *fast = PySequence_Fast(seq, "");
    if (fast == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a list, got %.100s",
                     fn, name, Py_TYPE(seq)->tp_name);
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s has %zd entries, expected %zd (one per "
                     "parameter)", fn, name, PySequence_Fast_GET_SIZE(fast),
                     n);
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (as_flag) {
            int b = PyObject_IsTrue(item);
            if (b < 0) {
                Py_DECREF(fast);
                return -1;
            }
            t[i].first = b;
        } else {
            double d = PyFloat_AsDouble(item);
            if (d == -1.0 && PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError,
                             "%s: %s[%zd] must be a number", fn, name, i);
                Py_DECREF(fast);
                return -1;
            }
            t[i].step = d;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *
adam_step(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static const char *fn = "adam_step";
    static char *kwlist[] = {
        "params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs",
        "masters", "steps", "lr", "beta1", "beta2", "eps", "weight_decay",
        "amsgrad", "maximize", "decoupled", "bias_correction", "inv_scale",
        "found_inf", "check_finite", NULL};
    PyObject *params, *grads, *m, *v, *vmax, *masters, *steps;
    PyObject *inv_obj = Py_None, *found_obj = Py_None;
    pd_adam_options o;
    o.amsgrad = 0;
    o.maximize = 0;
    o.decoupled = 0;
    o.bias_correction = 1;
    int check = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "OOOOOOOddddd|ppppOOp:adam_step", kwlist, &params,
            &grads, &m, &v, &vmax, &masters, &steps, &o.lr, &o.beta1,
            &o.beta2, &o.eps, &o.weight_decay, &o.amsgrad, &o.maximize,
            &o.decoupled, &o.bias_correction, &inv_obj, &found_obj,
            &check)) {
        return NULL;
    }
    if (m == Py_None || v == Py_None) {
        PyErr_Format(PyExc_ValueError,
                     "%s: exp_avgs and exp_avg_sqs are required", fn);
        return NULL;
    }
    if (o.amsgrad && vmax == Py_None) {
        PyErr_Format(PyExc_ValueError,
                     "%s: amsgrad needs max_exp_avg_sqs", fn);
        return NULL;
    }
    pd_scaling sc;
    sc.check_finite = check;
    if (pd_py_inv_scale(inv_obj, fn, &sc.inv_scale) < 0) {
        return NULL;
    }
    group_views g;
    if (group_get(&g, fn, params, grads, "exp_avgs", m, "exp_avg_sqs", v,
                  "max_exp_avg_sqs", o.amsgrad ? vmax : Py_None, masters,
                  found_obj) < 0 ||
        get_doubles(steps, g.n, fn, "steps", g.t, 0) < 0) {
        group_release(&g);
        return NULL;
    }
    sc.found_inf = g.found.held ? (float *)g.found.ptr : NULL;
    int stepped;
    Py_BEGIN_ALLOW_THREADS
    pd_adam_step(&o, &sc, g.t, (size_t)g.n, &stepped);
    Py_END_ALLOW_THREADS
    group_release(&g);
    return PyBool_FromLong(stepped);
}

static PyObject *
sgd_step(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static const char *fn = "sgd_step";
    static char *kwlist[] = {
        "params", "grads", "momentum_buffers", "masters", "first", "lr",
        "momentum", "dampening", "weight_decay", "nesterov", "maximize",
        "inv_scale", "found_inf", "check_finite", NULL};
    PyObject *params, *grads, *bufs, *masters, *first;
    PyObject *inv_obj = Py_None, *found_obj = Py_None;
    pd_sgd_options o;
    o.nesterov = 0;
    o.maximize = 0;
    int check = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "OOOOOdddd|ppOOp:sgd_step", kwlist, &params, &grads,
            &bufs, &masters, &first, &o.lr, &o.momentum, &o.dampening,
            &o.weight_decay, &o.nesterov, &o.maximize, &inv_obj, &found_obj,
            &check)) {
        return NULL;
    }
    if (o.momentum != 0.0 && bufs == Py_None) {
        PyErr_Format(PyExc_ValueError,
                     "%s: momentum != 0 needs momentum_buffers", fn);
        return NULL;
    }
    pd_scaling sc;
    sc.check_finite = check;
    if (pd_py_inv_scale(inv_obj, fn, &sc.inv_scale) < 0) {
        return NULL;
    }
    group_views g;
    if (group_get(&g, fn, params, grads, "momentum_buffers",
                  o.momentum != 0.0 ? bufs : Py_None, NULL, NULL, NULL, NULL,
                  masters, found_obj) < 0 ||
        (first != Py_None &&
         get_doubles(first, g.n, fn, "first", g.t, 1) < 0)) {
        group_release(&g);
        return NULL;
    }
    sc.found_inf = g.found.held ? (float *)g.found.ptr : NULL;
    int stepped;
    Py_BEGIN_ALLOW_THREADS
    pd_sgd_step(&o, &sc, g.t, (size_t)g.n, &stepped);
    Py_END_ALLOW_THREADS
    group_release(&g);
    return PyBool_FromLong(stepped);
}

static PyMethodDef optim_methods[] = {
    {"adam_step", (PyCFunction)(void (*)(void))adam_step,
     METH_VARARGS | METH_KEYWORDS,
     "adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, "
     "masters, steps, lr, beta1, beta2, eps, weight_decay, amsgrad=False, "
     "maximize=False, decoupled=False, bias_correction=True, inv_scale=None, "
     "found_inf=None, check_finite=False) -> bool\n\n"
     "One Adam/AdamW step over a whole parameter group (torch 2.13 "
     "formulas, float32 arithmetic), GIL released.  params: float32, "
     "float16 or bfloat16 (uint16 view) arrays; grads: same kinds, read "
     "only; exp_avgs, exp_avg_sqs, max_exp_avg_sqs (None unless amsgrad): "
     "float32 state; masters: None or a list of float32 master copies / None "
     "(updated, then rounded into params); steps: the step number of each "
     "param after this update.  Grads are multiplied by inv_scale on the fly "
     "(not written back).  found_inf: 1-element float32 array or None; "
     "non-zero skips the step; check_finite=True first scans the grads and "
     "sets found_inf and skips on inf/NaN.  Returns whether the step ran."},
    {"sgd_step", (PyCFunction)(void (*)(void))sgd_step,
     METH_VARARGS | METH_KEYWORDS,
     "sgd_step(params, grads, momentum_buffers, masters, first, lr, "
     "momentum, dampening, weight_decay, nesterov=False, maximize=False, "
     "inv_scale=None, found_inf=None, check_finite=False) -> bool\n\n"
     "One SGD step (torch.optim.SGD formulas) over a group, GIL released.  "
     "momentum_buffers: float32 arrays (None when momentum == 0); first: "
     "per-param flags, true where the buffer is new (it is set to the "
     "gradient).  Other arguments as adam_step."},
    {NULL, NULL, 0, NULL},
};

int
pd_optim_add_functions(PyObject *m, pd_module_state *st)
{
    return PyModule_AddFunctions(m, optim_methods);
}
