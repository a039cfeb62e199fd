"""gradcheck: compare backward's gradients with central finite differences (float64)."""
from __future__ import annotations

import numpy as np

from .._tensor import Tensor, grad, no_grad
from .._tensor._core import _new


class GradcheckError(RuntimeError):
    """Raised by gradcheck when analytical and numerical gradients disagree."""


def _outputs(fn, inputs):
    out = fn(*inputs)
    if isinstance(out, Tensor):
        return (out,)
    return tuple(o for o in out if isinstance(o, Tensor))


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True):
    """Check the gradients of fn at inputs (a Tensor or tuple) against finite differences.

    Every float input that requires grad is perturbed element by element (central differences);
    the analytical Jacobian is built with one backward per output element.  Inputs should be
    float64 and small.  Returns True, or raises GradcheckError (returns False when
    raise_exception=False).
    """
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    inputs = tuple(inputs)
    diff = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    with no_grad():
        outs0 = _outputs(fn, inputs)
    outs_sizes = [o.numel() for o in outs0]
    nout = sum(outs_sizes)
    for i in diff:
        x = inputs[i]
        if x.dtype != np.float64:
            import warnings
            warnings.warn("gradcheck: input is not float64; the check is unreliable")
        n = x.numel()
        num = np.zeros((nout, n))
        flat = x._data.reshape(-1)  # a view: perturb in place
        if not np.shares_memory(flat, x._data):
            raise ValueError("gradcheck needs contiguous inputs")
        for j in range(n):
            orig = flat[j]
            flat[j] = orig + eps
            with no_grad():
                fp = np.concatenate([np.asarray(o._data, np.float64).reshape(-1)
                                     for o in _outputs(fn, inputs)])
            flat[j] = orig - eps
            with no_grad():
                fm = np.concatenate([np.asarray(o._data, np.float64).reshape(-1)
                                     for o in _outputs(fn, inputs)])
            flat[j] = orig
            num[:, j] = (fp - fm) / (2 * eps)
        ana = np.zeros((nout, n))
        row = 0
        for k, size in enumerate(outs_sizes):
            for e in range(size):
                outs = _outputs(fn, inputs)
                o = outs[k]
                if not o.requires_grad:
                    row += 1
                    continue
                g = np.zeros(o.shape, dtype=o.dtype)
                g.reshape(-1)[e] = 1
                (gx,) = grad(o, x, grad_outputs=_new(g), allow_unused=True)
                if gx is not None:
                    ana[row] = np.asarray(gx._data, np.float64).reshape(-1)
                row += 1
        if not np.allclose(ana, num, rtol=rtol, atol=atol):
            msg = (f"Jacobian mismatch for output 0 with respect to input {i},\n"
                   f"numerical:{num}\nanalytical:{ana}\n")
            if raise_exception:
                raise GradcheckError(msg)
            return False
    return True
