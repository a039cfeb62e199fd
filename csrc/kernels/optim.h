/* Fused multi-tensor optimizer steps: Adam / AdamW and SGD.
 *
 * One call updates every tensor of a parameter group.  The arithmetic is
 * float32 and follows torch 2.13's single-tensor formulas (torch/optim/
 * adam.py, sgd.py) step by step, each scalar rounded to float32 where torch
 * would, so results match torch to a few float32 ulps.  Parameters may be
 * float32, or float16 / bfloat16 with or without a float32 master copy;
 * gradients float32, float16 or bfloat16; optimizer state is float32.
 *
 * Gradient scaling: grads are multiplied by inv_scale (1 = unscaled) on the
 * fly and never written back.  A found_inf flag that is already non-zero
 * skips the whole step; with check_finite the kernel first reads every
 * gradient and, on any inf/NaN, sets *found_inf = 1 and skips.
 */
#ifndef PD_KERNELS_OPTIM_H
#define PD_KERNELS_OPTIM_H

#include <stddef.h>

#include "kernels.h"

/* One parameter tensor and its state.  param: param_dtype (PD_FLOAT32,
 * PD_FLOAT16 or PD_BFLOAT16), count elements.  master: NULL, or a float32
 * master copy that the step updates and then rounds into param (to nearest
 * even); without one a half param is widened, updated in float32 and
 * rounded back.  grad: grad_dtype (PD_FLOAT32 / PD_FLOAT16 / PD_BFLOAT16),
 * read only. */
typedef struct pd_optim_tensor {
    void *param;
    pd_dtype param_dtype;
    float *master;
    const void *grad;
    pd_dtype grad_dtype;
    size_t count;
    /* Adam: exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad only; else NULL).
     * SGD: state0 = momentum buffer (NULL when momentum == 0). */
    float *state0;
    float *state1;
    float *state2;
    /* Adam: the step number after this update (torch's state['step'] + 1).
     * SGD: non-zero when the momentum buffer is new (it becomes the
     * gradient, as torch's first step clones it). */
    double step;
    int first;
} pd_optim_tensor;

typedef struct pd_adam_options {
    double lr;
    double beta1;
    double beta2;
    double eps;
    double weight_decay;
    int amsgrad;
    int maximize;
    int decoupled;        /* AdamW: param *= 1 - lr * weight_decay */
    int bias_correction;  /* apex's option; torch always corrects */
} pd_adam_options;

typedef struct pd_sgd_options {
    double lr;
    double momentum;
    double dampening;
    double weight_decay;
    int nesterov;
    int maximize;
} pd_sgd_options;

typedef struct pd_scaling {
    float inv_scale;   /* grads are multiplied by this; 1 = none */
    float *found_inf;  /* NULL, or a flag: non-zero on entry skips */
    int check_finite;  /* read every grad first; inf/NaN -> flag, skip */
} pd_scaling;

/* *stepped = 1 when the update ran, 0 when found_inf skipped it.
 * Arguments are assumed valid (the binding checks them). */
void pd_adam_step(const pd_adam_options *o, const pd_scaling *sc,
                  const pd_optim_tensor *t, size_t ntensors, int *stepped);
void pd_sgd_step(const pd_sgd_options *o, const pd_scaling *sc,
                 const pd_optim_tensor *t, size_t ntensors, int *stepped);

#endif
