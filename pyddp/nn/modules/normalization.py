"""LayerNorm, GroupNorm and RMSNorm (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.RMSNorm)."""
import numbers

from .. import functional as F
from .. import init
from .module import Module
from .utils import _empty_parameter

__all__ = ["LayerNorm", "GroupNorm", "RMSNorm"]


class LayerNorm(Module):
    """Layer normalisation over the trailing ``normalized_shape`` dimensions (torch.nn.LayerNorm).

    Weight initialised to ones and bias to zeros (``bias=False`` drops the bias).
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if self.elementwise_affine:
            self.weight = _empty_parameter(self.normalized_shape, dtype)
            if bias:
                self.bias = _empty_parameter(self.normalized_shape, dtype)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Weight to ones, bias to zeros."""
        if self.elementwise_affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input):
        """Normalise the trailing dimensions of ``input``."""
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return ("{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}, "
                "bias={use_bias}".format(**self.__dict__, use_bias=self.bias is not None))


class GroupNorm(Module):
    """Group normalisation (torch.nn.GroupNorm): the channels of (N, C, ...) input are split into
    ``num_groups`` groups, each normalised over its channels and the remaining dims per sample;
    then a per-channel ``weight`` (ones) and ``bias`` (zeros) when ``affine`` (``bias=False``
    drops the shift).  ``num_channels`` must be divisible by ``num_groups`` (torch's
    ValueError)."""

    __constants__ = ["num_groups", "num_channels", "eps", "affine"]

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None,
                 *, bias=True):
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if self.affine:
            self.weight = _empty_parameter((num_channels,), dtype)
            if bias:
                self.bias = _empty_parameter((num_channels,), dtype)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Weight to ones, bias to zeros."""
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input):
        """Normalise ``input`` by groups of channels."""
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return ("{num_groups}, {num_channels}, eps={eps}, affine={affine}, "
                "bias={use_bias}".format(**self.__dict__, use_bias=self.bias is not None))


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing ``normalized_shape`` dimensions
    (torch.nn.RMSNorm; eps None: the input dtype's machine epsilon).  Weight initialised to
    ones."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if self.elementwise_affine:
            self.weight = _empty_parameter(self.normalized_shape, dtype)
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Weight to ones."""
        if self.elementwise_affine:
            init.ones_(self.weight)

    def forward(self, x):
        """F.rms_norm over the normalized dimensions."""
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(
            **self.__dict__)
