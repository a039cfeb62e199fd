"""Parameter initialisation schemes, mirroring ``torch.nn.init``.

Every function fills a pyddp Tensor (or a bare ndarray) in place, writing into
its existing array (so views and optimizer references stay valid), and returns
it.  Fan computation, gains and error messages follow torch.  Values are drawn
in float64 and rounded to the tensor's dtype, so the distribution matches
torch's; the random stream does not (pass ``generator=`` a pyddp.Generator or a
numpy.random.Generator to control it, or seed pyddp's default generator).
"""
import math
import warnings

import numpy as np

from .. import _random

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
    "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
    "kaiming_normal_", "orthogonal_",
]


def _rng(generator=None):
    """The numpy Generator to draw from: ``generator``'s or pyddp's default generator's."""
    if generator is None:
        return _random.default_generator._gen
    if isinstance(generator, np.random.Generator):
        return generator
    inner = getattr(generator, "_gen", None)
    if isinstance(inner, np.random.Generator):
        return inner
    raise TypeError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}")


def _array(tensor):
    """The ndarray to write into: a Tensor's ``_data`` or the ndarray itself."""
    arr = getattr(tensor, "_data", tensor)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"expected a pyddp Tensor or numpy.ndarray, got {type(tensor).__name__}")
    if not arr.flags.writeable:
        raise ValueError("cannot initialise a read-only array")
    return arr


def _fill(tensor, values):
    arr = _array(tensor)
    arr[...] = values  # cast to the array's dtype, in place
    return tensor


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (torch's table).

    linear / conv / sigmoid: 1, tanh: 5/3, relu: sqrt(2),
    leaky_relu: sqrt(2 / (1 + negative_slope**2)) (slope ``param``, default 0.01), selu: 3/4.
    """
    linear_fns = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d"]
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    elif nonlinearity == "tanh":
        return 5.0 / 3
    elif nonlinearity == "relu":
        return math.sqrt(2.0)
    elif nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, int) or isinstance(param, float):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope ** 2))
    elif nonlinearity == "selu":
        return 3.0 / 4
    else:
        raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fill with values from U(a, b)."""
    arr = _array(tensor)
    return _fill(tensor, _rng(generator).uniform(a, b, size=arr.shape))


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with values from N(mean, std**2)."""
    arr = _array(tensor)
    return _fill(tensor, _rng(generator).normal(mean, std, size=arr.shape))


def _norm_cdf(x):
    return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0


def _trunc_std_normal(rng, n, lo, hi, mass):
    """n draws of N(0, 1) restricted to [lo, hi], exactly (rejection sampling, vectorised).

    Proposals: N(0, 1) when [lo, hi] holds a fair share of the mass; otherwise uniform on
    [lo, hi] when the window is narrow, or Robert's (1995) shifted exponential for a wide
    window in one tail.
    """
    out = np.empty(n, dtype=np.float64)
    filled = 0
    flip = False
    if mass < 1e-3 and hi <= 0:  # mirror a left-tail window to the right
        lo, hi, flip = -hi, -lo, True
    near = 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
    while filled < n:
        need = n - filled
        if mass >= 1e-3:
            z = rng.standard_normal(int(need / mass * 1.1) + 16)
            z = z[(z >= lo) & (z <= hi)]
        elif (hi - lo) * max(near, 1.0) <= 2.0:
            m = 4 * need + 16
            z = rng.uniform(lo, hi, m)
            z = z[rng.random(m) < np.exp((near * near - z * z) / 2)]
        else:
            lam = (lo + np.sqrt(lo * lo + 4)) / 2
            m = 2 * need + 16
            z = lo + rng.exponential(1 / lam, m)
            z = z[(rng.random(m) < np.exp(-((z - lam) ** 2) / 2)) & (z <= hi)]
        z = z[:need]
        out[filled:filled + z.size] = z
        filled += z.size
    return -out if flip else out


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fill with values from N(mean, std**2) truncated to [a, b] (exact rejection sampling)."""
    if (mean < a - 2 * std) or (mean > b + 2 * std):
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    arr = _array(tensor)
    lo, hi = (a - mean) / std, (b - mean) / std
    mass = _norm_cdf(hi) - _norm_cdf(lo)
    z = _trunc_std_normal(_rng(generator), arr.size, lo, hi, mass)
    out = np.clip(mean + std * z, a, b)
    return _fill(tensor, out.reshape(arr.shape))


def constant_(tensor, val):
    """Fill with the constant ``val``."""
    return _fill(tensor, val)


def ones_(tensor):
    """Fill with ones."""
    return _fill(tensor, 1)


def zeros_(tensor):
    """Fill with zeros."""
    return _fill(tensor, 0)


def eye_(tensor):
    """Fill a 2-D tensor with the identity matrix."""
    arr = _array(tensor)
    if arr.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill(tensor, np.eye(arr.shape[0], arr.shape[1]))


def dirac_(tensor, groups=1):
    """Fill a {3,4,5}-D conv weight with the Dirac delta (identity convolution), per group."""
    arr = _array(tensor)
    dimensions = arr.ndim
    if dimensions not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = arr.shape
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_chans_per_grp = sizes[0] // groups
    min_dim = min(out_chans_per_grp, sizes[1])
    arr[...] = 0
    centre = tuple(s // 2 for s in sizes[2:])
    for g in range(groups):
        for d in range(min_dim):
            arr[(g * out_chans_per_grp + d, d) + centre] = 1
    return tensor


def _calculate_fan_in_and_fan_out(tensor):
    shape = _array(tensor).shape
    if len(shape) < 2:
        raise ValueError(
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    num_input_fmaps = shape[1]
    num_output_fmaps = shape[0]
    receptive_field_size = 1
    for s in shape[2:]:
        receptive_field_size *= s
    return num_input_fmaps * receptive_field_size, num_output_fmaps * receptive_field_size


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    valid_modes = ["fan_in", "fan_out"]
    if mode not in valid_modes:
        raise ValueError(f"Mode {mode} not supported, please use one of {valid_modes}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """Glorot uniform: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """Glorot normal: N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """He uniform: U(-bound, bound), bound = gain * sqrt(3 / fan).

    gain = calculate_gain(nonlinearity, a); fan per ``mode`` ("fan_in" or "fan_out")."""
    if 0 in _array(tensor).shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    std = gain / math.sqrt(fan)
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """He normal: N(0, std**2), std = gain / sqrt(fan)."""
    if 0 in _array(tensor).shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    std = gain / math.sqrt(fan)
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor, gain=1, generator=None):
    """Fill with a (semi-)orthogonal matrix (trailing dims flattened), scaled by ``gain``."""
    arr = _array(tensor)
    if arr.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if arr.size == 0:
        return tensor
    rows = arr.shape[0]
    cols = arr.size // rows
    flattened = _rng(generator).normal(0.0, 1.0, size=(rows, cols))
    if rows < cols:
        flattened = flattened.T
    q, r = np.linalg.qr(flattened)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, (gain * q).reshape(arr.shape))
