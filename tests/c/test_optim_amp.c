/* Tests of csrc/kernels/optim.c and amp.c: the fused Adam/AdamW and SGD
 * steps against scalar reference code written here from torch's formulas
 * (same float32 operations in the same order, so results must be equal to
 * the bit), half-precision params with and without master copies, the
 * found_inf skip and check; the unscale + non-finite check and casts. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/amp.h"
#include "kernels/half.h"
#include "kernels/optim.h"
#include "pd_test.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static float
frand(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    uint64_t r = rng * 0x2545f4914f6cdd1dull;
    return (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

/* Reference Adam for one element, torch 2.13's _single_tensor_adam. */
static void
ref_adam(const pd_adam_options *o, float inv, float *p, float g, float *m,
         float *v, float *vmax, double step)
{
    float gi = g * (o->maximize ? -inv : inv);
    float pi = *p;
    if (o->weight_decay != 0.0) {
        if (o->decoupled) {
            pi = pi * (float)(1.0 - o->lr * o->weight_decay);
        } else {
            gi = gi + (float)o->weight_decay * pi;
        }
    }
    float w = (float)(1.0 - o->beta1);
    float mi = *m;
    mi = fabsf(w) < 0.5f ? mi + w * (gi - mi) : gi - (gi - mi) * (1.0f - w);
    *m = mi;
    float vi = *v * (float)o->beta2;
    vi = vi + (float)(1.0 - o->beta2) * gi * gi;
    *v = vi;
    if (o->amsgrad) {
        *vmax = *vmax > vi ? *vmax : vi;
        vi = *vmax;
    }
    double bc1 = 1.0 - pow(o->beta1, step), bc2 = 1.0 - pow(o->beta2, step);
    float denom = sqrtf(vi) / (float)sqrt(bc2) + (float)o->eps;
    *p = pi + (float)(-(o->lr / bc1)) * mi / denom;
}

static void
test_adam_options(int decoupled, int amsgrad, int maximize, double wd,
                  double beta1)
{
    enum { N = 1037, NT = 3, STEPS = 4 };
    static float p[NT][N], g[N], m[NT][N], v[NT][N], vm[NT][N];
    static float rp[NT][N], rm[NT][N], rv[NT][N], rvm[NT][N];
    pd_adam_options o = {1e-2, beta1, 0.999, 1e-8, wd, amsgrad, maximize,
                         decoupled, 1};
    for (int t = 0; t < NT; t++) {
        for (int i = 0; i < N; i++) {
            p[t][i] = rp[t][i] = frand();
            m[t][i] = rm[t][i] = v[t][i] = rv[t][i] = 0.0f;
            vm[t][i] = rvm[t][i] = 0.0f;
        }
    }
    int equal = 1;
    for (int s = 1; s <= STEPS; s++) {
        for (int i = 0; i < N; i++) {
            g[i] = frand();
        }
        pd_optim_tensor ts[NT];
        memset(ts, 0, sizeof(ts));
        for (int t = 0; t < NT; t++) {
            /* tensors of different lengths, all reading the same grads */
            size_t n = N - (size_t)t * 100;
            ts[t] = (pd_optim_tensor){p[t], PD_FLOAT32, NULL, g, PD_FLOAT32,
                                      n, m[t], v[t], amsgrad ? vm[t] : NULL,
                                      (double)s, 0};
            for (size_t i = 0; i < n; i++) {
                ref_adam(&o, 0.5f, &rp[t][i], g[i], &rm[t][i], &rv[t][i],
                         &rvm[t][i], (double)s);
            }
        }
        pd_scaling sc = {0.5f, NULL, 0};
        int stepped = 0;
        pd_adam_step(&o, &sc, ts, NT, &stepped);
        T_CHECK(stepped == 1);
    }
    for (int t = 0; t < NT; t++) {
        equal &= memcmp(p[t], rp[t], sizeof(p[t])) == 0;
        equal &= memcmp(m[t], rm[t], sizeof(m[t])) == 0;
        equal &= memcmp(v[t], rv[t], sizeof(v[t])) == 0;
    }
    if (!equal) {
        fprintf(stderr, "adam decoupled=%d amsgrad=%d maximize=%d wd=%g "
                "beta1=%g differs from the reference\n", decoupled, amsgrad,
                maximize, wd, beta1);
    }
    T_CHECK(equal);
}

static void
test_sgd(void)
{
    enum { N = 600 };
    static float p[N], g[N], buf[N], rp[N], rbuf[N];
    pd_sgd_options o = {0.1, 0.9, 0.1, 0.01, 0, 1};
    for (int i = 0; i < N; i++) {
        p[i] = rp[i] = frand();
    }
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < N; i++) {
            g[i] = frand();
            float gi = -g[i];
            gi = gi + 0.01f * rp[i];
            rbuf[i] = s == 0 ? gi : rbuf[i] * 0.9f + (float)(1.0 - 0.1) * gi;
            rp[i] = rp[i] + (float)(-0.1) * rbuf[i];
        }
        pd_optim_tensor t = {p, PD_FLOAT32, NULL, g, PD_FLOAT32, N, buf,
                             NULL, NULL, 0.0, s == 0};
        pd_scaling sc = {1.0f, NULL, 0};
        int stepped;
        pd_sgd_step(&o, &sc, &t, 1, &stepped);
        T_CHECK(stepped);
    }
    T_CHECK(memcmp(p, rp, sizeof(p)) == 0);
    T_CHECK(memcmp(buf, rbuf, sizeof(buf)) == 0);
}

/* float16 params with a float32 master: the master follows the float32
 * path exactly and the param is the master rounded; without a master the
 * param is the rounded float32 update of its widened value. */
static void
test_half_params(void)
{
    enum { N = 1500 };
    static float master[N], p32[N], g32[N], m1[N], v1[N], m2[N], v2[N];
    static float m3[N], v3[N], q32[N];
    static uint16_t p16[N], g16[N], q16[N];
    pd_adam_options o = {1e-2, 0.9, 0.999, 1e-8, 0.0, 0, 0, 1, 1};
    for (int i = 0; i < N; i++) {
        p16[i] = q16[i] = pd_f32_to_f16(frand());
        master[i] = p32[i] = pd_f16_to_f32(p16[i]);
        g16[i] = pd_f32_to_f16(frand());
        g32[i] = pd_f16_to_f32(g16[i]);
        m1[i] = v1[i] = m2[i] = v2[i] = m3[i] = v3[i] = 0.0f;
    }
    pd_scaling sc = {1.0f, NULL, 0};
    int stepped;
    for (int s = 1; s <= 3; s++) {
        pd_optim_tensor a = {p16, PD_FLOAT16, master, g16, PD_FLOAT16, N, m1,
                             v1, NULL, (double)s, 0};
        pd_optim_tensor b = {p32, PD_FLOAT32, NULL, g32, PD_FLOAT32, N, m2,
                             v2, NULL, (double)s, 0};
        pd_optim_tensor c = {q16, PD_FLOAT16, NULL, g16, PD_FLOAT16, N, m3,
                             v3, NULL, (double)s, 0};
        for (int i = 0; i < N; i++) {
            q32[i] = pd_f16_to_f32(q16[i]);
        }
        pd_adam_step(&o, &sc, &a, 1, &stepped);
        pd_adam_step(&o, &sc, &b, 1, &stepped);
        pd_adam_step(&o, &sc, &c, 1, &stepped);
        /* reference for c after its first step: one float32 step of the
         * widened param, rounded */
        int ok = 1;
        for (int i = 0; i < N && s == 1; i++) {
            float pp = q32[i], mm = 0.0f, vv = 0.0f, vmx = 0.0f;
            ref_adam(&o, 1.0f, &pp, g32[i], &mm, &vv, &vmx, 1.0);
            ok &= q16[i] == pd_f32_to_f16(pp);
        }
        T_CHECK(ok);
    }
    T_CHECK(memcmp(master, p32, sizeof(master)) == 0);
    int rounded = 1;
    for (int i = 0; i < N; i++) {
        rounded &= p16[i] == pd_f32_to_f16(master[i]);
    }
    T_CHECK(rounded);
}

static void
test_found_inf(void)
{
    enum { N = 100 };
    static float p[N], g[N], m[N], v[N], before[N];
    for (int i = 0; i < N; i++) {
        p[i] = before[i] = frand();
        g[i] = frand();
    }
    pd_adam_options o = {1e-2, 0.9, 0.999, 1e-8, 0.0, 0, 0, 1, 1};
    pd_optim_tensor t = {p, PD_FLOAT32, NULL, g, PD_FLOAT32, N, m, v, NULL,
                         1.0, 0};
    float flag = 1.0f;
    pd_scaling sc = {1.0f, &flag, 0};
    int stepped = 1;
    pd_adam_step(&o, &sc, &t, 1, &stepped);
    T_CHECK(stepped == 0 && memcmp(p, before, sizeof(p)) == 0);
    flag = 0.0f;
    g[N - 1] = NAN;
    sc.check_finite = 1;
    pd_adam_step(&o, &sc, &t, 1, &stepped);
    T_CHECK(stepped == 0 && flag == 1.0f && memcmp(p, before, sizeof(p)) == 0);
    pd_sgd_options so = {0.1, 0.0, 0.0, 0.0, 0, 0};
    pd_sgd_step(&so, &sc, &t, 1, &stepped);
    T_CHECK(stepped == 0);
    g[N - 1] = 1.0f;
    flag = 0.0f;
    pd_sgd_step(&so, &sc, &t, 1, &stepped);
    T_CHECK(stepped == 1 && flag == 0.0f && p[0] != before[0]);
}

static void
test_unscale(void)
{
    enum { N = 3000 };
    static float f[N];
    static double d[N];
    static uint16_t h[N], b[N];
    for (int pos = 0; pos < N; pos += 97) {
        for (int i = 0; i < N; i++) {
            f[i] = frand();
            d[i] = f[i];
            h[i] = pd_f32_to_f16(f[i]);
            b[i] = pd_f32_to_bf16(f[i]);
        }
        float f0 = f[1];
        T_CHECK(pd_amp_unscale(PD_FLOAT32, f, N, 0.25f) == 0);
        T_CHECK(f[1] == f0 * 0.25f);
        f[pos] = INFINITY;
        d[pos] = NAN;
        h[pos] = 0x7c00u;
        b[pos] = 0xffc1u;
        T_CHECK(pd_amp_unscale(PD_FLOAT32, f, N, 0.5f) == 1);
        T_CHECK(pd_amp_unscale(PD_FLOAT64, d, N, 0.5f) == 1);
        T_CHECK(pd_amp_unscale(PD_FLOAT16, h, N, 0.5f) == 1);
        T_CHECK(pd_amp_unscale(PD_BFLOAT16, b, N, 0.5f) == 1);
        T_CHECK(pd_amp_nonfinite(PD_FLOAT16, h, N) == 1);
        T_CHECK(pd_amp_nonfinite(PD_FLOAT16, h, (size_t)pos) == 0);
    }
    float big[3] = {3.4028235e38f, -3.4028235e38f, 1e-45f};
    T_CHECK(pd_amp_nonfinite(PD_FLOAT32, big, 3) == 0);
}

static void
test_cast(void)
{
    float src[5] = {1.0f, 65520.0f, -INFINITY, NAN, 1e-8f};
    uint16_t h[5];
    float back[5];
    double d[5];
    T_OK(pd_cast(PD_FLOAT16, h, PD_FLOAT32, src, 5));
    T_CHECK(h[0] == 0x3c00u && h[1] == 0x7c00u && h[2] == 0xfc00u);
    T_CHECK((h[3] & 0x7c00u) == 0x7c00u && (h[3] & 0x3ffu) != 0);
    T_CHECK(h[4] == 0x0000u);  /* 1e-8 < half the smallest subnormal */
    T_OK(pd_cast(PD_FLOAT32, back, PD_FLOAT16, h, 5));
    T_CHECK(back[0] == 1.0f && isinf(back[1]) && isnan(back[3]));
    T_OK(pd_cast(PD_FLOAT64, d, PD_FLOAT16, h, 5));
    T_CHECK(d[0] == 1.0 && isnan(d[3]));
    T_ST(pd_cast(PD_FLOAT16, h, PD_FLOAT64, d, 5), PD_ETYPE);
    T_MSG_HAS("float64 to float16");
    T_ST(pd_cast(PD_INT32, h, PD_FLOAT32, src, 5), PD_ETYPE);
}

int
main(void)
{
    double betas[2] = {0.9, 0.3};  /* 0.3: lerp's large-weight form */
    for (int dec = 0; dec < 2; dec++) {
        for (int ams = 0; ams < 2; ams++) {
            for (int mx = 0; mx < 2; mx++) {
                for (int b = 0; b < 2; b++) {
                    test_adam_options(dec, ams, mx, 0.0, betas[b]);
                    test_adam_options(dec, ams, mx, 0.05, betas[b]);
                }
            }
        }
    }
    test_sgd();
    test_half_params();
    test_found_inf();
    test_unscale();
    test_cast();
    return pd_test_result();
}
