"""``pyddp.backends``: torch.backends' switches that training scripts set (``cudnn``, ``cuda.matmul``)."""
from . import cuda, cudnn  # noqa: F401

__all__ = ["cuda", "cudnn"]
