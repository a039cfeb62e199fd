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

static inline uint32_t
load_pair(const uint16_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v)); /* little endian: p[0] low, p[1] high */
    return v;
}

/* dst[p * MR + i] = A[i][2p] | A[i][2p+1] << 16 for i < rows (A[i][k] at
 * a[i * rs + k * cs]), zero for rows <= i < MR and for k >= kc. */
static void
pack_a(uint32_t *dst, const uint16_t *a, ptrdiff_t rs, ptrdiff_t cs,
       size_t rows, size_t kc)
{
    size_t kp = (kc + 1) / 2, kfull = kc / 2;
    if (cs == 1) {
        for (size_t i = 0; i < rows; i++) {
            const uint16_t *row = a + (ptrdiff_t)i * rs;
            for (size_t p = 0; p < kfull; p++) {
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
 * b[k * rs + j * cs]), zero for cols <= j < NR and for k >= kc. */
static void
pack_b(uint32_t *dst, const uint16_t *b, ptrdiff_t rs, ptrdiff_t cs,
       size_t cols, size_t kc)
{
    size_t kp = (kc + 1) / 2, kfull = kc / 2;
    if (rs == 1 && cs != 1) {
        for (size_t j = 0; j < cols; j++) {
            const uint16_t *col = b + (ptrdiff_t)j * cs;
            for (size_t p = 0; p < kfull; p++) {
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

/* C[i][j] (+)= sum_p A-panel x B-panel for i < rows, j < cols; first: C is
 * overwritten, else added to; then bias[j] is added when bias is not NULL
 * (the driver passes it with the last K block only). */
typedef void (*ukernel_fn)(size_t kp, const uint32_t *ap, const uint32_t *bp,
                           float *c, ptrdiff_t ldc, size_t rows, size_t cols,
                           int first, const float *bias);

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
ukernel_portable(size_t kp, const uint32_t *ap, const uint32_t *bp, float *c,
                 ptrdiff_t ldc, size_t rows, size_t cols, int first,
                 const float *bias)
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
    for (size_t i = 0; i < rows; i++) {
        float *ci = c + (ptrdiff_t)i * ldc;
        for (size_t j = 0; j < cols; j++) {
            float v = first ? acc[i][j] : ci[j] + acc[i][j];
            ci[j] = bias != NULL ? v + bias[j] : v;
        }
    }
}

#ifdef HAVE_BF16_DISPATCH

__attribute__((target("avx512f,avx512bf16"))) static void
ukernel_avx512bf16(size_t kp, const uint32_t *ap, const uint32_t *bp,
                   float *c, ptrdiff_t ldc, size_t rows, size_t cols,
                   int first, const float *bias)
{
    __m512 c0[MR], c1[MR];
    for (int i = 0; i < MR; i++) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    for (size_t p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)bp);
        __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(bp + 16));
        for (int i = 0; i < MR; i++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[i]);
            c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
            c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
        }
        ap += MR;
        bp += NR;
    }
    __mmask16 m0 = cols >= 16 ? (__mmask16)0xffff
                              : (__mmask16)((1u << cols) - 1u);
    __mmask16 m1 = cols >= 32   ? (__mmask16)0xffff
                   : cols <= 16 ? (__mmask16)0
                                : (__mmask16)((1u << (cols - 16)) - 1u);
    __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
    if (bias != NULL) {
        bias0 = _mm512_maskz_loadu_ps(m0, bias);
        bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
    }
    for (int i = 0; i < MR; i++) {
        if ((size_t)i >= rows) {
            break;
        }
        float *ci = c + (ptrdiff_t)i * ldc;
        __m512 v0, v1;
        if (first) {
            v0 = c0[i];
            v1 = c1[i];
        } else {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, ci), c0[i]);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, ci + 16), c1[i]);
        }
        if (bias != NULL) {
            v0 = _mm512_add_ps(v0, bias0);
            v1 = _mm512_add_ps(v1, bias1);
        }
        _mm512_mask_storeu_ps(ci, m0, v0);
        _mm512_mask_storeu_ps(ci + 16, m1, v1);
    }
}

static int
have_avx512bf16(void)
{
    return __builtin_cpu_supports("avx512f") &&
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

static size_t
min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

static void
gemm_one(size_t M, size_t N, size_t K, const uint16_t *a, ptrdiff_t a_rs,
         ptrdiff_t a_cs, const uint16_t *b, ptrdiff_t b_rs, ptrdiff_t b_cs,
         float *c, ptrdiff_t c_rs, const float *bias, uint32_t *apack,
         uint32_t *bpack, ukernel_fn ukr)
{
    if (K == 0) {
        for (size_t i = 0; i < M; i++) {
            float *ci = c + (ptrdiff_t)i * c_rs;
            for (size_t j = 0; j < N; j++) {
                ci[j] = bias != NULL ? bias[j] : 0.0f;
            }
        }
        return;
    }
    for (size_t jc = 0; jc < N; jc += NC) {
        size_t nc = min_sz(NC, N - jc);
        for (size_t pc = 0; pc < K; pc += KC) {
            size_t kc = min_sz(KC, K - pc);
            size_t kp = (kc + 1) / 2;
            int first = pc == 0, last = pc + kc == K;
            const uint16_t *bblk =
                b + (ptrdiff_t)pc * b_rs + (ptrdiff_t)jc * b_cs;
            for (size_t jr = 0; jr < nc; jr += NR) {
                pack_b(bpack + (jr / NR) * kp * NR,
                       bblk + (ptrdiff_t)jr * b_cs, b_rs, b_cs,
                       min_sz(NR, nc - jr), kc);
            }
            for (size_t ic = 0; ic < M; ic += MC) {
                size_t mc = min_sz(MC, M - ic);
                const uint16_t *ablk =
                    a + (ptrdiff_t)ic * a_rs + (ptrdiff_t)pc * a_cs;
                for (size_t ir = 0; ir < mc; ir += MR) {
                    pack_a(apack + (ir / MR) * kp * MR,
                           ablk + (ptrdiff_t)ir * a_rs, a_rs, a_cs,
                           min_sz(MR, mc - ir), kc);
                }
                for (size_t jr = 0; jr < nc; jr += NR) {
                    const uint32_t *bp = bpack + (jr / NR) * kp * NR;
                    const float *bj =
                        (last && bias != NULL) ? bias + jc + jr : NULL;
                    for (size_t ir = 0; ir < mc; ir += MR) {
                        ukr(kp, apack + (ir / MR) * kp * MR, bp,
                            c + (ptrdiff_t)(ic + ir) * c_rs +
                                (ptrdiff_t)(jc + jr),
                            c_rs, min_sz(MR, mc - ir), min_sz(NR, nc - jr),
                            first, bj);
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
             ptrdiff_t b_cs, float *c, ptrdiff_t c_bs, ptrdiff_t c_rs,
             const float *bias, int force_portable)
{
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
    size_t kp = (min_sz(KC, K) + 1) / 2;
    size_t mrows = (min_sz(MC, M) + MR - 1) / MR * MR;
    size_t ncols = (min_sz(NC, N) + NR - 1) / NR * NR;
    size_t abytes = (kp * mrows * sizeof(uint32_t) + 63) / 64 * 64;
    size_t bbytes = (kp * ncols * sizeof(uint32_t) + 63) / 64 * 64;
    uint32_t *apack = NULL, *bpack = NULL;
    if (K > 0) {
        apack = aligned_alloc(64, abytes);
        bpack = aligned_alloc(64, bbytes);
        if (apack == NULL || bpack == NULL) {
            free(apack);
            free(bpack);
            return -1;
        }
    }
    for (size_t t = 0; t < batch; t++) {
        gemm_one(M, N, K, a + (ptrdiff_t)t * a_bs, a_rs, a_cs,
                 b + (ptrdiff_t)t * b_bs, b_rs, b_cs,
                 c + (ptrdiff_t)t * c_bs, c_rs, bias, apack, bpack, ukr);
    }
    free(apack);
    free(bpack);
    return 0;
}
