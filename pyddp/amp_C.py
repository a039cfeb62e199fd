"""apex's ``amp_C`` fused multi-tensor kernels, for ``multi_tensor_applier`` (pyddp.multi_tensor_apply).

``import amp_C`` ports as ``from pyddp import amp_C``.  Each op takes apex's arguments:
``(chunk_size, noop_flag, tensor_lists, *args)``; the chunk size is accepted and not needed (pyddp
works on whole host arrays).  Tensors are pyddp Tensors, NumPy arrays or torch CPU tensors; the
noop flag is a one-element int tensor that an op sets to 1 when it meets an inf or NaN, as apex's:

* ``multi_tensor_scale(chunk, noop, [srcs, dsts], scale)``: ``dst = src * scale`` (cast to dst's
  dtype); a non-finite value in a source sets the flag.
* ``multi_tensor_axpby(chunk, noop, [xs, ys, outs], a, b, arg_to_check)``: ``out = a*x + b*y``;
  the flag checks x (0), y (1) or both (-1).
* ``multi_tensor_l2norm(chunk, noop, [tensors], per_tensor=False)``: ``(total_norm,
  per_tensor_norms)`` as float32 tensors (the second empty unless per_tensor), computed in float32
  as apex's; a non-finite norm sets the flag.

The apex kernels pyddp has no counterpart of (the fused optimizers' multi_tensor_adam/sgd/lamb:
use pyddp.optimizers.FusedAdam / FusedSGD / FusedLAMB instead) are not here.
"""
from __future__ import annotations

import numpy as np

__all__ = ["multi_tensor_scale", "multi_tensor_axpby", "multi_tensor_l2norm"]


def _np(t):
    """A NumPy view of a pyddp Tensor, a torch CPU tensor or an array (writes go through)."""
    if isinstance(t, np.ndarray):
        return t
    if hasattr(t, "detach"):
        t = t.detach()
    if hasattr(t, "numpy"):
        return t.numpy()
    return np.asarray(t)


def _set_flag(noop_flag):
    _np(noop_flag).reshape(-1)[0] = 1


def _check_lists(name, tensor_lists, depth):
    if len(tensor_lists) != depth:
        raise RuntimeError(f"amp_C.{name}: expected {depth} tensor lists, got {len(tensor_lists)}")
    n = len(tensor_lists[0])
    for lst in tensor_lists[1:]:
        if len(lst) != n:
            raise RuntimeError(f"amp_C.{name}: the tensor lists have different lengths "
                               f"({[len(x) for x in tensor_lists]})")


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    """dst = src * scale for each (src, dst) of ``tensor_lists = [srcs, dsts]``."""
    _check_lists("multi_tensor_scale", tensor_lists, 2)
    bad = False
    for src, dst in zip(*tensor_lists):
        s, d = _np(src), _np(dst)
        if s.shape != d.shape and s.size != d.size:
            raise RuntimeError(f"amp_C.multi_tensor_scale: a source of shape {s.shape} and a "
                               f"destination of shape {d.shape}")
        sf = s.astype(np.float32, copy=False) if s.dtype.itemsize < 4 else s
        if not bad and not np.isfinite(sf).all():
            bad = True
        d.reshape(-1)[...] = (sf.reshape(-1) * scale).astype(d.dtype, copy=False)
    if bad:
        _set_flag(noop_flag)


def multi_tensor_axpby(chunk_size, noop_flag, tensor_lists, a, b, arg_to_check):
    """out = a * x + b * y for each (x, y, out) of ``tensor_lists = [xs, ys, outs]``."""
    _check_lists("multi_tensor_axpby", tensor_lists, 3)
    if arg_to_check not in (-1, 0, 1):
        raise RuntimeError(f"amp_C.multi_tensor_axpby: arg_to_check must be -1, 0 or 1, got "
                           f"{arg_to_check}")
    bad = False
    for x, y, out in zip(*tensor_lists):
        xa = _np(x).astype(np.float32, copy=False) if _np(x).dtype.itemsize < 4 else _np(x)
        ya = _np(y).astype(np.float32, copy=False) if _np(y).dtype.itemsize < 4 else _np(y)
        o = _np(out)
        if arg_to_check in (-1, 0) and not np.isfinite(xa).all():
            bad = True
        if arg_to_check in (-1, 1) and not np.isfinite(ya).all():
            bad = True
        o.reshape(-1)[...] = (a * xa.reshape(-1) + b * ya.reshape(-1)).astype(o.dtype, copy=False)
    if bad:
        _set_flag(noop_flag)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    """(total L2 norm, per-tensor norms) of ``tensor_lists = [tensors]``, float32 tensors."""
    from . import _tensor as T
    _check_lists("multi_tensor_l2norm", tensor_lists, 1)
    norms = np.array([np.sqrt(np.sum(np.square(_np(t).astype(np.float32)), dtype=np.float32))
                      for t in tensor_lists[0]], dtype=np.float32)
    total = np.sqrt(np.sum(np.square(norms), dtype=np.float32), dtype=np.float32)
    if not np.isfinite(total):
        _set_flag(noop_flag)
    per = norms if per_tensor else np.zeros(0, dtype=np.float32)
    return T.tensor(np.array([total], dtype=np.float32)), T.tensor(per)
