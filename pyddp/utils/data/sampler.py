"""Samplers with torch.utils.data.sampler's semantics, for any sized dataset.

With a seeded ``pyddp.Generator`` each sampler yields the same order as its
torch counterpart with an equally seeded ``torch.Generator`` (they make the
same draws from the same mt19937 stream).  Indices are Python ints.
"""
import itertools
from collections.abc import Iterable, Sized

import numpy as np

from ... import _random

__all__ = ["Sampler", "SequentialSampler", "RandomSampler",
           "SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler"]


class Sampler:
    """Base class of samplers: an iterable of dataset indices (or lists of
    them), optionally with ``__len__``."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """Indices 0, 1, ..., len(data_source) - 1 in order."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """Random order, torch.utils.data.RandomSampler's draws exactly.

    Without replacement: whole ``randperm(n)`` rounds until num_samples are
    yielded (one extra randperm is drawn when num_samples is a multiple of n,
    as torch does).  With replacement: ``randint(0, n)`` in chunks of 32.
    With no generator a fresh one is seeded from the default generator's
    next 63-bit draw (``pyddp.manual_seed`` makes it reproducible).
    """

    def __init__(self, data_source, replacement=False, num_samples=None,
                 generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(
                "replacement should be a boolean value, but got "
                f"replacement={self.replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                "num_samples should be a positive integer value, but got "
                f"num_samples={self.num_samples}")

    @property
    def num_samples(self):
        """len(data_source) unless given."""
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        if self.generator is None:
            seed = _random.default_generator._random_int64()
            generator = _random.Generator()
            generator.manual_seed(seed)
        else:
            generator = self.generator
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield from _random._randint(n, 32, generator).tolist()
            yield from _random._randint(
                n, self.num_samples % 32, generator).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from _random.randperm(n, generator=generator).tolist()
            yield from _random.randperm(
                n, generator=generator)[: self.num_samples % n].tolist()

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in random order (``randperm(len(indices))``)."""

    def __init__(self, indices, generator=None):
        self.indices = indices
        self.generator = generator

    def __iter__(self):
        for i in _random.randperm(len(self.indices),
                                  generator=self.generator).tolist():
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """Indices drawn with probabilities proportional to weights
    (``torch.multinomial``).

    With replacement and num_samples >= 2 the draws equal torch's bit for
    bit; without replacement (or num_samples == 1) torch's exponential-race
    algorithm is reproduced too, except that ties between zero weights are
    ordered by index.
    """

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        if (not isinstance(num_samples, int) or isinstance(num_samples, bool)
                or num_samples <= 0):
            raise ValueError(
                "num_samples should be a positive integer value, but got "
                f"num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(
                "replacement should be a boolean value, but got "
                f"replacement={replacement}")
        weights_arr = np.asarray(weights, dtype=np.float64)
        if weights_arr.ndim != 1:
            raise ValueError(
                "weights should be a 1d sequence but given weights have shape "
                f"{tuple(weights_arr.shape)}")
        self.weights = weights_arr
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self):
        rand = _random._multinomial(self.weights, self.num_samples,
                                    self.replacement, self.generator)
        yield from iter(rand.tolist())

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """Groups another sampler's indices into lists of batch_size."""

    def __init__(self, sampler, batch_size, drop_last):
        if (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                or batch_size <= 0):
            raise ValueError(
                "batch_size should be a positive integer value, but got "
                f"batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(
                "drop_last should be a boolean value, but got "
                f"drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        sampler_iter = iter(self.sampler)
        if self.drop_last:
            args = [sampler_iter] * self.batch_size
            for batch in zip(*args):
                yield [*batch]
        else:
            batch = [*itertools.islice(sampler_iter, self.batch_size)]
            while batch:
                yield batch
                batch = [*itertools.islice(sampler_iter, self.batch_size)]

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


class _InfiniteConstantSampler(Sampler):
    """None forever: the index stream of an IterableDataset."""

    def __iter__(self):
        while True:
            yield None
