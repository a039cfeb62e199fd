"""parameters_to_vector and vector_to_parameters (torch.nn.utils.convert_parameters)."""
from __future__ import annotations

from ... import _tensor as _t
from ..._tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters):
    """One 1-D Tensor holding every parameter, flattened, in order (differentiable)."""
    vec = []
    for p in parameters:
        if not isinstance(p, Tensor):
            raise TypeError(f"expected pyddp.Tensor, but got: {type(p).__name__}")
        vec.append(p.reshape(-1))
    if not vec:
        raise RuntimeError("parameters_to_vector: expected a non-empty iterable of parameters")
    return _t.cat(vec)


def vector_to_parameters(vec, parameters):
    """Copy consecutive slices of the 1-D ``vec`` into the parameters, in order (in place)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected pyddp.Tensor, but got: {type(vec).__name__}")
    if vec.ndim != 1:
        raise ValueError(f"vector_to_parameters: vec must be 1-D, got shape {list(vec.shape)}")
    params = list(parameters)
    need = sum(p.numel() for p in params)
    if need != vec.numel():
        raise RuntimeError(f"vector_to_parameters: vec has {vec.numel()} elements, the "
                           f"parameters {need}")
    src = vec._data
    off = 0
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"expected pyddp.Tensor, but got: {type(p).__name__}")
        n = p.numel()
        p._data[...] = src[off:off + n].reshape(p._data.shape)
        off += n
