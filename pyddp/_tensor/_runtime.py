"""Process-wide switches training scripts set up front, and a few random / window factories:
set/get_num_threads and set/get_num_interop_threads, get/set_rng_state,
use_deterministic_algorithms and its queries, normal, randint_like, hann_window, hamming_window.

Threads: pyddp's compute threads are NumPy's BLAS/OpenMP pools.  ``set_num_threads(n)`` limits
them to n (through threadpoolctl, which pyddp already uses to give each rank its share of the
cores; without it the count is recorded and a RuntimeWarning says the pools were left as they
are), and ``get_num_threads()`` returns the count last set, else torch's default:
``OMP_NUM_THREADS`` when set, else the cores this process may use.  pyddp runs no inter-op pool;
``set_num_interop_threads`` records the count with torch's rules (positive, settable once) and
``get_num_interop_threads`` returns it (default: the cores).

Determinism: pyddp's ops are NumPy's on the CPU, which give the same result on every run
(the same as torch's CPU kernels), so ``use_deterministic_algorithms`` records the mode and
the queries return it; no op raises for lack of a deterministic implementation.
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from .._random import _np_gen
from .._random import get_rng_state as _get_state
from .._random import set_rng_state as _set_state
from ._args import _t
from ._core import Tensor, _new, _new_on
from ._dtypes import _dtype, _is_float_dtype, _pybool, _pyfloat, _pyint
from ._grad_mode import _st

__all__ = ["set_num_threads", "get_num_threads", "set_num_interop_threads",
           "get_num_interop_threads", "get_rng_state", "set_rng_state",
           "use_deterministic_algorithms", "are_deterministic_algorithms_enabled",
           "is_deterministic_algorithms_warn_only_enabled", "set_deterministic_debug_mode",
           "get_deterministic_debug_mode", "normal", "randint_like", "hann_window",
           "hamming_window"]

_threads = {"intra": None, "interop": None}
_det = {"mode": False, "warn_only": False}


def _default_threads():
    v = os.environ.get("OMP_NUM_THREADS", "")
    if v.isdigit() and int(v) > 0:
        return int(v)
    from .. import _threads as th
    return th.cores()


def _check_count(n, name):
    if isinstance(n, _pybool) or not isinstance(n, (_pyint, np.integer)):
        raise RuntimeError(f"{name} expects an int, but got {type(n).__name__}")
    if n <= 0:
        raise RuntimeError(f"{name} expects a positive integer")
    return _pyint(n)


def set_num_threads(int):  # noqa: A002  (torch's parameter name)
    """Limit the threads NumPy's BLAS/OpenMP pools use to ``int`` (torch.set_num_threads)."""
    n = _check_count(int, "set_num_threads")
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        warnings.warn("pyddp.set_num_threads: threadpoolctl is not installed, so NumPy's "
                      "BLAS/OpenMP thread pools were left as they are (install threadpoolctl, or "
                      "set OMP_NUM_THREADS before starting Python)", RuntimeWarning, stacklevel=2)
    else:
        threadpool_limits(n)
    _threads["intra"] = n


def get_num_threads():
    """The thread count last given to set_num_threads, else OMP_NUM_THREADS, else the cores this
    process may use (torch.get_num_threads)."""
    n = _threads["intra"]
    return n if n is not None else _default_threads()


def set_num_interop_threads(int):  # noqa: A002
    """Record the inter-op thread count (torch.set_num_interop_threads: positive, settable once;
    pyddp runs no inter-op pool)."""
    n = _check_count(int, "set_num_interop_threads")
    if _threads["interop"] is not None:
        raise RuntimeError("Error: cannot set number of interop threads after parallel work has "
                           "started or set_num_interop_threads called")
    _threads["interop"] = n


def get_num_interop_threads():
    """The count given to set_num_interop_threads, else the cores this process may use."""
    n = _threads["interop"]
    if n is not None:
        return n
    from .. import _threads as th
    return th.cores()


def get_rng_state():
    """The default generator's state as a uint8 Tensor of torch's layout (5056 bytes;
    torch.set_rng_state accepts it, and its state is accepted here)."""
    return _new(_get_state())


def set_rng_state(new_state):
    """Restore the default generator's state from get_rng_state() (pyddp's or torch's)."""
    if not isinstance(new_state, Tensor) and not (hasattr(new_state, "numpy")
                                                  and hasattr(new_state, "dtype")):
        raise TypeError(f"expected a torch.ByteTensor, but got {type(new_state).__name__}")
    a = new_state._data if isinstance(new_state, Tensor) else new_state.detach().cpu().numpy()
    if a.dtype != np.uint8:
        raise TypeError("RNG state must be a torch.ByteTensor")
    if a.size != 5056:
        raise RuntimeError(f"Expected a CPUGeneratorImplState of size 5056 but found the input "
                           f"RNG state size to be {a.size}")
    _set_state(np.ascontiguousarray(a).reshape(-1))


def use_deterministic_algorithms(mode, *, warn_only=False):
    """Record whether deterministic algorithms are required (torch's switch; pyddp's NumPy ops
    are deterministic, so none raises or warns)."""
    if not isinstance(mode, _pybool):
        raise TypeError(f"_set_deterministic_algorithms(): argument 'mode' (position 1) must be "
                        f"bool, not {type(mode).__name__}")
    if not isinstance(warn_only, _pybool):
        raise TypeError(f"_set_deterministic_algorithms(): argument 'warn_only' must be bool, "
                        f"not {type(warn_only).__name__}")
    _det["mode"], _det["warn_only"] = mode, warn_only


def are_deterministic_algorithms_enabled():
    """Whether use_deterministic_algorithms(True) is in effect."""
    return _det["mode"]


def is_deterministic_algorithms_warn_only_enabled():
    """Whether use_deterministic_algorithms(True, warn_only=True) is in effect."""
    return _det["warn_only"]


def set_deterministic_debug_mode(debug_mode):
    """torch's other spelling of the switch: 0/'default' off, 1/'warn' warn only,
    2/'error' on."""
    if isinstance(debug_mode, str):
        names = {"default": 0, "warn": 1, "error": 2}
        if debug_mode not in names:
            raise RuntimeError(f"invalid value of debug_mode, expected one of `default`, `warn`, "
                               f"`error`, but got {debug_mode}")
        debug_mode = names[debug_mode]
    if isinstance(debug_mode, _pybool) or not isinstance(debug_mode, _pyint):
        raise TypeError(f"debug_mode must be str or int, but got {type(debug_mode)}")
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode, expected 0, 1, or 2, but got "
                           f"{debug_mode}")
    use_deterministic_algorithms(debug_mode != 0, warn_only=debug_mode == 1)


def get_deterministic_debug_mode():
    """0 (off), 1 (warn only) or 2 (on)."""
    if not _det["mode"]:
        return 0
    return 1 if _det["warn_only"] else 2


# ----------------------------------------------------------------------------------------------
# random

def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, out=None,
           requires_grad=False):
    """Normal samples (torch.normal): mean and std each a Tensor or a number (broadcast
    together; with two numbers, ``size`` gives the shape).  pyddp's generator: the same
    distribution as torch's, not the same draws."""
    mt, st = isinstance(mean, Tensor), isinstance(std, Tensor)
    if not mt and not st:
        if size is None:
            raise TypeError("normal() received an invalid combination of arguments - got "
                            f"({type(mean).__name__}, {type(std).__name__}), but expected one "
                            "of: (Tensor mean, Tensor std), (Tensor mean, float std), "
                            "(float mean, Tensor std), (float mean, float std, tuple of ints "
                            "size)")
        if std < 0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")
        dt = _dtype(dtype) or _st.default
        shape = (size,) if isinstance(size, (_pyint, np.integer)) else tuple(size)
        a = _np_gen(generator).standard_normal(shape) * _pyfloat(std) + _pyfloat(mean)
        t = _new(a.astype(dt))
        if requires_grad:
            t.requires_grad = True
        return t
    ref = mean if mt else std
    for v in (mean, std):
        if isinstance(v, Tensor) and not _is_float_dtype(v._data.dtype):
            raise NotImplementedError(f"\"normal_kernel_cpu\" not implemented for "
                                      f"'{_long_name(v._data.dtype)}'")
    md = mean._data if mt else np.asarray(mean, dtype=ref._data.dtype)
    sd = std._data if st else np.asarray(std, dtype=ref._data.dtype)
    if st:
        if np.any(sd < 0):
            raise RuntimeError("normal expects all elements of std >= 0.0")
    elif std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")
    try:
        shape = np.broadcast_shapes(md.shape, sd.shape)
    except ValueError:
        from ._combine import _broadcast_error
        raise _broadcast_error(md.shape, sd.shape) from None
    dt = np.result_type(md.dtype, sd.dtype)
    z = _np_gen(generator).standard_normal(shape)
    return _new_on((z * sd + md).astype(dt), mean, std)


def _long_name(dt):
    return {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool"}.get(np.dtype(dt).name, np.dtype(dt).name)


def randint_like(input, low=0, high=None, *, dtype=None, requires_grad=False,
                 memory_format=None, generator=None):
    """Integers in [low, high) shaped like input, of input's dtype unless ``dtype`` says
    otherwise (``randint_like(input, high)`` draws from [0, high))."""
    from ._factories import randint
    x = _t(input)
    if high is None:
        low, high = 0, low
    dt = _dtype(dtype) or x._data.dtype
    t = randint(low, high, tuple(x.shape), dtype=dt, generator=generator)
    if x._dev.type != "cpu":
        t = _new_on(t._data, x)
    if requires_grad:
        t.requires_grad = True
    return t


# ----------------------------------------------------------------------------------------------
# windows

def _window(name, n, periodic, dtype, requires_grad, f):
    if isinstance(n, _pybool) or not isinstance(n, (_pyint, np.integer)):
        raise TypeError(f"{name}(): argument 'window_length' must be int, not "
                        f"{type(n).__name__}")
    if n < 0:
        raise RuntimeError(f"{name} requires non-negative window_length, got window_length={n}")
    dt = _dtype(dtype) or _st.default
    if not _is_float_dtype(dt):
        raise RuntimeError(f"{name} expects floating point dtypes, got: TensorOptions(dtype="
                           f"{_c_name(dt)}, device=cpu, layout=Strided (default), requires_grad="
                           "false (default), pinned_memory=false, memory_format=(nullopt))")
    if n <= 1:
        a = np.ones((n,), dtype=np.float64)
    else:
        m = n if periodic else n - 1
        a = f(2 * np.pi * np.arange(n, dtype=np.float64) / m)
    t = _new(a.astype(dt))
    if requires_grad:
        t.requires_grad = True
    return t


def _c_name(dt):
    return {"int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char",
            "uint8": "unsigned char", "bool": "bool"}.get(np.dtype(dt).name, np.dtype(dt).name)


def hann_window(window_length, periodic=True, *, dtype=None, layout=None, device=None,
                pin_memory=False, requires_grad=False):
    """0.5 - 0.5 cos(2 pi n / N): N = window_length when periodic, else window_length - 1."""
    return _window("hann_window", window_length, periodic, dtype, requires_grad,
                   lambda w: 0.5 - 0.5 * np.cos(w))


def hamming_window(window_length, periodic=True, alpha=0.54, beta=0.46, *, dtype=None,
                   layout=None, device=None, pin_memory=False, requires_grad=False):
    """alpha - beta cos(2 pi n / N) (N as hann_window's)."""
    return _window("hamming_window", window_length, periodic, dtype, requires_grad,
                   lambda w: alpha - beta * np.cos(w))
