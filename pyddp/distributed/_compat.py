"""torch.distributed's small conveniences: ``get_default_backend_for_device`` and the deprecated
``reduce_op`` alias of ReduceOp."""
import warnings

from .distributed_c10d import ReduceOp

__all__ = ["get_default_backend_for_device", "reduce_op"]

# torch's Backend.default_device_backend_map ("gloo" is pyddp's CPU backend under torch's name)
default_device_backend_map = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl", "mps": "gloo"}

# torch's device types (torch.device rejects the others)
_DEVICE_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve",
                 "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia",
                 "privateuseone")


def _device_type(device):
    if isinstance(device, bool):
        raise TypeError(f"device must be a str, an int or a device, got {type(device).__name__}")
    if isinstance(device, int):
        # torch.device(int) names the current accelerator's device of that index
        from .. import accelerator
        acc = accelerator.current_accelerator()
        if acc is None:
            raise RuntimeError("Cannot access accelerator device when none is available.")
        return acc.type
    if isinstance(device, str):
        if not device:
            raise RuntimeError("Device string must not be empty")
        kind = device.split(":", 1)[0]
        if kind not in _DEVICE_TYPES:
            raise RuntimeError(f"Expected one of {', '.join(_DEVICE_TYPES)} device type at start "
                               f"of device string: {device}")
        return kind
    if hasattr(device, "type"):   # pyddp.device, torch.device
        return str(device.type)
    raise TypeError(f"device must be a str, an int or a device, got {type(device).__name__}")


def get_default_backend_for_device(device) -> str:
    """The default backend for a device (torch.distributed.get_default_backend_for_device):
    "gloo" for "cpu", "nccl" for "cuda" (also "cuda:N", ``device("cuda", 1)``); a ValueError for a
    device type without one (e.g. "meta")."""
    backend = default_device_backend_map.get(_device_type(device))
    if backend is None:
        raise ValueError(f"Default backend not registered for device : {device}")
    return backend


class _reduce_op:
    """Deprecated enum-like class: ``reduce_op.SUM`` etc. are ReduceOp's members (use ReduceOp)."""

    def __init__(self) -> None:
        for k, v in ReduceOp.__members__.items():
            setattr(self, k, v)
        self.__members__ = ReduceOp.__members__

    def __getattribute__(self, key):
        # only a member's use warns: tools that inspect the module (help(), completion in a notebook,
        # pytest's and doctest's collection) touch dunders and must not print a deprecation
        if key.startswith("_"):
            return object.__getattribute__(self, key)
        warnings.warn("`pyddp.distributed.reduce_op` (torch.distributed.reduce_op) is deprecated, "
                      "please use `pyddp.distributed.ReduceOp` instead", DeprecationWarning, stacklevel=2)
        return object.__getattribute__(self, key)


reduce_op = _reduce_op()
