"""Small helpers shared by the layer modules (torch.nn.modules.utils)."""
import collections.abc
from itertools import repeat

import numpy as np

from ..._tensor import Tensor
from ..parameter import Parameter


def _ntuple(n, name="parse"):
    def parse(x):
        if isinstance(x, collections.abc.Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(repeat(x, n))
    parse.__name__ = name
    return parse


_single = _ntuple(1, "_single")
_pair = _ntuple(2, "_pair")
_triple = _ntuple(3, "_triple")


def _reverse_repeat_tuple(t, n):
    """Reverse ``t`` and repeat each element ``n`` times (F.pad's padding order)."""
    return tuple(x for x in reversed(t) for _ in range(n))


def _factory_dtype(dtype):
    """The dtype for new parameters: ``dtype`` or float32 (torch's default dtype)."""
    if dtype is None:
        return np.dtype(np.float32)
    try:
        return np.dtype(dtype)
    except TypeError:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, dtype))


def _empty_parameter(shape, dtype=None):
    """An uninitialised float Parameter of ``shape`` (filled by the caller's reset_parameters)."""
    return Parameter(Tensor(np.empty(shape, dtype=_factory_dtype(dtype))))


def _buffer(array):
    """A buffer Tensor owning ``array``."""
    return Tensor(array)


def consume_prefix_in_state_dict_if_present(state_dict, prefix):
    """Strip ``prefix`` from the keys of ``state_dict`` in place (torch's helper).

    A state_dict saved from a DistributedDataParallel-wrapped model has keys
    "module.<name>"; ``consume_prefix_in_state_dict_if_present(sd, "module.")`` makes it
    loadable into the bare model.  The ``_metadata`` keys are renamed too.
    """
    for key in list(state_dict.keys()):
        if key.startswith(prefix):
            state_dict[key[len(prefix):]] = state_dict.pop(key)
    if hasattr(state_dict, "_metadata"):
        for key in list(state_dict._metadata.keys()):
            if len(key) == 0:
                continue
            if key == prefix.replace(".", "") or key.startswith(prefix):
                state_dict._metadata[key[len(prefix):]] = state_dict._metadata.pop(key)
