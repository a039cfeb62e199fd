"""pyddp.autograd's public names that need the Tensor class (pyddp.autograd serves them lazily)."""
from ._engine import queue_callback  # noqa: F401
from ._graph import FREED_MSG, AccumulateGrad, Node, RemovableHandle  # noqa: F401
from .._tensor import (Tensor, backward, enable_grad, grad, no_grad,  # noqa: F401
                       set_grad_enabled, inference_mode, is_grad_enabled)
from .._tensor._core import _new, _to_array
from .function import Function, FunctionCtx, once_differentiable  # noqa: F401
from .gradcheck import GradcheckError, gradcheck  # noqa: F401

__all__ = ["backward", "grad", "queue_callback", "Function", "FunctionCtx", "gradcheck",
           "GradcheckError", "no_grad", "enable_grad", "set_grad_enabled", "Variable",
           "inference_mode", "is_grad_enabled"]


class _ExecutionEngine:
    """torch's ``Variable._execution_engine``: only queue_callback is provided."""

    @staticmethod
    def queue_callback(fn):
        """Run fn() when the running backward has finished."""
        queue_callback(fn)

    @staticmethod
    def run_backward(tensors, grad_tensors, keep_graph, create_graph=False, inputs=(),
                     allow_unreachable=True, accumulate_grad=True):
        """torch's private entry point: like autograd.backward."""
        backward(tensors, grad_tensors, keep_graph, create_graph, inputs or None)


class Variable(Tensor):
    """torch.autograd.Variable (deprecated alias of Tensor); carries ``_execution_engine``."""

    _execution_engine = _ExecutionEngine()

    def __new__(cls, data, requires_grad=False):
        t = _new(data._data if isinstance(data, Tensor) else _to_array(data))
        if requires_grad:
            t.requires_grad = True
        return t
