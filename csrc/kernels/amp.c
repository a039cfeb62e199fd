/* Fused unscale + non-finite check, and multi-dtype casts (see amp.h).
 *
 * float32 / float64 run as one branch-free loop the compiler vectorises:
 * the finiteness test looks at the exponent bits and is OR-ed into an
 * accumulator, so no early exit breaks vectorisation (torch also scales
 * every element when an inf is present).  float16 / bfloat16 go
 * through a float32 block on the stack with the dispatched casts of cast.c.
 */
#include "amp.h"

#include <stdint.h>
#include <string.h>

/* Elements per on-stack float32 block of the half-precision paths: small
 * enough for L1, large enough to amortise the cast calls. */
#define BLOCK 1024

#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE static inline
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(PD_KERNELS_PORTABLE)
#define HAVE_X86_DISPATCH 1
#endif

/* The finiteness test on the bits: the exponent field is all ones (inf or
 * NaN) exactly when adding one to it carries into the sign bit.  Integer
 * and / add / or only, so the loops vectorise to three instructions per
 * vector of floats with no compare-to-flag conversions. */
ALWAYS_INLINE int
f32_unscale_body(float *restrict d, size_t n, float s)
{
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        float x = d[i];
        uint32_t u;
        memcpy(&u, &x, sizeof(u));
        acc |= (u & 0x7f800000u) + 0x00800000u;
        d[i] = x * s;
    }
    return (int)(acc >> 31);
}

ALWAYS_INLINE int
f32_nonfinite_body(const float *restrict d, size_t n)
{
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &d[i], sizeof(u));
        acc |= (u & 0x7f800000u) + 0x00800000u;
    }
    return (int)(acc >> 31);
}

ALWAYS_INLINE int
f64_unscale_body(double *restrict d, size_t n, double s)
{
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        double x = d[i];
        uint64_t u;
        memcpy(&u, &x, sizeof(u));
        acc |= (u & 0x7ff0000000000000ull) + 0x0010000000000000ull;
        d[i] = x * s;
    }
    return (int)(acc >> 63);
}

ALWAYS_INLINE int
f64_nonfinite_body(const double *restrict d, size_t n)
{
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &d[i], sizeof(u));
        acc |= (u & 0x7ff0000000000000ull) + 0x0010000000000000ull;
    }
    return (int)(acc >> 63);
}

/* Baseline builds, plus AVX2 builds of the same bodies chosen at run time
 * (no floating-point contraction is involved: same bits).  The loops run at
 * memory bandwidth with AVX2; AVX-512 builds measured slower (AMD Zen 4). */
#define DEFINE_VARIANTS(suffix, attr)                                         \
    attr static int f32_unscale##suffix(float *d, size_t n, float s)          \
    {                                                                         \
        return f32_unscale_body(d, n, s);                                     \
    }                                                                         \
    attr static int f32_nonfinite##suffix(const float *d, size_t n)           \
    {                                                                         \
        return f32_nonfinite_body(d, n);                                      \
    }                                                                         \
    attr static int f64_unscale##suffix(double *d, size_t n, double s)        \
    {                                                                         \
        return f64_unscale_body(d, n, s);                                     \
    }                                                                         \
    attr static int f64_nonfinite##suffix(const double *d, size_t n)          \
    {                                                                         \
        return f64_nonfinite_body(d, n);                                      \
    }

DEFINE_VARIANTS(_base, )
#ifdef HAVE_X86_DISPATCH
DEFINE_VARIANTS(_avx2, __attribute__((target("avx2"))))
#endif

#ifdef HAVE_X86_DISPATCH
/* 1: AVX2, 0: baseline. */
static int
isa_level(void)
{
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}
#endif

static int
f32_unscale(float *d, size_t n, float s)
{
#ifdef HAVE_X86_DISPATCH
    switch (isa_level()) {
    case 1:
        return f32_unscale_avx2(d, n, s);
    default:
        break;
    }
#endif
    return f32_unscale_base(d, n, s);
}

static int
f32_nonfinite(const float *d, size_t n)
{
#ifdef HAVE_X86_DISPATCH
    switch (isa_level()) {
    case 1:
        return f32_nonfinite_avx2(d, n);
    default:
        break;
    }
#endif
    return f32_nonfinite_base(d, n);
}

static int
f64_unscale(double *d, size_t n, double s)
{
#ifdef HAVE_X86_DISPATCH
    switch (isa_level()) {
    case 1:
        return f64_unscale_avx2(d, n, s);
    default:
        break;
    }
#endif
    return f64_unscale_base(d, n, s);
}

static int
f64_nonfinite(const double *d, size_t n)
{
#ifdef HAVE_X86_DISPATCH
    switch (isa_level()) {
    case 1:
        return f64_nonfinite_avx2(d, n);
    default:
        break;
    }
#endif
    return f64_nonfinite_base(d, n);
}

/* float16: exponent bits all ones (0x7c00) is inf or NaN. */
static int
f16_nonfinite(const uint16_t *restrict d, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad |= (d[i] & 0x7c00u) == 0x7c00u;
    }
    return bad;
}

static int
bf16_nonfinite(const uint16_t *restrict d, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad |= (d[i] & 0x7f80u) == 0x7f80u;
    }
    return bad;
}

static int
half_unscale(pd_dtype dt, uint16_t *d, size_t n, float s)
{
    float buf[BLOCK];
    int bad = 0;
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t m = n - off < BLOCK ? n - off : BLOCK;
        pd_cast_to_f32(dt, buf, d + off, m);
        bad |= f32_unscale(buf, m, s);
        pd_cast_from_f32(dt, d + off, buf, m);
    }
    return bad;
}

int
pd_amp_nonfinite(pd_dtype dt, const void *data, size_t count)
{
    switch (dt) {
    case PD_FLOAT16:
        return f16_nonfinite(data, count);
    case PD_BFLOAT16:
        return bf16_nonfinite(data, count);
    case PD_FLOAT32:
        return f32_nonfinite(data, count);
    case PD_FLOAT64:
        return f64_nonfinite(data, count);
    default:
        return 0;
    }
}

int
pd_amp_unscale(pd_dtype dt, void *data, size_t count, float inv_scale)
{
    if (inv_scale == 1.0f) {
        return pd_amp_nonfinite(dt, data, count);
    }
    switch (dt) {
    case PD_FLOAT16:
    case PD_BFLOAT16:
        return half_unscale(dt, data, count, inv_scale);
    case PD_FLOAT32:
        return f32_unscale(data, count, inv_scale);
    case PD_FLOAT64:
        return f64_unscale(data, count, (double)inv_scale);
    default:
        return 0;
    }
}

static void
f32_to_f64(double *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = (double)src[i];
    }
}

static void
f64_to_f32(float *restrict dst, const double *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = (float)src[i];
    }
}

static int
is_half(pd_dtype dt)
{
    return dt == PD_FLOAT16 || dt == PD_BFLOAT16;
}

static int
is_float(pd_dtype dt)
{
    return is_half(dt) || dt == PD_FLOAT32 || dt == PD_FLOAT64;
}

pd_status
pd_cast(pd_dtype dst_dt, void *dst, pd_dtype src_dt, const void *src,
        size_t count)
{
    if (!is_float(dst_dt) || !is_float(src_dt)) {
        return pd_error(PD_ETYPE, "cast from %s to %s is not supported "
                        "(float16, bfloat16, float32, float64 only)",
                        pd_dtype_name(src_dt), pd_dtype_name(dst_dt));
    }
    if (src_dt == PD_FLOAT64 && is_half(dst_dt)) {
        return pd_error(PD_ETYPE, "cast from float64 to %s is not supported "
                        "(cast to float32 first)", pd_dtype_name(dst_dt));
    }
    if (dst_dt == src_dt) {
        if (count > 0) {
            memcpy(dst, src, count * pd_dtype_size(dst_dt));
        }
        return PD_OK;
    }
    if (src_dt == PD_FLOAT32 && is_half(dst_dt)) {
        pd_cast_from_f32(dst_dt, dst, src, count);
    } else if (is_half(src_dt) && dst_dt == PD_FLOAT32) {
        pd_cast_to_f32(src_dt, dst, src, count);
    } else if (src_dt == PD_FLOAT32 && dst_dt == PD_FLOAT64) {
        f32_to_f64(dst, src, count);
    } else if (src_dt == PD_FLOAT64 && dst_dt == PD_FLOAT32) {
        f64_to_f32(dst, src, count);
    } else {
        /* half -> other half or half -> float64: widen exactly to float32
         * in blocks, then one conversion. */
        float buf[BLOCK];
        const uint16_t *s = src;
        for (size_t off = 0; off < count; off += BLOCK) {
            size_t m = count - off < BLOCK ? count - off : BLOCK;
            pd_cast_to_f32(src_dt, buf, s + off, m);
            if (dst_dt == PD_FLOAT64) {
                f32_to_f64((double *)dst + off, buf, m);
            } else {
                pd_cast_from_f32(dst_dt, (uint16_t *)dst + off, buf, m);
            }
        }
    }
    return PD_OK;
}
