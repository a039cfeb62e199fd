"""pyddp.distributed.algorithms: DDP communication hooks and the generic Join (torch's paths)."""
from .join import Join, Joinable, JoinHook  # noqa: F401
