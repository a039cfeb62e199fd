"""Activation functions: relu, relu6, threshold, leaky_relu, hardtanh, elu, softplus, silu, gelu
(exact or tanh), and those composed from differentiable tensor ops (mish, selu, celu, hardsigmoid,
hardswish, logsigmoid, softsign, tanhshrink, softshrink, hardshrink, glu, softmin, prelu).
"""
from __future__ import annotations

import math

import numpy as np

from ... import _tensor as _t
from ..._tensor import Tensor, sigmoid, softmax, tanh
from ... import _C
from ..._tensor._core import _mk, _to
from ..._tensor._dtypes import _F32, _HALFS
from ..._tensor._grad_mode import _st
from ..._tensor._ops import _sigmoid_f
from .._argcheck import require_tensors as _require_tensors

__all__ = ["relu", "relu6", "threshold", "leaky_relu", "hardtanh", "elu", "softplus", "silu",
           "gelu", "mish", "selu", "celu", "hardsigmoid", "hardswish", "logsigmoid", "softsign",
           "tanhshrink", "softshrink", "hardshrink", "glu", "softmin", "prelu"]


def relu(input, inplace=False):
    """max(input, 0)."""
    if inplace and not (_st.grad and input._requires_grad):
        np.maximum(input._data, 0, out=input._data)
        return input
    return _t.relu(input)


def relu6(input, inplace=False):
    """min(max(input, 0), 6)."""
    return hardtanh(input, 0.0, 6.0)


def threshold(input, threshold, value, inplace=False):
    """input where input > threshold, else value."""
    xd = input._data
    m = xd > threshold
    out = np.where(m, xd, value).astype(xd.dtype, copy=False)
    return _mk(out, "ThresholdBackward0", lambda g: (g * m,),
               (input,))


def leaky_relu(input, negative_slope=0.01, inplace=False):
    """input where positive, else negative_slope * input."""
    xd = input._data
    m = xd > 0
    out = np.where(m, xd, xd * negative_slope)
    return _mk(out, "LeakyReluBackward0",
               lambda g: (np.where(m, g, g * negative_slope),), (input,))


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """Clamp into [min_val, max_val] (zero gradient at and outside the bounds... like torch)."""
    xd = input._data
    out = np.clip(xd, min_val, max_val)
    m = (xd > min_val) & (xd < max_val)
    return _mk(out, "HardtanhBackward0", lambda g: (g * m,), (input,))


def elu(input, alpha=1.0, inplace=False):
    """x if x > 0 else alpha * (exp(x) - 1)."""
    xd = input._data
    m = xd > 0
    e = np.expm1(np.minimum(xd, 0))
    out = np.where(m, xd, alpha * e)
    return _mk(out, "EluBackward0", lambda g: (np.where(m, g, g * (alpha * (e + 1))),), (input,))


def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta (linear above threshold)."""
    xd = input._data
    bx = xd * beta
    lin = bx > threshold
    out = np.where(lin, xd, np.log1p(np.exp(np.minimum(bx, threshold))) / beta)
    s = _sigmoid_f(bx)
    return _mk(out.astype(xd.dtype, copy=False), "SoftplusBackward0",
               lambda g: (np.where(lin, g, g * s),), (input,))


def silu(input, inplace=False):
    """x * sigmoid(x)."""
    xd = input._data
    s = _sigmoid_f(xd)
    out = xd * s
    return _mk(out, "SiluBackward0", lambda g: (g * (s * (1 + xd * (1 - s))),), (input,))


_erf_impl = []


def _erf(x):
    """erf elementwise: scipy's when installed (imported on first use), else math.erf."""
    if not _erf_impl:
        try:
            from scipy.special import erf
        except ImportError:  # scipy is optional
            v = np.vectorize(math.erf, otypes=[np.float64])

            def erf(a):
                return v(a).astype(a.dtype, copy=False)
        _erf_impl.append(erf)
    return _erf_impl[0](x)


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_K_TANH = math.sqrt(2.0 / math.pi)


def gelu(input, approximate="none"):
    """x * Phi(x) (approximate='tanh': the tanh formula)."""
    xd = input._data
    if approximate == "tanh":
        inner = _K_TANH * (xd + 0.044715 * xd * xd * xd)
        t = np.tanh(inner)
        out = 0.5 * xd * (1 + t)

        def bw(g):
            dinner = _K_TANH * (1 + 3 * 0.044715 * xd * xd)
            return (g * (0.5 * (1 + t) + 0.5 * xd * (1 - t * t) * dinner),)
    elif approximate == "none" and (xd.dtype == _F32 or xd.dtype in _HALFS):
        return _gelu_c(input)
    elif approximate == "none":
        cdf = 0.5 * (1 + _erf(xd * _SQRT1_2)).astype(xd.dtype, copy=False)
        out = xd * cdf

        def bw(g):
            pdf = _INV_SQRT_2PI * np.exp(-0.5 * xd * xd)
            return (g * (cdf + xd * pdf),)
    else:
        raise RuntimeError(f"approximate argument must be either none or tanh, got "
                           f"{approximate!r}")
    return _mk(out, "GeluBackward0", bw, (input,))


def _gelu_c(input):
    """Exact GELU on float32 through pyddp._C's vectorised kernel (erf and exp there; NumPy has
    neither fast erf nor float16/bfloat16 arithmetic).  A float16/bfloat16 input is widened to
    float32, computed there and rounded once, as torch's CPU kernel does; so is its gradient."""
    xd = input._data
    dt = xd.dtype
    x32 = np.ascontiguousarray(_to(xd, _F32))
    o32 = np.empty(x32.shape, _F32)
    _C.gelu(o32, x32)
    out = _to(o32, dt)

    def bw(g):
        g32 = np.ascontiguousarray(_to(g, _F32), dtype=_F32)
        if g32.shape != x32.shape:
            g32 = np.ascontiguousarray(np.broadcast_to(g32, x32.shape))
        gx = np.empty(x32.shape, _F32)
        _C.gelu_backward(gx, g32, x32)
        return (_to(gx, dt),)
    return _mk(out, "GeluBackward0", bw, (input,))


def mish(input, inplace=False):
    """x * tanh(softplus(x))."""
    return input * tanh(softplus(input))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):
    """scale * elu(x, alpha) with SELU's constants."""
    return elu(input, _SELU_ALPHA) * _SELU_SCALE


def celu(input, alpha=1.0, inplace=False):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    return relu(input) + _t.clamp(_t.expm1(_t.clamp(input, max=0) / alpha) * alpha, max=0)


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6."""
    return relu6(input + 3.0) / 6.0


def hardswish(input, inplace=False):
    """x * relu6(x + 3) / 6."""
    return input * hardsigmoid(input)


def logsigmoid(input):
    """log(sigmoid(x)), stably (-softplus(-x))."""
    return -softplus(-input)


def softsign(input):
    """x / (1 + |x|)."""
    return input / (_t.abs(input) + 1.0)


def tanhshrink(input):
    """x - tanh(x)."""
    return input - tanh(input)


def softshrink(input, lambd=0.5):
    """x - lambd above lambd, x + lambd below -lambd, else 0."""
    return _t.where(input > lambd, input - lambd,
                    _t.where(input < -lambd, input + lambd, input * 0.0))


def hardshrink(input, lambd=0.5):
    """x where |x| > lambd, else 0."""
    return _t.where(_t.abs(input) > lambd, input, input * 0.0)


def glu(input, dim=-1):
    """a * sigmoid(b), a and b the halves of input along dim."""
    n = input.shape[dim]
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim % input.ndim} is "
                           f"size {n}")
    a, b = input.chunk(2, dim)
    return a * sigmoid(b)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-x) along dim."""
    return softmax(-input, dim, dtype=dtype)


def prelu(input, weight):
    """x where positive, else weight * x (weight per channel, dim 1, or one for all)."""
    w = weight
    if w.numel() > 1:
        if input.ndim < 2 or input.shape[1] != w.numel():
            raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found "
                               f"parameter numbers = {w.numel()} and channel size = "
                               f"{input.shape[1] if input.ndim > 1 else 1}.")
        w = w.reshape((1, -1) + (1,) * (input.ndim - 2))
    return _t.where(input > 0, input, input * w)


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
