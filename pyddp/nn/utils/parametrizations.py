"""Parametrizations by name (torch.nn.utils.parametrizations): ``weight_norm(module)`` keeps
``module.weight`` as ``g * v / ||v||`` computed from ``parametrizations.weight.original0`` (g)
and ``original1`` (v), torch 2.13's names and state_dict keys; checkpoints of the older
pyddp.nn.utils.weight_norm (``weight_g`` / ``weight_v``) load into it."""
from ..modules.module import Module
from . import parametrize
from .weight_norm import _weight_norm, norm_except_dim

__all__ = ["weight_norm"]


class _WeightNorm(Module):
    def __init__(self, dim=0):
        super().__init__()
        if dim is None:
            dim = -1
        self.dim = dim

    def forward(self, weight_g, weight_v):
        """The weight from its norm and direction."""
        return _weight_norm(weight_v, weight_g, self.dim)

    def right_inverse(self, weight):
        """(norm, direction) of a weight."""
        return norm_except_dim(weight, 2, self.dim), weight


def weight_norm(module, name="weight", dim=0):
    """Weight normalisation as a parametrization (torch.nn.utils.parametrizations.weight_norm):
    ``module.<name>`` becomes ``original0 * original1 / ||original1||`` with the norm over every
    dim but ``dim`` (the whole tensor for None).  Returns the module."""
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)

    def _weight_norm_compat_hook(mod, state_dict, prefix, local_metadata, strict, missing_keys,
                                 unexpected_keys, error_msgs):
        g_key, v_key = f"{prefix}{name}_g", f"{prefix}{name}_v"
        if g_key in state_dict and v_key in state_dict:
            state_dict[f"{prefix}parametrizations.{name}.original0"] = state_dict.pop(g_key)
            state_dict[f"{prefix}parametrizations.{name}.original1"] = state_dict.pop(v_key)
    module.register_load_state_dict_pre_hook(_weight_norm_compat_hook)
    return module
