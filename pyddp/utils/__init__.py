"""pyddp.utils: mirrors torch.utils (data loading in pyddp.utils.data; pyddp.utils.tensorboard's
SummaryWriter, imported on first use)."""
from . import data  # noqa: F401


def __getattr__(name):
    if name == "tensorboard":   # ``torch.utils.tensorboard.SummaryWriter`` after ``import pyddp as torch``
        import importlib
        mod = importlib.import_module(f"{__name__}.tensorboard")
        globals()[name] = mod
        return mod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
