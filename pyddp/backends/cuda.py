"""``pyddp.backends.cuda``: the ``matmul`` switches of torch.backends.cuda that scripts set, as torch's
CPU build keeps them (``is_built()`` False: pyddp runs no cuBLAS matmuls).  ``matmul.allow_tf32``
(default False) takes a bool, ``allow_fp16_reduced_precision_reduction`` and
``allow_bf16_reduced_precision_reduction`` (default True) a bool or a tuple/list of bools, with
torch's errors; other attributes raise ``AttributeError("Unknown attribute ...")``.  They change
nothing in pyddp's computation."""

__all__ = ["is_built", "matmul"]


def is_built() -> bool:
    """False: pyddp's own kernels are not built with CUDA (as torch's CPU build answers)."""
    return False


class _CuBLASModule:
    """torch.backends.cuda.matmul."""

    _defaults = {"allow_tf32": False, "allow_fp16_reduced_precision_reduction": True,
                 "allow_bf16_reduced_precision_reduction": True}

    def __init__(self):
        object.__setattr__(self, "_values", dict(self._defaults))

    def __getattr__(self, name):
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"Unknown attribute {name}")

    def __setattr__(self, name, value):
        if name == "allow_tf32":
            if not isinstance(value, bool):
                raise RuntimeError(f"set_allow_tf32_cublas expects a bool, but got "
                                   f"{type(value).__name__}")
        elif name in self._defaults:
            ok = isinstance(value, bool) or (isinstance(value, (tuple, list)) and value
                                             and all(isinstance(v, bool) for v in value))
            if not ok:
                raise TypeError(f"{name} expects a bool or a tuple/list of bools, but got "
                                f"{type(value)}")
        else:
            raise AttributeError(f"Unknown attribute {name}")
        self._values[name] = value


matmul = _CuBLASModule()
