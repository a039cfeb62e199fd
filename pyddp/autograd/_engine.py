"""The backward engine.

A non-leaf Tensor points at the Node that made it (``grad_fn``); a leaf that requires grad gets one
``AccumulateGrad`` node (created on first use, then reused); see pyddp/autograd/_graph.py.  Nodes
hold ``_next`` (one entry per differentiable input: a Node or None) and a backward closure
``fn(grad) -> tuple`` working on NumPy arrays.  The engine walks the graph in dependency order
(iteratively), sums the gradients flowing into each node, runs tensor hooks, accumulates leaf
gradients in place and fires post-accumulate-grad hooks as soon as a leaf's gradient is final, then
runs queued callbacks.

This module imports only the graph module, never the Tensor: pyddp._tensor imports it and hands
it the Tensor class (``_set_tensor_class``), which the engine needs to wrap gradients for hooks and
``.grad``.
"""
from __future__ import annotations

import heapq
import sys

import numpy as np

from ._graph import FREED_MSG, AccumulateGrad

# ----------------------------------------------------------------------------------------------
# the engine

_callbacks_stack = []   # one list of queued callbacks per running backward (nested: reentrant)
_Tensor = None         # pyddp.Tensor, set by pyddp._tensor when it is defined


def _set_tensor_class(cls, grad_add=None):
    """Called once by pyddp._tensor with the Tensor class (this module does not import it) and
    the function that sums two gradients of one node (float16/bfloat16 through float32: NumPy's
    and ml_dtypes' half additions are scalar loops)."""
    global _Tensor, _grad_add
    _Tensor = cls
    if grad_add is not None:
        _grad_add = grad_add


def _grad_add(a, b):
    return a + b


def queue_callback(fn):
    """Run fn() when the backward currently running has finished (torch's
    ``Variable._execution_engine.queue_callback``)."""
    if not _callbacks_stack:
        raise RuntimeError("Final callbacks can only be installed during backward pass.")
    _callbacks_stack[-1].append(fn)


# refcount of an ndarray held only by one local variable and the getrefcount argument
_BASE_REFS = None


def _owned(g):
    """True when nobody else can see g's memory, so it may become a leaf's .grad without a copy."""
    if not (g.flags.writeable and g.flags.c_contiguous):
        return False
    # g is referenced by: the caller's local, this function's argument and getrefcount's argument
    if sys.getrefcount(g) > _BASE_REFS:
        return False
    b = g.base
    if b is None:
        return True
    # a view: its owner must be referenced by this view only (plus our local b, getrefcount arg)
    return isinstance(b, np.ndarray) and b.base is None and sys.getrefcount(b) <= 3


def _probe():
    global _BASE_REFS
    _BASE_REFS = 1 << 30

    def caller():
        g = np.empty(2)
        return _count(g)

    def _count(g):
        return sys.getrefcount(g)
    _BASE_REFS = caller()


_probe()


def _apply_tensor_hooks(hooks, g):
    T = _Tensor
    for fn in list(hooks.values()):
        r = fn(T._wrap(g))
        if r is not None:
            g = r._data if isinstance(r, T) else np.asarray(r)
    return g


def _accumulate(node, g, capture):
    var = node.variable
    adopt = getattr(var, "_grad_adopt", None)
    if adopt is not None:  # the gradient was computed into DDP's bucket (_claim_grad_dest)
        var._grad_adopt = None
    if node._pre_hooks:
        g = _apply_tensor_hooks(node._pre_hooks, g)
    if capture is not None:
        if node in capture:
            capture[node] = g
        return
    if g.dtype != var._data.dtype:
        g = g.astype(var._data.dtype)
    elif g.shape != var._data.shape:
        g = np.broadcast_to(g, var._data.shape)
    cur = var._grad
    if cur is None:
        if g is not adopt and not _owned(g):
            g = np.array(g, order="C", copy=True)
        if g.shape != var._data.shape:
            g = np.array(np.broadcast_to(g, var._data.shape))
        var._grad = _Tensor._wrap(g)
    else:
        cd = cur._data
        np.add(cd, g, out=cd)
    # the hooks (DDP's) may count the references to the claimed array: hold none of our own
    adopt = g = None
    ph = var._post_hooks
    if ph:
        for fn in list(ph.values()):
            fn(var)


def run_backward(roots, grads, retain_graph=False, capture=None):
    """Backpropagate from root nodes (list of Node) with gradients (list of ndarray).

    capture: None, or a dict {node: None} of nodes whose incoming gradient is recorded instead of
    accumulated (autograd.grad).
    """
    # dependency counts, iteratively
    deps = {}
    stack = []
    for r in roots:
        if r not in deps:
            deps[r] = 0
            stack.append(r)
    while stack:
        n = stack.pop()
        for nx in n._next:
            if nx is None:
                continue
            if nx in deps:
                deps[nx] += 1
            else:
                deps[nx] = 1
                stack.append(nx)

    buffers = {}
    for r, g in zip(roots, grads):
        if r in buffers:
            buffers[r] = buffers[r] + g
        else:
            buffers[r] = g
    ready = []
    for r in buffers:
        if deps[r] == 0:
            heapq.heappush(ready, (-r.seq, id(r), r))

    callbacks = []
    _callbacks_stack.append(callbacks)
    # gradients through inf / NaN (an fp16 step that overflowed, which GradScaler then skips) are
    # computed silently, as torch's backward does: no NumPy "overflow" / "invalid value" warnings
    quiet = np.errstate(over="ignore", invalid="ignore", divide="ignore")
    quiet.__enter__()
    try:
        while ready:
            _, _, node = heapq.heappop(ready)
            if type(node) is AccumulateGrad:
                # no local reference to the gradient here: _accumulate may adopt it without a copy
                if buffers.get(node) is not None:
                    _accumulate(node, buffers.pop(node), capture)
                else:
                    buffers.pop(node, None)
                continue
            g = buffers.pop(node, None)
            nexts = node._next
            if g is None:
                grads_in = (None,) * len(nexts)
            else:
                if node._pre_hooks:
                    g = _apply_tensor_hooks(node._pre_hooks, g)
                if capture is not None and node in capture:
                    capture[node] = g
                fn = node.fn
                if fn is None:
                    raise RuntimeError(FREED_MSG)
                grads_in = fn(g)
                if not retain_graph and node._saves:
                    node.fn = None
                if node._hooks:
                    T = _Tensor
                    gi_t = tuple(None if x is None else T._wrap(x) for x in grads_in)
                    for h in list(node._hooks.values()):
                        h(gi_t, (T._wrap(g),))
            del g
            for nx, gi in zip(nexts, grads_in):
                if nx is None:
                    continue
                if gi is not None:
                    prev = buffers.get(nx)
                    if prev is None:
                        buffers[nx] = gi
                    else:
                        buffers[nx] = _grad_add(prev, gi)
                    prev = None
                d = deps[nx] - 1
                deps[nx] = d
                if d == 0:
                    if nx not in buffers:
                        buffers[nx] = None
                    heapq.heappush(ready, (-nx.seq, id(nx), nx))
            del grads_in
            gi = None   # no gradient outlives its step here (DDP counts references to its slots)
        # callbacks queued during this backward (they may queue more)
        i = 0
        while i < len(callbacks):
            callbacks[i]()
            i += 1
    finally:
        quiet.__exit__(None, None, None)
        _callbacks_stack.pop()
