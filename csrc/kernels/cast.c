/* float16 / bfloat16 <-> float32 array conversions.
 *
 * Collectives never add in half precision: they widen to float32, reduce,
 * and round once on the way out, so these loops run on every half-precision
 * allreduce and are kept branch-free for the vectoriser (see half.h).
 */
#include "kernels.h"

#include <assert.h>

#include "half.h"

static void
f16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_f16_to_f32(src[i]);
    }
}

static void
f32_to_f16(uint16_t *restrict dst, const float *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_f32_to_f16(src[i]);
    }
}

static void
bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_bf16_to_f32(src[i]);
    }
}

static void
f32_to_bf16(uint16_t *restrict dst, const float *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_f32_to_bf16(src[i]);
    }
}

void
pd_cast_to_f32(pd_dtype dt, float *dst, const void *src, size_t count)
{
    switch (dt) {
    case PD_FLOAT16:
        f16_to_f32(dst, src, count);
        break;
    case PD_BFLOAT16:
        bf16_to_f32(dst, src, count);
        break;
    default:
        /* Callers pick the cast from pd_dtype_accum(); anything else is a
         * programming error, not a user error. */
        assert(!"pd_cast_to_f32: dtype is not float16/bfloat16");
        break;
    }
}

void
pd_cast_from_f32(pd_dtype dt, void *dst, const float *src, size_t count)
{
    switch (dt) {
    case PD_FLOAT16:
        f32_to_f16(dst, src, count);
        break;
    case PD_BFLOAT16:
        f32_to_bf16(dst, src, count);
        break;
    default:
        assert(!"pd_cast_from_f32: dtype is not float16/bfloat16");
        break;
    }
}
