"""pyddp.autograd: backward, grad, queue_callback, custom Functions and gradcheck (torch.autograd).

The graph (``_graph``) and the engine (``_engine``) import nothing of pyddp's tensors; the names that
need the Tensor class (Tensor, backward, grad, Function, gradcheck, Variable, the grad modes) come
from ``_api`` on first use, so importing the package (which pyddp._tensor does for its engine)
never imports pyddp._tensor in turn.
"""
import importlib as _importlib

from ._engine import queue_callback  # noqa: F401
from ._graph import FREED_MSG, AccumulateGrad, Node, RemovableHandle  # noqa: F401

__all__ = ["backward", "grad", "queue_callback", "Function", "FunctionCtx", "gradcheck",
           "GradcheckError", "no_grad", "enable_grad", "set_grad_enabled", "Variable",
           "inference_mode", "is_grad_enabled"]

_LAZY = frozenset({"Tensor", "backward", "grad", "enable_grad", "no_grad", "set_grad_enabled",
                   "inference_mode", "is_grad_enabled", "Function", "FunctionCtx",
                   "once_differentiable", "GradcheckError", "gradcheck", "Variable"})
_LAZY_SUBMODULES = frozenset({"function"})


def __getattr__(name):
    # importlib, never ``from . import``: that looks the name up here first, i.e. calls this
    if name in _LAZY:
        api = _importlib.import_module(f"{__name__}._api")
        # every name at once: importing _api binds the submodules function and gradcheck here,
        # and the name gradcheck must stay the function, as it always was
        g = globals()
        for n in _LAZY:
            g[n] = getattr(api, n)
        return g[name]
    elif name in _LAZY_SUBMODULES:
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | _LAZY | _LAZY_SUBMODULES)
