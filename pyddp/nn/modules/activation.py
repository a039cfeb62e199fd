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


# ---------------------------------------------------------------- more activations (torch.nn)

def _act(name, fn, params=(), doc=""):
    """A module class applying ``F.<fn>(input, **its constructor arguments)``."""
    names = [p for p, _ in params]

    def __init__(self, *args, **kwargs):
        Module.__init__(self)
        if len(args) > len(params):
            raise TypeError(f"{name}() takes at most {len(params)} arguments")
        vals = dict(params)
        vals.update(zip(names, args))
        for k, v in kwargs.items():
            if k not in vals:
                raise TypeError(f"{name}() got an unexpected keyword argument '{k}'")
            vals[k] = v
        for k in names:
            setattr(self, k, vals[k])

    def forward(self, input):
        return getattr(F, fn)(input, *[getattr(self, k) for k in names if k != "inplace"])

    def extra_repr(self):
        if names == ["lambd"]:
            return str(self.lambd)   # torch's shrink modules show the bare value
        return ", ".join(f"{k}={getattr(self, k)}" for k in names
                         if k != "inplace" or getattr(self, k))
    forward.__doc__ = f"Apply {fn}."
    extra_repr.__doc__ = "The constructor arguments shown in the repr (as torch)."
    return type(name, (Module,), {"__init__": __init__, "forward": forward,
                                  "extra_repr": extra_repr, "__constants__": names,
                                  "__doc__": doc or f"torch.nn.{name}: F.{fn} elementwise.",
                                  "__module__": __name__})


LeakyReLU = _act("LeakyReLU", "leaky_relu", (("negative_slope", 0.01), ("inplace", False)))
ELU = _act("ELU", "elu", (("alpha", 1.0), ("inplace", False)))
CELU = _act("CELU", "celu", (("alpha", 1.0), ("inplace", False)))
SELU = _act("SELU", "selu", (("inplace", False),))
SiLU = _act("SiLU", "silu", (("inplace", False),))
Mish = _act("Mish", "mish", (("inplace", False),))
ReLU6 = _act("ReLU6", "relu6", (("inplace", False),))
Hardtanh = _act("Hardtanh", "hardtanh", (("min_val", -1.0), ("max_val", 1.0),
                                         ("inplace", False)))
Softplus = _act("Softplus", "softplus", (("beta", 1.0), ("threshold", 20.0)))
Softsign = _act("Softsign", "softsign")
Hardswish = _act("Hardswish", "hardswish", (("inplace", False),))
Hardsigmoid = _act("Hardsigmoid", "hardsigmoid", (("inplace", False),))
LogSigmoid = _act("LogSigmoid", "logsigmoid")
Tanhshrink = _act("Tanhshrink", "tanhshrink")
Softshrink = _act("Softshrink", "softshrink", (("lambd", 0.5),))
Hardshrink = _act("Hardshrink", "hardshrink", (("lambd", 0.5),))
Threshold = _act("Threshold", "threshold", (("threshold", None), ("value", None),
                                            ("inplace", False)))
GLU = _act("GLU", "glu", (("dim", -1),))
Softmin = _act("Softmin", "softmin", (("dim", None),))


class PReLU(Module):
    """torch.nn.PReLU(num_parameters=1, init=0.25): leaky ReLU with a learned slope (per
    channel when num_parameters > 1)."""

    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        from ... import _tensor
        from ..parameter import Parameter
        self.num_parameters = int(num_parameters)
        self.init = init
        self.weight = Parameter(_tensor.full((self.num_parameters,), float(init),
                                             dtype=dtype or _tensor.float32))

    def forward(self, input):
        """Apply PReLU."""
        return F.prelu(input, self.weight)

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return f"num_parameters={self.num_parameters}"


class CosineSimilarity(Module):
    """torch.nn.CosineSimilarity(dim=1, eps=1e-8)."""

    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        """Cosine similarity of x1 and x2 along dim."""
        return F.cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Module):
    """torch.nn.PairwiseDistance(p=2.0, eps=1e-6, keepdim=False)."""

    def __init__(self, p=2.0, eps=1e-6, keepdim=False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1, x2):
        """The p-distance of x1 and x2 along the last dimension."""
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


__all__ += ["LeakyReLU", "ELU", "CELU", "SELU", "SiLU", "Mish", "ReLU6", "Hardtanh", "Softplus",
            "Softsign", "Hardswish", "Hardsigmoid", "LogSigmoid", "Tanhshrink", "Softshrink",
            "Hardshrink", "Threshold", "GLU", "Softmin", "PReLU", "CosineSimilarity",
            "PairwiseDistance"]
