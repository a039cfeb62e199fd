/* float16 / bfloat16 <-> float32 array conversions.
 *
 * Collectives never add in half precision: they widen to float32, reduce,
 * and round once on the way out, so these loops run on every half-precision
 * collective.  The portable loops (half.h) are branch-free and vectorise at
 * the x86-64 baseline.  On x86-64, paths chosen at run time make them run
 * at memory bandwidth: F16C for float16, because the bit manipulation costs
 * several times what the one instruction does, and an AVX2 build of the
 * portable float32 -> bfloat16 loop.  Each gives the same bits as the
 * portable code for every input (tests/c/test_kernels.c checks all 2^32
 * float32 values).  -DPD_KERNELS_PORTABLE leaves only the portable code.
 */
#include "kernels.h"

#include <assert.h>

#include "half.h"

/* The 16-bit side of each conversion is a user's array, at any byte offset
 * (collectives work on NumPy views in place): read and written through a
 * type of alignment 1 (GCC and Clang let a typedef lower alignment). */
typedef uint16_t pd_u16u __attribute__((aligned(1)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(PD_KERNELS_PORTABLE)
#define HAVE_X86_DISPATCH 1
#include <immintrin.h>
#endif

static void
f16_to_f32(float *restrict dst, const pd_u16u *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_f16_to_f32(src[i]);
    }
}

static void
f32_to_f16(pd_u16u *restrict dst, const float *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_f32_to_f16(src[i]);
    }
}

static void
bf16_to_f32(float *restrict dst, const pd_u16u *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_bf16_to_f32(src[i]);
    }
}

static void
f32_to_bf16(pd_u16u *restrict dst, const float *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_f32_to_bf16(src[i]);
    }
}

#ifdef HAVE_X86_DISPATCH
/* VEX-encoded instructions also need the OS to save YMM state, which the
 * "avx" feature test includes; every F16C CPU has AVX. */
static int
have_f16c(void)
{
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}

__attribute__((target("avx,f16c"))) static void
f16_to_f32_f16c(float *restrict dst, const pd_u16u *restrict src,
                size_t count)
{
    const __m128i exp_quiet = _mm_set1_epi16(0x7e00);
    const __m128i exp_all_ones = _mm_set1_epi16(0x7c00);
    const __m128i man = _mm_set1_epi16(0x3ff);
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
        /* The instruction quiets signalling NaNs; numpy and the portable
         * code keep them as they are.  They are rare, so redo any block of
         * eight that holds one in scalar code. */
        /* exponent all ones and quiet bit clear: inf or signalling NaN */
        __m128i inf_or_snan =
            _mm_cmpeq_epi16(_mm_and_si128(h, exp_quiet), exp_all_ones);
        __m128i man_zero =
            _mm_cmpeq_epi16(_mm_and_si128(h, man), _mm_setzero_si128());
        __m128i snan = _mm_andnot_si128(man_zero, inf_or_snan);
        if (_mm_movemask_epi8(snan) != 0) {
            for (size_t k = i; k < i + 8; k++) {
                dst[k] = pd_f16_to_f32(src[k]);
            }
        }
    }
    for (; i < count; i++) {
        dst[i] = pd_f16_to_f32(src[i]);
    }
}

/* The portable loop again, compiled for AVX2: SSE2 has no 32 -> 16 bit
 * pack, and the emulation halves the speed.  Same source, same bits. */
__attribute__((target("avx2"))) static void
f32_to_bf16_avx2(pd_u16u *restrict dst, const float *restrict src,
                 size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = pd_f32_to_bf16(src[i]);
    }
}

/* Rounding mode 0 in the immediate is round-to-nearest-even whatever MXCSR
 * says; NaNs come out quiet with their top payload, as in half.h. */
__attribute__((target("avx,f16c"))) static void
f32_to_f16_f16c(pd_u16u *restrict dst, const float *restrict src,
                size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m256 f = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < count; i++) {
        dst[i] = pd_f32_to_f16(src[i]);
    }
}
#endif

void
pd_cast_to_f32(pd_dtype dt, float *dst, const void *src, size_t count)
{
    switch (dt) {
    case PD_FLOAT16:
#ifdef HAVE_X86_DISPATCH
        if (have_f16c()) {
            f16_to_f32_f16c(dst, src, count);
            break;
        }
#endif
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
#ifdef HAVE_X86_DISPATCH
        if (have_f16c()) {
            f32_to_f16_f16c(dst, src, count);
            break;
        }
#endif
        f32_to_f16(dst, src, count);
        break;
    case PD_BFLOAT16:
#ifdef HAVE_X86_DISPATCH
        if (__builtin_cpu_supports("avx2")) {
            f32_to_bf16_avx2(dst, src, count);
            break;
        }
#endif
        f32_to_bf16(dst, src, count);
        break;
    default:
        assert(!"pd_cast_from_f32: dtype is not float16/bfloat16");
        break;
    }
}
