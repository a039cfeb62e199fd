"""pyddp.utils: mirrors torch.utils (data loading in pyddp.utils.data; pyddp.utils.tensorboard's
SummaryWriter and pyddp.utils.model_zoo.load_url, imported on first use)."""
from . import data  # noqa: F401


def __getattr__(name):
    # ``torch.utils.tensorboard.SummaryWriter``, ``torch.utils.model_zoo.load_url`` after
    # ``import pyddp as torch``
    if name in ("tensorboard", "model_zoo"):
        import importlib
        mod = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = mod
        return mod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
