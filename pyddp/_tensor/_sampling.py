"""Random sampling from a tensor's values: multinomial (rows of weights) and bernoulli (0/1
draws), from pyddp's one generator (pyddp/_random.py).

Each function follows torch 2.13 on the same inputs (shapes, dtypes, errors; the tests compare them
with torch); the Tensor methods of the same names are attached at the end.
"""
from __future__ import annotations

import numpy as np

from .._random import _np_gen
from ._args import _t
from ._core import Tensor, _new_on
from ._dtypes import _is_float_dtype, _pyint, int64

__all__ = ["multinomial", "bernoulli"]


def multinomial(input, num_samples, replacement=False, *, generator=None):
    """num_samples indices drawn from each row's (unnormalised) probabilities."""
    x = _t(input)
    p = np.asarray(x._data, dtype=np.float64)
    if p.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not _is_float_dtype(x._data.dtype):
        raise RuntimeError("multinomial only supports floating-point dtypes for input")
    n = _pyint(num_samples)
    if n <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    rows = p.reshape(-1, p.shape[-1])
    if not replacement and n > rows.shape[1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if (rows < 0).any() or not np.isfinite(rows).all():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    g = _np_gen(generator)
    out = np.empty((rows.shape[0], n), dtype=int64)
    for r, w in enumerate(rows):
        s = w.sum()
        if s <= 0:
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        if replacement:
            out[r] = g.choice(w.size, size=n, replace=True, p=w / s)
        else:   # torch's way: the n smallest exponential(1) / w (zero weights come last)
            with np.errstate(divide="ignore"):
                key = g.exponential(size=w.size) / w
            out[r] = np.argsort(key, kind="stable")[:n]
    return _new_on(out.reshape(p.shape[:-1] + (n,)), x)


def bernoulli(input, p=None, *, generator=None):
    """0/1 draws with probability input (or p)."""
    x = _t(input)
    prob = x._data if p is None else np.broadcast_to(np.asarray(p), x.shape)
    g = _np_gen(generator)
    return _new_on((g.random(x.shape) < prob).astype(x._data.dtype), x)


def _attach():
    for name in ("multinomial", "bernoulli"):
        setattr(Tensor, name, globals()[name])


_attach()
