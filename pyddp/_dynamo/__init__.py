"""``pyddp._dynamo``: torch._dynamo's entry points that training scripts call, kept like
pyddp.backends.cudnn's switches: accepted, recorded where there is something to record, doing
nothing.  pyddp has no graph compiler; its tensors run eagerly on NumPy, so ``pyddp.compile``
(torch.compile) returns the model or function unchanged and ``reset()`` has no caches to clear.
``config`` holds torch._dynamo.config's switches (pyddp/_dynamo/config.py).
"""
from . import config  # noqa: F401

__all__ = ["config", "reset", "disable", "mark_dynamic", "mark_static", "maybe_mark_dynamic",
           "is_compiling", "allow_in_graph", "compile"]


def reset():
    """Clear compiled code and caches (torch._dynamo.reset): pyddp compiles nothing, so there
    is nothing to clear."""


def is_compiling():
    """False: pyddp code is never being traced by a compiler."""
    return False


def disable(fn=None, recursive=True, *, reason=None):
    """Exclude ``fn`` from compilation (torch._dynamo.disable): returns ``fn`` itself (as a
    decorator without arguments too), since nothing is compiled."""
    if fn is None:
        return lambda f: f
    return fn


def allow_in_graph(fn):
    """torch._dynamo.allow_in_graph: returns ``fn``."""
    return fn


def mark_dynamic(t, index, *, min=None, max=None, specialize_on=None):
    """Mark a dimension of ``t`` dynamic for the compiler (torch._dynamo.mark_dynamic): nothing
    to do."""


def maybe_mark_dynamic(t, index):
    """torch._dynamo.maybe_mark_dynamic: nothing to do."""


def mark_static(t, index=None):
    """torch._dynamo.mark_static: nothing to do."""


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,
            options=None, disable=False, **kwargs):
    """torch.compile: pyddp has no compiler, so the model (a Module or function) is returned as
    it is and runs eagerly, with the same results.  ``compile(fullgraph=True, ...)`` without a
    model returns a decorator doing the same.  ``mode`` is checked as torch checks it."""
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified "
                           "at the same time.")
    if mode is not None and mode not in ("default", "reduce-overhead", "max-autotune",
                                         "max-autotune-no-cudagraphs"):
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: default, "
                           "reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    if model is None:
        return lambda m: m
    if not callable(model):
        raise RuntimeError("The input to torch.compile should be callable")   # (as torch's)
    return model
