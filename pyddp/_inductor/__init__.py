"""``pyddp._inductor``: the home of ``pyddp._inductor.config`` (torch._inductor.config's switches,
accepted and recorded, doing nothing: pyddp has no code generator)."""
from . import config  # noqa: F401

__all__ = ["config"]
