"""Identity and Linear (torch.nn.Linear)."""
import math

from .. import functional as F
from .. import init
from .module import Module
from .utils import _empty_parameter

__all__ = ["Identity", "Linear"]


class Identity(Module):
    """A placeholder that returns its input unchanged (constructor arguments are ignored)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        """Return ``input``."""
        return input


class Linear(Module):
    """``y = x @ weight.T + bias``, weight of shape (out_features, in_features).

    Initialised as torch: weight by ``kaiming_uniform_(a=sqrt(5))`` (U(-1/sqrt(in), 1/sqrt(in))),
    bias by U(-1/sqrt(fan_in), 1/sqrt(fan_in)).  ``device`` is accepted and ignored.
    """

    __constants__ = ["in_features", "out_features"]

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = _empty_parameter((out_features, in_features), dtype)
        if bias:
            self.bias = _empty_parameter((out_features,), dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Re-draw the weight and bias with torch's default initialisation."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input):
        """Apply the affine map to the last dimension of ``input``."""
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")
