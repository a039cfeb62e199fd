"""Resampling: interpolate (nearest, nearest-exact, linear, bilinear, bicubic, trilinear, area
over 1 to 3 spatial dims), its legacy names upsample / upsample_nearest / upsample_bilinear, and
pixel_shuffle / pixel_unshuffle.

interpolate is separable: along each resized dimension the output is a fixed linear map of the
input, built here as a dense (out, in) matrix with torch's source indices and weights (its CPU
kernels' formulas, computed in the input's precision, so nearest picks the same pixels), and
applied with one tensordot per dimension; the backward applies the transpose, which is what
torch's backward kernels compute.
"""
from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from ..._tensor import Tensor
from ..._tensor._core import _mk
from ..._tensor._dtypes import _F64, _HALFS
from ..._tensor._ops import _cast
from .._argcheck import require_tensors as _require_tensors
from ._common import _f32

__all__ = ["interpolate", "upsample", "upsample_nearest", "upsample_bilinear", "pixel_shuffle",
           "pixel_unshuffle"]

_MODES = ("nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact")
_NEEDS = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5}


def _scale_value(scale, n_in, n_out, ft):
    """torch's compute_scales_value: 1 / scale_factor when one was given, else in / out."""
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n_in) / ft(n_out)


def _area_scale(n_in, n_out, align_corners, scale, ft):
    """torch's area_pixel_compute_scale."""
    if align_corners:
        return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)
    return _scale_value(scale, n_in, n_out, ft)


def _source(scale, dst, align_corners, cubic, ft):
    """torch's area_pixel_compute_source_index, for all output indices ``dst`` at once."""
    if align_corners:
        return scale * dst
    src = scale * (dst + ft(0.5)) - ft(0.5)
    return src if cubic else np.maximum(src, ft(0))


def _cubic_weights(t, A=-0.75):
    """The four cubic convolution coefficients for offset t (torch's, A = -0.75)."""
    def c1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def c2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return [c2(t + 1), c1(t), c1(1 - t), c2(2 - t)]


def _matrix(mode, n_in, n_out, align_corners, scale, ft):
    """The (n_out, n_in) map of one resized dimension, in float type ``ft``."""
    W = np.zeros((n_out, n_in), dtype=ft)
    rows = np.arange(n_out)
    dst = rows.astype(ft)
    if mode in ("nearest", "nearest-exact"):
        if n_out == n_in:
            src = rows
        elif mode == "nearest" and n_out == 2 * n_in:
            src = rows >> 1
        else:
            s = _scale_value(scale, n_in, n_out, np.float32)
            d32 = rows.astype(np.float32)
            src = np.floor(d32 * s if mode == "nearest" else (d32 + np.float32(0.5)) * s)
            src = np.minimum(src.astype(np.int64), n_in - 1)
        W[rows, src] = 1
    elif mode == "area":   # adaptive average pooling's windows
        start = (rows * n_in) // n_out
        end = -((-(rows + 1) * n_in) // n_out)
        for i in range(n_out):
            W[i, start[i]:end[i]] = ft(1) / ft(end[i] - start[i])
    elif mode == "bicubic":
        s = _area_scale(n_in, n_out, align_corners, scale, ft)
        real = _source(s, dst, align_corners, True, ft)
        i0 = np.minimum(np.floor(real).astype(np.int64), n_in - 1)
        t = np.clip(real - i0.astype(ft), 0, 1).astype(ft)
        for k, w in enumerate(_cubic_weights(t)):
            np.add.at(W, (rows, np.clip(i0 - 1 + k, 0, n_in - 1)), w.astype(ft))
    else:   # linear, bilinear, trilinear
        if n_out == n_in:
            W[rows, rows] = 1
            return W
        s = _area_scale(n_in, n_out, align_corners, scale, ft)
        real = _source(s, dst, align_corners, False, ft)
        i0 = np.minimum(np.floor(real).astype(np.int64), n_in - 1)
        lam1 = np.clip(real - i0.astype(ft), 0, 1).astype(ft)
        i1 = i0 + (i0 < n_in - 1)
        np.add.at(W, (rows, i0), ft(1) - lam1)
        np.add.at(W, (rows, i1), lam1)
    return W


def _resize_axis(x, W, d):
    """x resized along dimension d by the map W (a graph node; backward applies W.T)."""
    xd = x._data
    out = np.moveaxis(np.tensordot(W, xd, axes=([1], [d])), 0, d)

    def bw(g):
        return (np.moveaxis(np.tensordot(W.T, g, axes=([1], [d])), 0, d),)
    return _mk(np.ascontiguousarray(out), "UpsampleBackward0", bw, (x,), saves=False)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Resize the spatial dimensions of an (N, C, d1[, d2[, d3]]) input (torch's
    F.interpolate): to ``size``, or by ``scale_factor`` (output size floor(in * scale); the
    kernel then uses 1 / scale_factor as torch's does, or in / out with
    ``recompute_scale_factor=True``).  ``mode``: nearest, nearest-exact, linear (3-D input),
    bilinear / bicubic (4-D), trilinear (5-D), area (adaptive average pooling);
    ``align_corners`` for the interpolating modes.  Differentiable.  ``antialias=True`` is not
    supported."""
    dim = input.ndim - 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                raise ValueError(
                    "Input and output must have the same number of spatial dimensions, but got "
                    f"input with spatial dimensions of {list(input.shape[2:])} and output size "
                    f"of {size}. Please provide input tensor in (N, C, d1, d2, ...,dK) format "
                    "and output size in (o1, o2, ...,oK) format.")
            output_size = [int(n) for n in size]
        else:
            output_size = [int(size)] * dim
        scales = [None] * dim
    elif scale_factor is not None:
        if isinstance(scale_factor, (list, tuple)):
            if len(scale_factor) != dim:
                raise ValueError(
                    "Input and scale_factor must have the same number of spatial dimensions, "
                    f"but got input with spatial dimensions of {list(input.shape[2:])} and "
                    f"scale_factor of shape {scale_factor}. Please provide input tensor in (N, "
                    "C, d1, d2, ...,dK) format and scale_factor in (s1, s2, ...,sK) format.")
            scales = [float(s) for s in scale_factor]
        else:
            scales = [float(scale_factor)] * dim
        output_size = [int(math.floor(float(input.shape[i + 2]) * scales[i]))
                       for i in range(dim)]
        if recompute_scale_factor:
            scales = [None] * dim
    else:
        raise ValueError("either size or scale_factor should be defined")
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError("align_corners option can only be set with the interpolating modes: "
                             "linear | bilinear | bicubic | trilinear")
    elif align_corners is None:
        align_corners = False
    if mode not in _MODES or input.ndim not in (3, 4, 5):
        raise NotImplementedError(
            f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for the "
            "modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
            f"nearest-exact (got {mode})")
    need = _NEEDS.get(mode)
    if need is not None and input.ndim != need:
        raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs {need}D input")
    if antialias:
        raise NotImplementedError("interpolate(antialias=True) is not supported by pyddp")
    if any(n <= 0 for n in output_size):
        names = "DHW"[3 - dim:]
        raise RuntimeError(
            "Input and output sizes should be greater than 0, but got input ("
            + ", ".join(f"{a}: {n}" for a, n in zip(names, input.shape[2:])) + ") output ("
            + ", ".join(f"{a}: {n}" for a, n in zip(names, output_size)) + ")")
    x = _f32(input) if input.dtype in _HALFS else input
    ft = np.float64 if x.dtype == _F64 else np.float32
    if x.dtype.kind != "f":
        raise NotImplementedError(f'"upsample_{mode}" not implemented for integer tensors')
    out = x
    for i in range(dim):
        n_in, n_out = input.shape[i + 2], output_size[i]
        W = _matrix(mode, n_in, n_out, align_corners, scales[i], ft)
        out = _resize_axis(out, W, i + 2)
    return _cast(out, input.dtype) if input.dtype in _HALFS else out


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """The deprecated name of interpolate (torch's warning included)."""
    warnings.warn("`nn.functional.upsample` is deprecated. Use `nn.functional.interpolate` "
                  "instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None):
    """interpolate(mode='nearest'), deprecated as torch's."""
    warnings.warn("`nn.functional.upsample_nearest` is deprecated. Use "
                  "`nn.functional.interpolate` instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """interpolate(mode='bilinear', align_corners=True), deprecated as torch's."""
    warnings.warn("`nn.functional.upsample_bilinear` is deprecated. Use "
                  "`nn.functional.interpolate` instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


def _factor(v, name, arg):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name}(): argument '{arg}' (position 2) must be int, not "
                        f"{type(v).__name__}")
    return int(v)


def pixel_shuffle(input, upscale_factor):
    """(*, C r^2, H, W) -> (*, C, H r, W r) (torch's F.pixel_shuffle); differentiable."""
    r = _factor(upscale_factor, "pixel_shuffle", "upscale_factor")
    shape = tuple(input.shape)
    if len(shape) < 3:
        raise RuntimeError("pixel_shuffle expects input to have at least 3 dimensions, but got "
                           f"input with {len(shape)} dimension(s)")
    if r <= 0:
        raise RuntimeError(f"pixel_shuffle expects a positive upscale_factor, but got {r}")
    *b, c, h, w = shape
    if c % (r * r):
        raise RuntimeError("pixel_shuffle expects its input's 'channel' dimension to be divisible "
                           f"by the square of upscale_factor, but input.size(-3)={c} is not "
                           f"divisible by {r * r}")
    nb = len(b)
    x = input.reshape(*b, c // (r * r), r, r, h, w)
    x = x.permute(*range(nb), nb, nb + 3, nb + 1, nb + 4, nb + 2)
    return x.reshape(*b, c // (r * r), h * r, w * r)


def pixel_unshuffle(input, downscale_factor):
    """(*, C, H r, W r) -> (*, C r^2, H, W) (torch's F.pixel_unshuffle); differentiable."""
    r = _factor(downscale_factor, "pixel_unshuffle", "downscale_factor")
    shape = tuple(input.shape)
    if len(shape) < 3:
        raise RuntimeError("pixel_unshuffle expects input to have at least 3 dimensions, but got "
                           f"input with {len(shape)} dimension(s)")
    if r <= 0:
        raise RuntimeError(f"pixel_unshuffle expects a positive downscale_factor, but got {r}")
    *b, c, h, w = shape
    if h % r:
        raise RuntimeError("pixel_unshuffle expects height to be divisible by downscale_factor, "
                           f"but input.size(-2)={h} is not divisible by {r}")
    if w % r:
        raise RuntimeError("pixel_unshuffle expects width to be divisible by downscale_factor, "
                           f"but input.size(-1)={w} is not divisible by {r}")
    nb = len(b)
    x = input.reshape(*b, c, h // r, r, w // r, r)
    x = x.permute(*range(nb), nb, nb + 2, nb + 4, nb + 1, nb + 3)
    return x.reshape(*b, c * r * r, h // r, w // r)


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
