"""pyddp.nn.utils: gradient clipping, parameter/vector conversion, weight_norm and
parametrizations (torch.nn.utils)."""
from .clip_grad import clip_grad_norm, clip_grad_norm_, clip_grad_value_, get_total_norm  # noqa: F401
from .convert_parameters import parameters_to_vector, vector_to_parameters  # noqa: F401
from .weight_norm import remove_weight_norm, weight_norm  # noqa: F401
from . import parametrize, parametrizations  # noqa: F401,E402

__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_", "get_total_norm",
           "parameters_to_vector", "vector_to_parameters", "weight_norm", "remove_weight_norm",
           "parametrize", "parametrizations"]
