"""``pyddp.backends``: torch.backends' switches that training scripts set (``cudnn``)."""
from . import cudnn  # noqa: F401

__all__ = ["cudnn"]
