"""default_collate / default_convert for NumPy data.

torch's default_collate turns arrays and numbers into tensors; this one keeps
NumPy: arrays of equal shape are stacked (``np.stack``) into one array with a
new leading batch dimension, Python floats become a float64 array, ints an
int64 array, bools a bool array, NumPy scalars an array of their dtype;
strings and bytes stay lists; dicts, namedtuples, tuples and lists are
recursed into (a tuple gives a list, as in torch).  Other array-likes with
``__array__`` (e.g. torch tensors) are converted with ``np.asarray`` first.
"""
import collections.abc
import numbers

import numpy as np

__all__ = ["default_collate", "default_convert"]

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, "
    "dicts or lists; found {}")


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _stack(batch):
    arrs = [np.asarray(b) for b in batch]
    a0 = arrs[0]
    if a0.dtype.kind in "OUS":  # arrays of strings or objects, as torch
        raise TypeError(default_collate_err_msg_format.format(a0.dtype))
    for i, a in enumerate(arrs[1:], 1):
        if a.shape != a0.shape:
            raise RuntimeError(
                "stack expects each array to be equal size, but got "
                f"{list(a0.shape)} at entry 0 and {list(a.shape)} at entry {i}")
    return np.stack(arrs)


def default_collate(batch):
    """Merge a list of samples into a batch (see the module docstring)."""
    elem = batch[0]
    elem_type = type(elem)
    if isinstance(elem, np.ndarray):
        return _stack(batch)
    if isinstance(elem, (str, bytes)):  # also np.str_ / np.bytes_
        return batch
    if isinstance(elem, np.generic):
        if elem.dtype.kind in "USO":
            raise TypeError(default_collate_err_msg_format.format(elem.dtype))
        return np.array(batch, dtype=elem.dtype)
    if isinstance(elem, bool):
        return np.array(batch, dtype=np.bool_)
    if isinstance(elem, float):
        return np.array(batch, dtype=np.float64)
    if isinstance(elem, int):
        return np.array(batch, dtype=np.int64)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        try:
            if isinstance(elem, collections.abc.MutableMapping):
                clone = elem.copy()
                clone.update({k: default_collate([d[k] for d in batch])
                              for k in elem})
                return clone
            return elem_type({k: default_collate([d[k] for d in batch])
                              for k in elem})
        except TypeError:
            return {k: default_collate([d[k] for d in batch]) for k in elem}
    if _is_namedtuple(elem):
        return elem_type(*(default_collate(s) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        it = iter(batch)
        elem_size = len(next(it))
        if not all(len(e) == elem_size for e in it):
            raise RuntimeError(
                "each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        if isinstance(elem, tuple):
            return [default_collate(s) for s in transposed]
        try:
            if isinstance(elem, collections.abc.MutableSequence):
                clone = elem.copy()
                for i, s in enumerate(transposed):
                    clone[i] = default_collate(s)
                return clone
            return elem_type([default_collate(s) for s in transposed])
        except TypeError:
            return [default_collate(s) for s in transposed]
    if isinstance(elem, numbers.Number):
        return np.array(batch)
    if hasattr(elem, "__array__"):
        return _stack(batch)
    raise TypeError(default_collate_err_msg_format.format(elem_type))


def default_convert(data):
    """The per-sample conversion used without batching (batch_size=None):
    NumPy data is returned as is; containers are rebuilt around their
    converted elements."""
    if isinstance(data, (np.ndarray, np.generic, str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        try:
            return type(data)({k: default_convert(v) for k, v in data.items()})
        except TypeError:
            return {k: default_convert(v) for k, v in data.items()}
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence):
        try:
            return type(data)([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data
