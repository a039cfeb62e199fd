"""The gradient-scaling arguments every pyddp optimizer's ``step`` accepts.

``optimizer.step(closure=None, *, grad_scale=None, found_inf=None, inv_scale=None,
check_finite=False)``:

- ``grad_scale``: the loss scale the gradients carry (torch's fused optimizers' argument; also
  read from ``optimizer.grad_scale`` as torch's GradScaler sets it).  Gradients are multiplied by
  ``1 / grad_scale`` inside the update kernel, on the fly (they are not written back).
- ``inv_scale``: the same given as its inverse (float or 1-element float32 array).
- ``found_inf``: a 1-element float32 array/tensor (also read from ``optimizer.found_inf``); when
  non-zero the whole step is skipped and step counts stay unchanged.
- ``check_finite``: first check every gradient of every group for inf/NaN (one read-only C pass);
  if any, set ``found_inf`` (when given) and skip.  With ``inv_scale`` this makes unscale, check
  and update one call: ``opt.step(inv_scale=1/scale, found_inf=flag, check_finite=True)``.

``step`` returns the closure's loss (or None) as torch's does; ``optimizer.last_step_skipped``
tells whether found_inf skipped the last step.
"""
from __future__ import annotations

import numpy as np

from .. import _C
from ._functional import grad_array, scaling_args


def resolve(opt, grad_scale, found_inf, inv_scale, check_finite):
    """(inv_scale for the kernels, found_inf flag array or None, skip everything?)"""
    if grad_scale is None and inv_scale is None:
        grad_scale = getattr(opt, "grad_scale", None)
    if found_inf is None:
        found_inf = getattr(opt, "found_inf", None)
    inv, flag = scaling_args(grad_scale, found_inf, inv_scale, check_finite)
    if flag is not None and float(np.asarray(flag).reshape(-1)[0]) != 0.0:
        return inv, flag, True
    if check_finite:
        grads = [g if g.flags.c_contiguous else np.ascontiguousarray(g)
                 for group in opt.param_groups for g in map(grad_array, group["params"])
                 if g is not None]
        if _C.amp_unscale_(grads, flag, 1.0):
            return inv, flag, True
    return inv, flag, False
