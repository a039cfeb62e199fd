"""torch.distributed.GradBucket: what a DistributedDataParallel communication hook receives.

Here rather than beside DistributedDataParallel (pyddp.nn.parallel.distributed), which builds it,
so that ``pyddp.distributed.GradBucket`` imports nothing above pyddp.distributed.
"""
from __future__ import annotations

__all__ = ["GradBucket"]


class GradBucket:
    """What a communication hook receives: one bucket of flattened gradients (torch's GradBucket)."""

    def __init__(self, ddp, bucket):
        self._ddp = ddp
        self._bucket = bucket
        self._array = bucket.buffer

    def index(self) -> int:
        return self._bucket.index

    def buffer(self):
        """The flat gradient buffer, as a tensor of the model's framework (sharing memory)."""
        return self._ddp._ad.wrap(self._array)

    def gradients(self):
        return [self._ddp._ad.wrap(v) for v in self._bucket.views]

    def parameters(self):
        return [self._ddp._params[i] for i in self._bucket.params]

    def is_last(self) -> bool:
        return self._bucket.index == len(self._ddp._buckets) - 1

    def set_buffer(self, tensor):
        ad = self._ddp._ad
        ad.copy_(self._array, ad.as_array(tensor).reshape(self._array.shape))
