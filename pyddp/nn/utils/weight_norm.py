"""Weight normalisation by forward pre-hook (torch.nn.utils.weight_norm, deprecated in torch in
favour of pyddp.nn.utils.parametrizations.weight_norm): the parameter ``name`` is replaced by
``name_g`` (its norm over every dim but ``dim``) and ``name_v`` (its direction), and recomputed as
``v * g / ||v||`` before each forward."""
import warnings

from ..parameter import Parameter

__all__ = ["WeightNorm", "weight_norm", "remove_weight_norm", "norm_except_dim"]


def norm_except_dim(v, pow=2, dim=0):
    """The ``pow``-norm of ``v`` over every dimension but ``dim``, kept as size-1 dims
    (torch.norm_except_dim); ``dim=-1`` (or None) is the norm of the whole tensor, a 0-d tensor,
    as in torch.  Differentiable."""
    if dim is None or dim == -1:
        return (v.abs() ** pow).sum() ** (1.0 / pow)
    d = dim % v.ndim
    axes = tuple(i for i in range(v.ndim) if i != d)
    if not axes:
        return v.abs()
    return (v.abs() ** pow).sum(dim=axes, keepdim=True) ** (1.0 / pow)


def _weight_norm(v, g, dim):
    """v * (g / ||v||) with the norm over every dim but ``dim`` (torch._weight_norm)."""
    return v * (g / norm_except_dim(v, 2, dim))


class WeightNorm:
    """The forward pre-hook of weight_norm (torch.nn.utils.weight_norm.WeightNorm)."""

    def __init__(self, name, dim):
        if dim is None:
            dim = -1
        self.name = name
        self.dim = dim

    def compute_weight(self, module):
        """The weight from ``name_g`` and ``name_v``."""
        g = getattr(module, self.name + "_g")
        v = getattr(module, self.name + "_v")
        return _weight_norm(v, g, self.dim)

    @staticmethod
    def apply(module, name, dim):
        """Split ``module.name`` into ``name_g`` and ``name_v`` and register the hook."""
        warnings.warn("`torch.nn.utils.weight_norm` is deprecated in favor of "
                      "`torch.nn.utils.parametrizations.weight_norm`.", FutureWarning,
                      stacklevel=3)
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm) and hook.name == name:
                raise RuntimeError(f"Cannot register two weight_norm hooks on the same "
                                   f"parameter {name}")
        if dim is None:
            dim = -1
        fn = WeightNorm(name, dim)
        weight = getattr(module, name)
        del module._parameters[name]
        module.register_parameter(name + "_g", Parameter(norm_except_dim(weight, 2, dim).data
                                                         ._data.copy()))
        module.register_parameter(name + "_v", Parameter(weight.data))
        setattr(module, name, fn.compute_weight(module))
        module.register_forward_pre_hook(fn)
        return fn

    def remove(self, module):
        """Put back ``module.name`` as one Parameter with the current weight."""
        weight = self.compute_weight(module)
        delattr(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        setattr(module, self.name, Parameter(weight.data))

    def __call__(self, module, inputs):
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module, name="weight", dim=0):
    """Reparametrise ``module.name`` as ``name_g * name_v / ||name_v||`` (torch.nn.utils
    .weight_norm, with torch's FutureWarning): ``name_g`` and ``name_v`` become the parameters,
    the weight is recomputed before each forward.  Returns the module."""
    WeightNorm.apply(module, name, dim)
    return module


def remove_weight_norm(module, name="weight"):
    """Undo weight_norm: ``module.name`` is one Parameter again (torch's ValueError when the
    module has no weight_norm of that name).  Returns the module."""
    for k, hook in module._forward_pre_hooks.items():
        if isinstance(hook, WeightNorm) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[k]
            return module
    raise ValueError(f"weight_norm of '{name}' not found in {module}")


