"""Helpers shared by the optimizer tests: a stand-in for pyddp.Tensor (the real one lives in
another part of the project) with the interface the optimizers rely on."""
import numpy as np


class FakeTensor:
    """``_data`` (the ndarray), ``grad`` (None or FakeTensor), ``__array__``, ``requires_grad``,
    ``is_leaf``, ``dtype``, ``shape`` -- as in notes on the pyddp.Tensor interface."""

    def __init__(self, data, requires_grad=True):
        self._data = np.asarray(data)
        self.grad = None
        self.requires_grad = requires_grad
        self.is_leaf = True

    def __array__(self, dtype=None, copy=None):
        return self._data if dtype is None else self._data.astype(dtype)

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def shape(self):
        return self._data.shape

    def numpy(self):
        return self._data


def rel_close(actual, expected, rtol=1e-5, what=""):
    """Elementwise relative error <= rtol, with the denominator floored at 0.1 of the array's
    largest magnitude.  The floor is for elements that are differences of larger terms (momentum
    buffers, decayed weights): torch's vectorised CPU kernels round some multiply-adds once (FMA)
    and pyddp's twice, so such elements differ by an ulp of their terms, not of themselves."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, (what, a.shape, e.shape)
    scale = np.maximum(np.abs(e), 0.1 * max(np.abs(e).max(initial=0.0), 1e-30))
    err = np.abs(a - e) / scale
    worst = float(err.max(initial=0.0))
    assert worst <= rtol, f"{what}: max relative error {worst:.3g} > {rtol}"
