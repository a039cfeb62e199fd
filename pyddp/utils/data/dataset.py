"""Datasets with torch.utils.data.dataset's semantics, for NumPy arrays."""
import bisect
import itertools
import math
import warnings

from ... import _random

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "StackDataset",
           "ConcatDataset", "ChainDataset", "Subset", "random_split"]


class Dataset:
    """A map-style dataset: ``__getitem__(index)`` and usually ``__len__``.

    ``a + b`` is ``ConcatDataset([a, b])``.  A dataset may also define
    ``__getitems__(indices)`` returning a list of samples, which the
    DataLoader then calls once per batch.
    """

    def __getitem__(self, index):
        raise NotImplementedError(
            "Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A dataset that is an iterable of samples (``__iter__``).

    With DataLoader workers every worker iterates its own copy; use
    ``get_worker_info()`` inside ``__iter__`` to shard the stream.
    """

    def __iter__(self):
        raise NotImplementedError(
            "Subclasses of IterableDataset should implement __iter__.")

    def __add__(self, other):
        return ChainDataset([self, other])


def _first_dim(t):
    shape = getattr(t, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return len(t)


class TensorDataset(Dataset):
    """Samples ``tuple(a[index] for a in arrays)`` of arrays sharing their
    first dimension: NumPy arrays or any indexable array-like (lists,
    memory maps, torch tensors, ...)."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset needs at least one array")
        n = _first_dim(tensors[0])
        if any(n != _first_dim(t) for t in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return _first_dim(self.tensors[0])


class StackDataset(Dataset):
    """Datasets side by side: samples are tuples (``*args``) or dicts
    (``**kwargs``) of the datasets' samples at the same index."""

    def __init__(self, *args, **kwargs):
        if args:
            if kwargs:
                raise ValueError(
                    "Supported either ``tuple``- (via ``args``) or"
                    "``dict``- (via ``kwargs``) like input/output, but both "
                    "types are given.")
            self._length = len(args[0])
            if any(self._length != len(d) for d in args):
                raise ValueError("Size mismatch between datasets")
            self.datasets = args
        elif kwargs:
            tmp = list(kwargs.values())
            self._length = len(tmp[0])
            if any(self._length != len(d) for d in tmp):
                raise ValueError("Size mismatch between datasets")
            self.datasets = kwargs
        else:
            raise ValueError("At least one dataset should be passed")

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self):
        return self._length


class ConcatDataset(Dataset):
    """Several map-style datasets one after another."""

    @staticmethod
    def cumsum(sequence):
        """Running totals of the datasets' lengths."""
        r, s = [], 0
        for e in sequence:
            n = len(e)
            r.append(n + s)
            s += n
        return r

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if len(self.datasets) == 0:
            raise AssertionError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError(
                    "ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError(
                    "absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        dataset_idx = bisect.bisect_right(self.cumulative_sizes, idx)
        if dataset_idx == 0:
            sample_idx = idx
        else:
            sample_idx = idx - self.cumulative_sizes[dataset_idx - 1]
        return self.datasets[dataset_idx][sample_idx]


class ChainDataset(IterableDataset):
    """Several IterableDatasets one after another."""

    def __init__(self, datasets):
        self.datasets = datasets

    def __iter__(self):
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError(
                    "ChainDataset only supports IterableDataset")
            yield from d

    def __len__(self):
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError(
                    "ChainDataset only supports IterableDataset")
            total += len(d)
        return total


class Subset(Dataset):
    """The samples of dataset at the given indices, in that order."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices):
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__(
                [self.indices[idx] for idx in indices])
        return [self.dataset[self.indices[idx]] for idx in indices]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None):
    """Split dataset into non-overlapping Subsets of the given lengths (or
    fractions summing to 1), torch.utils.data.random_split's split exactly
    (``randperm(len(dataset))`` from generator, default: pyddp's default
    generator)."""
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        subset_lengths = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            subset_lengths.append(math.floor(len(dataset) * frac))
        remainder = len(dataset) - sum(subset_lengths)
        for i in range(remainder):
            subset_lengths[i % len(subset_lengths)] += 1
        lengths = subset_lengths
        for i, length in enumerate(lengths):
            if length == 0:
                warnings.warn(
                    f"Length of split at index {i} is 0. "
                    f"This might result in an empty dataset.", stacklevel=2)
    if sum(lengths) != len(dataset):
        raise ValueError(
            "Sum of input lengths does not equal the length of the input "
            "dataset!")
    indices = _random.randperm(sum(lengths), generator=generator).tolist()
    return [Subset(dataset, indices[offset - length: offset])
            for offset, length in zip(itertools.accumulate(lengths), lengths)]
