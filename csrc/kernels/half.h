/* Scalar float16 / bfloat16 <-> float32 conversions (internal to kernels/).
 *
 * Integer bit manipulation, so results never depend on the floating-
 * point environment (rounding mode, FTZ/DAZ) or on F16C / AVX512-BF16 being
 * present; the few float operations used are exact.  Each function is
 * straight-line selects rather than branches so loops calling them vectorise
 * even at the x86-64 baseline (SSE2).
 *
 * Conventions: half -> float is exact for every input, NaN payloads included
 * (as numpy does).  float -> half rounds to nearest even, overflows to inf,
 * and turns NaN into a quiet NaN with the same sign and the top payload bits
 * (as the x86 conversion instructions do).
 */
#ifndef PD_KERNELS_HALF_H
#define PD_KERNELS_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t
pd_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float
pd_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* c ? a : b for c in {0, 1}, as masks: GCC turns nested ?: on these values
 * into branches, which stops the vectoriser; this form it vectorises. */
static inline uint32_t
pd_sel32(uint32_t c, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - c;
    return (a & m) | (b & ~m);
}

static inline float
pd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    /* Normal: rebias the exponent from 15 to 127 (add 112 << 23). */
    uint32_t normal = ((uint32_t)(h & 0x7fffu) << 13) + 0x38000000u;
    /* Inf / NaN: exponent all ones, payload shifted up unchanged. */
    uint32_t special = 0x7f800000u | (man << 13);
    /* Subnormal / zero: man * 2^-24 is exact in float32 and lands in its
     * normal range, so neither rounding mode nor DAZ/FTZ can change it.
     * (The int32_t cast lets SSE2 use its signed int -> float convert.) */
    uint32_t sub = pd_f32_bits((float)(int32_t)man * 0x1p-24f);
    uint32_t mag = pd_sel32(exp == 0x1fu, special,
                            pd_sel32(exp == 0, sub, normal));
    return pd_f32_from_bits(sign | mag);
}

static inline uint16_t
pd_f32_to_f16(float f)
{
    uint32_t x = pd_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t is_sub = a < 0x38800000u;

    /* Normal half range [2^-14, 65536): drop the exponent bias difference
     * (112 << 23, i.e. add its two's complement 0xc8000000) and round the 13
     * dropped mantissa bits to nearest even by adding 0xfff plus the lowest
     * kept bit; a carry walks into the exponent, and values from 65520 up
     * carry into 0x7c00 = inf, which is the correctly rounded overflow. */
    uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;

    /* Below 2^-14 the result is the subnormal round(|f| / 2^-24).  Integer
     * code would need a per-lane variable shift (no SSE2 instruction), so
     * use float operations that are all exact and ignore the rounding mode:
     * scaling by 2^24 (t < 1024), truncating conversion, subtracting the
     * integer part.  Then round half to even by hand.  Lanes not in this
     * range scale 0 instead, so the conversion can never overflow.  Under
     * DAZ a float32 subnormal reads as 0, which is its correct result. */
    float t = pd_f32_from_bits(pd_sel32(is_sub, a, 0)) * 0x1p24f;
    int32_t ti = (int32_t)t;
    float frac = t - (float)ti;
    uint32_t q = (uint32_t)ti;
    uint32_t up = ((frac > 0.5f) | ((frac == 0.5f) & q)) & 1u;
    uint32_t sub = q + up;

    /* Inf stays inf; NaN becomes quiet (bit 9) and keeps its top payload. */
    uint32_t special = pd_sel32(a > 0x7f800000u,
                                0x7e00u | ((a >> 13) & 0x3ffu), 0x7c00u);

    uint32_t mag = pd_sel32(a >= 0x47800000u, special,
                            pd_sel32(is_sub, sub, normal));
    return (uint16_t)(sign | mag);
}

static inline float
pd_bf16_to_f32(uint16_t h)
{
    return pd_f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t
pd_f32_to_bf16(float f)
{
    uint32_t x = pd_f32_bits(f);
    /* bfloat16 is the top half of a float32, so round-to-nearest-even is the
     * classic bias trick; overflow carries into the exponent and gives inf,
     * subnormals round like any other value. */
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    /* NaN: keep sign and top payload, force the quiet bit (a payload living
     * only in the low 16 bits would otherwise round to inf). */
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)pd_sel32((x & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

#endif
