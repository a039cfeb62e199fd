"""Activation modules: ReLU, GELU, Tanh, Sigmoid, Softmax, LogSoftmax."""
import warnings

from .. import functional as F
from .module import Module

__all__ = ["ReLU", "GELU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax"]


class ReLU(Module):
    """``max(0, x)`` elementwise (``inplace=True`` overwrites the input)."""

    __constants__ = ["inplace"]

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        """Apply ReLU."""
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    """Gaussian error linear unit; ``approximate='tanh'`` uses the tanh approximation."""

    __constants__ = ["approximate"]

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        """Apply GELU."""
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return f"approximate={repr(self.approximate)}"


class Tanh(Module):
    """Hyperbolic tangent elementwise."""

    def forward(self, input):
        """Apply tanh."""
        return F.tanh(input)


class Sigmoid(Module):
    """Logistic sigmoid ``1 / (1 + exp(-x))`` elementwise."""

    def forward(self, input):
        """Apply the sigmoid."""
        return F.sigmoid(input)


def _get_softmax_dim(name, ndim):
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. "
                  "Change the call to include dim=X as an argument.", stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    """Softmax along ``dim``."""

    __constants__ = ["dim"]

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def forward(self, input):
        """Apply softmax along ``self.dim`` (torch's legacy choice when None, with a warning)."""
        dim = self.dim if self.dim is not None else _get_softmax_dim("softmax", len(input.shape))
        return F.softmax(input, dim)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """Log-softmax along ``dim``."""

    __constants__ = ["dim"]

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def forward(self, input):
        """Apply log-softmax along ``self.dim``."""
        dim = self.dim
        if dim is None:
            dim = _get_softmax_dim("log_softmax", len(input.shape))
        return F.log_softmax(input, dim)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return f"dim={self.dim}"
