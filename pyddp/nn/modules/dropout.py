"""Dropout (torch.nn.Dropout)."""
from .. import functional as F
from .module import Module

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d"]


class _DropoutNd(Module):
    __constants__ = ["p", "inplace"]

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """In training, zero each element with probability ``p`` and scale the rest by 1/(1-p);
    the identity in eval mode."""

    def forward(self, input):
        """Apply dropout (only when ``self.training``)."""
        return F.dropout(input, self.p, self.training, self.inplace)


class Dropout1d(_DropoutNd):
    """Zero entire channels of (N, C, L) or (C, L) input with probability ``p`` (training only),
    scaling the rest by 1/(1-p) (torch.nn.Dropout1d)."""

    def forward(self, input):
        """Channel-wise dropout (only when ``self.training``)."""
        return F.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(_DropoutNd):
    """Zero entire channels of (N, C, H, W) input with probability ``p`` (torch.nn.Dropout2d)."""

    def forward(self, input):
        """Channel-wise dropout (only when ``self.training``)."""
        return F.dropout2d(input, self.p, self.training, self.inplace)


class Dropout3d(_DropoutNd):
    """Zero entire channels of (N, C, D, H, W) or (C, D, H, W) input with probability ``p``
    (torch.nn.Dropout3d)."""

    def forward(self, input):
        """Channel-wise dropout (only when ``self.training``)."""
        return F.dropout3d(input, self.p, self.training, self.inplace)
