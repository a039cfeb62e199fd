"""Upsample, UpsamplingNearest2d and UpsamplingBilinear2d (torch.nn.Upsample*), each
F.interpolate with the module's size or scale factor and mode."""
from .. import functional as F
from .module import Module

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]


class Upsample(Module):
    """Resize the spatial dims to ``size`` or by ``scale_factor`` with ``mode`` (nearest,
    linear, bilinear, bicubic, trilinear, area, nearest-exact) and ``align_corners``, as
    F.interpolate (torch.nn.Upsample)."""

    __constants__ = ["size", "scale_factor", "mode", "align_corners", "name",
                     "recompute_scale_factor"]

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, tuple):
            self.scale_factor = tuple(float(f) for f in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):
        """``input`` resized."""
        return F.interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                             recompute_scale_factor=self.recompute_scale_factor)

    def __setstate__(self, state):
        if "recompute_scale_factor" not in state:
            state["recompute_scale_factor"] = True
        super().__setstate__(state)

    def extra_repr(self):
        """size or scale_factor, and mode, shown in the repr (as torch)."""
        if self.scale_factor is not None:
            info = "scale_factor=" + repr(self.scale_factor)
        else:
            info = "size=" + repr(self.size)
        return info + ", mode=" + repr(self.mode)


class UpsamplingNearest2d(Upsample):
    """Nearest-neighbour upsampling of (N, C, H, W) input (torch.nn.UpsamplingNearest2d)."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear upsampling of (N, C, H, W) input with ``align_corners=True``
    (torch.nn.UpsamplingBilinear2d)."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
