/* Element-wise reductions dst = a (op) b for every (dtype, op) pair.
 *
 * Each kernel is a plain loop over restrict-qualified pointers, generated per
 * element type by the macros below, so -O3 vectorises it with no intrinsics
 * (float32 SUM runs at memory bandwidth; see tests/c/bench_kernels.c).
 * Three variants exist because restrict forbids aliasing:
 *   fwd:   d[i] = d[i] op s[i]   pd_reduce, and pd_reduce3 with dst == a
 *   rev:   d[i] = s[i] op d[i]   pd_reduce3 with dst == b
 *   three: d[i] = a[i] op b[i]   pd_reduce3 with three distinct buffers
 * rev is needed although every op is commutative mathematically: float
 * MIN/MAX return the second operand on ties (-0.0 vs 0.0), like numpy.
 * dst may be the very same buffer as a and/or b; partial overlap is not
 * supported (no collective produces it).
 */
#include "kernels.h"

#include <assert.h>
#include <string.h>

typedef void (*reduce2_fn)(void *restrict dst, const void *restrict src,
                           size_t n);
typedef void (*reduce3_fn)(void *restrict dst, const void *restrict a,
                           const void *restrict b, size_t n);

struct kernel {
    reduce2_fn fwd;
    reduce2_fn rev;
    reduce3_fn three;
};

/* Arrays come from users and may sit at any byte offset (a NumPy view at an
 * odd offset; collectives read and write them in place), so the kernels
 * access elements through a type of alignment 1: the same loads and stores
 * on x86 and ARM64 (the vectorised loops use unaligned vector moves either
 * way), and no undefined behaviour for a misaligned array.  GCC and Clang
 * allow a typedef to lower alignment. */
#define PD_UA(T) pd_ua_##T
typedef int8_t pd_ua_int8_t __attribute__((aligned(1)));
typedef uint8_t pd_ua_uint8_t __attribute__((aligned(1)));
typedef int16_t pd_ua_int16_t __attribute__((aligned(1)));
typedef uint16_t pd_ua_uint16_t __attribute__((aligned(1)));
typedef int32_t pd_ua_int32_t __attribute__((aligned(1)));
typedef uint32_t pd_ua_uint32_t __attribute__((aligned(1)));
typedef int64_t pd_ua_int64_t __attribute__((aligned(1)));
typedef uint64_t pd_ua_uint64_t __attribute__((aligned(1)));
typedef float pd_ua_float __attribute__((aligned(1)));
typedef double pd_ua_double __attribute__((aligned(1)));

/* Element operations.  All take (T, W, x, y): T is the element type, W the
 * type the arithmetic happens in.  For integers W is unsigned and at least
 * as wide as int, so overflow wraps instead of being undefined (uint16 *
 * uint16 would otherwise promote to int and overflow); converting back
 * to a signed T is modulo 2^N on GCC and Clang (documented
 * implementation-defined behaviour, not UB). */
#define E_IADD(T, W, x, y) ((T)((W)(x) + (W)(y)))
#define E_IMUL(T, W, x, y) ((T)((W)(x) * (W)(y)))
#define E_IMIN(T, W, x, y) ((x) < (y) ? (x) : (y))
#define E_IMAX(T, W, x, y) ((x) > (y) ? (x) : (y))
#define E_BAND(T, W, x, y) ((T)((x) & (y)))
#define E_BOR(T, W, x, y) ((T)((x) | (y)))
#define E_BXOR(T, W, x, y) ((T)((x) ^ (y)))

/* bool is stored as one byte and read as uint8_t, never _Bool: a byte other
 * than 0/1 in a _Bool is undefined behaviour, and normalising with != 0
 * makes any nonzero byte count as true. */
#define E_LOR(T, W, x, y) ((T)(((x) | (y)) != 0))
#define E_LAND(T, W, x, y) ((T)(((x) != 0) & ((y) != 0)))
#define E_LXOR(T, W, x, y) ((T)(((x) != 0) ^ ((y) != 0)))

/* numpy.minimum/maximum: a NaN in either operand is returned, otherwise the
 * second operand wins ties, so (-0.0, 0.0) gives 0.0 for both. */
#define E_FADD(T, W, x, y) ((x) + (y))
#define E_FMUL(T, W, x, y) ((x) * (y))
#define E_FMIN(T, W, x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#define E_FMAX(T, W, x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))

#define DEFINE_KERNEL(name, T, W, OP)                                       \
    static void                                                             \
    name##_fwd(void *restrict dst_, const void *restrict src_, size_t n)    \
    {                                                                       \
        PD_UA(T) *restrict d = dst_;                                        \
        const PD_UA(T) *restrict s = src_;                                  \
        for (size_t i = 0; i < n; i++) {                                    \
            d[i] = OP(T, W, d[i], s[i]);                                    \
        }                                                                   \
    }                                                                       \
    static void                                                             \
    name##_rev(void *restrict dst_, const void *restrict src_, size_t n)    \
    {                                                                       \
        PD_UA(T) *restrict d = dst_;                                        \
        const PD_UA(T) *restrict s = src_;                                  \
        for (size_t i = 0; i < n; i++) {                                    \
            d[i] = OP(T, W, s[i], d[i]);                                    \
        }                                                                   \
    }                                                                       \
    static void                                                             \
    name##_three(void *restrict dst_, const void *restrict a_,              \
                 const void *restrict b_, size_t n)                         \
    {                                                                       \
        PD_UA(T) *restrict d = dst_;                                        \
        const PD_UA(T) *restrict a = a_;                                    \
        const PD_UA(T) *restrict b = b_;                                    \
        for (size_t i = 0; i < n; i++) {                                    \
            d[i] = OP(T, W, a[i], b[i]);                                    \
        }                                                                   \
    }

#define DEFINE_INT_KERNELS(tag, T, W)                                       \
    DEFINE_KERNEL(tag##_sum, T, W, E_IADD)                                  \
    DEFINE_KERNEL(tag##_prod, T, W, E_IMUL)                                 \
    DEFINE_KERNEL(tag##_min, T, W, E_IMIN)                                  \
    DEFINE_KERNEL(tag##_max, T, W, E_IMAX)                                  \
    DEFINE_KERNEL(tag##_band, T, W, E_BAND)                                 \
    DEFINE_KERNEL(tag##_bor, T, W, E_BOR)                                   \
    DEFINE_KERNEL(tag##_bxor, T, W, E_BXOR)

#define DEFINE_FLOAT_KERNELS(tag, T)                                        \
    DEFINE_KERNEL(tag##_sum, T, T, E_FADD)                                  \
    DEFINE_KERNEL(tag##_prod, T, T, E_FMUL)                                 \
    DEFINE_KERNEL(tag##_min, T, T, E_FMIN)                                  \
    DEFINE_KERNEL(tag##_max, T, T, E_FMAX)

DEFINE_KERNEL(b8_or, uint8_t, unsigned, E_LOR)
DEFINE_KERNEL(b8_and, uint8_t, unsigned, E_LAND)
DEFINE_KERNEL(b8_xor, uint8_t, unsigned, E_LXOR)

DEFINE_INT_KERNELS(i8, int8_t, unsigned)
DEFINE_INT_KERNELS(u8, uint8_t, unsigned)
DEFINE_INT_KERNELS(i16, int16_t, unsigned)
DEFINE_INT_KERNELS(u16, uint16_t, unsigned)
DEFINE_INT_KERNELS(i32, int32_t, uint32_t)
DEFINE_INT_KERNELS(u32, uint32_t, uint32_t)
DEFINE_INT_KERNELS(i64, int64_t, uint64_t)
DEFINE_INT_KERNELS(u64, uint64_t, uint64_t)

DEFINE_FLOAT_KERNELS(f32, float)
DEFINE_FLOAT_KERNELS(f64, double)

/* Complex numbers are interleaved (re, im) pairs, as in numpy and C99.
 * Their SUM is the real SUM over twice as many elements.  PRODUCT is written
 * out rather than using _Complex, whose multiply follows C Annex G (calls
 * __mulsc3 to fix up inf/NaN, is not vectorised, and differs from numpy);
 * numpy computes (ar*br - ai*bi, ar*bi + ai*br), and so do we, operand order
 * included, so results match it bit for bit (-std=c11 keeps GCC from
 * contracting these into FMAs). */
#define CMUL_BODY(R, dre, dim, ar, ai, br, bi)                              \
    do {                                                                    \
        R ar_ = (ar), ai_ = (ai), br_ = (br), bi_ = (bi);                   \
        (dre) = ar_ * br_ - ai_ * bi_;                                      \
        (dim) = ar_ * bi_ + ai_ * br_;                                      \
    } while (0)

#define DEFINE_COMPLEX_KERNELS(tag, R, rtag)                                \
    static void                                                             \
    tag##_sum_fwd(void *restrict dst, const void *restrict src, size_t n)   \
    {                                                                       \
        rtag##_sum_fwd(dst, src, 2 * n);                                    \
    }                                                                       \
    static void                                                             \
    tag##_sum_rev(void *restrict dst, const void *restrict src, size_t n)   \
    {                                                                       \
        rtag##_sum_rev(dst, src, 2 * n);                                    \
    }                                                                       \
    static void                                                             \
    tag##_sum_three(void *restrict dst, const void *restrict a,             \
                    const void *restrict b, size_t n)                       \
    {                                                                       \
        rtag##_sum_three(dst, a, b, 2 * n);                                 \
    }                                                                       \
    static void                                                             \
    tag##_prod_fwd(void *restrict dst_, const void *restrict src_,          \
                   size_t n)                                                \
    {                                                                       \
        PD_UA(R) *restrict d = dst_;                                        \
        const PD_UA(R) *restrict s = src_;                                  \
        for (size_t i = 0; i < n; i++) {                                    \
            CMUL_BODY(R, d[2 * i], d[2 * i + 1], d[2 * i], d[2 * i + 1],    \
                      s[2 * i], s[2 * i + 1]);                              \
        }                                                                   \
    }                                                                       \
    static void                                                             \
    tag##_prod_rev(void *restrict dst_, const void *restrict src_,          \
                   size_t n)                                                \
    {                                                                       \
        PD_UA(R) *restrict d = dst_;                                        \
        const PD_UA(R) *restrict s = src_;                                  \
        for (size_t i = 0; i < n; i++) {                                    \
            CMUL_BODY(R, d[2 * i], d[2 * i + 1], s[2 * i], s[2 * i + 1],    \
                      d[2 * i], d[2 * i + 1]);                              \
        }                                                                   \
    }                                                                       \
    static void                                                             \
    tag##_prod_three(void *restrict dst_, const void *restrict a_,          \
                     const void *restrict b_, size_t n)                     \
    {                                                                       \
        PD_UA(R) *restrict d = dst_;                                        \
        const PD_UA(R) *restrict a = a_;                                    \
        const PD_UA(R) *restrict b = b_;                                    \
        for (size_t i = 0; i < n; i++) {                                    \
            CMUL_BODY(R, d[2 * i], d[2 * i + 1], a[2 * i], a[2 * i + 1],    \
                      b[2 * i], b[2 * i + 1]);                              \
        }                                                                   \
    }

DEFINE_COMPLEX_KERNELS(c64, float, f32)
DEFINE_COMPLEX_KERNELS(c128, double, f64)

#define K(name) { name##_fwd, name##_rev, name##_three }

/* AVG reduces like SUM; pd_reduce_avg_finish divides once at the end. */
#define INT_ROW(tag)                                                        \
    {                                                                       \
        [PD_SUM] = K(tag##_sum), [PD_AVG] = K(tag##_sum),                   \
        [PD_PRODUCT] = K(tag##_prod), [PD_MIN] = K(tag##_min),              \
        [PD_MAX] = K(tag##_max), [PD_BAND] = K(tag##_band),                 \
        [PD_BOR] = K(tag##_bor), [PD_BXOR] = K(tag##_bxor),                 \
    }
#define FLOAT_ROW(tag)                                                      \
    {                                                                       \
        [PD_SUM] = K(tag##_sum), [PD_AVG] = K(tag##_sum),                   \
        [PD_PRODUCT] = K(tag##_prod), [PD_MIN] = K(tag##_min),              \
        [PD_MAX] = K(tag##_max),                                            \
    }
#define COMPLEX_ROW(tag)                                                    \
    {                                                                       \
        [PD_SUM] = K(tag##_sum), [PD_AVG] = K(tag##_sum),                   \
        [PD_PRODUCT] = K(tag##_prod),                                       \
    }

/* Empty entries are the pairs pd_redop_check rejects; float16/bfloat16 rows
 * are empty because they are reduced through float32 (reduce_half). */
static const struct kernel kernels[PD_NDTYPES][PD_NREDOPS] = {
    [PD_BOOL] = {
        [PD_SUM] = K(b8_or), [PD_PRODUCT] = K(b8_and),
        [PD_MIN] = K(b8_and), [PD_MAX] = K(b8_or),
        [PD_BAND] = K(b8_and), [PD_BOR] = K(b8_or), [PD_BXOR] = K(b8_xor),
    },
    [PD_INT8] = INT_ROW(i8),
    [PD_UINT8] = INT_ROW(u8),
    [PD_INT16] = INT_ROW(i16),
    [PD_UINT16] = INT_ROW(u16),
    [PD_INT32] = INT_ROW(i32),
    [PD_UINT32] = INT_ROW(u32),
    [PD_INT64] = INT_ROW(i64),
    [PD_UINT64] = INT_ROW(u64),
    [PD_FLOAT32] = FLOAT_ROW(f32),
    [PD_FLOAT64] = FLOAT_ROW(f64),
    [PD_COMPLEX64] = COMPLEX_ROW(c64),
    [PD_COMPLEX128] = COMPLEX_ROW(c128),
};

/* Elements per stack chunk in the slow paths: 2 x 4 KiB of float. */
#define CHUNK 1024

static const struct kernel *
lookup(pd_dtype dt, pd_redop op)
{
    if ((unsigned)dt >= (unsigned)PD_NDTYPES
        || (unsigned)op >= (unsigned)PD_NREDOPS) {
        return NULL;
    }
    return &kernels[dt][op];
}

/* float16/bfloat16 are documented as not accepted, but a caller that slips
 * still gets the right answer (widen, reduce in float32, round once) rather
 * than garbage.  Reading both chunks before writing dst makes aliasing of
 * dst with a and/or b harmless. */
static void
reduce_half(pd_dtype dt, pd_redop op, void *dst, const void *a,
            const void *b, size_t count)
{
    const struct kernel *k = lookup(PD_FLOAT32, op);
    float ta[CHUNK], tb[CHUNK];
    if (k == NULL || k->fwd == NULL) {
        assert(!"pd_reduce: op not valid for dtype (check pd_redop_check)");
        return;
    }
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t m = count - off < CHUNK ? count - off : CHUNK;
        size_t byte_off = off * sizeof(uint16_t);
        pd_cast_to_f32(dt, ta, (const char *)a + byte_off, m);
        pd_cast_to_f32(dt, tb, (const char *)b + byte_off, m);
        k->fwd(ta, tb, m);
        pd_cast_from_f32(dt, (char *)dst + byte_off, ta, m);
    }
}

/* dst == a == b: restrict forbids passing one buffer twice, so copy b a
 * chunk at a time.  (x op x is rare enough not to need its own kernels.) */
static void
reduce_self(const struct kernel *k, size_t esize, void *dst, size_t count)
{
    /* double keeps the buffer aligned for every element type */
    double tmp[CHUNK];
    size_t per = sizeof(tmp) / esize;
    for (size_t off = 0; off < count; off += per) {
        size_t m = count - off < per ? count - off : per;
        char *d = (char *)dst + off * esize;
        memcpy(tmp, d, m * esize);
        k->fwd(d, tmp, m);
    }
}

void
pd_reduce3(pd_dtype dt, pd_redop op, void *dst, const void *a,
           const void *b, size_t count)
{
    if (count == 0) {
        return;
    }
    if (dt == PD_FLOAT16 || dt == PD_BFLOAT16) {
        reduce_half(dt, op, dst, a, b, count);
        return;
    }
    const struct kernel *k = lookup(dt, op);
    if (k == NULL || k->fwd == NULL) {
        /* Callers validate with pd_redop_check first; this is a bug. */
        assert(!"pd_reduce: op not valid for dtype (check pd_redop_check)");
        return;
    }
    if (dst == a && dst == b) {
        reduce_self(k, pd_dtype_size(dt), dst, count);
    } else if (dst == a) {
        k->fwd(dst, b, count);
    } else if (dst == b) {
        k->rev(dst, a, count);
    } else {
        k->three(dst, a, b, count);
    }
}

void
pd_reduce(pd_dtype dt, pd_redop op, void *dst, const void *src, size_t count)
{
    pd_reduce3(dt, op, dst, dst, src, count);
}

/* Integer AVG truncates toward zero, which C's / already does for signed
 * operands (D is int for narrow types, so int8 / int promotes safely).  n is
 * a positive world size, so INT_MIN / -1 cannot happen. */
#define DEFINE_AVG(tag, T, D)                                               \
    static void                                                             \
    tag##_avg(void *buf_, size_t count, int n)                              \
    {                                                                       \
        PD_UA(T) *restrict buf = buf_;                                      \
        D div = (D)n;                                                       \
        for (size_t i = 0; i < count; i++) {                                \
            buf[i] = (T)(buf[i] / div);                                     \
        }                                                                   \
    }

DEFINE_AVG(i8, int8_t, int)
DEFINE_AVG(u8, uint8_t, unsigned)
DEFINE_AVG(i16, int16_t, int)
DEFINE_AVG(u16, uint16_t, unsigned)
DEFINE_AVG(i32, int32_t, int32_t)
DEFINE_AVG(u32, uint32_t, uint32_t)
DEFINE_AVG(i64, int64_t, int64_t)
DEFINE_AVG(u64, uint64_t, uint64_t)
/* Divide rather than multiply by 1/n: one correctly rounded operation, so
 * the result equals numpy's sum / n. */
DEFINE_AVG(f32, float, float)
DEFINE_AVG(f64, double, double)

static void
avg_half(pd_dtype dt, void *buf, size_t count, int n)
{
    float tmp[CHUNK];
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t m = count - off < CHUNK ? count - off : CHUNK;
        char *p = (char *)buf + off * sizeof(uint16_t);
        pd_cast_to_f32(dt, tmp, p, m);
        f32_avg(tmp, m, n);
        pd_cast_from_f32(dt, p, tmp, m);
    }
}

void
pd_reduce_avg_finish(pd_dtype dt, void *buf, size_t count, int n)
{
    if (n <= 0) {
        assert(!"pd_reduce_avg_finish: n must be positive");
        return;
    }
    /* x / 1 == x in every type, and n == 1 is common (world size 1). */
    if (n == 1 || count == 0) {
        return;
    }
    switch (dt) {
    case PD_INT8:
        i8_avg(buf, count, n);
        break;
    case PD_UINT8:
        u8_avg(buf, count, n);
        break;
    case PD_INT16:
        i16_avg(buf, count, n);
        break;
    case PD_UINT16:
        u16_avg(buf, count, n);
        break;
    case PD_INT32:
        i32_avg(buf, count, n);
        break;
    case PD_UINT32:
        u32_avg(buf, count, n);
        break;
    case PD_INT64:
        i64_avg(buf, count, n);
        break;
    case PD_UINT64:
        u64_avg(buf, count, n);
        break;
    case PD_FLOAT16:
    case PD_BFLOAT16:
        avg_half(dt, buf, count, n);
        break;
    case PD_FLOAT32:
        f32_avg(buf, count, n);
        break;
    case PD_FLOAT64:
        f64_avg(buf, count, n);
        break;
    /* Dividing a complex number by a real n divides both parts. */
    case PD_COMPLEX64:
        f32_avg(buf, 2 * count, n);
        break;
    case PD_COMPLEX128:
        f64_avg(buf, 2 * count, n);
        break;
    default:
        /* bool (AVG is rejected by pd_redop_check) or an invalid dtype */
        assert(!"pd_reduce_avg_finish: AVG not valid for dtype");
        break;
    }
}
