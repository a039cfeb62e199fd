/* Self-checking tests for csrc/kernels: every (dtype, op) pair against a
 * scalar reference written independently of the kernels (64-bit modular
 * integer arithmetic, explicit isnan tests, double-precision rounding for the
 * half casts), edge cases, and exhaustive half-precision casts.
 *
 * The library may convert float16 with F16C and bfloat16 with an AVX2 build
 * (cast.c); the portable functions of half.h are also checked directly, in
 * loops this file's -O3 build vectorises the same way, so both paths are
 * covered on any machine.
 *
 * Exit status 0 when every check passes; each failure prints what differed.
 * PD_TEST_QUICK=1 skips the exhaustive 2^32 float32 -> float16 sweep.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/half.h"
#include "kernels/kernels.h"

static int failures;
static int checks;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        checks++;                                                           \
        if (!(cond)) {                                                      \
            failures++;                                                     \
            if (failures <= 50) {                                           \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
                fprintf(stderr, __VA_ARGS__);                               \
                fputc('\n', stderr);                                        \
            }                                                               \
        }                                                                   \
    } while (0)

/* ---- deterministic random numbers (xorshift64*) ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t
rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static uint32_t
f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float
u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ---- element access by dtype, for the reference ---- */

static int
is_signed_int(pd_dtype dt)
{
    return dt == PD_INT8 || dt == PD_INT16 || dt == PD_INT32
           || dt == PD_INT64;
}

static int
is_int(pd_dtype dt)
{
    return dt >= PD_INT8 && dt <= PD_UINT64;
}

/* Integer element as uint64_t; signed values are sign-extended, so the
 * 64-bit modular result truncated back is the N-bit wrapped result. */
static uint64_t
load_int(pd_dtype dt, const void *p)
{
    switch (dt) {
    case PD_INT8: {
        int8_t v;
        memcpy(&v, p, 1);
        return (uint64_t)(int64_t)v;
    }
    case PD_UINT8: {
        uint8_t v;
        memcpy(&v, p, 1);
        return v;
    }
    case PD_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        return (uint64_t)(int64_t)v;
    }
    case PD_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case PD_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        return (uint64_t)(int64_t)v;
    }
    case PD_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    default: {
        uint64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    }
}

static void
store_int(pd_dtype dt, void *p, uint64_t v)
{
    /* truncation to the low N bits, independent of byte order */
    switch (pd_dtype_size(dt)) {
    case 1: {
        uint8_t t = (uint8_t)v;
        memcpy(p, &t, 1);
        break;
    }
    case 2: {
        uint16_t t = (uint16_t)v;
        memcpy(p, &t, 2);
        break;
    }
    case 4: {
        uint32_t t = (uint32_t)v;
        memcpy(p, &t, 4);
        break;
    }
    default:
        memcpy(p, &v, 8);
        break;
    }
}

static int
int_less(pd_dtype dt, uint64_t x, uint64_t y)
{
    if (is_signed_int(dt)) {
        return (int64_t)x < (int64_t)y;
    }
    return x < y;
}

/* numpy.minimum / maximum on floats: NaN if either is NaN (the first NaN
 * operand), otherwise the smaller/larger, the second operand on ties. */
static double
ref_fmin(double x, double y)
{
    if (isnan(x)) {
        return x;
    }
    if (isnan(y)) {
        return y;
    }
    return x < y ? x : y;
}

static double
ref_fmax(double x, double y)
{
    if (isnan(x)) {
        return x;
    }
    if (isnan(y)) {
        return y;
    }
    return x > y ? x : y;
}

static double
ref_fop(pd_redop op, double x, double y)
{
    switch (op) {
    case PD_SUM:
    case PD_AVG:
        return x + y;
    case PD_PRODUCT:
        return x * y;
    case PD_MIN:
        return ref_fmin(x, y);
    default:
        return ref_fmax(x, y);
    }
}

/* ---- reference half conversions, written differently from half.h ---- */

/* float16 -> float via ldexp on the decoded fields. */
static float
ref_f16_to_f32(uint16_t h)
{
    int sign = h >> 15;
    int exp = (h >> 10) & 0x1f;
    int man = h & 0x3ff;
    float v;
    if (exp == 0x1f) {
        /* keep the payload exactly, as numpy does */
        return u2f(((uint32_t)sign << 31) | 0x7f800000u
                   | ((uint32_t)man << 13));
    }
    if (exp == 0) {
        v = (float)ldexp((double)man, -24);
    } else {
        v = (float)ldexp((double)(man | 0x400), exp - 25);
    }
    return sign ? -v : v;
}

/* float -> float16 by scaling to an integer count of ulps in double and
 * letting rint (round-to-nearest-even, the default mode) round once. */
static uint16_t
ref_f32_to_f16(float f)
{
    uint32_t x = f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    double a = fabs((double)f);
    if (isnan(f)) {
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    }
    if (a >= 65520.0) {
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a == 0.0) {
        return sign;
    }
    int e;
    frexp(a, &e); /* a = m * 2^e with m in [0.5, 1): floor(log2 a) = e-1 */
    e -= 1;
    if (e < -14) {
        e = -14; /* subnormal: fixed ulp 2^-24 */
    }
    double q = rint(ldexp(a, 10 - e)); /* in [0, 2048] */
    uint32_t qi = (uint32_t)q;
    if (e == -14 && qi < 1024) {
        return (uint16_t)(sign | qi); /* subnormal */
    }
    /* qi in [1024, 2048]; 2048 carries into the next binade */
    return (uint16_t)(sign | (((uint32_t)(e + 15) << 10) + (qi - 1024u)));
}

static uint16_t
ref_f32_to_bf16(float f)
{
    uint32_t x = f2u(f);
    if (isnan(f)) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    uint32_t hi = x >> 16, lo = x & 0xffffu;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) {
        hi++;
    }
    return (uint16_t)hi;
}

static float
ref_to_f32(pd_dtype dt, uint16_t h)
{
    return dt == PD_FLOAT16 ? ref_f16_to_f32(h) : u2f((uint32_t)h << 16);
}

static uint16_t
ref_from_f32(pd_dtype dt, float f)
{
    return dt == PD_FLOAT16 ? ref_f32_to_f16(f) : ref_f32_to_bf16(f);
}

/* One element of dst = x (op) y. */
static void
ref_apply(pd_dtype dt, pd_redop op, void *out, const void *xp, const void *yp)
{
    if (dt == PD_BOOL) {
        int x = *(const uint8_t *)xp != 0, y = *(const uint8_t *)yp != 0;
        int r;
        switch (op) {
        case PD_SUM:
        case PD_MAX:
        case PD_BOR:
            r = x || y;
            break;
        case PD_BXOR:
            r = x != y;
            break;
        default:
            r = x && y;
            break;
        }
        *(uint8_t *)out = (uint8_t)r;
    } else if (is_int(dt)) {
        uint64_t x = load_int(dt, xp), y = load_int(dt, yp), r;
        switch (op) {
        case PD_SUM:
        case PD_AVG:
            r = x + y;
            break;
        case PD_PRODUCT:
            r = x * y;
            break;
        case PD_MIN:
            r = int_less(dt, y, x) ? y : x;
            break;
        case PD_MAX:
            r = int_less(dt, x, y) ? y : x;
            break;
        case PD_BAND:
            r = x & y;
            break;
        case PD_BOR:
            r = x | y;
            break;
        default:
            r = x ^ y;
            break;
        }
        store_int(dt, out, r);
    } else if (dt == PD_FLOAT16 || dt == PD_BFLOAT16) {
        uint16_t x, y, r;
        memcpy(&x, xp, 2);
        memcpy(&y, yp, 2);
        float fx = ref_to_f32(dt, x), fy = ref_to_f32(dt, y), fr;
        /* in float: a double sum rounded to float could round twice */
        switch (op) {
        case PD_SUM:
        case PD_AVG:
            fr = fx + fy;
            break;
        case PD_PRODUCT:
            fr = fx * fy;
            break;
        default:
            fr = (float)ref_fop(op, fx, fy);
            break;
        }
        r = ref_from_f32(dt, fr);
        memcpy(out, &r, 2);
    } else if (dt == PD_FLOAT32) {
        float x, y, r;
        memcpy(&x, xp, 4);
        memcpy(&y, yp, 4);
        /* float arithmetic, not double, so sums round like the kernel */
        switch (op) {
        case PD_SUM:
        case PD_AVG:
            r = x + y;
            break;
        case PD_PRODUCT:
            r = x * y;
            break;
        default:
            r = (float)ref_fop(op, x, y);
            break;
        }
        memcpy(out, &r, 4);
    } else if (dt == PD_FLOAT64) {
        double x, y, r;
        memcpy(&x, xp, 8);
        memcpy(&y, yp, 8);
        r = ref_fop(op, x, y);
        memcpy(out, &r, 8);
    } else if (dt == PD_COMPLEX64) {
        float x[2], y[2], r[2];
        memcpy(x, xp, 8);
        memcpy(y, yp, 8);
        if (op == PD_PRODUCT) {
            float p0 = x[0] * y[0], p1 = x[1] * y[1];
            float p2 = x[0] * y[1], p3 = x[1] * y[0];
            r[0] = p0 - p1;
            r[1] = p2 + p3;
        } else {
            r[0] = x[0] + y[0];
            r[1] = x[1] + y[1];
        }
        memcpy(out, r, 8);
    } else {
        double x[2], y[2], r[2];
        memcpy(x, xp, 16);
        memcpy(y, yp, 16);
        if (op == PD_PRODUCT) {
            double p0 = x[0] * y[0], p1 = x[1] * y[1];
            double p2 = x[0] * y[1], p3 = x[1] * y[0];
            r[0] = p0 - p1;
            r[1] = p2 + p3;
        } else {
            r[0] = x[0] + y[0];
            r[1] = x[1] + y[1];
        }
        memcpy(out, r, 16);
    }
}

/* Bitwise equality, except that any two NaNs match: the hardware may pick
 * either operand's payload once the compiler commutes an add. */
static int
elem_equal(pd_dtype dt, const void *x, const void *y)
{
    switch (dt) {
    case PD_FLOAT16: {
        uint16_t a, b;
        memcpy(&a, x, 2);
        memcpy(&b, y, 2);
        int na = (a & 0x7fff) > 0x7c00, nb = (b & 0x7fff) > 0x7c00;
        return (na && nb) || a == b;
    }
    case PD_BFLOAT16: {
        uint16_t a, b;
        memcpy(&a, x, 2);
        memcpy(&b, y, 2);
        int na = (a & 0x7fff) > 0x7f80, nb = (b & 0x7fff) > 0x7f80;
        return (na && nb) || a == b;
    }
    case PD_FLOAT32:
    case PD_COMPLEX64:
        for (size_t off = 0; off < pd_dtype_size(dt); off += 4) {
            float a, b;
            memcpy(&a, (const char *)x + off, 4);
            memcpy(&b, (const char *)y + off, 4);
            if (!(isnan(a) && isnan(b)) && f2u(a) != f2u(b)) {
                return 0;
            }
        }
        return 1;
    case PD_FLOAT64:
    case PD_COMPLEX128:
        for (size_t off = 0; off < pd_dtype_size(dt); off += 8) {
            double a, b;
            memcpy(&a, (const char *)x + off, 8);
            memcpy(&b, (const char *)y + off, 8);
            if (!(isnan(a) && isnan(b)) && memcmp(&a, &b, 8) != 0) {
                return 0;
            }
        }
        return 1;
    default:
        return memcmp(x, y, pd_dtype_size(dt)) == 0;
    }
}

/* ---- random inputs with the awkward values mixed in ---- */

static const float f32_special[] = {
    0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN,
    FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX, FLT_TRUE_MIN, 65504.0f, 65520.0f,
    0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1p-14f, 3.0f, 0.5f,
};

static float
rnd_float(void)
{
    uint64_t r = rnd();
    switch (r % 4) {
    case 0:
        return f32_special[(r >> 8) % (sizeof(f32_special) / sizeof(float))];
    case 1:
        return u2f((uint32_t)(r >> 32)); /* any bit pattern */
    default:
        /* ordinary values, with repeats so MIN/MAX ties happen */
        return (float)((int64_t)((r >> 16) % 64) - 32) * 0.25f;
    }
}

static double
rnd_double(void)
{
    uint64_t r = rnd();
    if (r % 4 == 1) {
        uint64_t bits = rnd();
        double d;
        memcpy(&d, &bits, 8);
        return d;
    }
    return (double)rnd_float();
}

static void
fill_random(pd_dtype dt, void *buf, size_t count)
{
    char *p = buf;
    size_t es = pd_dtype_size(dt);
    for (size_t i = 0; i < count; i++, p += es) {
        uint64_t r = rnd();
        switch (dt) {
        case PD_BOOL:
            /* mostly 0/1, sometimes another nonzero byte */
            *(uint8_t *)p = (uint8_t)(r % 8 == 0 ? (r >> 8) & 0xff : r & 1);
            break;
        case PD_FLOAT16:
        case PD_BFLOAT16: {
            uint16_t h = r % 2 ? (uint16_t)(r >> 16)
                               : ref_from_f32(dt, rnd_float());
            memcpy(p, &h, 2);
            break;
        }
        case PD_FLOAT32:
        case PD_COMPLEX64: {
            for (size_t off = 0; off < es; off += 4) {
                float f = rnd_float();
                memcpy(p + off, &f, 4);
            }
            break;
        }
        case PD_FLOAT64:
        case PD_COMPLEX128: {
            for (size_t off = 0; off < es; off += 8) {
                double d = rnd_double();
                memcpy(p + off, &d, 8);
            }
            break;
        }
        default:
            /* extremes often, so wraparound and INT_MIN are exercised */
            if (r % 8 == 0) {
                r = (r & 16) ? ~(uint64_t)0 >> 1 : (uint64_t)1 << 63;
                r >>= 64 - 8 * es;
                if (is_signed_int(dt) && (rnd() & 1)) {
                    r = (uint64_t)1 << (8 * es - 1); /* INT_MIN */
                }
            } else if (r % 8 == 1) {
                r = r % 5; /* small values, ties */
            }
            store_int(dt, p, r);
            break;
        }
    }
}

/* ---- reductions ---- */

enum alias { DISTINCT, DST_IS_A, DST_IS_B, ALL_SAME, VIA_REDUCE };
static const char *const alias_names[] = {
    "distinct", "dst==a", "dst==b", "dst==a==b", "pd_reduce",
};

static void
check_one(pd_dtype dt, pd_redop op, size_t count, size_t misalign,
          enum alias mode)
{
    size_t es = pd_dtype_size(dt);
    /* separate, exactly sized mallocs so ASan catches any access past the
     * end (misalign shifts the start off the allocator's alignment) */
    size_t bytes = (count + misalign) * es + (count + misalign == 0);
    char *abuf = malloc(bytes), *bbuf = malloc(bytes), *dbuf = malloc(bytes);
    char *expect = malloc(bytes);
    if (!abuf || !bbuf || !dbuf || !expect) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    char *a = abuf + misalign * es, *b = bbuf + misalign * es;
    char *d = dbuf + misalign * es;
    fill_random(dt, a, count);
    fill_random(dt, b, count);
    if (mode == ALL_SAME) {
        memcpy(b, a, count * es);
    }
    for (size_t i = 0; i < count; i++) {
        ref_apply(dt, op, expect + i * es, a + i * es, b + i * es);
    }
    switch (mode) {
    case DISTINCT:
        memset(d, 0xa5, count * es);
        pd_reduce3(dt, op, d, a, b, count);
        break;
    case DST_IS_A:
        pd_reduce3(dt, op, a, a, b, count);
        d = a;
        break;
    case DST_IS_B:
        pd_reduce3(dt, op, b, a, b, count);
        d = b;
        break;
    case ALL_SAME:
        pd_reduce3(dt, op, a, a, a, count);
        d = a;
        break;
    case VIA_REDUCE:
        pd_reduce(dt, op, a, b, count);
        d = a;
        break;
    }
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        if (!elem_equal(dt, d + i * es, expect + i * es)) {
            if (bad++ == 0) {
                fprintf(stderr, "  first mismatch at %zu: got", i);
                for (size_t k = 0; k < es; k++) {
                    fprintf(stderr, " %02x", (unsigned char)d[i * es + k]);
                }
                fprintf(stderr, ", want");
                for (size_t k = 0; k < es; k++) {
                    fprintf(stderr, " %02x",
                            (unsigned char)expect[i * es + k]);
                }
                fputc('\n', stderr);
            }
        }
    }
    CHECK(bad == 0, "%s %s n=%zu misalign=%zu %s: %zu wrong elements",
          pd_dtype_name(dt), pd_redop_name(op), count, misalign,
          alias_names[mode], bad);
    free(abuf);
    free(bbuf);
    free(dbuf);
    free(expect);
}

static int
op_allowed(pd_dtype dt, pd_redop op)
{
    int bitwise = op == PD_BAND || op == PD_BOR || op == PD_BXOR;
    int cplx = dt == PD_COMPLEX64 || dt == PD_COMPLEX128;
    if (bitwise) {
        return dt == PD_BOOL || is_int(dt);
    }
    if (op == PD_MIN || op == PD_MAX) {
        return !cplx;
    }
    if (op == PD_AVG) {
        return dt != PD_BOOL;
    }
    return 1;
}

static void
test_redop_check(void)
{
    for (int dt = 0; dt < PD_NDTYPES; dt++) {
        for (int op = 0; op < PD_NREDOPS; op++) {
            pd_error(PD_OK, "%s", "");
            pd_status st = pd_redop_check((pd_dtype)dt, (pd_redop)op);
            if (op_allowed((pd_dtype)dt, (pd_redop)op)) {
                CHECK(st == PD_OK, "%s %s should be allowed",
                      pd_dtype_name(dt), pd_redop_name(op));
            } else {
                char want[128];
                snprintf(want, sizeof(want),
                         "ReduceOp.%s is not supported for dtype %s",
                         pd_redop_name(op), pd_dtype_name(dt));
                CHECK(st == PD_ETYPE && strcmp(pd_errmsg(), want) == 0,
                      "%s %s: status %d message '%s'", pd_dtype_name(dt),
                      pd_redop_name(op), (int)st, pd_errmsg());
            }
        }
    }
    CHECK(pd_redop_check(PD_FLOAT32, PD_BAND) == PD_ETYPE
          && strcmp(pd_errmsg(),
                    "ReduceOp.BAND is not supported for dtype float32") == 0,
          "BAND/float32 message: '%s'", pd_errmsg());
    CHECK(pd_redop_check(PD_NDTYPES, PD_SUM) == PD_EINVAL, "bad dtype");
    CHECK(pd_redop_check((pd_dtype)-1, PD_SUM) == PD_EINVAL, "dtype -1");
    CHECK(pd_redop_check(PD_FLOAT32, PD_NREDOPS) == PD_EINVAL, "bad op");
    CHECK(pd_redop_check(PD_FLOAT32, (pd_redop)-3) == PD_EINVAL, "op -3");

    static const size_t sizes[PD_NDTYPES] = {1, 1, 1, 2, 2, 4, 4, 8, 8,
                                             2, 2, 4, 8, 8, 16};
    static const char *const names[PD_NDTYPES] = {
        "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
        "int64", "uint64", "float16", "bfloat16", "float32", "float64",
        "complex64", "complex128"};
    for (int dt = 0; dt < PD_NDTYPES; dt++) {
        CHECK(pd_dtype_size((pd_dtype)dt) == sizes[dt], "size of %d", dt);
        CHECK(strcmp(pd_dtype_name((pd_dtype)dt), names[dt]) == 0,
              "name of %d: %s", dt, pd_dtype_name((pd_dtype)dt));
        int acc = (int)pd_dtype_accum((pd_dtype)dt);
        int half = dt == PD_FLOAT16 || dt == PD_BFLOAT16;
        CHECK(acc == (half ? (int)PD_FLOAT32 : dt), "accum of %s",
              names[dt]);
    }
    CHECK(pd_dtype_size(PD_NDTYPES) == 0, "size of invalid dtype");
    static const char *const ops[] = {"SUM", "AVG", "PRODUCT", "MIN",
                                      "MAX", "BAND", "BOR", "BXOR"};
    for (int op = 0; op < PD_NREDOPS; op++) {
        CHECK(strcmp(pd_redop_name((pd_redop)op), ops[op]) == 0, "op %d",
              op);
    }
}

static void
test_all_reductions(void)
{
    /* lengths around vector widths and unroll factors, plus one long run */
    static const size_t counts[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 64,
                                    127, 1000, 4099};
    for (int dt = 0; dt < PD_NDTYPES; dt++) {
        for (int op = 0; op < PD_NREDOPS; op++) {
            if (!op_allowed((pd_dtype)dt, (pd_redop)op)) {
                continue;
            }
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                for (int mode = DISTINCT; mode <= VIA_REDUCE; mode++) {
                    check_one((pd_dtype)dt, (pd_redop)op, counts[c], c % 2,
                              (enum alias)mode);
                }
            }
        }
    }
}

/* ---- hand-picked edge cases, stated as plain numbers ---- */

static void
test_int_edges(void)
{
    int32_t i32a[] = {INT32_MIN, INT32_MAX, INT32_MIN, -7, 0x10000};
    int32_t i32b[] = {-1, 1, INT32_MIN, 3, 0x10000};
    int32_t out[5];
    pd_reduce3(PD_INT32, PD_SUM, out, i32a, i32b, 5);
    CHECK(out[0] == INT32_MAX && out[1] == INT32_MIN && out[2] == 0
              && out[3] == -4 && out[4] == 0x20000,
          "int32 wrapping sum: %d %d %d %d", out[0], out[1], out[2], out[3]);
    pd_reduce3(PD_INT32, PD_PRODUCT, out, i32a, i32b, 5);
    CHECK(out[0] == INT32_MIN && out[1] == INT32_MAX && out[2] == 0
              && out[3] == -21 && out[4] == 0,
          "int32 wrapping product: %d %d %d %d %d", out[0], out[1], out[2],
          out[3], out[4]);
    pd_reduce3(PD_INT32, PD_MIN, out, i32a, i32b, 5);
    CHECK(out[0] == INT32_MIN && out[1] == 1 && out[3] == -7, "int32 min");
    pd_reduce3(PD_INT32, PD_MAX, out, i32a, i32b, 5);
    CHECK(out[0] == -1 && out[1] == INT32_MAX && out[3] == 3, "int32 max");

    int8_t i8a[] = {127, -128, -128, 100};
    int8_t i8b[] = {1, -1, -1, 100};
    int8_t o8[4];
    pd_reduce3(PD_INT8, PD_SUM, o8, i8a, i8b, 4);
    CHECK(o8[0] == -128 && o8[1] == 127 && o8[3] == -56, "int8 sum wraps");
    pd_reduce3(PD_INT8, PD_PRODUCT, o8, i8a, i8b, 4);
    CHECK(o8[1] == -128 && o8[3] == 16, "int8 product wraps: %d %d", o8[1],
          o8[3]);

    /* uint16 * uint16 promotes to int in C and would overflow it */
    uint16_t u16a[] = {65535, 65535, 256};
    uint16_t u16b[] = {65535, 2, 256};
    uint16_t o16[3];
    pd_reduce3(PD_UINT16, PD_PRODUCT, o16, u16a, u16b, 3);
    CHECK(o16[0] == 1 && o16[1] == 65534 && o16[2] == 0,
          "uint16 product: %u %u %u", o16[0], o16[1], o16[2]);
    int16_t i16a[] = {0x7fff, -32768};
    int16_t i16b[] = {0x7fff, -32768};
    int16_t oi16[2];
    pd_reduce3(PD_INT16, PD_PRODUCT, oi16, i16a, i16b, 2);
    CHECK(oi16[0] == 1 && oi16[1] == 0, "int16 product: %d %d", oi16[0],
          oi16[1]);

    int64_t i64a[] = {INT64_MIN, INT64_MAX, INT64_MIN};
    int64_t i64b[] = {-1, 2, INT64_MIN};
    int64_t o64[3];
    pd_reduce3(PD_INT64, PD_PRODUCT, o64, i64a, i64b, 3);
    CHECK(o64[0] == INT64_MIN && o64[1] == -2 && o64[2] == 0,
          "int64 product");
    pd_reduce3(PD_INT64, PD_SUM, o64, i64a, i64b, 3);
    CHECK(o64[0] == INT64_MAX && o64[1] == INT64_MIN + 1 && o64[2] == 0,
          "int64 sum");

    uint32_t u32a[] = {0xffffffffu, 0xf0f0f0f0u};
    uint32_t u32b[] = {1, 0x0ff00ff0u};
    uint32_t o32[2];
    pd_reduce3(PD_UINT32, PD_SUM, o32, u32a, u32b, 2);
    CHECK(o32[0] == 0, "uint32 sum wraps");
    pd_reduce3(PD_UINT32, PD_BAND, o32, u32a, u32b, 2);
    CHECK(o32[1] == 0x00f000f0u, "uint32 band");
    pd_reduce3(PD_UINT32, PD_BOR, o32, u32a, u32b, 2);
    CHECK(o32[1] == 0xfff0fff0u, "uint32 bor");
    pd_reduce3(PD_UINT32, PD_BXOR, o32, u32a, u32b, 2);
    CHECK(o32[1] == 0xff00ff00u, "uint32 bxor");
    pd_reduce3(PD_UINT32, PD_MAX, o32, u32a, u32b, 2);
    CHECK(o32[0] == 0xffffffffu, "uint32 max is unsigned");

    /* bool: any nonzero byte is true, results are 0/1 */
    uint8_t ba[] = {0, 0, 1, 1, 2, 4};
    uint8_t bb[] = {0, 1, 0, 1, 4, 0};
    uint8_t ob[6];
    static const uint8_t want_or[] = {0, 1, 1, 1, 1, 1};
    static const uint8_t want_and[] = {0, 0, 0, 1, 1, 0};
    static const uint8_t want_xor[] = {0, 1, 1, 0, 0, 1};
    pd_reduce3(PD_BOOL, PD_SUM, ob, ba, bb, 6);
    CHECK(memcmp(ob, want_or, 6) == 0, "bool SUM = or");
    pd_reduce3(PD_BOOL, PD_MAX, ob, ba, bb, 6);
    CHECK(memcmp(ob, want_or, 6) == 0, "bool MAX = or");
    pd_reduce3(PD_BOOL, PD_BOR, ob, ba, bb, 6);
    CHECK(memcmp(ob, want_or, 6) == 0, "bool BOR = or");
    pd_reduce3(PD_BOOL, PD_PRODUCT, ob, ba, bb, 6);
    CHECK(memcmp(ob, want_and, 6) == 0, "bool PRODUCT = and");
    pd_reduce3(PD_BOOL, PD_MIN, ob, ba, bb, 6);
    CHECK(memcmp(ob, want_and, 6) == 0, "bool MIN = and");
    pd_reduce3(PD_BOOL, PD_BAND, ob, ba, bb, 6);
    CHECK(memcmp(ob, want_and, 6) == 0, "bool BAND = and");
    pd_reduce3(PD_BOOL, PD_BXOR, ob, ba, bb, 6);
    CHECK(memcmp(ob, want_xor, 6) == 0, "bool BXOR = xor");
}

static void
test_float_edges(void)
{
    float a[] = {NAN, 1.0f, -0.0f, 0.0f, -INFINITY, NAN};
    float b[] = {1.0f, NAN, 0.0f, -0.0f, 2.0f, -NAN};
    float o[6];
    pd_reduce3(PD_FLOAT32, PD_MIN, o, a, b, 6);
    CHECK(isnan(o[0]) && isnan(o[1]) && isnan(o[5]), "min propagates NaN");
    CHECK(f2u(o[2]) == f2u(0.0f) && f2u(o[3]) == f2u(-0.0f),
          "min of zeros returns the second operand like numpy");
    CHECK(o[4] == -INFINITY, "min -inf");
    pd_reduce3(PD_FLOAT32, PD_MAX, o, a, b, 6);
    CHECK(isnan(o[0]) && isnan(o[1]) && isnan(o[5]), "max propagates NaN");
    CHECK(f2u(o[2]) == f2u(0.0f) && f2u(o[3]) == f2u(-0.0f),
          "max of zeros returns the second operand like numpy");
    CHECK(o[4] == 2.0f, "max 2");
    /* in place with dst == b must still treat a as the first operand */
    float bb[6];
    memcpy(bb, b, sizeof(b));
    pd_reduce3(PD_FLOAT32, PD_MIN, bb, a, bb, 6);
    CHECK(f2u(bb[2]) == f2u(0.0f) && f2u(bb[3]) == f2u(-0.0f),
          "dst==b keeps operand order");
    pd_reduce3(PD_FLOAT32, PD_SUM, o, a, b, 6);
    CHECK(isnan(o[0]) && f2u(o[2]) == f2u(0.0f), "-0 + 0 = +0");
    float nz[] = {-0.0f};
    float nz2[] = {-0.0f};
    pd_reduce(PD_FLOAT32, PD_SUM, nz, nz2, 1);
    CHECK(f2u(nz[0]) == f2u(-0.0f), "-0 + -0 = -0");

    double da[] = {NAN, -0.0, 1e308};
    double db[] = {-1.0, 0.0, 1e308};
    double dout[3];
    pd_reduce3(PD_FLOAT64, PD_MAX, dout, da, db, 3);
    CHECK(isnan(dout[0]) && !signbit(dout[1]), "double max");
    pd_reduce3(PD_FLOAT64, PD_SUM, dout, da, db, 3);
    CHECK(isinf(dout[2]), "double overflow to inf");

    /* complex: (1+2i)(3+4i) = -5+10i; (0+1i)^2 = -1 */
    float ca[] = {1, 2, 0, 1};
    float cb[] = {3, 4, 0, 1};
    float co[4];
    pd_reduce3(PD_COMPLEX64, PD_PRODUCT, co, ca, cb, 2);
    CHECK(co[0] == -5 && co[1] == 10 && co[2] == -1 && co[3] == 0,
          "complex64 product %g %g %g %g", co[0], co[1], co[2], co[3]);
    pd_reduce(PD_COMPLEX64, PD_SUM, ca, cb, 2);
    CHECK(ca[0] == 4 && ca[1] == 6 && ca[2] == 0 && ca[3] == 2,
          "complex64 sum");
    double za[] = {1.5, -2, INFINITY, 0};
    double zb[] = {2, 0.5, 1, 1};
    double zo[4];
    pd_reduce3(PD_COMPLEX128, PD_PRODUCT, zo, za, zb, 2);
    /* naive formula like numpy: (inf+0i)(1+1i) = (inf - 0) + (inf + 0)i */
    CHECK(zo[0] == 4 && zo[1] == -3.25 && isinf(zo[2]) && isinf(zo[3]),
          "complex128 product %g %g %g %g", zo[0], zo[1], zo[2], zo[3]);
}

static void
test_avg_finish(void)
{
    int32_t i32[] = {7, -7, INT32_MIN, INT32_MAX, -1, 0};
    pd_reduce_avg_finish(PD_INT32, i32, 6, 2);
    CHECK(i32[0] == 3 && i32[1] == -3 && i32[2] == INT32_MIN / 2
              && i32[3] == INT32_MAX / 2 && i32[4] == 0 && i32[5] == 0,
          "int32 avg truncates toward zero: %d %d", i32[0], i32[1]);
    int8_t i8[] = {-128, 127, -5};
    pd_reduce_avg_finish(PD_INT8, i8, 3, 3);
    CHECK(i8[0] == -42 && i8[1] == 42 && i8[2] == -1, "int8 avg %d %d %d",
          i8[0], i8[1], i8[2]);
    int64_t i64[] = {INT64_MIN, -9};
    pd_reduce_avg_finish(PD_INT64, i64, 2, 4);
    CHECK(i64[0] == INT64_MIN / 4 && i64[1] == -2, "int64 avg");
    uint8_t u8[] = {255, 7};
    pd_reduce_avg_finish(PD_UINT8, u8, 2, 2);
    CHECK(u8[0] == 127 && u8[1] == 3, "uint8 avg");
    uint64_t u64[] = {UINT64_MAX, 5};
    pd_reduce_avg_finish(PD_UINT64, u64, 2, 3);
    CHECK(u64[0] == UINT64_MAX / 3 && u64[1] == 1,
          "uint64 avg divides unsigned");
    uint32_t u32[] = {0xffffffffu};
    pd_reduce_avg_finish(PD_UINT32, u32, 1, 2);
    CHECK(u32[0] == 0x7fffffffu, "uint32 avg");
    uint16_t u16[] = {65535};
    pd_reduce_avg_finish(PD_UINT16, u16, 1, 7);
    CHECK(u16[0] == 9362, "uint16 avg");
    int16_t i16[] = {-32768};
    pd_reduce_avg_finish(PD_INT16, i16, 1, 7);
    CHECK(i16[0] == -4681, "int16 avg");

    float f[] = {1.0f, 3.0f, -0.0f, INFINITY, NAN};
    pd_reduce_avg_finish(PD_FLOAT32, f, 5, 3);
    CHECK(f[0] == 1.0f / 3.0f && f[1] == 1.0f && f2u(f[2]) == f2u(-0.0f)
              && isinf(f[3]) && isnan(f[4]),
          "float32 avg divides");
    double d[] = {1.0, 10.0};
    pd_reduce_avg_finish(PD_FLOAT64, d, 2, 3);
    CHECK(d[0] == 1.0 / 3.0 && d[1] == 10.0 / 3.0, "float64 avg");
    float c[] = {3.0f, -6.0f};
    pd_reduce_avg_finish(PD_COMPLEX64, c, 1, 3);
    CHECK(c[0] == 1.0f && c[1] == -2.0f, "complex64 avg");
    double z[] = {1.0, -1.0};
    pd_reduce_avg_finish(PD_COMPLEX128, z, 1, 4);
    CHECK(z[0] == 0.25 && z[1] == -0.25, "complex128 avg");
    int32_t keep[] = {5};
    pd_reduce_avg_finish(PD_INT32, keep, 1, 1);
    CHECK(keep[0] == 5, "n == 1 leaves values alone");

    /* half types go through float32 and round once */
    uint16_t h[] = {0x4200 /* 3.0 */, 0x3c00 /* 1.0 */};
    pd_reduce_avg_finish(PD_FLOAT16, h, 2, 3);
    CHECK(h[0] == 0x3c00 && h[1] == ref_f32_to_f16(1.0f / 3.0f),
          "float16 avg: %04x %04x", h[0], h[1]);
    uint16_t bf[] = {0x4040 /* 3.0 */};
    pd_reduce_avg_finish(PD_BFLOAT16, bf, 1, 3);
    CHECK(bf[0] == 0x3f80, "bfloat16 avg: %04x", bf[0]);

    /* larger arrays against the reference division */
    size_t n = 1003;
    int64_t *big = malloc(n * sizeof(*big));
    int64_t *ref = malloc(n * sizeof(*ref));
    if (!big || !ref) {
        exit(2);
    }
    fill_random(PD_INT64, big, n);
    for (size_t i = 0; i < n; i++) {
        ref[i] = big[i] / 5;
    }
    pd_reduce_avg_finish(PD_INT64, big, n, 5);
    CHECK(memcmp(big, ref, n * sizeof(*big)) == 0, "int64 avg array");
    free(big);
    free(ref);
}

/* ---- half-precision casts ---- */

/* The portable conversions as the library's loops use them. */
static void
portable_from_f32(pd_dtype dt, uint16_t *restrict dst,
                  const float *restrict src, size_t n)
{
    if (dt == PD_FLOAT16) {
        for (size_t i = 0; i < n; i++) {
            dst[i] = pd_f32_to_f16(src[i]);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            dst[i] = pd_f32_to_bf16(src[i]);
        }
    }
}

static void
portable_to_f32(pd_dtype dt, float *restrict dst,
                const uint16_t *restrict src, size_t n)
{
    if (dt == PD_FLOAT16) {
        for (size_t i = 0; i < n; i++) {
            dst[i] = pd_f16_to_f32(src[i]);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            dst[i] = pd_bf16_to_f32(src[i]);
        }
    }
}

static int
f16_is_nan(uint16_t h)
{
    return (h & 0x7fffu) > 0x7c00u;
}

static void
test_f16_exhaustive_roundtrip(void)
{
    static uint16_t all[65536], back[65536];
    static float wide[65536];
    for (uint32_t i = 0; i < 65536; i++) {
        all[i] = (uint16_t)i;
    }
    static float pwide[65536];
    static uint16_t pback[65536];
    pd_cast_to_f32(PD_FLOAT16, wide, all, 65536);
    pd_cast_from_f32(PD_FLOAT16, back, wide, 65536);
    portable_to_f32(PD_FLOAT16, pwide, all, 65536);
    portable_from_f32(PD_FLOAT16, pback, pwide, 65536);
    CHECK(memcmp(wide, pwide, sizeof(wide)) == 0,
          "float16 -> float32: library and portable differ");
    CHECK(memcmp(back, pback, sizeof(back)) == 0,
          "float16 round trip: library and portable differ");
    size_t bad_wide = 0, bad_back = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        float want = ref_f16_to_f32((uint16_t)i);
        if (f2u(wide[i]) != f2u(want)) {
            if (bad_wide++ == 0) {
                fprintf(stderr, "  f16 %04x -> %08x, want %08x\n", i,
                        f2u(wide[i]), f2u(want));
            }
        }
        if (f16_is_nan((uint16_t)i)) {
            /* NaN comes back NaN, same sign, quiet, payload kept */
            if (back[i] != (i | 0x200u)) {
                if (bad_back++ == 0) {
                    fprintf(stderr, "  f16 NaN %04x came back %04x\n", i,
                            back[i]);
                }
            }
        } else if (back[i] != i) {
            if (bad_back++ == 0) {
                fprintf(stderr, "  f16 %04x came back %04x\n", i, back[i]);
            }
        }
    }
    CHECK(bad_wide == 0, "float16 -> float32 exact: %zu wrong", bad_wide);
    CHECK(bad_back == 0, "float16 round trip: %zu wrong", bad_back);
}

static void
test_bf16_exhaustive_roundtrip(void)
{
    static uint16_t all[65536], back[65536];
    static float wide[65536];
    for (uint32_t i = 0; i < 65536; i++) {
        all[i] = (uint16_t)i;
    }
    static float pwide[65536];
    static uint16_t pback[65536];
    pd_cast_to_f32(PD_BFLOAT16, wide, all, 65536);
    pd_cast_from_f32(PD_BFLOAT16, back, wide, 65536);
    portable_to_f32(PD_BFLOAT16, pwide, all, 65536);
    portable_from_f32(PD_BFLOAT16, pback, pwide, 65536);
    CHECK(memcmp(wide, pwide, sizeof(wide)) == 0
              && memcmp(back, pback, sizeof(back)) == 0,
          "bfloat16: library and portable differ");
    size_t bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        int nan = (i & 0x7fffu) > 0x7f80u;
        uint32_t want_back = nan ? (i | 0x40u) : i;
        if (f2u(wide[i]) != i << 16 || back[i] != want_back) {
            if (bad++ == 0) {
                fprintf(stderr, "  bf16 %04x -> %08x -> %04x\n", i,
                        f2u(wide[i]), back[i]);
            }
        }
    }
    CHECK(bad == 0, "bfloat16 round trip: %zu wrong", bad);
}

static void
test_cast_known_values(void)
{
    static const struct {
        uint32_t f;
        uint16_t h;
    } f16[] = {
        {0x3f800000u, 0x3c00}, /* 1.0 */
        {0xbf800000u, 0xbc00}, /* -1.0 */
        {0x00000000u, 0x0000}, {0x80000000u, 0x8000}, /* +-0 */
        {0x477fe000u, 0x7bff}, /* 65504, the largest half */
        {0x477fefffu, 0x7bff}, /* just below the tie */
        {0x477ff000u, 0x7c00}, /* 65520: tie rounds to even = inf */
        {0x7f7fffffu, 0x7c00}, /* FLT_MAX overflows */
        {0xff800000u, 0xfc00}, /* -inf */
        {0x38800000u, 0x0400}, /* 2^-14, smallest normal */
        {0x387fc000u, 0x03ff}, /* largest subnormal */
        {0x387fe000u, 0x0400}, /* tie between them rounds to even 0x400 */
        {0x33800000u, 0x0001}, /* 2^-24, smallest subnormal */
        {0x33000000u, 0x0000}, /* 2^-25: tie rounds to even 0 */
        {0x33000001u, 0x0001}, /* just above the tie */
        {0x33c00000u, 0x0002}, /* 1.5 * 2^-24: tie rounds to even 2 */
        {0x34200000u, 0x0002}, /* 2.5 * 2^-24: tie rounds to even 2 */
        {0xb3c00000u, 0x8002}, /* negative subnormal tie */
        {0x00000001u, 0x0000}, /* float32 subnormals vanish */
        {0x80000001u, 0x8000},
        {0x3f801000u, 0x3c00}, /* 1 + 2^-11: tie to even down */
        {0x3f803000u, 0x3c02}, /* 1 + 3*2^-11: tie to even up */
        {0x3f801001u, 0x3c01}, /* just above the tie */
        {0x7fc00000u, 0x7e00}, /* quiet NaN */
        {0xffc00000u, 0xfe00}, /* negative NaN keeps its sign */
        {0x7f800001u, 0x7e00}, /* signalling NaN with low payload: quiet */
        {0x7f802000u, 0x7e01}, /* payload's top bits kept */
    };
    for (size_t i = 0; i < sizeof(f16) / sizeof(f16[0]); i++) {
        float in = u2f(f16[i].f);
        uint16_t out;
        pd_cast_from_f32(PD_FLOAT16, &out, &in, 1);
        CHECK(out == f16[i].h, "f32 %08x -> f16 %04x, want %04x", f16[i].f,
              out, f16[i].h);
        CHECK(pd_f32_to_f16(in) == f16[i].h, "portable f16 of %08x",
              f16[i].f);
        CHECK(ref_f32_to_f16(in) == f16[i].h, "reference f16 of %08x",
              f16[i].f);
    }
    static const struct {
        uint32_t f;
        uint16_t h;
    } bf16[] = {
        {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80}, /* tie, even down */
        {0x3f818000u, 0x3f82}, /* tie, even up */
        {0x3f808001u, 0x3f81}, {0x7f7fffffu, 0x7f80}, /* overflow -> inf */
        {0x7f7f7fffu, 0x7f7f}, {0x00008000u, 0x0000}, /* subnormal tie */
        {0x00018000u, 0x0002}, {0x80000001u, 0x8000},
        {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},
        {0x7f800001u, 0x7fc0}, /* NaN with only low payload stays NaN */
        {0xffc00000u, 0xffc0}, {0x7fa00000u, 0x7fe0},
    };
    for (size_t i = 0; i < sizeof(bf16) / sizeof(bf16[0]); i++) {
        float in = u2f(bf16[i].f);
        uint16_t out;
        pd_cast_from_f32(PD_BFLOAT16, &out, &in, 1);
        CHECK(out == bf16[i].h, "f32 %08x -> bf16 %04x, want %04x",
              bf16[i].f, out, bf16[i].h);
        CHECK(pd_f32_to_bf16(in) == bf16[i].h, "portable bf16 of %08x",
              bf16[i].f);
    }
}

/* Every float32 bit pattern in a range through the kernel (in batches, as
 * the vectorised loop sees them) and through the reference. */
static size_t
sweep_f32(pd_dtype dt, uint64_t lo, uint64_t hi, uint64_t stride)
{
    enum { BATCH = 4096 };
    static float in[BATCH];
    static uint16_t out[BATCH], port[BATCH];
    size_t bad = 0;
    for (uint64_t base = lo; base < hi; base += (uint64_t)BATCH * stride) {
        size_t m = 0;
        for (uint64_t u = base; u < hi && m < BATCH; u += stride) {
            in[m++] = u2f((uint32_t)u);
        }
        pd_cast_from_f32(dt, out, in, m);
        portable_from_f32(dt, port, in, m);
        for (size_t i = 0; i < m; i++) {
            uint16_t want = ref_from_f32(dt, in[i]);
            if (out[i] != want || port[i] != want) {
                if (bad++ < 3) {
                    fprintf(stderr,
                            "  %s(%08x) = %04x (portable %04x), want %04x\n",
                            pd_dtype_name(dt), f2u(in[i]), out[i], port[i],
                            want);
                }
            }
        }
    }
    return bad;
}

static void
test_cast_sweeps(int quick)
{
    /* Every float32 whose float16 result is subnormal or at the
     * subnormal/normal boundary (2^-26 <= |x| < 2^-13), both signs: the
     * path with the hand-written rounding.  Below that everything rounds to
     * zero; sample it. */
    size_t bad = sweep_f32(PD_FLOAT16, 0x32800000u, 0x39000000u, 1);
    bad += sweep_f32(PD_FLOAT16, 0xb2800000u, 0xb9000000u, 1);
    bad += sweep_f32(PD_FLOAT16, 0, 0x32800000u, 101);
    CHECK(bad == 0, "float16 subnormal range sweep: %zu wrong", bad);
    /* Every float32 near the overflow threshold and the inf/NaN range. */
    bad = sweep_f32(PD_FLOAT16, 0x477f0000u, 0x47810000u, 1);
    bad += sweep_f32(PD_FLOAT16, 0x7f800000u, 0x80000000u, 1);
    CHECK(bad == 0, "float16 overflow/NaN sweep: %zu wrong", bad);
    /* The whole float32 range with an odd stride, so every low-bit pattern
     * is visited (the F16C oracle below covers every input). */
    uint64_t stride = quick ? 4099 : 257;
    bad = sweep_f32(PD_FLOAT16, 0, (uint64_t)1 << 32, stride);
    CHECK(bad == 0, "float16 full sweep (stride %" PRIu64 "): %zu wrong",
          stride, bad);
    stride = quick ? 4099 : 7;
    bad = sweep_f32(PD_BFLOAT16, 0, (uint64_t)1 << 32, stride);
    CHECK(bad == 0, "bfloat16 full sweep (stride %" PRIu64 "): %zu wrong",
          stride, bad);
    /* random inputs, mostly around rounding boundaries */
    enum { N = 1 << 16 };
    static float in[N];
    static uint16_t out[N];
    for (int rep = 0; rep < 16; rep++) {
        for (size_t i = 0; i < N; i++) {
            uint32_t u = (uint32_t)rnd();
            if (i % 2) {
                /* force low bits to a tie or next to one */
                static const uint32_t lows[] = {0x1000, 0xfff, 0x1001,
                                                0x0000, 0x1fff};
                u = (u & ~0x1fffu) | lows[rnd() % 5];
            }
            in[i] = u2f(u);
        }
        pd_cast_from_f32(PD_FLOAT16, out, in, N);
        size_t nbad = 0;
        for (size_t i = 0; i < N; i++) {
            nbad += out[i] != ref_f32_to_f16(in[i]);
        }
        CHECK(nbad == 0, "float16 random batch %d: %zu wrong", rep, nbad);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The F16C instruction is an independent oracle: it rounds to nearest even
 * (imm8 = 0, ignoring MXCSR) and quiets NaNs keeping the top payload, i.e.
 * the same convention as ours, so for every one of the 2^32 inputs the
 * instruction, the library and the portable code must agree. */
__attribute__((target("f16c"))) static size_t
f16c_sweep(void)
{
    enum { BATCH = 4096 };
    static float in[BATCH];
    static uint16_t out[BATCH], port[BATCH];
    size_t bad = 0;
    for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += BATCH) {
        for (size_t i = 0; i < BATCH; i++) {
            in[i] = u2f((uint32_t)(base + i));
        }
        pd_cast_from_f32(PD_FLOAT16, out, in, BATCH);
        portable_from_f32(PD_FLOAT16, port, in, BATCH);
        for (size_t i = 0; i < BATCH; i += 4) {
            __m128 v = _mm_loadu_ps(in + i);
            __m128i h = _mm_cvtps_ph(v, 0);
            uint16_t hw[8];
            _mm_storeu_si128((__m128i *)hw, h);
            for (size_t k = 0; k < 4; k++) {
                if ((hw[k] != out[i + k] || hw[k] != port[i + k])
                    && bad++ < 3) {
                    fprintf(stderr,
                            "  F16C(%08x) = %04x, library %04x, "
                            "portable %04x\n",
                            f2u(in[i + k]), hw[k], out[i + k], port[i + k]);
                }
            }
        }
    }
    return bad;
}

static void
test_f16c_oracle(int quick)
{
    __builtin_cpu_init();
    if (quick || !__builtin_cpu_supports("f16c")) {
        printf("  F16C oracle: skipped (%s)\n",
               quick ? "PD_TEST_QUICK" : "no F16C");
        return;
    }
    size_t bad = f16c_sweep();
    CHECK(bad == 0, "float16 vs F16C over all 2^32 inputs: %zu differ", bad);
    printf("  F16C oracle: all 2^32 float32 inputs agree\n");
}
/* Casts must not depend on MXCSR: a library built with -ffast-math that
 * sets flush-to-zero / denormals-are-zero for the whole process must not
 * change float16 subnormals (the portable code uses a few float operations,
 * F16C reads MXCSR for nothing but its exceptions). */
static void
test_casts_under_ftz_daz(int quick)
{
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u); /* FTZ | DAZ */
    test_f16_exhaustive_roundtrip();
    test_bf16_exhaustive_roundtrip();
    test_cast_known_values();
    size_t bad = sweep_f32(PD_FLOAT16, 0x32800000u, 0x39000000u,
                           quick ? 13 : 1);
    bad += sweep_f32(PD_FLOAT16, 0xb2800000u, 0xb9000000u, quick ? 13 : 1);
    _mm_setcsr(csr);
    CHECK(bad == 0, "float16 subnormal sweep under FTZ/DAZ: %zu wrong", bad);
}
#else
static void
test_casts_under_ftz_daz(int quick)
{
    (void)quick;
}

static void
test_f16c_oracle(int quick)
{
    (void)quick;
    printf("  F16C oracle: not an x86-64 GCC/Clang build\n");
}
#endif

/* pd_copy and pd_move give memcpy's and memmove's bytes at every gap
 * between destination and source modulo 4096 near the aliasing window
 * (where pd_copy takes its vector loop), at sizes around its threshold and
 * odd tails; pd_move also with overlap both ways. */
static void
test_copies(void)
{
    size_t sizes[] = {0, 1, 63, 64, 65, 2047, 2048, 2049, 4096, 5000, 70001};
    size_t cap = (70001 + 8192 + 256 + 4095) & ~(size_t)4095;
    unsigned char *src = aligned_alloc(4096, cap);
    unsigned char *dst = aligned_alloc(4096, cap);
    unsigned char *ref = malloc(cap);
    size_t bad = 0;
    for (size_t i = 0; i < cap; i++) {
        src[i] = (unsigned char)(i * 131u + 7u);
    }
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        for (size_t gap = 0; gap < 130; gap++) {
            for (size_t soff = 0; soff < 3; soff++) {
                size_t s0 = soff * 4096 / 2 + soff; /* 0, 2049, 4098 */
                size_t d0 = (s0 + gap) % 4096;
                memset(dst, 0xee, cap);
                memcpy(ref, dst, cap);
                memcpy(ref + d0, src + s0, n);
                pd_copy(dst + d0, src + s0, n);
                bad += memcmp(dst, ref, cap) != 0;
            }
        }
        /* overlapping moves, forward and backward */
        for (size_t shift = 1; shift < 80; shift += 13) {
            memcpy(dst, src, cap);
            memcpy(ref, src, cap);
            memmove(ref + shift, ref, n);
            pd_move(dst + shift, dst, n);
            bad += memcmp(dst, ref, cap) != 0;
            memcpy(dst, src, cap);
            memcpy(ref, src, cap);
            memmove(ref, ref + shift, n);
            pd_move(dst, dst + shift, n);
            bad += memcmp(dst, ref, cap) != 0;
        }
        memcpy(dst, src, cap);
        pd_move(dst + 16, dst + 16, n); /* onto itself: nothing moves */
        bad += memcmp(dst, src, cap) != 0;
    }
    CHECK(bad == 0, "pd_copy/pd_move: %zu copies differ from memcpy/memmove",
          bad);
    free(src);
    free(dst);
    free(ref);
}

int
main(void)
{
    const char *q = getenv("PD_TEST_QUICK");
    int quick = q != NULL && *q != '\0' && strcmp(q, "0") != 0;
    printf("test_kernels: seed %016" PRIx64 "%s\n", rng_state,
           quick ? " (quick)" : "");
    test_redop_check();
    test_int_edges();
    test_float_edges();
    test_avg_finish();
    test_all_reductions();
    test_cast_known_values();
    test_f16_exhaustive_roundtrip();
    test_bf16_exhaustive_roundtrip();
    test_cast_sweeps(quick);
    test_f16c_oracle(quick);
    test_casts_under_ftz_daz(quick);
    test_copies();
    if (failures) {
        printf("test_kernels: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("test_kernels: all %d checks passed\n", checks);
    return 0;
}
