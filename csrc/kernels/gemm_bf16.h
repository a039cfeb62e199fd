/* bfloat16 matrix product with float32 accumulation (gemm_bf16.c). */
#ifndef PD_KERNELS_GEMM_BF16_H
#define PD_KERNELS_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

/* Which code pd_gemm_bf16 runs: PD_GEMM_BF16_NATIVE is the AVX512-BF16
 * kernel (vdpbf16ps), chosen at run time where the CPU has it;
 * PD_GEMM_BF16_PORTABLE is plain C (bfloat16 widened by shifts, float32
 * multiply-adds), slower than a float32 BLAS and kept for correctness on
 * other CPUs. */
enum { PD_GEMM_BF16_PORTABLE = 0, PD_GEMM_BF16_NATIVE = 1 };

/* The implementation pd_gemm_bf16 picks on this CPU. */
int pd_gemm_bf16_native(void);

/* For b in [0, batch): C_b = A_b @ B_b (+ bias), where
 *   A_b[i, k] = a[b * a_bs + i * a_rs + k * a_cs]   (M x K, bfloat16 bits)
 *   B_b[k, j] = bb[b * b_bs + k * b_rs + j * b_cs]  (K x N, bfloat16 bits)
 *   C_b[i, j] = c[b * c_bs + i * c_rs + j]          (M x N, float32, or
 *                                                   bfloat16 bits when c_bf16,
 *                                                   rounded to nearest even
 *                                                   from the float32 result)
 * Strides are in elements and may be zero or negative (any transpose or
 * broadcast); C must not overlap A or B.  Products are exact in float32 and
 * summed in float32 (K-order blocked, not a correctly rounded dot product);
 * bias (N floats, or NULL) is then added to every row in float32.  K == 0 gives C = bias
 * (or zeros).  force_portable selects the plain-C code even where the
 * native kernel exists (tests).  Returns 0, or -1 when the packing buffers
 * or float32 scratch cannot be allocated (C then unspecified). */
int pd_gemm_bf16(size_t batch, size_t M, size_t N, size_t K,
                 const uint16_t *a, ptrdiff_t a_bs, ptrdiff_t a_rs,
                 ptrdiff_t a_cs, const uint16_t *bb, ptrdiff_t b_bs,
                 ptrdiff_t b_rs, ptrdiff_t b_cs, void *c, int c_bf16,
                 ptrdiff_t c_bs, ptrdiff_t c_rs, const float *bias,
                 int force_portable);

#endif
