"""The autograd graph: nodes (torch's ``grad_fn`` objects), the AccumulateGrad node of a leaf, hook
handles, and ``_edge`` (the node a tensor's gradient flows into).

Both sides of autograd import this module and it imports neither: pyddp._tensor builds graphs of
these nodes, pyddp.autograd._engine walks them.
"""
import itertools

_seq = itertools.count()

FREED_MSG = (
    "Trying to backward through the graph a second time (or directly access saved tensors after "
    "they have already been freed). Saved intermediate values of the graph are freed when you call "
    ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the "
    "graph a second time or if you need to access saved tensors after calling backward.")


class Node:
    """One backward function of the graph (torch's ``grad_fn`` objects)."""

    __slots__ = ("fn", "_next", "seq", "_name", "_saves", "_pre_hooks", "_hooks",
                 "__weakref__")

    def __init__(self, name, fn, next_functions, saves=True):
        self._name = name
        self.fn = fn
        self._next = next_functions
        self.seq = next(_seq)
        self._saves = saves
        self._pre_hooks = None
        self._hooks = None

    def name(self):
        """The node's name, e.g. ``'MulBackward0'``."""
        return self._name

    @property
    def next_functions(self):
        """((node or None, 0), ...) per input, as torch shows it."""
        return tuple((n, 0) for n in self._next)

    def __call__(self, *grads):
        """Run this node's backward on ndarray/Tensor gradients (debugging aid)."""
        if self.fn is None:
            raise RuntimeError(FREED_MSG)
        g = grads[0]
        return self.fn(getattr(g, "_data", g))

    def register_prehook(self, fn):
        """fn(grad Tensor) -> None or a replacement, run before this node's backward."""
        if self._pre_hooks is None:
            self._pre_hooks = {}
        return _add_hook(self._pre_hooks, fn)

    def register_hook(self, fn):
        """fn(grad_inputs tuple, grad_outputs tuple) run after this node's backward (no replacement)."""
        if self._hooks is None:
            self._hooks = {}
        return _add_hook(self._hooks, fn)

    def __repr__(self):
        return f"<{self._name} object at {id(self):#x}>"


class AccumulateGrad(Node):
    """The node that accumulates a leaf's gradient into ``leaf.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        Node.__init__(self, "AccumulateGrad", None, (), saves=False)
        self.variable = variable
        # processed as soon as ready (torch gives AccumulateGrad the highest priority)
        self.seq = 1 << 62


class RemovableHandle:
    """Returned by the register_*hook methods; ``remove()`` unregisters the hook."""

    __slots__ = ("_dict", "id")
    _ids = itertools.count()

    def __init__(self, d):
        self._dict = d
        self.id = next(RemovableHandle._ids)

    def remove(self):
        """Unregister the hook (idempotent)."""
        self._dict.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _add_hook(d, fn):
    h = RemovableHandle(d)
    d[h.id] = fn
    return h


def _edge(t):
    """The node t's gradient flows into: its grad_fn, its AccumulateGrad (made on first use) when
    it is a leaf that requires grad, else None."""
    n = t.grad_fn
    if n is not None:
        return n
    if t._requires_grad:
        a = t._accum
        if a is None:
            a = t._accum = AccumulateGrad(t)
        return a
    return None
