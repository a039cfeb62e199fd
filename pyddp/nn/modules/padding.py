"""Padding modules (torch.nn.modules.padding): ConstantPad1d/2d/3d, ZeroPad1d/2d/3d,
ReflectionPad1d/2d/3d, ReplicationPad1d/2d/3d and CircularPad1d/2d/3d, each F.pad with its
mode over the last 1, 2 or 3 dimensions; ``padding`` is an int (every side) or a tuple
(left, right[, top, bottom[, front, back]]), as torch's."""
from .. import functional as F
from .module import Module
from .utils import _ntuple

__all__ = ["ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ZeroPad1d", "ZeroPad2d",
           "ZeroPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d",
           "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
           "CircularPad2d", "CircularPad3d"]


class _ConstantPadNd(Module):
    __constants__ = ["padding", "value"]
    _n = 1

    def __init__(self, padding, value):
        super().__init__()
        self.padding = _ntuple(2 * self._n, "_pad")(padding)
        self.value = value

    def forward(self, input):
        """``input`` padded with ``value``."""
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return f"padding={self.padding}, value={self.value}"


class _ModePadNd(Module):
    __constants__ = ["padding"]
    _n = 1
    _mode = "reflect"

    def __init__(self, padding):
        super().__init__()
        self.padding = _ntuple(2 * self._n, "_pad")(padding)

    def forward(self, input):
        """``input`` padded in this module's mode."""
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self):
        """The padding shown in the repr (as torch)."""
        return f"{self.padding}"


def _doc(cls, what, n):
    dims = {1: "(N, C, W) or (C, W)", 2: "(N, C, H, W) or (C, H, W)",
            3: "(N, C, D, H, W) or (C, D, H, W)"}[n]
    cls.__doc__ = f"Pads the last {n} dimension{'s' if n > 1 else ''} of {dims} input {what} " \
                  f"(torch.nn.{cls.__name__})."
    return cls


class ConstantPad1d(_ConstantPadNd):
    _n = 1


class ConstantPad2d(_ConstantPadNd):
    _n = 2


class ConstantPad3d(_ConstantPadNd):
    _n = 3


class ZeroPad1d(ConstantPad1d):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self):
        """The padding shown in the repr (as torch)."""
        return f"{self.padding}"


class ZeroPad2d(ConstantPad2d):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    extra_repr = ZeroPad1d.extra_repr


class ZeroPad3d(ConstantPad3d):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    extra_repr = ZeroPad1d.extra_repr


class ReflectionPad1d(_ModePadNd):
    _n, _mode = 1, "reflect"


class ReflectionPad2d(_ModePadNd):
    _n, _mode = 2, "reflect"


class ReflectionPad3d(_ModePadNd):
    _n, _mode = 3, "reflect"


class ReplicationPad1d(_ModePadNd):
    _n, _mode = 1, "replicate"


class ReplicationPad2d(_ModePadNd):
    _n, _mode = 2, "replicate"


class ReplicationPad3d(_ModePadNd):
    _n, _mode = 3, "replicate"


class CircularPad1d(_ModePadNd):
    _n, _mode = 1, "circular"


class CircularPad2d(_ModePadNd):
    _n, _mode = 2, "circular"


class CircularPad3d(_ModePadNd):
    _n, _mode = 3, "circular"


for _c in (ConstantPad1d, ConstantPad2d, ConstantPad3d):
    _doc(_c, "with a constant ``value``", _c._n)
for _c in (ZeroPad1d, ZeroPad2d, ZeroPad3d):
    _doc(_c, "with zeros", _c._n)
for _c in (ReflectionPad1d, ReflectionPad2d, ReflectionPad3d):
    _doc(_c, "with its reflection (the edge not repeated)", _c._n)
for _c in (ReplicationPad1d, ReplicationPad2d, ReplicationPad3d):
    _doc(_c, "by repeating its edge", _c._n)
for _c in (CircularPad1d, CircularPad2d, CircularPad3d):
    _doc(_c, "circularly (wrapping around)", _c._n)
del _c
