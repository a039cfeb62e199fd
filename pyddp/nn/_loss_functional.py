"""Loss functions as fused autograd Functions with hand-written backward (torch.nn.functional).

cross_entropy is one log-softmax + NLL Function (class-index or class-probability
targets, ``weight``, ``ignore_index``, ``label_smoothing``, ``reduction``) whose
backward is ``g * (sum_c a_c * softmax - a)``; nll_loss, mse_loss, l1_loss and
binary_cross_entropy_with_logits are single Functions too.  Every formula,
including the denominators of the weighted means, follows ATen's
(aten/src/ATen/native/LossNLL.cpp, Loss.cpp).

Precision: float16/bfloat16 inputs are computed in float32; outside autocast the
loss is returned in the input's dtype (torch's CPU behaviour), inside
``pyddp.autocast`` the input is upcast first and the loss is float32.
"""
import warnings

import numpy as np

from .. import _autocast, _tensor
from .._tensor import Tensor
from ..autograd.function import Function
from ._argcheck import quiet_all as _quiet_all

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss",
           "binary_cross_entropy_with_logits"]

_REDUCTIONS = ("none", "mean", "sum")


def _legacy_reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    ret = "mean" if (size_average and reduce) else ("sum" if reduce else "none")
    warnings.warn("size_average and reduce args will be deprecated, please use "
                  f"reduction='{ret}' instead.", stacklevel=3)
    return ret


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")


def _t(x, fn=None, name="input", pos=1):
    """A Tensor for a Tensor, ndarray or number (ndarrays are wrapped without a copy).  A tuple or
    list (a model's several outputs given as one) raises torch's TypeError, naming the function
    ``fn`` as torch's message does ("cross_entropy_loss(): argument 'input' (position 1) must be
    Tensor, not tuple")."""
    if isinstance(x, Tensor):
        return x
    if fn is not None and isinstance(x, (tuple, list)):
        raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be Tensor, not "
                        f"{type(x).__name__}")
    return Tensor(x if isinstance(x, np.ndarray) else np.asarray(x))


def _arr(x):
    return None if x is None else (x._data if isinstance(x, Tensor) else np.asarray(x))


def _work_dtype(dt):
    """float16/bfloat16 are computed in float32; float32/float64 in themselves."""
    return dt if dt in (np.float32, np.float64) else np.dtype(np.float32)


def _out(a, dt):
    return Tensor(np.asarray(a, dtype=dt))


def _float_dtype_name(dt):
    return {np.dtype(np.int64): "Long", np.dtype(np.int32): "Int", np.dtype(np.float32): "Float",
            np.dtype(np.float64): "Double", np.dtype(np.float16): "Half",
            np.dtype(np.bool_): "Bool"}.get(np.dtype(dt), str(dt))


# ----------------------------------------------------------------------------------------------
# cross entropy / nll

def _classes_last(x):
    """(N, C, d1..dk) -> (N*d1..dk, C); (C,) -> (1, C)."""
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim == 2:
        return x
    return np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])


def _classes_back(g, shape):
    """Inverse of _classes_last for a gradient of the input's shape."""
    if len(shape) <= 2:
        return g.reshape(shape)
    moved = (shape[0],) + tuple(shape[2:]) + (shape[1],)
    return np.moveaxis(g.reshape(moved), -1, 1)


def _index_target(x_shape, t):
    """Validate integer class targets for input of x_shape; returns the flat int64 targets."""
    if t.dtype.kind not in "iu":
        raise RuntimeError(
            f"expected target dtype to be Long or Byte, but got {_float_dtype_name(t.dtype)}")
    if len(x_shape) == 1:
        expected = ()
    elif len(x_shape) >= 2:
        expected = (x_shape[0],) + tuple(x_shape[2:])
    else:
        raise ValueError(f"Expected 1 or more dimensions for input (got {len(x_shape)})")
    if t.shape != expected:
        if len(x_shape) >= 2 and t.ndim >= 1 and t.shape[0] != x_shape[0]:
            raise ValueError(f"Expected input batch_size ({x_shape[0]}) to match target "
                             f"batch_size ({t.shape[0]}).")
        if len(x_shape) <= 2 and t.ndim > 1:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
        raise RuntimeError(f"Expected target size {list(expected)}, got {list(t.shape)}")
    return t.reshape(-1).astype(np.int64, copy=False)


def _pick(flat_t, ignore_index, n_classes):
    valid = flat_t != ignore_index
    tc = np.where(valid, flat_t, 0)
    bad = (tc < 0) | (tc >= n_classes)
    if bad.any():
        raise IndexError(f"Target {int(flat_t[np.argmax(bad)])} is out of bounds.")
    return valid, tc


def _softmax_rows(xm):
    """(z, p, lse): z = x - rowmax, p = softmax (rows), lse = log(sum(exp(z))) of shape (M,).

    log_softmax is ``z - lse[:, None]``; it is never materialised (the loss needs only a few
    of its entries or row sums of it, the backward needs p).
    """
    z = xm - xm.max(axis=1, keepdims=True)
    p = np.exp(z)
    s = p.sum(axis=1, keepdims=True)
    p /= s
    return z, p, np.log(s[:, 0])


class _CrossEntropy(Function):
    @staticmethod
    def forward(ctx, input, target, weight, ignore_index, reduction, label_smoothing):
        x = input._data
        dt = x.dtype
        wdt = _work_dtype(dt)
        C = x.shape[0] if x.ndim == 1 else x.shape[1]
        z, p, lse = _softmax_rows(_classes_last(x).astype(wdt, copy=False))
        M = p.shape[0]
        w = _arr(weight)
        if w is not None:
            if w.shape != (C,):
                raise RuntimeError(f"weight tensor should be defined either for all {C} classes "
                                   f"or no classes but got weight tensor of shape: {list(w.shape)}")
            w = w.astype(wdt, copy=False)
        t = target._data
        eps = float(label_smoothing)
        # class probabilities when the target is floating with the input's shape (as torch)
        if (t.dtype.kind == "f" or t.dtype == _tensor.bfloat16) and t.shape == x.shape:
            a = _classes_last(t).astype(wdt, copy=False)
            if eps > 0:
                a = a * (1 - eps) + eps / C
            if w is not None:
                a = a * w
            asum = a.sum(axis=1)
            # -(a . log_softmax) = -(a . z) + lse * sum(a)
            loss_el = lse * asum - np.einsum("ij,ij->i", a, z)
            if reduction == "none":
                loss = loss_el.reshape(x.shape[:1] + x.shape[2:] if x.ndim > 1 else ())
                denom = None
            elif reduction == "sum":
                loss = loss_el.sum()
                denom = 1.0
            else:
                denom = float(M) if x.size else float("nan")
                loss = loss_el.sum() / denom
            logp = (z - lse[:, None]) if ctx.needs_input_grad[1] else None
            ctx.state = ("prob", p, (a, asum, logp), w, eps, x.shape, denom, wdt)
        else:
            flat_t = _index_target(x.shape, t)
            valid, tc = _pick(flat_t, ignore_index, C)
            rows = np.arange(M)
            wy = (w[tc] if w is not None else np.ones(M, dtype=wdt)) * valid
            loss_el = (lse - z[rows, tc]) * wy
            if eps > 0:
                # -sum_c w_c log_softmax_c = -(z . w) + lse * sum(w)
                if w is not None:
                    smooth = lse * w.sum() - z @ w
                else:
                    smooth = lse * C - z.sum(axis=1)
                loss_el = (1 - eps) * loss_el + (eps / C) * (smooth * valid)
            if reduction == "none":
                loss = loss_el.reshape(t.shape)
                denom = None
            elif reduction == "sum":
                loss = loss_el.sum()
                denom = 1.0
            else:
                denom = wy.sum()
                with np.errstate(invalid="ignore", divide="ignore"):
                    loss = loss_el.sum() / denom
            ctx.state = ("index", p, (rows, tc, valid, wy), w, eps, x.shape, denom, wdt)
        ctx.reduction = reduction
        return _out(loss, wdt if _autocast.is_autocast_enabled() else dt)

    @staticmethod
    def backward(ctx, grad):
        kind, p, extra, w, eps, shape, denom, wdt = ctx.state
        g = grad._data.astype(wdt, copy=False)
        M, C = p.shape
        if ctx.reduction == "none":
            gi = g.reshape(M)
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                gi = np.full(M, g / wdt.type(denom) if ctx.reduction == "mean" else g, dtype=wdt)
        grad_target = None
        if kind == "prob":
            a, asum, logp = extra
            # d/dx of -(a . log_softmax(x)) = sum(a) * softmax - a
            gx = p * (asum * gi)[:, None]
            gx -= a * gi[:, None]
            if ctx.needs_input_grad[1]:
                gt = logp * (-(1 - eps) * gi)[:, None]
                if w is not None:
                    gt *= w
                grad_target = _classes_back(gt, shape)
        else:
            rows, tc, valid, wy = extra
            # a_ic = (1-eps) wy_i [c == t_i] + (eps/C) w_c valid_i;  grad = g_i (sum_c a_ic p - a)
            if eps > 0:
                wsum = w.sum() if w is not None else wdt.type(C)
                s = ((1 - eps) * wy + (eps / C) * valid * wsum) * gi
                gx = p * s[:, None]
                sv = (eps / C) * valid * gi
                gx -= sv[:, None] * w if w is not None else sv[:, None]
                gx[rows, tc] -= (1 - eps) * wy * gi
            else:
                gw = wy * gi
                gx = p * gw[:, None]
                gx[rows, tc] -= gw
        return _classes_back(gx, shape), grad_target, None, None, None, None


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                  reduce=None, reduction="mean", label_smoothing=0.0):
    """Cross entropy of logits ``input`` (C), (N, C) or (N, C, d1, ...) against ``target``.

    ``target``: class indices (int, shape without the class dim) or class
    probabilities (float, the input's shape).  ``weight``: per-class rescaling (C,).
    ``ignore_index``: index targets to skip.  ``label_smoothing``: in [0, 1].
    ``reduction``: "mean" (weighted mean over non-ignored targets), "sum" or "none".
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    input = _autocast.upcast(_t(input, "cross_entropy_loss"))
    target = _t(target, "cross_entropy_loss", "target", 2)
    if target.dtype.kind == "f":
        target = _autocast.upcast(target)
    return _CrossEntropy.apply(input, target, weight, ignore_index, reduction, label_smoothing)


class _NLL(Function):
    @staticmethod
    def forward(ctx, input, target, weight, ignore_index, reduction):
        x = input._data
        dt = x.dtype
        wdt = _work_dtype(dt)
        if x.ndim < 1:
            raise ValueError(f"Expected 1 or more dimensions (got {x.ndim})")
        C = x.shape[0] if x.ndim == 1 else x.shape[1]
        xm = _classes_last(x)
        M = xm.shape[0]
        w = _arr(weight)
        if w is not None:
            if w.shape != (C,):
                raise RuntimeError(f"weight tensor should be defined either for all {C} classes "
                                   f"or no classes but got weight tensor of shape: {list(w.shape)}")
            w = w.astype(wdt, copy=False)
        t = target._data
        flat_t = _index_target(x.shape, t)
        valid, tc = _pick(flat_t, ignore_index, C)
        rows = np.arange(M)
        wy = (w[tc] if w is not None else np.ones(M, dtype=wdt)) * valid
        loss_el = -xm[rows, tc].astype(wdt, copy=False) * wy
        if reduction == "none":
            loss = loss_el.reshape(t.shape)
            denom = None
        elif reduction == "sum":
            loss = loss_el.sum()
            denom = None
        else:
            denom = wdt.type(wy.sum())
            with np.errstate(invalid="ignore", divide="ignore"):
                loss = loss_el.sum() / denom
        ctx.state = (rows, tc, wy, x.shape, M, C, denom, wdt)
        ctx.reduction = reduction
        return _out(loss, wdt if _autocast.is_autocast_enabled() else dt)

    @staticmethod
    def backward(ctx, grad):
        rows, tc, wy, shape, M, C, denom, wdt = ctx.state
        g = grad._data.astype(wdt, copy=False)
        if ctx.reduction == "none":
            gi = g.reshape(M)
        elif ctx.reduction == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                gi = g / denom
        else:
            gi = g
        gx = np.zeros((M, C), dtype=wdt)
        gx[rows, tc] = -wy * gi
        return _classes_back(gx, shape), None, None, None, None


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """Negative log-likelihood of log-probabilities ``input`` (C), (N, C) or (N, C, d1, ...)
    at the integer class ``target``; ``weight``/``ignore_index``/``reduction`` as cross_entropy."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    input = _autocast.upcast(_t(input, "nll_loss_nd"))
    return _NLL.apply(input, _t(target, "nll_loss_nd", "target", 2), weight, ignore_index,
                      reduction)


# ----------------------------------------------------------------------------------------------
# regression losses

def _broadcast_warn(input, target):
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(
            f"Using a target size ({tuple(target.shape)}) that is different to the input size "
            f"({tuple(input.shape)}). This will likely lead to incorrect results due to "
            "broadcasting. Please ensure they have the same size.", stacklevel=3)


def _reduce(el, reduction):
    if reduction == "none":
        return el
    if reduction == "sum":
        return el.sum()
    return el.mean() if el.size else np.asarray(np.nan, dtype=el.dtype)


def _reduce_grad(g, shape, n, reduction, wdt):
    g = g.astype(wdt, copy=False)
    if reduction == "mean":
        g = g / wdt.type(n)
    return g if reduction == "none" else np.broadcast_to(g, shape)


class _PointwiseLoss(Function):
    """Shared forward/backward of mse and l1: loss_el = f(x - y)."""

    @staticmethod
    def forward(ctx, input, target, reduction, kind):
        x, y = input._data, target._data
        dt = np.result_type(x.dtype, y.dtype) if y.dtype.kind == "f" else x.dtype
        wdt = _work_dtype(np.dtype(dt))
        d = x.astype(wdt, copy=False) - y.astype(wdt, copy=False)
        el = d * d if kind == "mse" else np.abs(d)
        ctx.save = (d, reduction, kind, wdt)
        out_dt = wdt if _autocast.is_autocast_enabled() else np.dtype(dt)
        return _out(_reduce(el, reduction), out_dt)

    @staticmethod
    def backward(ctx, grad):
        d, reduction, kind, wdt = ctx.save
        g = _reduce_grad(grad._data, d.shape, d.size, reduction, wdt)
        gx = g * (2 * d) if kind == "mse" else g * np.sign(d)
        gy = -gx if ctx.needs_input_grad[1] else None
        return gx, gy, None, None


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Squared error ``(input - target)**2``, mean/sum/none.

    Shapes broadcast, with torch's warning when they differ."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    input = _autocast.upcast(_t(input, "mse_loss"))
    target = _autocast.upcast(_t(target, "mse_loss", "target", 2))
    _broadcast_warn(input, target)
    return _PointwiseLoss.apply(input, target, reduction, "mse")


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Absolute error ``|input - target|``, mean/sum/none.

    The gradient is sign(input - target), 0 where they are equal (as torch)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    input = _autocast.upcast(_t(input, "l1_loss"))
    target = _autocast.upcast(_t(target, "l1_loss", "target", 2))
    _broadcast_warn(input, target)
    return _PointwiseLoss.apply(input, target, reduction, "l1")


# ----------------------------------------------------------------------------------------------
# binary cross entropy with logits

class _BCEWithLogits(Function):
    @staticmethod
    def forward(ctx, input, target, weight, pos_weight, reduction):
        x = input._data
        dt = x.dtype
        wdt = _work_dtype(dt)
        x = x.astype(wdt, copy=False)
        t = target._data.astype(wdt, copy=False)
        # softplus(-x) = log(1 + exp(-x)), computed without overflow
        sp = np.maximum(-x, 0) + np.log1p(np.exp(-np.abs(x)))
        pw = _arr(pos_weight)
        if pw is not None:
            pw = pw.astype(wdt, copy=False)
            lw = 1 + (pw - 1) * t
            el = (1 - t) * x + lw * sp
        else:
            lw = None
            el = (1 - t) * x + sp
        w = _arr(weight)
        if w is not None:
            w = w.astype(wdt, copy=False)
            el = el * w
        ctx.save = (x, t, sp, pw, lw, w, reduction, wdt)
        out_dt = wdt if _autocast.is_autocast_enabled() else dt
        return _out(_reduce(el, reduction), out_dt)

    @staticmethod
    def backward(ctx, grad):
        x, t, sp, pw, lw, w, reduction, wdt = ctx.save
        g = _reduce_grad(grad._data, x.shape, x.size, reduction, wdt)
        if w is not None:
            g = g * w
        sig_neg = np.exp(-(sp + x))  # sigmoid(-x) = exp(-x) * sigmoid(x), never overflows
        gx = g * ((1 - t) - (lw if lw is not None else 1) * sig_neg)
        gt = None
        if ctx.needs_input_grad[1]:
            gt = g * (-x + ((pw - 1) * sp if pw is not None else 0))
        return gx, gt, None, None, None


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """Sigmoid + binary cross entropy, stable for large logits.

    ``loss = -w [pos_weight * t * log(sigmoid(x)) + (1 - t) * log(1 - sigmoid(x))]``;
    ``weight`` broadcasts to the input, ``pos_weight`` along the last (class) dimension.
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    input = _autocast.upcast(_t(input, "binary_cross_entropy_with_logits"))
    target = _autocast.upcast(_t(target, "binary_cross_entropy_with_logits", "target", 2))
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({tuple(target.shape)}) must be the same as input size "
                         f"({tuple(input.shape)})")
    return _BCEWithLogits.apply(input, target, weight, pos_weight, reduction)


# inf and NaN computed silently, as torch's (pyddp/nn/_argcheck.py)
_quiet_all(globals(), __all__)
