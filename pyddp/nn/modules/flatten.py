"""Flatten (torch.nn.Flatten)."""
from .module import Module

__all__ = ["Flatten"]


class Flatten(Module):
    """Flatten dimensions ``start_dim..end_dim`` into one (default: all but the batch dim)."""

    __constants__ = ["start_dim", "end_dim"]

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input):
        """Reshape ``input`` with the chosen dimensions merged."""
        shape = tuple(input.shape)
        nd = len(shape)
        if nd == 0:
            return input.reshape((1,))
        start = self.start_dim + nd if self.start_dim < 0 else self.start_dim
        end = self.end_dim + nd if self.end_dim < 0 else self.end_dim
        if not (0 <= start < nd and 0 <= end < nd):
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], "
                f"but got {self.start_dim if not 0 <= start < nd else self.end_dim})")
        if start > end:
            raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
        merged = 1
        for s in shape[start:end + 1]:
            merged *= s
        return input.reshape(shape[:start] + (merged,) + shape[end + 1:])

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
