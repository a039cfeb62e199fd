/* bfloat16 GEMM with float32 accumulation, for pyddp's autocast(bfloat16)
 * matmuls and linears on CPU (NumPy has no bfloat16 product: without this,
 * bfloat16 operands are widened to float32 and multiplied by float32 BLAS).
 *
 * Where the CPU has AVX512-BF16, vdpbf16ps multiplies 32 bfloat16 pairs
 * into 16 float32 sums per instruction, twice the multiply-adds of a float32
 * FMA, so the product runs at up to twice sgemm's rate.  The code is the
 * usual BLIS-style blocking:
 *   - B is packed, KC rows x NC columns at a time, into micro-panels of NR
 *     columns whose K runs in pairs: panel[p][j] = B[2p][j] | B[2p+1][j] << 16
 *     (one 32-bit lane holds the pair vdpbf16ps multiplies);
 *   - A is packed, MC rows x KC at a time, into micro-panels of MR rows,
 *     panel[p][i] = A[i][2p] | A[i][2p+1] << 16 (one 32-bit broadcast each);
 *   - the micro-kernel keeps an MR x NR tile of C in 2 * MR zmm registers
 *     and, per K pair, loads two B vectors and issues 2 * MR vdpbf16ps with
 *     A broadcast from memory.
 * Packing takes any strides, so transposed and broadcast operands (the
 * backward's g @ W and g^T @ x) need no copy first.  An odd K and ragged
 * M / N edges are zero-padded in the packs; the kernel stores only the
 * valid rows and (masked) columns.  The K blocks after the first add into
 * C, so sums are float32 throughout; the bias, when given, is added to the
 * finished sum in the last K block (as a product followed by a float32 add).
 * A bfloat16 output is rounded from those float32 values in the last block
 * (partial sums of earlier K blocks wait in a float32 scratch), so the
 * float32 result never makes a separate pass through memory.
 *
 * vdpbf16ps treats bfloat16 denormal inputs as zero and flushes denormal
 * results (as torch's oneDNN bfloat16 kernels on the same instruction do);
 * products of two bfloat16 values are exact in float32.
 *
 * The portable kernel (other CPUs; tests force it) packs the same way and
 * widens with shifts in plain C; it is correct but no faster than float32
 * BLAS, so pyddp only calls this module where pd_gemm_bf16_native() is 1.
 */
#include "gemm_bf16.h"

#include <stdlib.h>
#include <string.h>

#include "half.h"

#if defined(__x86_64__) && defined(__GNUC__) &&                              \
    !defined(PD_KERNELS_PORTABLE) &&                                         \
    ((defined(__clang__) && __clang_major__ >= 9) ||                         \
     (!defined(__clang__) && __GNUC__ >= 10))
#define HAVE_BF16_DISPATCH 1
#include <immintrin.h>
#endif

#define MR 14       /* rows of the register tile */
#define NR 32       /* columns of the register tile (two zmm) */
#define KC 384      /* K per packed block (even) */
#define MC (MR * 8) /* rows per packed A block */
#define NC 1536     /* columns per packed B block (multiple of NR) */

/* ------------------------------------------------------------------ packs */

static size_t
min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

static inline uint32_t
load_pair(const uint16_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v)); /* little endian: p[0] low, p[1] high */
    return v;
}

#ifdef HAVE_BF16_DISPATCH
static size_t pack_a_rows_avx512(uint32_t *dst, const uint16_t *a,
                                 ptrdiff_t rs, size_t rows, size_t kfull);
static size_t pack_b_cols_avx512(uint32_t *dst, const uint16_t *b,
                                 ptrdiff_t cs, size_t cols, size_t kfull);
static void pack_pairs_avx512(uint32_t *dst, const uint16_t *r0,
                              const uint16_t *r1, size_t n);
#endif

/* dst[p * MR + i] = A[i][2p] | A[i][2p+1] << 16 for i < rows (A[i][k] at
 * a[i * rs + k * cs]), zero for rows <= i < MR and for k >= kc.  simd: the
 * AVX-512 transposes may be used (row-major A). */
static void
pack_a(uint32_t *dst, const uint16_t *a, ptrdiff_t rs, ptrdiff_t cs,
       size_t rows, size_t kc, int simd)
{
    (void)simd; /* (a portable build has no AVX-512 packing) */
    size_t kp = (kc + 1) / 2, kfull = kc / 2;
    if (cs == 1) {
        size_t p0 = 0;
#ifdef HAVE_BF16_DISPATCH
        if (simd) {
            p0 = pack_a_rows_avx512(dst, a, rs, rows, kfull);
        }
#endif
        for (size_t i = 0; i < rows; i++) {
            const uint16_t *row = a + (ptrdiff_t)i * rs;
            for (size_t p = p0; p < kfull; p++) {
                dst[p * MR + i] = load_pair(row + 2 * p);
            }
            if (kc & 1) {
                dst[kfull * MR + i] = row[kc - 1];
            }
        }
    } else {
        for (size_t p = 0; p < kp; p++) {
            const uint16_t *r0 = a + (ptrdiff_t)(2 * p) * cs;
            const uint16_t *r1 = r0 + cs;
            uint32_t *d = dst + p * MR;
#ifdef HAVE_BF16_DISPATCH
            if (simd && rs == 1) {
                pack_pairs_avx512(d, r0, 2 * p + 1 < kc ? r1 : NULL, rows);
                continue;
            }
#endif
            if (2 * p + 1 < kc) {
                for (size_t i = 0; i < rows; i++) {
                    d[i] = (uint32_t)r0[(ptrdiff_t)i * rs] |
                           (uint32_t)r1[(ptrdiff_t)i * rs] << 16;
                }
            } else {
                for (size_t i = 0; i < rows; i++) {
                    d[i] = r0[(ptrdiff_t)i * rs];
                }
            }
        }
    }
    if (rows < MR) {
        for (size_t p = 0; p < kp; p++) {
            for (size_t i = rows; i < MR; i++) {
                dst[p * MR + i] = 0;
            }
        }
    }
}

/* dst[p * NR + j] = B[2p][j] | B[2p+1][j] << 16 for j < cols (B[k][j] at
 * b[k * rs + j * cs]), zero for cols <= j < NR and for k >= kc.  simd: the
 * AVX-512 transposes may be used (column-major B). */
static void
pack_b(uint32_t *dst, const uint16_t *b, ptrdiff_t rs, ptrdiff_t cs,
       size_t cols, size_t kc, int simd)
{
    (void)simd; /* (a portable build has no AVX-512 packing) */
    size_t kp = (kc + 1) / 2, kfull = kc / 2;
    if (rs == 1 && cs != 1) {
        size_t p0 = 0;
#ifdef HAVE_BF16_DISPATCH
        if (simd) {
            p0 = pack_b_cols_avx512(dst, b, cs, cols, kfull);
        }
#endif
        for (size_t j = 0; j < cols; j++) {
            const uint16_t *col = b + (ptrdiff_t)j * cs;
            for (size_t p = p0; p < kfull; p++) {
                dst[p * NR + j] = load_pair(col + 2 * p);
            }
            if (kc & 1) {
                dst[kfull * NR + j] = col[kc - 1];
            }
        }
    } else {
        for (size_t p = 0; p < kp; p++) {
            const uint16_t *r0 = b + (ptrdiff_t)(2 * p) * rs;
            const uint16_t *r1 = r0 + rs;
            uint32_t *d = dst + p * NR;
#ifdef HAVE_BF16_DISPATCH
            if (simd && cs == 1) {
                pack_pairs_avx512(d, r0, 2 * p + 1 < kc ? r1 : NULL, cols);
                continue;
            }
#endif
            if (2 * p + 1 < kc) {
                for (size_t j = 0; j < cols; j++) {
                    d[j] = (uint32_t)r0[(ptrdiff_t)j * cs] |
                           (uint32_t)r1[(ptrdiff_t)j * cs] << 16;
                }
            } else {
                for (size_t j = 0; j < cols; j++) {
                    d[j] = r0[(ptrdiff_t)j * cs];
                }
            }
        }
    }
    if (cols < NR) {
        for (size_t p = 0; p < kp; p++) {
            for (size_t j = cols; j < NR; j++) {
                dst[p * NR + j] = 0;
            }
        }
    }
}

/* ----------------------------------------------------------- micro-kernels */

/* One MR x NR tile: v[i][j] = sum_p A-panel x B-panel (+ cin[i][j] when cin
 * is not NULL) (+ bias[j] when bias is not NULL), for i < rows, j < cols,
 * stored as float32 to cout, or, when o16 is not NULL, rounded to bfloat16
 * (nearest even, NaN kept quiet: pd_f32_to_bf16) into o16.  The driver
 * passes cin after the first K block and bias and o16 with the last. */
typedef struct {
    const float *cin;
    ptrdiff_t ldcin;
    float *cout;
    ptrdiff_t ldcout;
    uint16_t *o16;
    ptrdiff_t ldo16;
    const float *bias;
    size_t rows, cols;
} tile_out;

typedef void (*ukernel_fn)(size_t kp, const uint32_t *ap, const uint32_t *bp,
                           const tile_out *t);

static inline float
bf16_lo(uint32_t pair)
{
    uint32_t u = pair << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline float
bf16_hi(uint32_t pair)
{
    uint32_t u = pair & 0xffff0000u;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void
ukernel_portable(size_t kp, const uint32_t *ap, const uint32_t *bp,
                 const tile_out *t)
{
    float acc[MR][NR];
    memset(acc, 0, sizeof(acc));
    for (size_t p = 0; p < kp; p++) {
        float b0[NR], b1[NR];
        for (size_t j = 0; j < NR; j++) {
            b0[j] = bf16_lo(bp[j]);
            b1[j] = bf16_hi(bp[j]);
        }
        for (size_t i = 0; i < MR; i++) {
            float a0 = bf16_lo(ap[i]), a1 = bf16_hi(ap[i]);
            for (size_t j = 0; j < NR; j++) {
                /* vdpbf16ps's order: the odd (high) product first */
                acc[i][j] = (acc[i][j] + a1 * b1[j]) + a0 * b0[j];
            }
        }
        ap += MR;
        bp += NR;
    }
    for (size_t i = 0; i < t->rows; i++) {
        for (size_t j = 0; j < t->cols; j++) {
            float v = acc[i][j];
            if (t->cin != NULL) {
                v = t->cin[(ptrdiff_t)i * t->ldcin + (ptrdiff_t)j] + v;
            }
            if (t->bias != NULL) {
                v = v + t->bias[j];
            }
            if (t->o16 != NULL) {
                t->o16[(ptrdiff_t)i * t->ldo16 + (ptrdiff_t)j] =
                    pd_f32_to_bf16(v);
            } else {
                t->cout[(ptrdiff_t)i * t->ldcout + (ptrdiff_t)j] = v;
            }
        }
    }
}

#ifdef HAVE_BF16_DISPATCH

/* 16 float32 -> bfloat16 as pd_f32_to_bf16 does (the bias trick, NaN
 * quieted); vcvtneps2bf16 would flush denormals. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m256i
round_bf16_avx512(__m512 v)
{
    __m512i x = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16),
                                   _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb),
        16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
        _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16),
                             _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void
store_row_avx512(const tile_out *t, size_t i, __m512 v0, __m512 v1,
                 __mmask16 m0, __mmask16 m1, __m512 bias0, __m512 bias1)
{
    if (t->cin != NULL) {
        const float *ci = t->cin + (ptrdiff_t)i * t->ldcin;
        v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, ci), v0);
        v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, ci + 16), v1);
    }
    if (t->bias != NULL) {
        v0 = _mm512_add_ps(v0, bias0);
        v1 = _mm512_add_ps(v1, bias1);
    }
    if (t->o16 != NULL) {
        uint16_t *oi = t->o16 + (ptrdiff_t)i * t->ldo16;
        _mm256_mask_storeu_epi16(oi, m0, round_bf16_avx512(v0));
        _mm256_mask_storeu_epi16(oi + 16, m1, round_bf16_avx512(v1));
    } else {
        float *ci = t->cout + (ptrdiff_t)i * t->ldcout;
        _mm512_mask_storeu_ps(ci, m0, v0);
        _mm512_mask_storeu_ps(ci + 16, m1, v1);
    }
}

#define ROW_STEP(i)                                                          \
    do {                                                                     \
        __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[i]);               \
        c0_##i = _mm512_dpbf16_ps(c0_##i, av, b0);                           \
        c1_##i = _mm512_dpbf16_ps(c1_##i, av, b1);                           \
    } while (0)
#define ROW_DECL(i)                                                          \
    __m512 c0_##i = _mm512_setzero_ps(), c1_##i = _mm512_setzero_ps()
#define ROW_STORE(i)                                                         \
    do {                                                                     \
        if (t->rows > (i)) {                                                 \
            store_row_avx512(t, (i), c0_##i, c1_##i, m0, m1, bias0, bias1);  \
        }                                                                    \
    } while (0)
#define ROWS_14(X)                                                           \
    X(0); X(1); X(2); X(3); X(4); X(5); X(6); X(7); X(8); X(9); X(10);       \
    X(11); X(12); X(13)

#if MR != 14
#error "ukernel_avx512bf16 is written out for MR == 14"
#endif

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
ukernel_avx512bf16(size_t kp, const uint32_t *ap, const uint32_t *bp,
                   const tile_out *t)
{
    ROWS_14(ROW_DECL);
    for (size_t p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)bp);
        __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(bp + 16));
        ROWS_14(ROW_STEP);
        ap += MR;
        bp += NR;
    }
    size_t cols = t->cols;
    __mmask16 m0 = cols >= 16 ? (__mmask16)0xffff
                              : (__mmask16)((1u << cols) - 1u);
    __mmask16 m1 = cols >= 32   ? (__mmask16)0xffff
                   : cols <= 16 ? (__mmask16)0
                                : (__mmask16)((1u << (cols - 16)) - 1u);
    __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
    if (t->bias != NULL) {
        bias0 = _mm512_maskz_loadu_ps(m0, t->bias);
        bias1 = _mm512_maskz_loadu_ps(m1, t->bias + 16);
    }
    ROWS_14(ROW_STORE);
}

/* r[i][j] -> r[j][i] for a 16 x 16 matrix of 32-bit lanes. */
__attribute__((target("avx512f"))) static inline void
transpose16_epi32(__m512i r[16])
{
    __m512i t[16];
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; k++) {
        r[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        r[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        r[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        r[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    /* r[4k + c], 128-bit lane l: column 4l + c of rows 4k .. 4k + 3 */
    for (int c = 0; c < 4; c++) {
        __m512i x = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
        __m512i y = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
        __m512i z = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
        __m512i w = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
        t[c] = _mm512_shuffle_i32x4(x, z, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(x, z, 0xdd);
        t[4 + c] = _mm512_shuffle_i32x4(y, w, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(y, w, 0xdd);
    }
    for (int k = 0; k < 16; k++) {
        r[k] = t[k];
    }
}

/* pack_a's row-major case, 16 pairs at a time through a transpose (rows
 * <= MR < 16, the missing rows zero); returns the pairs done. */
__attribute__((target("avx512f"))) static size_t
pack_a_rows_avx512(uint32_t *dst, const uint16_t *a, ptrdiff_t rs,
                   size_t rows, size_t kfull)
{
    size_t p = 0;
    for (; p + 16 <= kfull; p += 16) {
        __m512i r[16];
        for (size_t i = 0; i < 16; i++) {
            r[i] = i < rows ? _mm512_loadu_si512(
                                  (const void *)(a + (ptrdiff_t)i * rs + 2 * p))
                            : _mm512_setzero_si512();
        }
        transpose16_epi32(r);
        for (size_t q = 0; q < 16; q++) {
            _mm512_mask_storeu_epi32(dst + (p + q) * MR,
                                     (__mmask16)((1u << MR) - 1u), r[q]);
        }
    }
    return p;
}

/* pack_b's column-major case (pairs contiguous in each column), 16 pairs of
 * 16 columns per transpose (cols <= NR, the missing columns zero); returns
 * the pairs done. */
__attribute__((target("avx512f"))) static size_t
pack_b_cols_avx512(uint32_t *dst, const uint16_t *b, ptrdiff_t cs,
                   size_t cols, size_t kfull)
{
    size_t p = 0;
    for (; p + 16 <= kfull; p += 16) {
        for (size_t j0 = 0; j0 < NR; j0 += 16) {
            __m512i r[16];
            for (size_t jj = 0; jj < 16; jj++) {
                r[jj] = j0 + jj < cols
                            ? _mm512_loadu_si512((const void *)(
                                  b + (ptrdiff_t)(j0 + jj) * cs + 2 * p))
                            : _mm512_setzero_si512();
            }
            transpose16_epi32(r);
            for (size_t q = 0; q < 16; q++) {
                _mm512_storeu_si512((void *)(dst + (p + q) * NR + j0), r[q]);
            }
        }
    }
    return p;
}

/* d[j] = r0[j] | r1[j] << 16 for j < n (r1 NULL: zero), n <= 32. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
pack_pairs_avx512(uint32_t *d, const uint16_t *r0, const uint16_t *r1,
                  size_t n)
{
    for (size_t j = 0; j < n; j += 16) {
        size_t m = min_sz(16, n - j);
        __mmask16 k = (__mmask16)(m == 16 ? 0xffffu : (1u << m) - 1u);
        __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, r0 + j));
        if (r1 != NULL) {
            __m512i hi =
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, r1 + j));
            lo = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
        }
        _mm512_mask_storeu_epi32(d + j, k, lo);
    }
}

static int
have_avx512bf16(void)
{
    return __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bf16");
}

#endif

int
pd_gemm_bf16_native(void)
{
#ifdef HAVE_BF16_DISPATCH
    if (have_avx512bf16()) {
        return PD_GEMM_BF16_NATIVE;
    }
#endif
    return PD_GEMM_BF16_PORTABLE;
}

/* ------------------------------------------------------------------ driver */

/* The K block: K split into equal even parts of at most KC (a short last
 * block would pay the C tile's load and store for little work). */
static size_t
k_block(size_t K)
{
    size_t nblocks = (K + KC - 1) / KC;
    size_t kc = nblocks ? (K + nblocks - 1) / nblocks : 0;
    return (kc + 1) / 2 * 2;
}

/* One product.  Output: c (float32, row stride c_rs) or, when o16 is not
 * NULL, o16 (bfloat16, row stride c_rs) with float32 partial sums over K
 * blocks kept in scratch (M x min(N, NC), needed only when K > KC). */
static void
gemm_one(size_t M, size_t N, size_t K, const uint16_t *a, ptrdiff_t a_rs,
         ptrdiff_t a_cs, const uint16_t *b, ptrdiff_t b_rs, ptrdiff_t b_cs,
         float *c, uint16_t *o16, ptrdiff_t c_rs, const float *bias,
         uint32_t *apack, uint32_t *bpack, float *scratch, ukernel_fn ukr,
         int simd)
{
    if (K == 0) {
        for (size_t i = 0; i < M; i++) {
            for (size_t j = 0; j < N; j++) {
                float v = bias != NULL ? bias[j] : 0.0f;
                if (o16 != NULL) {
                    o16[(ptrdiff_t)i * c_rs + (ptrdiff_t)j] = pd_f32_to_bf16(v);
                } else {
                    c[(ptrdiff_t)i * c_rs + (ptrdiff_t)j] = v;
                }
            }
        }
        return;
    }
    size_t kcb = k_block(K);
    for (size_t jc = 0; jc < N; jc += NC) {
        size_t nc = min_sz(NC, N - jc);
        for (size_t pc = 0; pc < K; pc += kcb) {
            size_t kc = min_sz(kcb, K - pc);
            size_t kp = (kc + 1) / 2;
            int first = pc == 0, last = pc + kc == K;
            const uint16_t *bblk =
                b + (ptrdiff_t)pc * b_rs + (ptrdiff_t)jc * b_cs;
            for (size_t jr = 0; jr < nc; jr += NR) {
                pack_b(bpack + (jr / NR) * kp * NR,
                       bblk + (ptrdiff_t)jr * b_cs, b_rs, b_cs,
                       min_sz(NR, nc - jr), kc, simd);
            }
            for (size_t ic = 0; ic < M; ic += MC) {
                size_t mc = min_sz(MC, M - ic);
                const uint16_t *ablk =
                    a + (ptrdiff_t)ic * a_rs + (ptrdiff_t)pc * a_cs;
                for (size_t ir = 0; ir < mc; ir += MR) {
                    pack_a(apack + (ir / MR) * kp * MR,
                           ablk + (ptrdiff_t)ir * a_rs, a_rs, a_cs,
                           min_sz(MR, mc - ir), kc, simd);
                }
                for (size_t jr = 0; jr < nc; jr += NR) {
                    const uint32_t *bp = bpack + (jr / NR) * kp * NR;
                    for (size_t ir = 0; ir < mc; ir += MR) {
                        size_t i0 = ic + ir, j0 = jc + jr;
                        tile_out t;
                        /* float32 sums: in c, or for bfloat16 output in
                         * scratch (row stride nc, columns from jc) */
                        float *acc32;
                        ptrdiff_t ld32;
                        if (o16 != NULL) {
                            acc32 = scratch != NULL
                                        ? scratch + (ptrdiff_t)i0 * (ptrdiff_t)nc +
                                              (ptrdiff_t)jr
                                        : NULL;
                            ld32 = (ptrdiff_t)nc;
                        } else {
                            acc32 = c + (ptrdiff_t)i0 * c_rs + (ptrdiff_t)j0;
                            ld32 = c_rs;
                        }
                        t.cin = first ? NULL : acc32;
                        t.ldcin = ld32;
                        t.cout = acc32;
                        t.ldcout = ld32;
                        t.o16 = (last && o16 != NULL)
                                    ? o16 + (ptrdiff_t)i0 * c_rs + (ptrdiff_t)j0
                                    : NULL;
                        t.ldo16 = c_rs;
                        t.bias = (last && bias != NULL) ? bias + j0 : NULL;
                        t.rows = min_sz(MR, mc - ir);
                        t.cols = min_sz(NR, nc - jr);
                        ukr(kp, apack + (ir / MR) * kp * MR, bp, &t);
                    }
                }
            }
        }
    }
}

int
pd_gemm_bf16(size_t batch, size_t M, size_t N, size_t K, const uint16_t *a,
             ptrdiff_t a_bs, ptrdiff_t a_rs, ptrdiff_t a_cs,
             const uint16_t *b, ptrdiff_t b_bs, ptrdiff_t b_rs,
             ptrdiff_t b_cs, void *c, int c_bf16, ptrdiff_t c_bs,
             ptrdiff_t c_rs, const float *bias, int force_portable)
{
    (void)force_portable; /* (a portable build has only the portable kernel) */
    if (batch == 0 || M == 0 || N == 0) {
        return 0;
    }
    ukernel_fn ukr = ukernel_portable;
#ifdef HAVE_BF16_DISPATCH
    if (!force_portable && have_avx512bf16()) {
        ukr = ukernel_avx512bf16;
    }
#endif
    /* packs sized for the blocks this product uses, 64-byte aligned */
    size_t kp = (min_sz(k_block(K), K) + 1) / 2;
    size_t mrows = (min_sz(MC, M) + MR - 1) / MR * MR;
    size_t ncols = (min_sz(NC, N) + NR - 1) / NR * NR;
    size_t abytes = (kp * mrows * sizeof(uint32_t) + 63) / 64 * 64;
    size_t bbytes = (kp * ncols * sizeof(uint32_t) + 63) / 64 * 64;
    size_t sbytes = (c_bf16 && K > k_block(K))
                        ? (M * min_sz(NC, N) * sizeof(float) + 63) / 64 * 64
                        : 0;
    uint32_t *apack = NULL, *bpack = NULL;
    float *scratch = NULL;
    if (K > 0) {
        apack = aligned_alloc(64, abytes);
        bpack = aligned_alloc(64, bbytes);
        scratch = sbytes ? aligned_alloc(64, sbytes) : NULL;
        if (apack == NULL || bpack == NULL || (sbytes && scratch == NULL)) {
            free(apack);
            free(bpack);
            free(scratch);
            return -1;
        }
    }
    for (size_t t = 0; t < batch; t++) {
        float *c32 = c_bf16 ? NULL : (float *)c + (ptrdiff_t)t * c_bs;
        uint16_t *c16 = c_bf16 ? (uint16_t *)c + (ptrdiff_t)t * c_bs : NULL;
        gemm_one(M, N, K, a + (ptrdiff_t)t * a_bs, a_rs, a_cs,
                 b + (ptrdiff_t)t * b_bs, b_rs, b_cs, c32, c16, c_rs, bias,
                 apack, bpack, scratch, ukr, ukr != ukernel_portable);
    }
    free(apack);
    free(bpack);
    free(scratch);
    return 0;
}
