"""The per-group update functions behind pyddp's optimizers.

float32, float16 and bfloat16 parameters go to the fused C kernels (pyddp._C.adam_step /
sgd_step: one call per group, GIL released, float32 arithmetic and float32 state).  Other
floating parameters (float64) take a NumPy path that follows the same torch formulas in the
parameter's own precision.
"""
from __future__ import annotations

import numpy as np

from .. import _C
from .._kernels import as_array

_KERNEL_PARAM = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint16))


def param_array(p) -> np.ndarray:
    """The ndarray behind a parameter (pyddp Tensor or torch CPU tensor); bfloat16 as uint16."""
    return as_array(p, "param")


def grad_array(p):
    """The ndarray behind ``p.grad``, or None when the parameter has no gradient."""
    g = p.grad
    if g is None:
        return None
    return as_array(g, "grad")


def uses_kernel(a: np.ndarray) -> bool:
    """True when the fused C kernels take this parameter array (float32/float16/bfloat16,
    C-contiguous, writable); others are updated with NumPy."""
    return a.dtype in _KERNEL_PARAM and a.flags.c_contiguous and a.flags.writeable


def entry(p, st):
    """(param array, grad array, state) for one parameter with a gradient, or None without one.

    The gradient is made acceptable to the kernels without touching the parameter: a
    non-contiguous gradient is copied, one of another floating dtype (float64) converted to
    float32 (gradients are only read).
    """
    g = grad_array(p)
    if g is None:
        return None
    a = param_array(p)
    if g.size != a.size:
        raise ValueError(f"gradient has {g.size} elements but its parameter has {a.size} "
                         f"(shapes {g.shape} and {a.shape})")
    if uses_kernel(a):
        if g.dtype not in _KERNEL_PARAM:
            g = g.astype(np.float32)
        elif not g.flags.c_contiguous:
            g = np.ascontiguousarray(g)
    elif a.dtype == np.uint16:  # a bfloat16 view the NumPy path cannot do arithmetic on
        raise ValueError("bfloat16 parameters must be C-contiguous and writable")
    elif a.dtype.kind != "f":
        raise TypeError(f"can only optimize floating-point parameters, got {a.dtype}")
    return a, g, st


def state_zeros(a: np.ndarray) -> np.ndarray:
    """A zero state array for param array ``a``: float32, or float64 for float64 params."""
    dt = np.float64 if a.dtype == np.float64 else np.float32
    return np.zeros(a.shape, dtype=dt)


def scaling_args(grad_scale=None, found_inf=None, inv_scale=None, check_finite=False):
    """Turn torch-style ``grad_scale`` (grads are divided by it) or ``inv_scale`` into the
    kernel's inv_scale, and ``found_inf`` into a float32 flag array."""
    if grad_scale is not None and inv_scale is not None:
        raise ValueError("give grad_scale or inv_scale, not both")
    inv = None
    if grad_scale is not None:
        gs = float(np.asarray(as_array(grad_scale, "grad_scale") if not isinstance(
            grad_scale, (int, float)) else grad_scale).reshape(-1)[0])
        inv = 1.0 / gs
    elif inv_scale is not None:
        inv = inv_scale if isinstance(inv_scale, (int, float)) else as_array(inv_scale, "inv_scale")
    flag = None if found_inf is None else as_array(found_inf, "found_inf")
    if check_finite and flag is None:
        flag = np.zeros(1, dtype=np.float32)
    return inv, flag


def _inv_value(inv):
    if inv is None:
        return None
    return float(np.asarray(inv, dtype=np.float32).reshape(-1)[0])


def skip_for_found_inf(flag) -> bool:
    """True when the found_inf flag (array or None) is already set."""
    return flag is not None and float(np.asarray(flag).reshape(-1)[0]) != 0.0


# ---------------------------------------------------------------- Adam
def adam_group(entries, *, lr, beta1, beta2, eps, weight_decay, amsgrad, maximize, decoupled,
               bias_correction=True, inv_scale=None, found_inf=None, check_finite=False) -> bool:
    """One Adam/AdamW step over ``entries``: (param_array, grad_array, state) triples.

    state holds 'step' (0-d float32 array), 'exp_avg', 'exp_avg_sq' ('max_exp_avg_sq' with
    amsgrad, 'master_param' for a float32 master copy).  Returns False when found_inf skipped
    the step (the step counts are then left unchanged).
    """
    fused = [e for e in entries if uses_kernel(e[0])]
    other = [e for e in entries if not uses_kernel(e[0])]
    if skip_for_found_inf(found_inf):
        return False
    if check_finite and other:
        if any(not np.isfinite(g).all() for _, g, _ in other):
            found_inf[...] = 1.0
            return False
    stepped = True
    if fused:
        stepped = _C.adam_step(
            [e[0] for e in fused], [e[1] for e in fused],
            [e[2]["exp_avg"] for e in fused], [e[2]["exp_avg_sq"] for e in fused],
            [e[2]["max_exp_avg_sq"] for e in fused] if amsgrad else None,
            [e[2].get("master_param") for e in fused],
            [float(e[2]["step"]) + 1.0 for e in fused],
            float(lr), float(beta1), float(beta2), float(eps), float(weight_decay),
            amsgrad=bool(amsgrad), maximize=bool(maximize), decoupled=bool(decoupled),
            bias_correction=bool(bias_correction), inv_scale=inv_scale, found_inf=found_inf,
            check_finite=bool(check_finite))
        if not stepped:
            return False
    inv = _inv_value(inv_scale)
    for p, g, st in other:
        _adam_numpy(p, g, st, float(st["step"]) + 1.0, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                    weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                    decoupled=decoupled, bias_correction=bias_correction, inv=inv)
    for _, _, st in entries:
        st["step"] += 1
    return True


def _adam_numpy(p, g, st, step, *, lr, beta1, beta2, eps, weight_decay, amsgrad, maximize,
                decoupled, bias_correction, inv):
    dt = p.dtype.type
    if inv is not None:
        g = g * dt(inv)
    g = -g if maximize else g.astype(dt, copy=False)
    if weight_decay != 0:
        if decoupled:
            p *= dt(1 - lr * weight_decay)
        else:
            g = g + dt(weight_decay) * p
    m, v = st["exp_avg"], st["exp_avg_sq"]
    w = 1 - beta1
    if abs(w) < 0.5:
        m += dt(w) * (g - m)
    else:
        m[...] = g - (g - m) * (dt(1) - dt(w))
    v *= dt(beta2)
    v += dt(1 - beta2) * g * g
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    step_size = lr / bc1
    if amsgrad:
        np.maximum(st["max_exp_avg_sq"], v, out=st["max_exp_avg_sq"])
        v = st["max_exp_avg_sq"]
    denom = np.sqrt(v) / dt(bc2 ** 0.5) + dt(eps)
    p += dt(-step_size) * m / denom


# ---------------------------------------------------------------- SGD
def sgd_group(entries, *, lr, momentum, dampening, weight_decay, nesterov, maximize,
              inv_scale=None, found_inf=None, check_finite=False) -> bool:
    """One SGD step over (param_array, grad_array, state) triples; state['momentum_buffer'] is
    created (a copy of the first gradient, as torch's clone) when momentum != 0.  Returns False
    when found_inf skipped the step."""
    if skip_for_found_inf(found_inf):
        return False
    fused = [e for e in entries if uses_kernel(e[0])]
    other = [e for e in entries if not uses_kernel(e[0])]
    if check_finite and other:
        if any(not np.isfinite(g).all() for _, g, _ in other):
            found_inf[...] = 1.0
            return False
    first, bufs = [], []
    if momentum != 0:
        for p, _, st in fused:
            buf = st.get("momentum_buffer")
            first.append(buf is None)
            if buf is None:
                buf = np.empty(p.shape, dtype=np.float32)
            elif buf.dtype != np.float32 or not buf.flags.c_contiguous:
                buf = np.ascontiguousarray(buf, dtype=np.float32)
            bufs.append(buf)
    if fused:
        stepped = _C.sgd_step(
            [e[0] for e in fused], [e[1] for e in fused],
            bufs if momentum != 0 else None,
            [e[2].get("master_param") for e in fused],
            first if momentum != 0 else None,
            float(lr), float(momentum), float(dampening), float(weight_decay),
            nesterov=bool(nesterov), maximize=bool(maximize), inv_scale=inv_scale,
            found_inf=found_inf, check_finite=bool(check_finite))
        if not stepped:
            return False
        for (_, _, st), buf in zip(fused, bufs):
            st["momentum_buffer"] = buf
    inv = _inv_value(inv_scale)
    for p, g, st in other:
        _sgd_numpy(p, g, st, lr=lr, momentum=momentum, dampening=dampening,
                   weight_decay=weight_decay, nesterov=nesterov, maximize=maximize, inv=inv)
    return True


def _sgd_numpy(p, g, st, *, lr, momentum, dampening, weight_decay, nesterov, maximize, inv):
    dt = p.dtype.type
    if inv is not None:
        g = g * dt(inv)
    g = -g if maximize else g.astype(dt, copy=False)
    if weight_decay != 0:
        g = g + dt(weight_decay) * p
    if momentum != 0:
        buf = st.get("momentum_buffer")
        if buf is None:
            buf = st["momentum_buffer"] = np.array(g, dtype=p.dtype, copy=True)
        else:
            buf *= dt(momentum)
            buf += dt(1 - dampening) * g
        g = g + dt(momentum) * buf if nesterov else buf
    p += dt(-lr) * g

