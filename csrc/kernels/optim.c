/* Fused multi-tensor Adam / AdamW and SGD steps (see optim.h).
 *
 * The float32 loop bodies are always_inline functions taking their option
 * flags as arguments; each caller passes constants, so every flag
 * combination becomes its own branch-free loop the compiler vectorises.
 * On x86-64 the same bodies are also compiled for AVX2 (not FMA: no
 * contraction, so both builds give the same bits) and picked at run time.
 * Half-precision parameters or gradients are widened into float32 blocks
 * on the stack with the casts of cast.c, updated by the float32 body, and
 * rounded back once.
 *
 * sqrtf may set errno (negative input), so GCC only vectorises the Adam
 * loop under -fno-math-errno, which setup.py passes; without it the results
 * are the same, only slower.
 */
#include "optim.h"

#include <math.h>
#include <string.h>

#include "amp.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(PD_KERNELS_PORTABLE)
#define HAVE_X86_DISPATCH 1
#endif

#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE static inline
#endif

#define BLOCK 512

/* ---- Adam ---- */

/* The scalars of one tensor's update, rounded to float32 where torch
 * turns a Python float into the tensor's dtype. */
typedef struct adam_consts {
    float gscale;  /* inv_scale, negated for maximize (both exact) */
    float wd;      /* L2: grad + wd * param */
    float decay;   /* AdamW: param * (1 - lr * wd) */
    float w1;      /* lerp weight 1 - beta1 */
    float omw1;    /* 1 - w1, for lerp's large-weight form */
    float b2;
    float c2;      /* 1 - beta2 */
    float bc2s;    /* sqrt(1 - beta2^step) */
    float eps;
    float nss;     /* -lr / (1 - beta1^step) */
} adam_consts;

enum { WD_NONE = 0, WD_L2 = 1, WD_DECOUPLED = 2 };

/* torch: exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2)
 * .addcmul_(grad, grad, value=1 - beta2); denom = (v.sqrt() / bc2_sqrt)
 * .add_(eps); param.addcdiv_(exp_avg, denom, value=-step_size). */
ALWAYS_INLINE void
adam_body(const adam_consts *k, float *restrict p, const float *restrict g,
          float *restrict m, float *restrict v, float *restrict vmax,
          size_t n, int wd_mode, int ams, int small)
{
    const float gscale = k->gscale, wd = k->wd, decay = k->decay;
    const float w1 = k->w1, omw1 = k->omw1, b2 = k->b2, c2 = k->c2;
    const float bc2s = k->bc2s, eps = k->eps, nss = k->nss;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float pi = p[i];
        if (wd_mode == WD_L2) {
            gi = gi + wd * pi;
        } else if (wd_mode == WD_DECOUPLED) {
            pi = pi * decay;
        }
        float mi = m[i];
        mi = small ? mi + w1 * (gi - mi) : gi - (gi - mi) * omw1;
        m[i] = mi;
        float vi = v[i] * b2;
        vi = vi + c2 * gi * gi;
        v[i] = vi;
        if (ams) {
            /* torch.maximum: NaN in either operand gives NaN */
            float vm = vmax[i];
            vm = (vm != vm || vm > vi) ? vm : vi;
            vmax[i] = vm;
            vi = vm;
        }
        float denom = sqrtf(vi) / bc2s + eps;
        p[i] = pi + nss * mi / denom;
    }
}

#define ADAM_DISPATCH(k, p, g, m, v, vmax, n, wd_mode, ams, small)            \
    do {                                                                      \
        if (ams) {                                                            \
            if (small) {                                                      \
                ADAM_WD(k, p, g, m, v, vmax, n, wd_mode, 1, 1);               \
            } else {                                                          \
                ADAM_WD(k, p, g, m, v, vmax, n, wd_mode, 1, 0);               \
            }                                                                 \
        } else {                                                              \
            if (small) {                                                      \
                ADAM_WD(k, p, g, m, v, vmax, n, wd_mode, 0, 1);               \
            } else {                                                          \
                ADAM_WD(k, p, g, m, v, vmax, n, wd_mode, 0, 0);               \
            }                                                                 \
        }                                                                     \
    } while (0)

#define ADAM_WD(k, p, g, m, v, vmax, n, wd_mode, A, S)                        \
    do {                                                                      \
        if ((wd_mode) == WD_L2) {                                             \
            adam_body(k, p, g, m, v, vmax, n, WD_L2, A, S);                   \
        } else if ((wd_mode) == WD_DECOUPLED) {                               \
            adam_body(k, p, g, m, v, vmax, n, WD_DECOUPLED, A, S);            \
        } else {                                                              \
            adam_body(k, p, g, m, v, vmax, n, WD_NONE, A, S);                 \
        }                                                                     \
    } while (0)

typedef void (*adam_fn)(const adam_consts *, float *, const float *, float *,
                        float *, float *, size_t, int, int, int);

static void
adam_f32(const adam_consts *k, float *p, const float *g, float *m, float *v,
         float *vmax, size_t n, int wd_mode, int ams, int small)
{
    ADAM_DISPATCH(k, p, g, m, v, vmax, n, wd_mode, ams, small);
}

#ifdef HAVE_X86_DISPATCH
__attribute__((target("avx2"))) static void
adam_f32_avx2(const adam_consts *k, float *p, const float *g, float *m,
              float *v, float *vmax, size_t n, int wd_mode, int ams,
              int small)
{
    ADAM_DISPATCH(k, p, g, m, v, vmax, n, wd_mode, ams, small);
}
#endif

/* ---- SGD ---- */

typedef struct sgd_consts {
    float gscale;
    float wd;
    float mom;
    float damp1;  /* 1 - dampening */
    float nlr;    /* -lr */
} sgd_consts;

/* torch: grad = grad.add(param, alpha=wd); buf = grad.clone() on the first
 * step, else buf.mul_(momentum).add_(grad, alpha=1 - dampening); grad =
 * grad.add(buf, alpha=momentum) (nesterov) or buf; param.add_(grad,
 * alpha=-lr). */
ALWAYS_INLINE void
sgd_body(const sgd_consts *k, float *restrict p, const float *restrict g,
         float *restrict buf, size_t n, int l2, int mom, int first, int nest)
{
    const float gscale = k->gscale, wd = k->wd, mo = k->mom;
    const float damp1 = k->damp1, nlr = k->nlr;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float pi = p[i];
        if (l2) {
            gi = gi + wd * pi;
        }
        if (mom) {
            float b = first ? gi : buf[i] * mo + damp1 * gi;
            buf[i] = b;
            gi = nest ? gi + mo * b : b;
        }
        p[i] = pi + nlr * gi;
    }
}

#define SGD_N(k, p, g, b, n, L, M, F, nest)                                   \
    do {                                                                      \
        if (nest) {                                                           \
            sgd_body(k, p, g, b, n, L, M, F, 1);                              \
        } else {                                                              \
            sgd_body(k, p, g, b, n, L, M, F, 0);                              \
        }                                                                     \
    } while (0)

#define SGD_DISPATCH(k, p, g, b, n, l2, mom, first, nest)                     \
    do {                                                                      \
        if (!(mom)) {                                                         \
            if (l2) {                                                         \
                sgd_body(k, p, g, b, n, 1, 0, 0, 0);                          \
            } else {                                                          \
                sgd_body(k, p, g, b, n, 0, 0, 0, 0);                          \
            }                                                                 \
        } else if (first) {                                                   \
            if (l2) {                                                         \
                SGD_N(k, p, g, b, n, 1, 1, 1, nest);                          \
            } else {                                                          \
                SGD_N(k, p, g, b, n, 0, 1, 1, nest);                          \
            }                                                                 \
        } else {                                                              \
            if (l2) {                                                         \
                SGD_N(k, p, g, b, n, 1, 1, 0, nest);                          \
            } else {                                                          \
                SGD_N(k, p, g, b, n, 0, 1, 0, nest);                          \
            }                                                                 \
        }                                                                     \
    } while (0)

typedef void (*sgd_fn)(const sgd_consts *, float *, const float *, float *,
                       size_t, int, int, int, int);

static void
sgd_f32(const sgd_consts *k, float *p, const float *g, float *b, size_t n,
        int l2, int mom, int first, int nest)
{
    SGD_DISPATCH(k, p, g, b, n, l2, mom, first, nest);
}

#ifdef HAVE_X86_DISPATCH
__attribute__((target("avx2"))) static void
sgd_f32_avx2(const sgd_consts *k, float *p, const float *g, float *b,
             size_t n, int l2, int mom, int first, int nest)
{
    SGD_DISPATCH(k, p, g, b, n, l2, mom, first, nest);
}
#endif

#ifdef HAVE_X86_DISPATCH
static int
use_avx2(void)
{
    return __builtin_cpu_supports("avx2");
}
#endif

/* ---- shared driver ---- */

/* Whether the step runs: a set flag skips; check_finite reads every grad
 * first and sets the flag on inf/NaN. */
static int
should_step(const pd_scaling *sc, const pd_optim_tensor *t, size_t nt)
{
    if (sc->found_inf != NULL && *sc->found_inf != 0.0f) {
        return 0;
    }
    if (sc->check_finite) {
        for (size_t i = 0; i < nt; i++) {
            if (pd_amp_nonfinite(t[i].grad_dtype, t[i].grad, t[i].count)) {
                if (sc->found_inf != NULL) {
                    *sc->found_inf = 1.0f;
                }
                return 0;
            }
        }
    }
    return 1;
}

/* Where block [off, off + m) of the float32 parameter values lives: the
 * master copy, the float32 param itself, or pbuf widened from a half param.
 */
static float *
param_block(const pd_optim_tensor *t, size_t off, size_t m, float *pbuf)
{
    if (t->master != NULL) {
        return t->master + off;
    }
    if (t->param_dtype == PD_FLOAT32) {
        return (float *)t->param + off;
    }
    pd_cast_to_f32(t->param_dtype, pbuf, (const uint16_t *)t->param + off, m);
    return pbuf;
}

static const float *
grad_block(const pd_optim_tensor *t, size_t off, size_t m, float *gbuf)
{
    if (t->grad_dtype == PD_FLOAT32) {
        return (const float *)t->grad + off;
    }
    pd_cast_to_f32(t->grad_dtype, gbuf, (const uint16_t *)t->grad + off, m);
    return gbuf;
}

/* Write the updated float32 values back into param (rounding a half
 * param; copying a master into a float32 param). */
static void
param_store(const pd_optim_tensor *t, size_t off, size_t m, const float *p)
{
    if (t->param_dtype == PD_FLOAT32) {
        if (t->master != NULL) {
            memcpy((float *)t->param + off, p, m * sizeof(float));
        }
        return;
    }
    pd_cast_from_f32(t->param_dtype, (uint16_t *)t->param + off, p, m);
}

static int
plain_f32(const pd_optim_tensor *t)
{
    return t->param_dtype == PD_FLOAT32 && t->grad_dtype == PD_FLOAT32 &&
           t->master == NULL;
}

void
pd_adam_step(const pd_adam_options *o, const pd_scaling *sc,
             const pd_optim_tensor *t, size_t nt, int *stepped)
{
    *stepped = 0;
    if (!should_step(sc, t, nt)) {
        return;
    }
    adam_fn fn = adam_f32;
#ifdef HAVE_X86_DISPATCH
    if (use_avx2()) {
        fn = adam_f32_avx2;
    }
#endif
    int wd_mode = o->weight_decay == 0.0 ? WD_NONE
                  : o->decoupled         ? WD_DECOUPLED
                                         : WD_L2;
    int small = fabs(1.0 - o->beta1) < 0.5;
    for (size_t i = 0; i < nt; i++) {
        const pd_optim_tensor *ti = &t[i];
        /* Python float arithmetic of torch's _single_tensor_adam. */
        double bc1 = 1.0, bc2 = 1.0;
        if (o->bias_correction) {
            bc1 = 1.0 - pow(o->beta1, ti->step);
            bc2 = 1.0 - pow(o->beta2, ti->step);
        }
        adam_consts k;
        k.gscale = o->maximize ? -sc->inv_scale : sc->inv_scale;
        k.wd = (float)o->weight_decay;
        k.decay = (float)(1.0 - o->lr * o->weight_decay);
        k.w1 = (float)(1.0 - o->beta1);
        k.omw1 = 1.0f - k.w1;
        k.b2 = (float)o->beta2;
        k.c2 = (float)(1.0 - o->beta2);
        k.bc2s = (float)sqrt(bc2);
        k.eps = (float)o->eps;
        k.nss = (float)(-(o->lr / bc1));
        if (plain_f32(ti)) {
            fn(&k, ti->param, ti->grad, ti->state0, ti->state1, ti->state2,
               ti->count, wd_mode, o->amsgrad, small);
            continue;
        }
        float pbuf[BLOCK], gbuf[BLOCK];
        for (size_t off = 0; off < ti->count; off += BLOCK) {
            size_t m = ti->count - off < BLOCK ? ti->count - off : BLOCK;
            float *p = param_block(ti, off, m, pbuf);
            const float *g = grad_block(ti, off, m, gbuf);
            fn(&k, p, g, ti->state0 + off, ti->state1 + off,
               ti->state2 != NULL ? ti->state2 + off : NULL, m, wd_mode,
               o->amsgrad, small);
            param_store(ti, off, m, p);
        }
    }
    *stepped = 1;
}

void
pd_sgd_step(const pd_sgd_options *o, const pd_scaling *sc,
            const pd_optim_tensor *t, size_t nt, int *stepped)
{
    *stepped = 0;
    if (!should_step(sc, t, nt)) {
        return;
    }
    sgd_fn fn = sgd_f32;
#ifdef HAVE_X86_DISPATCH
    if (use_avx2()) {
        fn = sgd_f32_avx2;
    }
#endif
    sgd_consts k;
    k.gscale = o->maximize ? -sc->inv_scale : sc->inv_scale;
    k.wd = (float)o->weight_decay;
    k.mom = (float)o->momentum;
    k.damp1 = (float)(1.0 - o->dampening);
    k.nlr = (float)(-o->lr);
    int l2 = o->weight_decay != 0.0;
    int mom = o->momentum != 0.0;
    for (size_t i = 0; i < nt; i++) {
        const pd_optim_tensor *ti = &t[i];
        int first = mom && ti->first;
        if (plain_f32(ti)) {
            fn(&k, ti->param, ti->grad, ti->state0, ti->count, l2, mom,
               first, o->nesterov);
            continue;
        }
        float pbuf[BLOCK], gbuf[BLOCK];
        for (size_t off = 0; off < ti->count; off += BLOCK) {
            size_t m = ti->count - off < BLOCK ? ti->count - off : BLOCK;
            float *p = param_block(ti, off, m, pbuf);
            const float *g = grad_block(ti, off, m, gbuf);
            fn(&k, p, g, mom ? ti->state0 + off : NULL, m, l2, mom, first,
               o->nesterov);
            param_store(ti, off, m, p);
        }
    }
    *stepped = 1;
}
