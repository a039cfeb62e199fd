"""``apex.parallel.LARC``: ``from pyddp.parallel.LARC import LARC`` (pyddp.nn.parallel.LARC's class)."""
from ..nn.parallel.LARC import LARC  # noqa: F401

__all__ = ["LARC"]
