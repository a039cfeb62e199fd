"""Parameter: a Tensor that a Module registers as trainable state (torch.nn.Parameter)."""
import numpy as np

from .._tensor import Tensor

__all__ = ["Parameter", "Buffer"]


class Parameter(Tensor):
    """A leaf Tensor that requires grad by default and is registered by Modules on assignment.

    ``Parameter(data, requires_grad=True)``: ``data`` (a Tensor or ndarray) is shared,
    not copied, as in torch.  Only floating-point data may require grad.
    """

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = np.empty((0,), dtype=np.float32)
        elif not isinstance(data, (Tensor, np.ndarray)):
            data = np.asarray(data)
        super().__init__(data, requires_grad=False)
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, proto):
        # Plain pickling (multiprocessing, weights_only=False checkpoints) keeps the class.
        return (_rebuild_parameter, (self._data, self._requires_grad))


def _rebuild_parameter(data, requires_grad):
    return Parameter(data, requires_grad=requires_grad)


class Buffer(Tensor):
    """Marker for a Module buffer (torch.nn.Buffer): ``module.x = Buffer(arr, persistent=True)``
    registers ``x`` as a buffer; the module stores a plain Tensor sharing the data."""

    def __init__(self, data=None, *, persistent=True):
        if data is None:
            data = np.empty((0,), dtype=np.float32)
        elif not isinstance(data, (Tensor, np.ndarray)):
            data = np.asarray(data)
        super().__init__(data)
        self.persistent = persistent
