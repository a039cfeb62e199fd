/* Exact GELU forward and backward on contiguous float32 arrays (gelu.c). */
#ifndef PD_KERNELS_GELU_H
#define PD_KERNELS_GELU_H

#include <stddef.h>

/* out[i] = x[i] / 2 * (1 + erf(x[i] / sqrt 2)); out may be x itself
 * (each element is read before it is written). */
void pd_gelu_f32(float *out, const float *x, size_t count);

/* gx[i] = g[i] * (Phi(x[i]) + x[i] * phi(x[i])); gx may be g or x
 * itself. */
void pd_gelu_backward_f32(float *gx, const float *g, const float *x,
                          size_t count);

#endif
