"""Flatten and Unflatten (torch.nn.Flatten, torch.nn.Unflatten)."""
from .module import Module

__all__ = ["Flatten", "Unflatten"]


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


class Unflatten(Module):
    """Split dimension ``dim`` into ``unflattened_size`` (Tensor.unflatten)."""

    __constants__ = ["dim", "unflattened_size"]

    def __init__(self, dim, unflattened_size):
        super().__init__()
        if isinstance(dim, str):
            raise TypeError("pyddp tensors have no named dimensions: dim must be an int")
        if not isinstance(dim, int):
            raise TypeError("invalid argument type for dim parameter")
        if not isinstance(unflattened_size, (tuple, list)):
            raise TypeError("unflattened_size must be tuple of ints, but found type "
                            f"{type(unflattened_size).__name__}")
        for idx, elem in enumerate(unflattened_size):
            if not isinstance(elem, int):
                raise TypeError("unflattened_size must be tuple of ints, but found element of "
                                f"type {type(elem).__name__} at pos {idx}")
        self.dim = dim
        self.unflattened_size = unflattened_size

    def forward(self, input):
        """``input.unflatten(dim, unflattened_size)``."""
        return input.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
