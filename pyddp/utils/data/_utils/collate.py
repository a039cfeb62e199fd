"""default_collate / default_convert: torch.utils.data._utils.collate for pyddp Tensors.

As torch's: NumPy arrays (of numbers) and pyddp Tensors are stacked into one pyddp Tensor with a new
leading batch dimension (their dtype kept); NumPy scalars give a Tensor of their dtype, Python
floats a float64 Tensor, Python ints an int64 Tensor (bools a bool Tensor, a mix with floats the
default float dtype: ``torch.tensor``'s inference); strings and bytes stay lists; dicts,
namedtuples, tuples and lists are recursed into (a tuple gives a list).  Arrays of strings or
objects and other types raise torch's TypeError.  torch tensors are stacked by torch
(``torch.stack``), so a dataset of torch tensors gives torch batches, as in torch.

``collate(batch, collate_fn_map=...)`` and ``default_collate_fn_map`` extend it as in torch: the
map's keys are types (or tuples of types), its values ``fn(batch, *, collate_fn_map)``.
"""
import collections.abc
import copy
import re

import numpy as np

from ...._detect import is_torch_tensor as _is_torch_tensor, loaded_torch

__all__ = ["collate", "default_collate", "default_convert", "default_collate_fn_map",
           "collate_tensor_fn", "collate_numpy_array_fn", "collate_numpy_scalar_fn",
           "collate_float_fn", "collate_int_fn", "collate_str_fn", "default_collate_err_msg_format"]

np_str_obj_array_pattern = re.compile(r"[SaUO]")

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, "
    "dicts or lists; found {}")


def _tensor_mod():
    from .... import _tensor   # pyddp._tensor, imported on the first batch
    return _tensor



def _numeric(a):
    """``a`` (an ndarray) when torch.as_tensor would take its dtype, else TypeError."""
    t = _tensor_mod()
    if a.dtype.kind not in "biufc" and not (t.bfloat16 is not None and a.dtype == t.bfloat16):
        raise TypeError(f"can't convert np.ndarray of type {a.dtype}. The only supported types "
                        "are: float64, float32, float16, complex64, complex128, int64, int32, "
                        "int16, int8, uint64, uint32, uint16, uint8, and bool.")
    return a


def _as_tensor(a):
    """torch.as_tensor of an ndarray or NumPy scalar: a Tensor sharing its memory when it can."""
    t = _tensor_mod()
    return t._new(_numeric(np.asarray(a)))


def collate_tensor_fn(batch, *, collate_fn_map=None):
    """Stack Tensors (pyddp's; torch's with torch.stack) along a new first dimension."""
    elem = batch[0]
    if _is_torch_tensor(elem):
        import torch
        return torch.stack(batch, 0)
    t = _tensor_mod()
    shape = tuple(elem.shape)
    for i, b in enumerate(batch):
        if not isinstance(b, t.Tensor):
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got "
                            f"{type(b).__name__}")
        if tuple(b.shape) != shape:
            raise RuntimeError("stack expects each tensor to be equal size, but got "
                               f"{list(shape)} at entry 0 and {list(b.shape)} at entry {i}")
    if any(b.requires_grad for b in batch):
        return t.stack(list(batch), 0)
    return t._new(np.stack([b._data for b in batch]))


def collate_numpy_array_fn(batch, *, collate_fn_map=None):
    """Arrays (not of strings or objects) to Tensors, then stacked."""
    elem = batch[0]
    if np_str_obj_array_pattern.search(elem.dtype.str) is not None:
        raise TypeError(default_collate_err_msg_format.format(elem.dtype))
    return collate([_as_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def collate_numpy_scalar_fn(batch, *, collate_fn_map=None):
    """NumPy scalars: one Tensor (torch.as_tensor(batch))."""
    return _as_tensor(np.array(batch))


def collate_float_fn(batch, *, collate_fn_map=None):
    """Python floats: a float64 Tensor."""
    return _tensor_mod()._new(np.array(batch, dtype=np.float64))


def collate_int_fn(batch, *, collate_fn_map=None):
    """Python ints (and bools): torch.tensor(batch)'s dtype (int64, bool, or the default float
    dtype when floats follow the first int)."""
    t = _tensor_mod()
    a = np.asarray(batch)
    if a.dtype.kind == "O" or a.dtype.kind == "u":
        raise RuntimeError(f"Overflow when unpacking long: {batch!r} does not fit in int64")
    return t.tensor(a if a.dtype.kind == "b" else batch)


def collate_str_fn(batch, *, collate_fn_map=None):
    """Strings and bytes stay a list."""
    return batch


def _pyddp_tensor_type():
    return _tensor_mod().Tensor


class _TensorKey:
    """The map's key for pyddp's Tensor, resolved on first use (importing pyddp.utils.data does
    not import the tensor library)."""


class _TorchTensorKey:
    """The map's key for torch.Tensor when torch is imported (never imports it)."""


class _Never:
    pass


default_collate_fn_map = {
    _TensorKey: collate_tensor_fn,
    _TorchTensorKey: collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,
    (np.bool_, np.number, np.object_): collate_numpy_scalar_fn,
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}


def _resolve(key):
    if key is _TensorKey:
        return _pyddp_tensor_type()
    if key is _TorchTensorKey:
        torch = loaded_torch()
        return torch.Tensor if torch is not None and hasattr(torch, "Tensor") else _Never
    return key


def collate(batch, *, collate_fn_map=None):
    """Collate a batch (a sequence of samples) by the type of its first element, recursing into
    mappings, namedtuples and sequences (torch.utils.data._utils.collate.collate)."""
    elem = batch[0]
    elem_type = type(elem)
    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for collate_type in collate_fn_map:
            if isinstance(elem, _resolve(collate_type)):
                return collate_fn_map[collate_type](batch, collate_fn_map=collate_fn_map)
    if isinstance(elem, collections.abc.Mapping):
        try:
            if isinstance(elem, collections.abc.MutableMapping):
                clone = copy.copy(elem)
                clone.update({key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map)
                              for key in elem})
                return clone
            return elem_type({key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map)
                              for key in elem})
        except TypeError:
            return {key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map)
                    for key in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return elem_type(*(collate(samples, collate_fn_map=collate_fn_map)
                           for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        it = iter(batch)
        elem_size = len(next(it))
        if not all(len(e) == elem_size for e in it):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        if isinstance(elem, tuple):
            return [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]
        try:
            if isinstance(elem, collections.abc.MutableSequence):
                clone = copy.copy(elem)
                for i, samples in enumerate(transposed):
                    clone[i] = collate(samples, collate_fn_map=collate_fn_map)
                return clone
            return elem_type([collate(samples, collate_fn_map=collate_fn_map)
                              for samples in transposed])
        except TypeError:
            return [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]
    raise TypeError(default_collate_err_msg_format.format(elem_type))


def default_collate(batch):
    """Merge a list of samples into a batch of pyddp Tensors (see the module docstring)."""
    return collate(batch, collate_fn_map=default_collate_fn_map)


def default_convert(data):
    """The per-sample conversion used without batching (batch_size=None): NumPy arrays (not of
    strings or objects) and NumPy scalars become Tensors; Tensors and other values are returned
    as they are; containers are rebuilt around their converted elements (a tuple gives a list)."""
    elem_type = type(data)
    if _is_torch_tensor(data) or isinstance(data, _pyddp_tensor_type()):
        return data
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "bytes_",
                                                                       "string_"):
        if elem_type.__name__ == "ndarray" and \
                np_str_obj_array_pattern.search(data.dtype.str) is not None:
            return data
        return _as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update({key: default_convert(data[key]) for key in data})
                return clone
            return elem_type({key: default_convert(data[key]) for key in data})
        except TypeError:
            return {key: default_convert(data[key]) for key in data}
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return elem_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, d in enumerate(data):
                    clone[i] = default_convert(d)
                return clone
            return elem_type([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data
