"""torch.optim.LBFGS's interface and semantics in NumPy: limited-memory BFGS (Nocedal & Wright,
*Numerical Optimization*, 2nd ed., algorithm 7.4, the two-loop recursion) with an optional
strong-Wolfe line search (algorithms 3.5 / 3.6, zoom by cubic interpolation, eq. 3.59).

All parameters are handled as one flat vector, in the parameters' own floating precision.
Scalars derived from vectors (dot products, norms, step lengths computed from them) are NumPy
scalars of that precision, so float32 parameters get float32 scalar arithmetic and Python floats
mix with them as torch's 0-d tensors do with Python numbers (NumPy 2's promotion rules).

Also ``SparseAdam``, which raises at construction: pyddp has no sparse tensors.
"""
from __future__ import annotations

import numpy as np

from .._interop import is_torch_tensor as _is_torch
from ._functional import grad_array, param_array
from .optimizer import Optimizer

__all__ = ["LBFGS", "SparseAdam"]

_LIST_KEYS = ("old_dirs", "old_stps", "ro", "al")
_ARRAY_KEYS = ("d", "H_diag", "prev_flat_grad", "t")


def _to_numpy(v):
    if _is_torch(v):
        v = v.detach().cpu().numpy().copy()
        return v[()] if v.ndim == 0 else v
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return v[()]  # a NumPy scalar, as step keeps them
    return v


def _loss_value(loss) -> float:
    """A closure's loss as a Python float (torch tensors detached first: no warning)."""
    if _is_torch(loss):
        return float(loss.detach().item())
    return float(loss)


def _axpy(a, alpha, b):
    """a += alpha * b in place, rounded once (a fused multiply-add, as torch's CPU
    ``add_(b, alpha=...)``) for float32 / float16 arrays: their products are exact in float64."""
    if a.dtype == np.float64:
        a += alpha * b
    else:
        alpha = np.float64(a.dtype.type(alpha))  # alpha in the array's precision, as torch
        a[...] = a.astype(np.float64) + alpha * b.astype(np.float64)


def _cubic_min(x1, f1, g1, x2, f2, g2, bounds=None):
    """Minimiser of the cubic through (x1, f1) and (x2, f2) with slopes g1, g2, clipped to
    ``bounds`` (default: the interval between x1 and x2); the bounds' midpoint when the cubic
    has no real minimiser (Nocedal & Wright eq. 3.59)."""
    lo, hi = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    disc = d1 ** 2 - g1 * g2
    if not disc >= 0:  # (NaN included)
        return (lo + hi) / 2.0
    d2 = np.sqrt(disc)
    if x1 <= x2:
        xm = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        xm = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(xm, lo), hi)


def _strong_wolfe(evaluate, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9,
                  max_ls=25):
    """Line search along ``d`` from the current point (loss ``f``, gradient ``g``, slope
    ``gtd``) for a step ``t`` meeting the strong Wolfe conditions.  ``evaluate(t)`` returns
    (loss, flat gradient) at ``x + t d`` without moving ``x``.  Returns (loss, gradient, t,
    evaluations)."""
    d_scale = np.abs(d).max()
    g = g.copy()
    f_t, g_t = evaluate(t)
    n_evals = 1
    gtd_t = g_t.dot(d)

    # Phase 1 (algorithm 3.5): grow the step until an interval holding a Wolfe point is found.
    t_old, f_old, g_old, gtd_old = 0, f, g, gtd
    done = False
    it = 0
    lo_hi = None
    while it < max_ls:
        if f_t > f + c1 * t * gtd or (it > 1 and f_t >= f_old):
            lo_hi = [[t_old, f_old, g_old, gtd_old], [t, f_t, g_t.copy(), gtd_t]]
            break
        if abs(gtd_t) <= -c2 * gtd:
            lo_hi = [[t, f_t, g_t, gtd_t]]
            done = True
            break
        if gtd_t >= 0:
            lo_hi = [[t_old, f_old, g_old, gtd_old], [t, f_t, g_t.copy(), gtd_t]]
            break
        # extrapolate: a cubic step between 1.01 t - 0.01 t_old and 10 t
        lower = t + 0.01 * (t - t_old)
        upper = t * 10
        t_next = _cubic_min(t_old, f_old, gtd_old, t, f_t, gtd_t, bounds=(lower, upper))
        t_old, f_old, g_old, gtd_old = t, f_t, g_t.copy(), gtd_t
        t = t_next
        f_t, g_t = evaluate(t)
        n_evals += 1
        gtd_t = g_t.dot(d)
        it += 1
    if it == max_ls:
        lo_hi = [[0, f, g, None], [t, f_t, g_t, None]]

    # Phase 2 (algorithm 3.6, "zoom"): shrink the interval by cubic interpolation.
    # Entries are [step, loss, gradient, slope]; `lo` indexes the lower loss.
    lo, hi = (0, 1) if lo_hi[0][1] <= lo_hi[-1][1] else (1, 0)
    stalled = False
    while not done and it < max_ls:
        a, b = lo_hi[0][0], lo_hi[1][0]
        if abs(b - a) * d_scale < tolerance_change:
            break
        t = _cubic_min(a, lo_hi[0][1], lo_hi[0][3], b, lo_hi[1][1], lo_hi[1][3])
        # keep t off the interval's ends; move it in by a tenth when it stalls there
        top, bottom = max(a, b), min(a, b)
        margin = 0.1 * (top - bottom)
        if min(top - t, t - bottom) < margin:
            if stalled or t >= top or t <= bottom:
                t = top - margin if abs(t - top) < abs(t - bottom) else bottom + margin
                stalled = False
            else:
                stalled = True
        else:
            stalled = False
        f_t, g_t = evaluate(t)
        n_evals += 1
        gtd_t = g_t.dot(d)
        it += 1
        if f_t > f + c1 * t * gtd or f_t >= lo_hi[lo][1]:
            lo_hi[hi] = [t, f_t, g_t.copy(), gtd_t]
            lo, hi = (0, 1) if lo_hi[0][1] <= lo_hi[1][1] else (1, 0)
        else:
            if abs(gtd_t) <= -c2 * gtd:
                done = True
            elif gtd_t * (lo_hi[hi][0] - lo_hi[lo][0]) >= 0:
                lo_hi[hi] = lo_hi[lo]
            lo_hi[lo] = [t, f_t, g_t.copy(), gtd_t]
    t, f_t, g_t = lo_hi[lo][0], lo_hi[lo][1], lo_hi[lo][2]
    return f_t, g_t, t, n_evals


class LBFGS(Optimizer):
    """torch.optim.LBFGS(params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
    tolerance_change=1e-9, history_size=100, line_search_fn=None).

    ``step(closure)`` runs up to ``max_iter`` L-BFGS iterations (``max_eval`` closure calls,
    default ``max_iter * 5 // 4``); ``closure`` must zero the gradients, recompute the loss,
    call ``backward()`` and return the loss.  ``line_search_fn="strong_wolfe"`` picks each step
    length by a strong-Wolfe line search; otherwise steps are ``lr`` (the first one scaled by
    ``min(1, 1 / |g|_1)``).  One parameter group only.  The state (torch's keys: ``d``, ``t``,
    ``old_dirs``, ``old_stps``, ``ro``, ``H_diag``, ``prev_flat_grad``, ``prev_loss``, ``al``,
    ``n_iter``, ``func_evals``) lives under the first parameter.
    """

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
                 tolerance_change=1e-9, history_size=100, line_search_fn=None):
        if _is_torch(lr) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        super().__init__(params, dict(lr=lr, max_iter=max_iter, max_eval=max_eval,
                                      tolerance_grad=tolerance_grad,
                                      tolerance_change=tolerance_change,
                                      history_size=history_size,
                                      line_search_fn=line_search_fn))
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")

    # ---- the parameters as one flat vector ----
    def _arrays(self):
        out = []
        for p in self.param_groups[0]["params"]:
            a = param_array(p)
            if a.dtype.kind != "f":
                raise TypeError("LBFGS updates float16, float32 and float64 parameters, got "
                                f"{'bfloat16' if a.dtype == np.uint16 else a.dtype}")
            out.append((p, a))
        return out

    def _flat_grad(self):
        parts = []
        for p, a in self._arrays():
            g = grad_array(p)
            parts.append(np.zeros(a.size, a.dtype) if g is None else np.asarray(g).reshape(-1))
        return np.concatenate(parts)

    def _flat_params(self):
        return [a.copy() for _, a in self._arrays()]

    def _set_params(self, saved):
        for (_, a), s in zip(self._arrays(), saved):
            a[...] = s

    def _move(self, t, d):
        """parameters += t * d"""
        off = 0
        for _, a in self._arrays():
            n = a.size
            _axpy(a, t, d[off:off + n].reshape(a.shape))
            off += n

    def _after_load(self):
        super()._after_load()
        # a loaded state (pyddp's or torch's) back to the types step keeps
        for st in self.state.values():
            for k in _LIST_KEYS:
                if k in st:
                    st[k] = [None if v is None else _to_numpy(v) for v in st[k]]
            for k in _ARRAY_KEYS:
                if k in st:
                    st[k] = _to_numpy(st[k])
            for k in ("n_iter", "func_evals"):
                if k in st:
                    st[k] = int(np.asarray(_to_numpy(st[k])))
            if "prev_loss" in st:
                st["prev_loss"] = float(np.asarray(_to_numpy(st["prev_loss"])))

    def step(self, closure):
        """Run the L-BFGS iterations; returns the loss ``closure()`` gave before them."""
        if not callable(closure):
            raise TypeError("LBFGS.step() needs a closure that zeroes the gradients, recomputes "
                            f"the loss, calls backward() and returns the loss; got {closure!r}")
        if len(self.param_groups) != 1:
            raise AssertionError(
                f"Expected exactly one param_group, but got {len(self.param_groups)}")
        group = self.param_groups[0]
        lr = float(group["lr"]) if _is_torch(group["lr"]) else group["lr"]
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        history_size, line_search_fn = group["history_size"], group["line_search_fn"]

        def evaluate():
            return _loss_value(self._run_closure(closure))

        state = self.state[group["params"][0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = self._run_closure(closure)
        loss = _loss_value(orig_loss)
        evals = 1
        state["func_evals"] += 1
        g = self._flat_grad()
        if np.abs(g).max() <= tol_grad:  # already optimal
            return orig_loss

        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        H_diag = state.get("H_diag")
        prev_g, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1

            # ---- the search direction: d = -H g by the two-loop recursion ----
            if state["n_iter"] == 1:
                d = -g
                old_dirs, old_stps, ro = [], [], []
                H_diag = 1
            else:
                y = g - prev_g            # gradient change
                s = d * t                 # step taken
                ys = y.dot(s)
                if ys > 1e-10:            # curvature condition: keep the pair
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / y.dot(y)  # initial Hessian scaling gamma_k
                m = len(old_dirs)
                al = state.get("al")
                if al is None or len(al) < history_size:
                    al = state["al"] = [None] * history_size
                q = -g
                for i in range(m - 1, -1, -1):
                    al[i] = old_stps[i].dot(q) * ro[i]
                    _axpy(q, -al[i], old_dirs[i])
                r = q * H_diag
                for i in range(m):
                    beta = old_dirs[i].dot(r) * ro[i]
                    _axpy(r, al[i] - beta, old_stps[i])
                d = r

            prev_g = g.copy()
            prev_loss = loss

            # ---- the step length ----
            if state["n_iter"] == 1:
                t = min(1.0, 1.0 / np.abs(g).sum()) * lr
            else:
                t = lr
            gtd = g.dot(d)
            if gtd > -tol_change:  # not a descent direction
                break

            ls_evals = 0
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                x0 = self._flat_params()

                def along(step, x0=x0, d=d):
                    self._move(step, d)
                    f_new = evaluate()
                    g_new = self._flat_grad()
                    self._set_params(x0)
                    return f_new, g_new

                loss, g, t, ls_evals = _strong_wolfe(along, t, d, loss, g, gtd)
                self._move(t, d)
                opt_cond = np.abs(g).max() <= tol_grad
            else:
                self._move(t, d)
                opt_cond = False
                if n_iter != max_iter:
                    loss = evaluate()
                    g = self._flat_grad()
                    opt_cond = np.abs(g).max() <= tol_grad
                    ls_evals = 1
            evals += ls_evals
            state["func_evals"] += ls_evals

            # ---- stopping tests ----
            if n_iter == max_iter or evals >= max_eval or opt_cond:
                break
            if np.abs(d * t).max() <= tol_change:  # the step is too small
                break
            if abs(loss - prev_loss) < tol_change:  # the loss stopped changing
                break

        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                     prev_flat_grad=prev_g, prev_loss=prev_loss)
        return orig_loss


class SparseAdam(Optimizer):
    """torch.optim.SparseAdam's name only: constructing it raises NotImplementedError, since
    pyddp has no sparse tensors (use Adam, or torch's SparseAdam on torch's sparse
    gradients)."""

    def __init__(self, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, maximize=False):
        raise NotImplementedError(
            "pyddp.optim.SparseAdam: pyddp has no sparse tensors (no sparse gradients to "
            "update); use pyddp.optim.Adam, or torch.optim.SparseAdam with torch's sparse "
            "embeddings")

    def step(self, closure=None):
        raise NotImplementedError("pyddp has no sparse tensors")
