"""``pyddp.backends.cudnn``: torch.backends.cudnn as torch's CPU build answers it.

pyddp runs no cuDNN kernels (its own tensors compute on the CPU), so ``is_available()`` is False
and ``version()`` None, on every machine.  The switches scripts set (``benchmark``,
``deterministic``, ``enabled``, ``allow_tf32``, ``benchmark_limit``) keep the value given, with
torch's defaults (False, False, True, True, None) and torch's check that the first four are bools
(``RuntimeError: set_benchmark_cudnn expects a bool, but got int``); ``flags(...)`` sets them
for a ``with`` block.  They change nothing in pyddp's computation.
"""
import contextlib
import sys
import types

__all__ = ["is_available", "version", "is_acceptable", "flags", "benchmark", "deterministic",
           "enabled", "allow_tf32", "benchmark_limit"]

# attribute -> the name torch's error message gives its setter (allow_tf32's is torch's own)
_SETTERS = {"benchmark": "set_benchmark_cudnn", "deterministic": "set_deterministic_cudnn",
            "enabled": "set_enabled_cudnn", "allow_tf32": "set_allow_tf32_cublas"}
_state = {"benchmark": False, "deterministic": False, "enabled": True, "allow_tf32": True}
benchmark_limit = None


def is_available() -> bool:
    """False: pyddp has no cuDNN."""
    return False


def version():
    """None: pyddp has no cuDNN (as torch's CPU build)."""
    return None


def is_acceptable(tensor) -> bool:
    """False: no tensor is run through cuDNN."""
    return False


@contextlib.contextmanager
def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False,
          allow_tf32=True, fp32_precision="none", depthwise_kernel="auto"):
    """Set enabled, benchmark, benchmark_limit, deterministic and allow_tf32 inside a ``with``
    block (torch.backends.cudnn.flags); the previous values come back after it."""
    mod = sys.modules[__name__]
    new = {"enabled": enabled, "benchmark": benchmark, "deterministic": deterministic,
           "allow_tf32": allow_tf32}
    old = dict(_state)
    old_limit = mod.benchmark_limit
    for k, v in new.items():
        setattr(mod, k, v)
    mod.benchmark_limit = benchmark_limit
    try:
        yield
    finally:
        _state.update(old)
        mod.benchmark_limit = old_limit


class _CudnnModule(types.ModuleType):
    """The module's class: its switches are checked properties, as in torch's CudnnModule."""

    def __getattr__(self, name):
        if name in _state:
            return _state[name]
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in _state:
            if not isinstance(value, bool):
                raise RuntimeError(f"{_SETTERS[name]} expects a bool, but got "
                                   f"{type(value).__name__}")
            _state[name] = value
            return
        super().__setattr__(name, value)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_state))


sys.modules[__name__].__class__ = _CudnnModule
