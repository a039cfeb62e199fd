"""``pyddp._dynamo.config``: torch._dynamo.config's switches that training scripts set
(``suppress_errors``, ``cache_size_limit``, ``optimize_ddp``, ...), with torch 2.13's defaults.

They are accepted and recorded, and do nothing: pyddp has no compiler (``pyddp.compile`` returns
the model as it is), as pyddp.backends.cudnn's switches are kept without cuDNN.  A name torch's
config does not have either raises its AttributeError ("pyddp._dynamo.config.foo does not
exist"); ``patch``, ``get_config_copy``, ``save_config`` and ``load_config`` work as torch's.
"""
from ._switches import install as _install

_install(__name__, {
    "suppress_errors": False,
    "verbose": False,
    "cache_size_limit": 8,
    "recompile_limit": 8,
    "accumulated_cache_size_limit": 256,
    "accumulated_recompile_limit": 256,
    "optimize_ddp": True,
    "automatic_dynamic_shapes": True,
    "assume_static_by_default": True,
    "dynamic_shapes": True,
    "capture_scalar_outputs": False,
    "capture_dynamic_output_shape_ops": False,
    "inline_inbuilt_nn_modules": True,
    "specialize_int": False,
    "force_parameter_static_shapes": True,
    "log_compilation_metrics": True,
    "error_on_recompile": False,
    "allow_unspec_int_on_nn_module": False,
    "guard_nn_modules": True,
})
