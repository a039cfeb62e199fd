"""pyddp.utils: mirrors torch.utils (data loading in pyddp.utils.data)."""
from . import data  # noqa: F401
