/* Mixed-precision helpers: the fused unscale + non-finite check of gradient
 * scaling, and casts between the floating types amp moves values through.
 *
 * Both run one call over many arrays (multi-tensor), so the binding releases
 * the GIL once per call, not once per array.
 */
#ifndef PD_KERNELS_AMP_H
#define PD_KERNELS_AMP_H

#include <stddef.h>

#include "kernels.h"

/* data[i] *= inv_scale in place, in dt's arithmetic (float16 / bfloat16
 * widen to float32 and round once, to nearest even; float64 multiplies by
 * the float32 inv_scale widened to double), as torch's
 * _amp_foreach_non_finite_check_and_unscale_ does.  Returns 1 when any input
 * element was inf or NaN (checked before scaling), else 0.  When inv_scale
 * is exactly 1 the array is only read (check only).  dt is one of
 * PD_FLOAT16, PD_BFLOAT16, PD_FLOAT32, PD_FLOAT64. */
int pd_amp_unscale(pd_dtype dt, void *data, size_t count, float inv_scale);

/* 1 when any element of data is inf or NaN (read only). */
int pd_amp_nonfinite(pd_dtype dt, const void *data, size_t count);

/* dst = src converted; each of dst_dt and src_dt is PD_FLOAT16, PD_BFLOAT16,
 * PD_FLOAT32 or PD_FLOAT64.  Narrowing rounds to nearest even, overflow
 * gives inf, inf and NaN stay inf and NaN (NaN comes out quiet).  Same
 * dtypes copy.  float16 <-> bfloat16 and half -> float64 go through float32
 * (exact widening, then at most one rounding).  float64 -> float16/bfloat16
 * is refused (PD_ETYPE): through float32 it would round twice.  src and dst
 * must not overlap. */
pd_status pd_cast(pd_dtype dst_dt, void *dst, pd_dtype src_dt,
                  const void *src, size_t count);

#endif
