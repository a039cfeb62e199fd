"""Python entry points of the amp and optimizer C kernels (pyddp._C).  ``as_array``
(pyddp._interop's ``host_array``) turns parameters, gradients and state into the NumPy arrays those
kernels take.

Arrays reach C through the buffer protocol: float16, float32 and float64 arrays as they are, and
bfloat16 (ml_dtypes.bfloat16 arrays, torch.bfloat16 tensors) as uint16 views of the same memory.
Every function accepts NumPy arrays, pyddp Tensors (their ``_data`` array) and torch CPU tensors
(``.detach().numpy()`` shares their memory), so the same calls update torch models in place.

Kernel API (for pyddp.amp and the optimizers):

- ``unscale_(arrays, found_inf, inv_scale) -> bool``: one pass over every array: multiply in place
  by ``inv_scale`` and record inf/NaN (torch's ``_amp_foreach_non_finite_check_and_unscale_``).
- ``nonfinite(arrays) -> bool``: the check alone (reads only).
- ``cast_(dsts, srcs)``: ``dsts[i][...] = srcs[i]`` converted (float16/bfloat16/float32/float64,
  round to nearest even, inf and NaN kept), all pairs in one C call; e.g. amp O2 copying float32
  masters back into float16 model parameters.
"""
from __future__ import annotations

import numpy as np

from . import _C
from ._interop import host_array as as_array, is_torch_tensor

__all__ = ["as_array", "unscale_", "nonfinite", "cast_"]


def _arrays(xs, name):
    if type(xs) is not list and type(xs) is not tuple:
        if isinstance(xs, np.ndarray) or is_torch_tensor(xs) or hasattr(xs, "_data"):
            raise TypeError(f"{name} must be a list of arrays, got a single {type(xs).__name__}")
        xs = list(xs)
    try:
        return [as_array(x, name) for x in xs]
    except (TypeError, ValueError):
        for i, x in enumerate(xs):  # again, to name the index
            as_array(x, f"{name}[{i}]")
        raise


def _flag(found_inf):
    if found_inf is None:
        return None
    return as_array(found_inf, "found_inf")


def _scalar(inv_scale):
    if isinstance(inv_scale, (int, float, np.floating, np.integer)):
        return float(inv_scale)
    return as_array(inv_scale, "inv_scale")


def unscale_(arrays, found_inf, inv_scale) -> bool:
    """Multiply every array by ``inv_scale`` in place and check for inf/NaN, in one pass.

    Args:
        arrays: list of float16 / bfloat16 / float32 / float64 arrays or tensors (C-contiguous,
            writable), dtypes may differ between arrays.
        found_inf: a 1-element float32 array/tensor set to 1.0 when any input element is inf or
            NaN (never reset to 0 here), or None.
        inv_scale: float or 1-element float32 array/tensor.  Exactly 1.0 checks without writing.

    Returns:
        True when an inf or NaN was seen in this call.
    """
    return _C.amp_unscale_(_arrays(arrays, "arrays"), _flag(found_inf), _scalar(inv_scale))


def nonfinite(arrays) -> bool:
    """True when any element of any array is inf or NaN (read only, one C call)."""
    return _C.amp_unscale_(_arrays(arrays, "arrays"), None, 1.0)


def cast_(dsts, srcs) -> None:
    """``dsts[i][...] = srcs[i]`` with dtype conversion for every pair, in one C call.

    float32 <-> float16 / bfloat16 (round to nearest even, overflow to inf, inf and NaN kept),
    float16 <-> bfloat16, float32 <-> float64, half -> float64, same-dtype copies.  float64 ->
    float16/bfloat16 raises TypeError (it would round twice).  Element counts must match (shapes
    may differ).
    """
    _C.cast_(_arrays(dsts, "dsts"), _arrays(srcs, "srcs"))
