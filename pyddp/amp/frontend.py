"""amp.initialize, amp.state_dict, amp.load_state_dict, amp.master_params (apex.amp's frontend).

Opt levels (apex's table; any explicit keyword overrides the level's default):

====== =============== ===================== =================== ============== ==========
level  cast_model_type patch_torch_functions keep_batchnorm_fp32 master_weights loss_scale
====== =============== ===================== =================== ============== ==========
O0     float32         False                 None                False          1.0
O1     None            True (autocast)       None                None           "dynamic"
O2     float16         False                 True                True           "dynamic"
O3     float16         False                 False               False          1.0
====== =============== ===================== =================== ============== ==========
"""
from __future__ import annotations

import functools
from collections import OrderedDict

from . import _fw
from ._amp_state import _amp_state, maybe_print, warn_or_err
from ._process_optimizer import process_optimizer
from .scaler import LossScaler

__all__ = ["initialize", "state_dict", "load_state_dict", "master_params", "Properties"]


class Properties:
    """The options of an amp run (apex's Properties), checked as they are set."""

    def __init__(self):
        self.options = {
            "enabled": False,
            "opt_level": None,
            "cast_model_type": None,
            "patch_torch_functions": False,
            "keep_batchnorm_fp32": None,
            "master_weights": None,
            "loss_scale": 1.0,
        }

    def _update_options_dict(self, new_options):
        for k, v in new_options.items():
            if k in self.options:
                self.options[k] = v
            else:
                raise ValueError(f"Tried to set unexpected option {k}")

    def __getattr__(self, name):
        if "options" in self.__dict__:
            options = self.__dict__["options"]
            if name in options:
                return options[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        if "options" not in self.__dict__:
            super().__setattr__(name, value)
            return
        if name not in self.options:
            super().__setattr__(name, value)
            return
        if name == "cast_model_type":
            value = _fw.dtype_str(value) if value is not None and value is not False else value
            if self.opt_level == "O1" and value is not None:
                if value is not False and value != "float32":
                    warn_or_err("O1 inserts casts around Torch functions rather than "
                                "model weights, so with O1, the model weights themselves "
                                "should remain FP32. If you wish to cast the model to a "
                                "different type, use opt_level='O2' or 'O3'. "
                                f"cast_model_type was {value}")
            if value not in (None, False, "float16", "float32"):
                raise ValueError(f"cast_model_type must be float16 or float32, got {value}")
            self.options[name] = value
        elif name == "patch_torch_functions":
            if self.opt_level != "O1" and value:
                warn_or_err("Currently, patch_torch_functions=True should only be set by "
                            "selecting opt_level='O1'.")
            self.options[name] = value
        elif name == "keep_batchnorm_fp32":
            if self.opt_level == "O1" and value is not None:
                warn_or_err("With opt_level O1, batchnorm functions are automatically patched "
                            "to run in FP32, so keep_batchnorm_fp32 should be None."
                            f" keep_batchnorm_fp32 was {value}")
            if value == "False":
                self.options[name] = False
            elif value == "True":
                self.options[name] = True
            else:
                assert value is True or value is False or value is None, \
                    ("keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', "
                     f"or None, found keep_batchnorm_fp32={value}")
                self.options[name] = value
        elif name == "master_weights":
            if self.opt_level == "O1" and value is not None:
                warn_or_err("It doesn't make sense to use master_weights with O1. "
                            "With O1, your model weights themselves should be FP32.")
            self.options[name] = value
        elif name == "loss_scale":
            if value == "dynamic":
                self.options[name] = value
            else:
                self.options[name] = float(value)
        else:
            self.options[name] = value


class O3:
    """Opt level O3: the whole model in float16, static loss scale 1.0."""

    brief = "O3:  Pure FP16 training."
    more = ("Calls .half() on your model, converting the entire model to FP16.\n"
            "A casting operation is also inserted to cast incoming Tensors to FP16,\n"
            "so you don't need to change your data pipeline.\n"
            "This mode is useful for establishing a performance ceiling.\n"
            "It's also possible training may 'just work' in this mode.\n"
            "If not, try other optimization levels.")

    def __call__(self, properties):
        properties.enabled = True
        properties.opt_level = "O3"
        properties.cast_model_type = "float16"
        properties.patch_torch_functions = False
        properties.keep_batchnorm_fp32 = False
        properties.master_weights = False
        properties.loss_scale = 1.0
        return properties


class O2:
    """Opt level O2: float16 model with float32 batch norm, float32 master weights, dynamic loss scale."""

    brief = "O2:  FP16 training with FP32 batchnorm and FP32 master weights.\n"
    more = ("Calls .half() on your model, converting the entire model (except for batchnorms)\n"
            "to FP16.  Batchnorms are retained in FP32 for additional stability.\n"
            "The forward pass is patched to cast incoming Tensors to FP16, so you don't need "
            "to change\nyour data pipeline.\n"
            "O2 creates FP32 master weights outside the model and patches any optimizers to "
            "update\nthese master weights, then copy the master weights into the FP16 model "
            "weights.\nMaster weights can also improve convergence and stability.")

    def __call__(self, properties):
        properties.enabled = True
        properties.opt_level = "O2"
        properties.cast_model_type = "float16"
        properties.patch_torch_functions = False
        properties.keep_batchnorm_fp32 = True
        properties.master_weights = True
        properties.loss_scale = "dynamic"
        return properties


class O1:
    """Opt level O1: float32 weights, autocast (float16 matmul/linear/conv), dynamic loss scale."""

    brief = "O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n"
    more = ("The type of your model's weights is not altered.  However, internally,\n"
            "Pytorch functions are patched to cast any Tensor Core-friendly ops to FP16 for "
            "speed,\nwhile operations that might benefit from the additional stability of FP32 "
            "are patched\nto cast their inputs to fp32.\n"
            "O1 is the safest way to try mixed precision training, and is recommended when\n"
            "trying mixed precision training for the first time.")

    def __call__(self, properties):
        properties.enabled = True
        properties.opt_level = "O1"
        properties.cast_model_type = None
        properties.patch_torch_functions = True
        properties.keep_batchnorm_fp32 = None
        properties.master_weights = None
        properties.loss_scale = "dynamic"
        return properties


class O0:
    """Opt level O0: pure float32 training (loss scale 1.0)."""

    brief = "O0:  Pure FP32 training.\n"
    more = ("Your models are checked to make sure parameters are FP32, but otherwise the\n"
            "types of weights and internal Pytorch operations are not altered.  This mode\n"
            "is useful as a baseline for performance and accuracy.")

    def __call__(self, properties):
        properties.enabled = True
        properties.opt_level = "O0"
        properties.cast_model_type = "float32"
        properties.patch_torch_functions = False
        properties.keep_batchnorm_fp32 = None
        properties.master_weights = False
        properties.loss_scale = 1.0
        return properties


opt_levels = {"O3": O3(), "O2": O2(), "O1": O1(), "O0": O0()}


def _check_models(models):
    for model in models:
        parallel_type = _fw.is_ddp(model)
        if parallel_type is not None:
            raise RuntimeError(f"Incoming model is an instance of {parallel_type}. "
                               "Parallel wrappers should only be applied to the model(s) AFTER \n"
                               "the model(s) have been returned from amp.initialize.")
        if not _fw.is_module(model):
            raise TypeError("models must be either a single model or a list of models.")


def _check_params_fp32(models):
    for model in models:
        for name, param in model.named_parameters():
            dt = _fw.dtype_name(param)
            if dt != "float32":
                warn_or_err(f"Found param {name} with type {dt}, expected float32.\n"
                            "When using amp.initialize, you do not need to call .half() on your "
                            "model\nbefore passing it, no matter what optimization level you "
                            "choose.")
        for name, buf in model.named_buffers():
            dt = _fw.dtype_name(buf)
            if dt in ("float16", "bfloat16", "float64"):
                warn_or_err(f"Found buffer {name} with type {dt}, expected float32.\n"
                            "When using amp.initialize, you do not need to call .half() on your "
                            "model\nbefore passing it, no matter what optimization level you "
                            "choose.")


def _o2_state_dict_hooks(model):
    """model.state_dict() in float32: parameters with a master show the master (exact float32
    values, so a checkpoint restores the run bit for bit); other float16 values are widened.
    model.load_state_dict() writes the float32 values into the masters too."""
    torch_model = _fw.is_torch_module(model)

    def save_hook(module, state_dict, prefix, local_metadata):
        for name, param in module._parameters.items():
            key = prefix + name
            if param is None or key not in state_dict:
                continue
            entry = _amp_state.masters.get(id(param))
            if entry is not None and entry[0] is param:
                state_dict[key] = entry[1] if state_dict[key] is param else entry[1].detach()
        for key in list(state_dict):
            if key.startswith(prefix) and "." not in key[len(prefix):]:
                v = state_dict[key]
                if _fw.dtype_name(v) in ("float16", "bfloat16") and hasattr(v, "float"):
                    state_dict[key] = v.float()

    def load_hook(module, state_dict, prefix, *args):
        import numpy as np

        for name, param in module._parameters.items():
            key = prefix + name
            entry = _amp_state.masters.get(id(param)) if param is not None else None
            if entry is None or entry[0] is not param or key not in state_dict:
                continue
            value = state_dict[key]
            if _fw.is_torch(entry[1]):
                master = entry[1]
                import torch

                v = value if _fw.is_torch(value) else torch.as_tensor(np.asarray(value))
                if v.numel() == master.numel():
                    with torch.no_grad():
                        master.copy_(v.reshape(master.shape))
                continue
            src = _fw.as_array(value, key) if not isinstance(value, (list, float, int)) \
                else np.asarray(value)
            dst = _fw.as_array(entry[1], "master")
            if src.size == dst.size:
                dst[...] = np.asarray(src, dtype=np.float32).reshape(dst.shape)

    for module in model.modules():
        if torch_model:
            module._register_state_dict_hook(save_hook)
            module._register_load_state_dict_pre_hook(load_hook, with_module=True)
        else:
            module.register_state_dict_post_hook(save_hook)
            module.register_load_state_dict_pre_hook(load_hook)


def _patch_forward(model, input_caster, output_caster):
    old_fwd = model.forward

    def new_fwd(*args, **kwargs):
        if input_caster is not None:
            args = _fw.applier(args, input_caster)
            kwargs = _fw.applier(kwargs, input_caster)
        output = old_fwd(*args, **kwargs)
        return _fw.applier(output, output_caster)

    model.forward = new_fwd


def _initialize(models, optimizers, properties, num_losses=1, cast_model_outputs=None):
    optimizers_was_list = False
    if _fw.is_optimizer(optimizers):
        optimizers = [optimizers]
    elif optimizers is None:
        optimizers = []
    elif isinstance(optimizers, list):
        optimizers_was_list = True
        for o in optimizers:
            if not _fw.is_optimizer(o):
                raise TypeError("optimizers must be either a single optimizer or a list of "
                                f"optimizers; got an element of type {type(o).__name__}.")
    else:
        raise TypeError("optimizers must be either a single optimizer or a list of optimizers.")
    seen = set()
    for o in optimizers:
        if id(o) in seen or hasattr(o, "_amp_stash"):
            raise RuntimeError("A given optimizer should only be passed through amp.initialize "
                               "once.")
        seen.add(id(o))

    if isinstance(models, list):
        models_was_list = True
    elif _fw.is_module(models) or _fw.is_ddp(models):
        models_was_list = False
        models = [models]
    else:
        raise TypeError("models must be either a single model or a list of models.")
    _check_models(models)
    if not _amp_state.allow_incoming_model_not_fp32:
        _check_params_fp32(models)

    if properties.cast_model_type:
        for model in models:
            _fw.cast_module(model, properties.cast_model_type,
                            bool(properties.keep_batchnorm_fp32))
        input_caster = functools.partial(_fw.to_type, properties.cast_model_type)
        out_type = _fw.dtype_str(cast_model_outputs) if cast_model_outputs is not None \
            else "float32"
        output_caster = functools.partial(_fw.to_type, out_type)
        for model in models:
            _patch_forward(model, input_caster, output_caster)
    elif cast_model_outputs is not None:
        output_caster = functools.partial(_fw.to_type, _fw.dtype_str(cast_model_outputs))
        for model in models:
            _patch_forward(model, None, output_caster)

    for i, optimizer in enumerate(optimizers):
        optimizers[i] = process_optimizer(optimizer, properties)

    if properties.cast_model_type:
        for model in models:
            _o2_state_dict_hooks(model)

    _amp_state.loss_scalers = [
        LossScaler(properties.loss_scale, min_loss_scale=_amp_state.min_loss_scale,
                   max_loss_scale=_amp_state.max_loss_scale) for _ in range(num_losses)]

    if properties.patch_torch_functions:
        from .handle import AmpHandle

        use_torch = any(_fw.is_torch_module(m) for m in models)
        use_pyddp = any(not _fw.is_torch_module(m) for m in models) or not models
        # torch's autocast on the models' device types (CUDA models: torch's CUDA autocast)
        devices = sorted({p.device.type for m in models if _fw.is_torch_module(m)
                          for p in m.parameters()}) or ["cpu"]
        _amp_state.handle = AmpHandle(properties.loss_scale, pyddp=use_pyddp, torch=use_torch,
                                      torch_devices=devices)
        _amp_state.handle._activate()

    if optimizers_was_list:
        return (models, optimizers) if models_was_list else (models[0], optimizers)
    if models_was_list:
        return models if len(optimizers) == 0 else (models, optimizers[0])
    return models[0] if len(optimizers) == 0 else (models[0], optimizers[0])


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None,
               loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=2.0 ** 24, hard_override=False):
    """Prepare models and optimizers for mixed precision (apex.amp.initialize).

    Args:
        models: a pyddp.nn.Module or torch.nn.Module, or a list of them (not yet wrapped in
            DistributedDataParallel: wrap the returned models).
        optimizers: an optimizer (pyddp.optim / pyddp.optimizers / torch.optim), a list of
            them, or None.
        enabled: False returns everything unchanged and makes scale_loss a no-op.
        opt_level: "O0" (float32), "O1" (autocast), "O2" (float16 model, float32 batch norm
            and master weights), "O3" (float16 everything).
        cast_model_type, patch_torch_functions, keep_batchnorm_fp32, master_weights,
        loss_scale: override the level's defaults (loss_scale: a float or "dynamic").
        cast_model_outputs: dtype the patched forward casts outputs to.
        num_losses: number of loss scalers (``scale_loss(..., loss_id=i)``).
        verbosity: 0 silences amp's messages.
        min_loss_scale, max_loss_scale: bounds of the dynamic scale.
        hard_override: turn contradictory-option errors into warnings (apex's
            ``_amp_state.hard_override``).

    Returns:
        models and optimizers in the shape they were given: ``model, optimizer``,
        ``[models], optimizer``, ``model, [optimizers]``, ...; just the model(s) without
        optimizers.
    """
    _amp_state.reset()
    _amp_state.hard_override = hard_override
    _amp_state.opt_properties = Properties()
    _amp_state.verbosity = verbosity

    if not enabled:
        if optimizers is None:
            return models
        return models, optimizers

    if opt_level not in opt_levels:
        raise RuntimeError(
            f"Unexpected optimization level {opt_level}. "
            "Options are 'O0', 'O1', 'O2', 'O3'.  Note that in `O0`, `O1`, etc., the prefix O is "
            "the letter O, not the number zero.")
    _amp_state.opt_properties = opt_levels[opt_level](_amp_state.opt_properties)
    maybe_print(f"Selected optimization level {opt_levels[opt_level].brief}", True)
    maybe_print("Defaults for this optimization level are:", True)
    for k, v in _amp_state.opt_properties.options.items():
        maybe_print(f"{k:22} : {v}", True)

    _amp_state.min_loss_scale = min_loss_scale
    _amp_state.max_loss_scale = max_loss_scale

    maybe_print("Processing user overrides (additional kwargs that are not None)...", True)
    props = _amp_state.opt_properties
    if enabled is not None:
        props.enabled = enabled
    if opt_level is not None:
        props.opt_level = opt_level
    if cast_model_type is not None:
        props.cast_model_type = cast_model_type
    if patch_torch_functions is not None:
        props.patch_torch_functions = patch_torch_functions
    if keep_batchnorm_fp32 is not None:
        props.keep_batchnorm_fp32 = keep_batchnorm_fp32
    if master_weights is not None:
        props.master_weights = master_weights
    if loss_scale is not None:
        props.loss_scale = loss_scale

    maybe_print("After processing overrides, optimization options are:", True)
    for k, v in props.options.items():
        maybe_print(f"{k:22} : {v}", True)

    return _initialize(models, optimizers, props, num_losses, cast_model_outputs)


def state_dict(destination=None):
    """``{'loss_scaler0': {'loss_scale': float, 'unskipped': int}, ...}`` (apex's format)."""
    if destination is None:
        destination = OrderedDict()
    for idx, loss_scaler in enumerate(_amp_state.loss_scalers):
        destination["loss_scaler%d" % idx] = {
            "loss_scale": loss_scaler.loss_scale(),
            "unskipped": loss_scaler._unskipped,
        }
    return destination


def load_state_dict(state_dict):
    """Restore the loss scalers from ``amp.state_dict()``'s output (after amp.initialize).

    Keys other than ``loss_scalerN`` raise RuntimeError; a count mismatch prints apex's warning.
    """
    if len(state_dict) != len(_amp_state.loss_scalers):
        print("Warning: state_dict contains {} entries, while {} loss_scalers are used".format(
            len(state_dict), len(_amp_state.loss_scalers)))
    state_dict = state_dict.copy()
    nb_loss_scalers = len(_amp_state.loss_scalers)
    unexpected_keys = []
    idx = 0
    for key in state_dict:
        if "loss_scaler" not in key:
            unexpected_keys.append(key)
        else:
            if idx > (nb_loss_scalers - 1):
                print("Skipping loss_scaler[{}], since num_losses was set to {}".format(
                    idx, nb_loss_scalers))
                break
            _amp_state.loss_scalers[idx]._loss_scale = state_dict[key]["loss_scale"]
            _amp_state.loss_scalers[idx]._unskipped = state_dict[key]["unskipped"]
            idx += 1
    if len(unexpected_keys) > 0:
        raise RuntimeError(
            "Error(s) in loading state_dict. Unexpected key(s) in state_dict: {}. ".format(
                ", ".join('"{}"'.format(k) for k in unexpected_keys)))


def master_params(optimizer):
    """The parameters ``optimizer`` steps (the float32 masters under O2), group by group."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            yield p
