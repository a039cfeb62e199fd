"""Tensor factories: tensor, as_tensor, from_numpy, zeros/ones/empty/full(_like),
rand/randn/randint/randperm(_like) (drawing from pyddp's generator, pyddp/_random.py), arange,
linspace, eye."""
import builtins

import numpy as np

from .._random import _check_generator_device, _np_gen
from .. import _random
from .._device import _check_device
from ._core import Tensor, _new, _place, _to_array
from ._dtypes import _check_memory_format, _layout
from ._dtypes import _F32, _F64, _dtype, _is_float_dtype, _pybool, _pyint, bool, int64
from ._dtypes import preserve_format as _preserve
from ._grad_mode import _st


def _strided_like(a, like):
    """``a`` (C-contiguous, like's shape) re-laid out with the order of like's strides, as
    torch's *_like keep a dense input's strides (preserve_format)."""
    order = sorted(range(like.ndim), key=lambda i: -like.strides[i])
    if builtins.any(s <= 0 for s in like.strides) or not like.transpose(order).flags.c_contiguous:
        return a   # overlapping, reversed or gapped: torch gives a contiguous tensor too
    return np.ascontiguousarray(a.transpose(order)).transpose(np.argsort(order))


# ----------------------------------------------------------------------------------------------
# factories

def _size(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(size)


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of data (Python floats -> float32, ints -> int64)."""
    dev = _check_device(device) if device is not None else None
    dt = _dtype(dtype)
    a = _to_array(data, dt)
    if a is (data._data if isinstance(data, Tensor) else data):
        a = a.copy()
    elif isinstance(data, np.ndarray) and np.shares_memory(a, data):
        a = a.copy()
    t = _place(_new(a), dev) if dev is not None else _new(a)
    if requires_grad:
        t.requires_grad = True
    return t


def as_tensor(data, dtype=None, device=None):
    """A tensor sharing data's memory when possible."""
    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype)
    if isinstance(data, np.ndarray):
        t = _new(data if dtype is None else data.astype(_dtype(dtype), copy=False))
        return t.to(device) if device is not None else t
    return tensor(data, dtype, device)


def from_numpy(a):
    """A tensor sharing the ndarray a."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(a).__name__})")
    return _new(a)


def _factory(fn, size, dtype, requires_grad, device=None, memory_format=None):
    dev = _check_device(device) if device is not None else None
    _check_memory_format(memory_format, "empty")
    t = _new(_layout(fn(_size(size), _dtype(dtype) or _st.default), memory_format))
    if dev is not None:
        _place(t, dev)
    if requires_grad:
        t.requires_grad = True
    return t


def zeros(*size, dtype=None, device=None, requires_grad=False, out=None):
    """Tensor of zeros."""
    return _factory(np.zeros, size, dtype, requires_grad, device)


def ones(*size, dtype=None, device=None, requires_grad=False, out=None):
    """Tensor of ones."""
    return _factory(np.ones, size, dtype, requires_grad, device)


def empty(*size, dtype=None, device=None, requires_grad=False, out=None, memory_format=None):
    """Uninitialised tensor."""
    return _factory(np.empty, size, dtype, requires_grad, device, memory_format)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    """Tensor filled with fill_value (dtype inferred from it like torch)."""
    if dtype is None:
        dtype = bool if isinstance(fill_value, _pybool) else int64 if isinstance(
            fill_value, _pyint) else _st.default
    return _factory(lambda s, d: np.full(s, fill_value, d), (size,) if isinstance(size, _pyint)
                    else (tuple(size),), dtype, requires_grad, device)


def _like(fn, t, dtype, requires_grad, device=None, memory_format=None):
    dev = _check_device(device) if device is not None else t._dev
    _check_memory_format(memory_format, "empty_like")
    a = fn(t.shape, _dtype(dtype) or t.dtype)
    if memory_format is None or memory_format is _preserve:
        if not t._data.flags.c_contiguous and t._data.ndim > 1 and t._data.size:
            a = _strided_like(a, t._data)
    else:
        a = _layout(a, memory_format)
    r = _place(_new(a), dev)
    if requires_grad:
        r.requires_grad = True
    return r


def zeros_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    """zeros shaped like t."""
    return _like(np.zeros, t, dtype, requires_grad, device, memory_format)


def ones_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    """ones shaped like t."""
    return _like(np.ones, t, dtype, requires_grad, device, memory_format)


def empty_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    """uninitialised, shaped like t."""
    return _like(np.empty, t, dtype, requires_grad, device, memory_format)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    """filled with fill_value, shaped like t."""
    return _like(lambda s, d: np.full(s, fill_value, d), t, dtype, requires_grad, device)


def _rand_arr(kind, shape, dt, generator):
    g = _np_gen(generator)
    wdt = dt if dt in (_F32, _F64) else _F32
    a = g.standard_normal(shape, dtype=wdt) if kind == "n" else g.random(shape, dtype=wdt)
    return a if a.dtype == dt else a.astype(dt)


def randn(*size, dtype=None, device=None, requires_grad=False, generator=None):
    """Standard normal samples (pyddp's generator; not bit-identical to torch)."""
    _check_generator_device(generator, device)
    return _factory(lambda s, d: _rand_arr("n", s, d, generator), size, dtype, requires_grad,
                    device)


def rand(*size, dtype=None, device=None, requires_grad=False, generator=None):
    """Uniform [0, 1) samples."""
    _check_generator_device(generator, device)
    return _factory(lambda s, d: _rand_arr("u", s, d, generator), size, dtype, requires_grad,
                    device)


def randn_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    """randn shaped like t."""
    return _like(lambda s, d: _rand_arr("n", s, d, None), t, dtype, requires_grad, device,
                 memory_format)


def rand_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    """rand shaped like t."""
    return _like(lambda s, d: _rand_arr("u", s, d, None), t, dtype, requires_grad, device,
                 memory_format)


def randint(low, high=None, size=None, dtype=None, generator=None, device=None,
            requires_grad=False):
    """Integers in [low, high), int64 unless ``dtype`` says otherwise (a float dtype gives
    integer-valued floats, as in torch).  ``randint(high, size)`` draws from [0, high)."""
    dev = _check_device(device) if device is not None else None
    if size is None:
        if high is None or isinstance(high, (_pyint, np.integer)):
            raise TypeError("randint() missing required argument 'size' (a tuple of ints)")
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    if isinstance(size, (_pyint, np.integer)):
        raise TypeError(f"randint(): argument 'size' must be a tuple of ints, not "
                        f"{type(size).__name__}")
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} "
                           f">= to={high}")
    dt = _dtype(dtype) or int64
    if dt.kind == "c" or (dt.kind not in "biuf" and not _is_float_dtype(dt)):
        raise RuntimeError("check_random_bounds handles only integral, floating-point and "
                           "boolean types")
    if dt.kind in "iu" and (low < np.iinfo(dt).min or high - 1 > np.iinfo(dt).max):
        which = "from" if low < np.iinfo(dt).min else "to - 1"
        raise RuntimeError(f"{which} is out of bounds for {dt.name}")
    a = _np_gen(generator).integers(low, high, size=tuple(size), dtype=np.int64)
    t = _new(a.astype(dt, copy=False))
    if dev is not None:
        _place(t, dev)
    if requires_grad:
        t.requires_grad = True
    return t


def randperm(n, dtype=None, generator=None, device=None):
    """A random permutation of range(n) (int64): torch's values for the default generator or a
    pyddp.Generator (as ``pyddp.randperm``), NumPy's permutation for a numpy.random.Generator."""
    dev = _check_device(device) if device is not None else None
    dt = _dtype(dtype) or int64
    if isinstance(generator, np.random.Generator):
        t = _new(generator.permutation(n).astype(dt))
    else:
        t = _new(_random.randperm(n, generator=generator, dtype=dt))
    return _place(t, dev) if dev is not None else t


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    """Evenly spaced values in [start, end) (int64 for ints, float32 for floats)."""
    dev = _check_device(device) if device is not None else None
    if end is None:
        start, end = 0, start
    dt = _dtype(dtype)
    if dt is None:
        dt = int64 if builtins.all(isinstance(v, (_pyint, np.integer))
                                   for v in (start, end, step)) else _st.default
    t = _new(np.arange(start, end, step).astype(dt, copy=False))
    if dev is not None:
        _place(t, dev)
    if requires_grad:
        t.requires_grad = True
    return t


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    """steps values from start to end inclusive."""
    dev = _check_device(device) if device is not None else None
    t = _new(np.linspace(start, end, steps).astype(_dtype(dtype) or _st.default))
    if dev is not None:
        _place(t, dev)
    if requires_grad:
        t.requires_grad = True
    return t


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    """Identity matrix."""
    dev = _check_device(device) if device is not None else None
    t = _new(np.eye(n, m, dtype=_dtype(dtype) or _st.default))
    if dev is not None:
        _place(t, dev)
    if requires_grad:
        t.requires_grad = True
    return t
