"""LayerNorm (torch.nn.LayerNorm)."""
import numbers

from .. import functional as F
from .. import init
from .module import Module
from .utils import _empty_parameter

__all__ = ["LayerNorm"]


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
