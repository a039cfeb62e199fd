"""DistributedSampler: the indices of torch.utils.data.DistributedSampler,
bit for bit, computed in C."""
import math

import numpy as np

from ... import _C
from .sampler import Sampler

__all__ = ["DistributedSampler"]


def _dist():
    from ... import distributed
    return distributed


class DistributedSampler(Sampler):
    """Restricts loading to this rank's share of the dataset, exactly as
    ``torch.utils.data.distributed.DistributedSampler``.

    Args: dataset (anything with ``len``), num_replicas and rank (default:
    the world size and rank of pyddp.distributed's default group), shuffle,
    seed (an int in [-2**63, 2**64 - epoch)), drop_last.  Call
    ``set_epoch(epoch)`` before each epoch to reshuffle.

    Order: ``randperm(len(dataset))`` from a generator seeded with
    ``seed + epoch`` (or 0..len-1 without shuffle); padded by repeating it
    from the start (or cut, with drop_last) to ``num_samples * num_replicas``;
    rank r takes every num_replicas-th index from r.  The permutation and the
    slice are computed in C with the GIL released; ``indices()`` returns them
    as a NumPy int64 array, iterating yields Python ints.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True,
                 seed=0, drop_last=False):
        # As torch: without an initialised default group, get_world_size()
        # raises its ValueError ("Default process group has not been
        # initialized, ...").
        if num_replicas is None:
            dist = _dist()
            if not dist.is_available():
                raise RuntimeError(
                    "Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            dist = _dist()
            if not dist.is_available():
                raise RuntimeError(
                    "Requires distributed package to be available")
            rank = dist.get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval "
                f"[0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if self.drop_last and len(self.dataset) % self.num_replicas != 0:
            self.num_samples = math.ceil(
                (len(self.dataset) - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(len(self.dataset) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def indices(self):
        """This rank's indices for the current epoch as a NumPy int64 array
        (what iterating yields, without creating Python ints)."""
        n = len(self.dataset)
        out = np.empty(self.num_samples, dtype=np.int64)
        if self.num_samples != _C.dist_num_samples(n, self.num_replicas,
                                                  bool(self.drop_last)):
            # Only reachable if num_replicas/drop_last were changed after
            # construction; torch then fails its length assertions.
            raise AssertionError(
                f"Number of subsampled indices does not match num_samples "
                f"({self.num_samples})")
        seed = self.seed + self.epoch if self.shuffle else 0
        _C.dist_sampler_indices(n, self.num_replicas, self.rank,
                                bool(self.shuffle), seed,
                                bool(self.drop_last), out)
        return out

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Set the epoch: with shuffle, each epoch gets its own order."""
        self.epoch = epoch
