/* Exact GELU, x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)), and its gradient on
 * float32 arrays, for pyddp.nn.functional.gelu (approximate='none').
 *
 * libm's erff and expf are scalar calls that the loops cannot vectorise, and
 * NumPy has no erf, so the erf and exp here are the usual branch-free
 * float32 approximations that -O3 vectorises:
 *   erf: the odd/even rational approximation on [-4, 4] that Eigen and XLA
 *        use for float32 (erf rounds to +-1 in float32 beyond 3.92), a few
 *        ulp from the correctly rounded value;
 *   exp: Cody-Waite range reduction and a degree-6 polynomial (Cephes'
 *        expf), about 1 ulp, for the gradient's exp(-x^2 / 2).
 * torch's CPU kernel is the same formula on vectorised erf / exp of similar
 * accuracy, so results agree to float32 rounding.  Half-precision callers
 * widen to float32, call these, and round once.
 */
#include "gelu.h"

#include <stdint.h>

#include "half.h" /* pd_f32_bits, pd_f32_from_bits */

static inline float
erf_f32(float x)
{
    /* clamp |x| to 4 on the bits, an integer min (float compares do not
     * if-convert under -ftrapping-math, so would stop the vectoriser); NaN
     * becomes +-4, and the callers multiply by x, so NaN comes out NaN */
    uint32_t u = pd_f32_bits(x);
    uint32_t mag = u & 0x7fffffffu;
    mag = mag < 0x40800000u ? mag : 0x40800000u;
    float c = pd_f32_from_bits((u & 0x80000000u) | mag);
    float x2 = c * c;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    p = p * c;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return p / q;
}

/* exp(x) for x <= 0 (the gradient needs exp(-x^2/2)); below -87.3 the
 * result flushes to 0, as exp's float32 result underflows there anyway. */
static inline float
exp_neg_f32(float x)
{
    /* x is -v*v/2 <= 0 or NaN: -|x| clamped to -87 (NaN too); integer
     * min, as in erf_f32 */
    uint32_t mag = pd_f32_bits(x) & 0x7fffffffu;
    mag = mag < 0x42ae0000u ? mag : 0x42ae0000u;
    x = pd_f32_from_bits(0x80000000u | mag);
    /* n = round(x / ln 2) by the 1.5 * 2^23 trick, which leaves n in the
     * low mantissa bits too (float -> int conversions stop the vectoriser
     * under -ftrapping-math) */
    float t = x * 1.44269504088896341f + 12582912.0f;
    int32_t ni = (int32_t)(pd_f32_bits(t) - 0x4b400000u);
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    return p * pd_f32_from_bits((uint32_t)(ni + 127) << 23);
}

#define SQRT1_2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

/* The loops, inlined into a portable build and, on x86-64, AVX2+FMA and
 * AVX-512 builds chosen at run time (as kernels/cast.c does). */
static inline void
gelu_loop(float *out, const float *x, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + erf_f32(v * SQRT1_2));
    }
}

static inline void
gelu_backward_loop(float *gx, const float *g,
                   const float *x, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float v = x[i];
        float cdf = 0.5f * (1.0f + erf_f32(v * SQRT1_2));
        float pdf = INV_SQRT_2PI * exp_neg_f32(-0.5f * v * v);
        gx[i] = g[i] * (cdf + v * pdf);
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(PD_KERNELS_PORTABLE)
#define HAVE_X86_DISPATCH 1

__attribute__((target("avx2,fma"))) static void
gelu_avx2(float *out, const float *x, size_t count)
{
    gelu_loop(out, x, count);
}

__attribute__((target("avx512f,avx2,fma"))) static void
gelu_avx512(float *out, const float *x, size_t count)
{
    gelu_loop(out, x, count);
}

__attribute__((target("avx2,fma"))) static void
gelu_backward_avx2(float *gx, const float *g,
                   const float *x, size_t count)
{
    gelu_backward_loop(gx, g, x, count);
}

__attribute__((target("avx512f,avx2,fma"))) static void
gelu_backward_avx512(float *gx, const float *g,
                     const float *x, size_t count)
{
    gelu_backward_loop(gx, g, x, count);
}
#endif

void
pd_gelu_f32(float *out, const float *x, size_t count)
{
#ifdef HAVE_X86_DISPATCH
    if (__builtin_cpu_supports("avx512f")) {
        gelu_avx512(out, x, count);
        return;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        gelu_avx2(out, x, count);
        return;
    }
#endif
    gelu_loop(out, x, count);
}

void
pd_gelu_backward_f32(float *gx, const float *g,
                     const float *x, size_t count)
{
#ifdef HAVE_X86_DISPATCH
    if (__builtin_cpu_supports("avx512f")) {
        gelu_backward_avx512(gx, g, x, count);
        return;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        gelu_backward_avx2(gx, g, x, count);
        return;
    }
#endif
    gelu_backward_loop(gx, g, x, count);
}
