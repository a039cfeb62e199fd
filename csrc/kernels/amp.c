/* Fused unscale + non-finite check, and multi-dtype casts (see amp.h).
 *
 * float32 / float64 run as one branch-free loop the compiler vectorises:
 * the finiteness test is !(|x| <= max), false for inf and NaN alike, OR-ed
 * into an accumulator so no early exit breaks vectorisation (torch also
 * scales every element when an inf is present).  float16 / bfloat16 go
 * through a float32 block on the stack with the dispatched casts of cast.c.
 */
#include "amp.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Elements per on-stack float32 block of the half-precision paths: small
 * enough for L1, large enough to amortise the cast calls. */
#define BLOCK 1024

static int
f32_unscale(float *restrict d, size_t n, float s)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float x = d[i];
        bad |= !(fabsf(x) <= FLT_MAX);
        d[i] = x * s;
    }
    return bad;
}

static int
f32_nonfinite(const float *restrict d, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad |= !(fabsf(d[i]) <= FLT_MAX);
    }
    return bad;
}

static int
f64_unscale(double *restrict d, size_t n, double s)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double x = d[i];
        bad |= !(fabs(x) <= DBL_MAX);
        d[i] = x * s;
    }
    return bad;
}

static int
f64_nonfinite(const double *restrict d, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad |= !(fabs(d[i]) <= DBL_MAX);
    }
    return bad;
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
