"""Custom differentiable operations: subclass Function with static forward/backward."""
from __future__ import annotations

import numpy as np

from .._tensor import Tensor, no_grad
from .._tensor._core import _new, _red
from .._tensor._grad_mode import _st
from ._graph import Node, _edge


class FunctionCtx:
    """The ``ctx`` passed to Function.forward / backward."""

    def __init__(self):
        self.saved_tensors = ()
        self.needs_input_grad = ()
        self._non_diff = set()
        self.materialize_grads = True

    def save_for_backward(self, *tensors):
        """Keep tensors for backward (read back as ``ctx.saved_tensors``)."""
        self.saved_tensors = tuple(tensors)

    def mark_non_differentiable(self, *tensors):
        """Outputs that get no gradient."""
        self._non_diff.update(id(t) for t in tensors)

    def mark_dirty(self, *tensors):
        """Accepted for compatibility (in-place inputs)."""

    def set_materialize_grads(self, value):
        """Whether None output gradients become zeros (default True)."""
        self.materialize_grads = bool(value)


class Function:
    """Base class of custom ops (torch.autograd.Function)::

        class Exp(Function):
            @staticmethod
            def forward(ctx, x):
                y = x.exp(); ctx.save_for_backward(y); return y
            @staticmethod
            def backward(ctx, g):
                y, = ctx.saved_tensors; return g * y

        y = Exp.apply(x)
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        """Compute the outputs (Tensors) from the inputs; runs without graph recording."""
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grad_outputs):
        """Gradients w.r.t. each forward input (None for non-Tensor or non-differentiable ones)."""
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        """Run forward and record one graph node whose backward is cls.backward."""
        ctx = FunctionCtx()
        tins = [a if isinstance(a, Tensor) else None for a in args]
        ctx.needs_input_grad = tuple(t is not None and t.requires_grad for t in tins)
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        # outputs are on the inputs' device (only PYDDP_CUDA_ON_CPU=1 tags tensors with another)
        dev = next((t._dev for t in tins if t is not None and t._dev.type != "cpu"), None)
        if dev is not None:
            for o in outs:
                if isinstance(o, Tensor) and o._dev.type == "cpu" and \
                        not any(o is t for t in tins):
                    o._dev = dev
        if not (_st.grad and any(ctx.needs_input_grad)):
            return out
        nout = len(outs)
        shapes = [o.shape if isinstance(o, Tensor) else None for o in outs]
        dtypes = [o.dtype if isinstance(o, Tensor) else None for o in outs]
        diff = [i for i, o in enumerate(outs) if isinstance(o, Tensor)
                and id(o) not in ctx._non_diff and o.is_floating_point()]
        if not diff:
            return out
        # one node per differentiable output would need multi-output nodes; instead, each output
        # gets a node that feeds a shared collector: gradients of all outputs are gathered, then
        # cls.backward runs once when the last one arrives.  For the common single-output case
        # this is a single node.
        edges = tuple(None if t is None else _edge(t) if t.requires_grad else None
                      for t in tins)

        def run(grads):
            gts = []
            for i in range(nout):
                g = grads[i]
                if g is None and ctx.materialize_grads and shapes[i] is not None:
                    g = np.zeros(shapes[i], dtype=dtypes[i])
                gts.append(None if g is None else _new(g))
            with no_grad():
                res = cls.backward(ctx, *gts)
            if not isinstance(res, tuple):
                res = (res,)
            if len(res) < len(args):
                res = res + (None,) * (len(args) - len(res))
            out_g = []
            for i in range(len(args)):
                r = res[i]
                if r is None or tins[i] is None:
                    out_g.append(None)
                else:
                    ra = r._data if isinstance(r, Tensor) else np.asarray(r)
                    out_g.append(_red(ra, tins[i].shape, tins[i].dtype))
            return tuple(out_g)

        name = cls.__name__ + "Backward"
        if len(diff) == 1:
            k = diff[0]

            def bw(g):
                grads = [None] * nout
                grads[k] = g
                return run(grads)
            node = Node(name, bw, edges)
            o = outs[k]
            o.grad_fn, o._requires_grad = node, True
            return out
        # several differentiable outputs: a collector node fed by one identity node per output
        state = {"grads": [None] * nout}

        def collect(g):
            grads, state["grads"] = state["grads"], [None] * nout  # fresh for a retained graph
            return run(grads)
        collector = Node(name, collect, edges)
        for k in diff:
            def make(k):
                def bw(g):
                    state["grads"][k] = g
                    return (g,)
                return bw
            o = outs[k]
            o.grad_fn = Node(name + "Output", make(k), (collector,), saves=False)
            o._requires_grad = True
        return out


def once_differentiable(fn):
    """Decorator accepted for compatibility (backward already runs without graph recording)."""
    return fn
