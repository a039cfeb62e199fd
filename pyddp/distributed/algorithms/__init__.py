"""pyddp.distributed.algorithms: DDP communication hooks and Join (torch's module paths)."""
from .join import Join  # noqa: F401
