"""PixelShuffle and PixelUnshuffle (torch.nn.PixelShuffle / PixelUnshuffle)."""
from .. import functional as F
from .module import Module

__all__ = ["PixelShuffle", "PixelUnshuffle"]


class PixelShuffle(Module):
    """(*, C r^2, H, W) -> (*, C, H r, W r) with r = ``upscale_factor`` (F.pixel_shuffle)."""

    __constants__ = ["upscale_factor"]

    def __init__(self, upscale_factor):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input):
        """Rearrange channels of ``input`` into space."""
        return F.pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self):
        """The constructor argument shown in the repr (as torch)."""
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """(*, C, H r, W r) -> (*, C r^2, H, W) with r = ``downscale_factor`` (F.pixel_unshuffle)."""

    __constants__ = ["downscale_factor"]

    def __init__(self, downscale_factor):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input):
        """Rearrange space of ``input`` into channels."""
        return F.pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self):
        """The constructor argument shown in the repr (as torch)."""
        return f"downscale_factor={self.downscale_factor}"
