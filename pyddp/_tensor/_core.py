"""pyddp.Tensor: a NumPy array with torch-style reverse-mode autograd.

A Tensor wraps one ndarray (``t._data``; ``t.numpy()`` and ``np.asarray(t)`` return it without a
copy).  Operations build a graph of ``pyddp.autograd`` nodes when grad mode is on and an input
requires grad; ``backward()`` walks it (see pyddp/autograd/_engine.py).  Type promotion follows
torch: float32 stays float32 with Python scalars, integer tensors with float scalars give the default
float dtype, 0-d tensors take part like scalars of their category.

This module holds the Tensor class, the helpers ops use to build results and graph nodes (``_new``,
``_mk``, promotion, ``_to_array``), and the backward entry points (backward, grad).  It imports no
module built on it: the methods that call _ops and _factories (``t + u``, ``t.sum()``, ``t.to()``,
``t.new_zeros()``, ...) are in _methods, which attaches them to the class.
"""
from __future__ import annotations

import builtins

import numpy as np

from .._random import _np_gen
from .. import _C
from ..autograd._engine import _set_tensor_class, run_backward
from ..autograd._graph import Node, _add_hook, _edge
from ._dtypes import (_CPU, _F32, _F64, _HALFS, _dtype, _is_float_dtype, _pybool, _pyfloat, _pyint,
                      bfloat16, bool, float16, int32, int64)
from ._dtypes import _check_memory_format, _layout, channels_last, channels_last_3d
from ._dtypes import contiguous_format as _contiguous_format
from .._device import _check_device, _cuda_error
from ._grad_mode import _st


# ----------------------------------------------------------------------------------------------
# helpers

def _new(a, requires_grad=False):
    if not isinstance(a, np.ndarray):
        a = np.asarray(a)  # numpy scalars from reductions / ufuncs on 0-d arrays
    t = Tensor.__new__(Tensor)
    t._data = a
    t._requires_grad = requires_grad
    t.grad_fn = None
    t._grad = None
    t._accum = None
    t._post_hooks = None
    return t


def _new_on(out, *inputs):
    """_new(out) on the device of the first input placed on an emulated CUDA device."""
    r = _new(out)
    for t in inputs:
        if isinstance(t, Tensor) and t._dev is not _CPU:
            r._dev = t._dev
            break
    return r


def _mk(out, name, fn, inputs, saves=True):
    """Wrap an op's result; record a node when grad mode is on and an input requires grad."""
    r = _new(out)
    for t in inputs:   # a tensor on an emulated CUDA device gives results on it
        if t is not None and t._dev is not _CPU:
            r._dev = t._dev
            break
    if _st.grad:
        for t in inputs:
            if t is not None and t._requires_grad:
                r.grad_fn = Node(name, fn, tuple(None if x is None else _edge(x) for x in inputs),
                                 saves)
                r._requires_grad = True
                break
    return r


def _needs(t):
    return t is not None and t._requires_grad and _st.grad


def _unbc(g, shape):
    """Sum a broadcast gradient back to shape."""
    if g.shape == shape:
        return g
    nd = g.ndim - len(shape)
    if nd:
        g = g.sum(axis=tuple(range(nd)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g


def _red(g, shape, dt):
    g = _unbc(g, shape)
    if g.dtype != dt:
        g = _to(g, dt)
    return g


def _cat(dt):
    k = dt.kind
    if k == "b":
        return 0
    if k in "iu":
        return 1
    if k == "c":
        return 3
    return 2


def _as_t(x, like=None):
    """Tensor from x (a Tensor, ndarray or Python number)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return _new(x)
    if isinstance(x, _pybool):
        return _new(np.asarray(x))
    if isinstance(x, _pyint):
        dt = like._data.dtype if like is not None and like._data.dtype.kind != "b" else int64
        return _new(np.asarray(x, dtype=dt))
    if isinstance(x, (_pyfloat,)):
        dt = like._data.dtype if like is not None and _is_float_dtype(like._data.dtype) \
            else _st.default
        return _new(np.asarray(x, dtype=dt))
    return _new(_to_array(x))


def _scalar_ok(a, x):
    """Turn a Python scalar into something numpy combines with a the way torch would."""
    if isinstance(x, _pyfloat) and not _is_float_dtype(a.dtype):
        return np.asarray(x, dtype=_st.default)  # int tensor * float -> default float
    return x


def _promote(a, b):
    """torch's result dtype for two arrays (0-d arrays count like scalars of their category)."""
    da, db = a.dtype, b.dtype
    if da == db:
        return da
    za, zb = a.ndim == 0, b.ndim == 0
    if za != zb:
        dim_dt, z_dt = (db, da) if za else (da, db)
        if _cat(dim_dt) >= _cat(z_dt):
            return dim_dt
        if _cat(z_dt) == 2 and _cat(dim_dt) < 2:
            return _st.default if z_dt == _F64 else z_dt
        return z_dt
    ca, cb = _cat(da), _cat(db)
    if ca != cb:
        return da if ca > cb else db
    if bfloat16 is not None and bfloat16 in (da, db):
        other = db if da == bfloat16 else da
        if other == float16:
            return _F32
        return other if _cat(other) >= 2 and other.itemsize > 2 else bfloat16
    return np.promote_types(da, db)


def _binop_arrays(a, b):
    """(ndarray, ndarray-or-scalar) with torch's promotion applied."""
    ad = a._data
    if isinstance(b, Tensor):
        bd = b._data
        if ad.dtype != bd.dtype:
            dt = _promote(ad, bd)
            if ad.dtype != dt:
                ad = _to(ad, dt)
            if bd.dtype != dt:
                bd = _to(bd, dt)
        return ad, bd
    if isinstance(b, np.generic):
        b = b.item()
    elif isinstance(b, np.ndarray):
        return _binop_arrays(a, _new(b))
    if isinstance(b, _pyfloat) and not _is_float_dtype(ad.dtype):
        ad = ad.astype(_st.default)  # int tensor * float -> default float dtype
    return ad, b


def _to_array(data, dtype=None):
    if isinstance(data, Tensor):
        a = data._data
    elif isinstance(data, np.ndarray):
        a = data
    elif isinstance(data, (list, tuple)) and data and builtins.any(isinstance(x, Tensor)
                                                                     for x in data):
        a = np.array([_to_array(x) for x in data])
    else:
        a = np.asarray(data)
        if dtype is None and a.dtype == _F64 and not isinstance(data, np.generic):
            a = a.astype(_st.default)
        elif dtype is None and a.dtype.kind in "iu" and not isinstance(data, np.generic):
            a = a.astype(int64)
    if dtype is not None and a.dtype != dtype:
        a = a.astype(dtype)
    return a


# Below this many elements NumPy's astype costs less than a call into pyddp._C.
_CAST_MIN = 2048


def _c16(a):
    """a as pyddp._C's casts take it: a bfloat16 array as a uint16 view of its memory."""
    return a.view(np.uint16) if a.dtype == bfloat16 else a


def _to(a, dt):
    """``a.astype(dt, copy=False)``, float32 <-> float16/bfloat16 in one C pass.

    NumPy's float16 casts and ml_dtypes' bfloat16 ones are scalar loops (2-3 ns an element);
    pyddp._C.cast_ (F16C / AVX2) converts at memory speed, with the same bits (round to nearest
    even, overflow to inf without a warning, inf and NaN kept)."""
    src = a.dtype
    if src == dt:
        return a
    if a.size >= _CAST_MIN and ((src == _F32 and dt in _HALFS) or (dt == _F32 and src in _HALFS)):
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        out = np.empty(a.shape, dt)
        _C.cast_([_c16(out)], [_c16(a)])
        return out
    if dt in _HALFS:
        with np.errstate(over="ignore"):
            return a.astype(dt)
    return a.astype(dt)


def _mm32(x, y):
    """matmul of half-precision (or float32) arrays as float32: half inputs widened exactly, one
    float32 BLAS call (float32 accumulation, as torch's CPU half matmuls)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.matmul(_to(x, _F32), _to(y, _F32))


# pyddp._C.gemm_bf16 multiplies bfloat16 natively (vdpbf16ps, float32 sums) where the CPU has
# AVX512-BF16, at about twice float32 BLAS's rate; elsewhere bfloat16 goes through float32 BLAS.
_GEMM_BF16 = bfloat16 is not None and _C.gemm_bf16_native()
# below this many multiply-adds the product is too small for the kernel's packing to pay
_GEMM_BF16_MIN = 1 << 15


def _mm_bf16(x, y, bias=None, dtype=bfloat16):
    """x @ y for bfloat16 arrays x (..., M, K) and y (..., K, N) (NumPy's batch broadcasting; any
    strides) by pyddp._C.gemm_bf16: float32 sums, plus float32 bias (N,) when given, returned as
    dtype (bfloat16: rounded once to nearest even, in the kernel; or float32).  None where the
    native kernel is missing or the product is small or not matrix-by-matrix."""
    if not _GEMM_BF16 or x.ndim < 2 or y.ndim < 2:
        return None
    M, K = x.shape[-2:]
    N = y.shape[-1]
    if y.shape[-2] != K or M * N * K < _GEMM_BF16_MIN:
        return None
    if y.ndim == 2:
        out = np.empty(x.shape[:-1] + (N,), dtype)
        a = x.reshape(-1, K) if x.ndim > 2 else x
        _C.gemm_bf16(_c16(out).reshape(-1, N), a.view(np.uint16), y.view(np.uint16), bias)
        return out
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    if len(batch) > 6:
        return None
    # strided views, no copies (attention's q, k, v are views of one projection)
    a = np.broadcast_to(x, batch + (M, K))
    b = np.broadcast_to(y, batch + (K, N))
    out = np.empty(batch + (M, N), dtype)
    _C.gemm_bf16(_c16(out), a.view(np.uint16), b.view(np.uint16), bias)
    return out


def _mm(x, y):
    """matmul; half types are computed on float32 BLAS and rounded back once (bfloat16: by
    _mm_bf16's native kernel where the CPU has AVX512-BF16, the same numerics)."""
    dt = x.dtype
    if dt in _HALFS:
        if dt == bfloat16 and y.dtype == dt:
            out = _mm_bf16(x, y)
            if out is not None:
                return out
        # overflow to inf is the float16 result (as on float16 hardware), not a warning
        return _to(_mm32(x, y), dt)
    return np.matmul(x, y)


def _claim_grad_dest(t, shape, dtype):
    """The array a leaf's gradient may be computed straight into, or None.

    DistributedDataParallel offers each parameter its slot in a gradient bucket
    (``t._grad_dest``) for one backward; an op that computes the parameter's whole gradient
    (linear's weight) claims it while the parameter has no ``.grad``, writes its result there
    with ``out=``, and the engine adopts that array as ``.grad`` without a copy (``t._grad_adopt``),
    so DDP finds the gradient already in its bucket.  Claimed once: a second use of the same
    parameter in the graph gets an array of its own, which the engine adds in.
    """
    d = getattr(t, "_grad_dest", None)
    if d is None:
        return None
    t._grad_dest = None
    if t._grad is not None or d.shape != shape or d.dtype != dtype:
        return None
    t._grad_adopt = d
    return d


def _check_inplace(t, overlap=True):
    """torch's checks before an in-place write into t: not a leaf that requires grad, and (unless
    ``overlap`` is False: fill_, zero_, masked_fill_ accept it as torch's do) not a tensor whose
    elements share memory, such as an ``expand``-ed one."""
    if _st.grad and t._requires_grad and t.grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation.")
    if overlap:
        _check_overlap(t._data)


_OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a "
            "single memory location. Please clone() the tensor before performing the operation.")


def _check_overlap(a):
    """RuntimeError (torch's) when elements of ``a`` share memory: a stride of 0 along a dimension
    of more than one element (what ``expand`` makes)."""
    if 0 in a.strides and a.size > 1:
        for n, s in zip(a.shape, a.strides):
            if s == 0 and n > 1:
                raise RuntimeError(_OVERLAP)


def _dims(dim, ndim):
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return tuple(d % ndim if ndim else 0 for d in dim)
    return dim % ndim if ndim else 0


# ----------------------------------------------------------------------------------------------
# the Tensor

class Tensor:
    """A NumPy-backed tensor with autograd (torch.Tensor's API for CPU float/int arrays).

    ``Tensor(data, requires_grad=False)``: an ndarray is wrapped without a copy, a Tensor shares
    its array, anything else goes through ``np.asarray`` (Python floats become float32).
    """

    __slots__ = ("_data", "_requires_grad", "grad_fn", "_grad", "_accum", "_post_hooks",
                 "__dict__", "__weakref__")
    __array_priority__ = 1000
    _dev = _CPU   # the device; only PYDDP_CUDA_ON_CPU=1 places tensors elsewhere (host memory)

    def __init__(self, data=None, requires_grad=False):
        if data is None:
            a = np.empty((0,), dtype=_st.default)
        elif isinstance(data, Tensor):
            a = data._data
        elif isinstance(data, np.ndarray):
            a = data
        else:
            a = _to_array(data)
            if a.dtype.kind in "iub":
                a = a.astype(_st.default)
        self._data = a
        self._requires_grad = False
        self.grad_fn = None
        self._grad = None
        self._accum = None
        self._post_hooks = None
        if requires_grad:
            self.requires_grad = True

    _wrap = staticmethod(_new)

    # --- basic properties -------------------------------------------------------------------
    @property
    def dtype(self):
        """The element type (a numpy dtype)."""
        return self._data.dtype

    @property
    def shape(self):
        """The shape (a tuple)."""
        return self._data.shape

    @property
    def ndim(self):
        """Number of dimensions."""
        return self._data.ndim

    @property
    def device(self):
        """device('cpu') (equal to the string 'cpu'); under PYDDP_CUDA_ON_CPU=1 the emulated
        CUDA device the tensor was placed on."""
        return self._dev

    @property
    def is_cuda(self):
        """False (True only for tensors placed on an emulated CUDA device)."""
        return self._dev.type == "cuda"

    @property
    def is_leaf(self):
        """True for tensors not produced by a recorded operation."""
        return self.grad_fn is None

    @property
    def requires_grad(self):
        """Whether gradients are computed for this tensor."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        value = _pybool(value)
        if self.grad_fn is not None:
            if not value:
                raise RuntimeError(
                    "you can only change requires_grad flags of leaf variables. If you want to use "
                    "a computed variable in a subgraph that doesn't require differentiation use "
                    "var_no_grad = var.detach().")
            return
        if value and not _is_float_dtype(self._data.dtype):
            raise RuntimeError("only Tensors of floating point and complex dtype can require "
                               "gradients")
        self._requires_grad = value

    def requires_grad_(self, requires_grad=True):
        """Set requires_grad in place; returns self."""
        self.requires_grad = requires_grad
        return self

    @property
    def grad(self):
        """The accumulated gradient (a Tensor) or None."""
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of "
                                f"type {type(value).__name__}")
            if value.shape != self._data.shape:
                raise RuntimeError(f"assigned grad has data of a different size: "
                                   f"{value.shape} vs {self._data.shape}")
        self._grad = value

    @grad.deleter
    def grad(self):
        self._grad = None

    @property
    def data(self):
        """A detached Tensor sharing this tensor's array; assigning replaces the array."""
        return _place(_new(self._data), self._dev)

    @data.setter
    def data(self, value):
        self._data = value._data if isinstance(value, Tensor) else np.asarray(value)

    @property
    def T(self):
        """All dimensions reversed (2-D: the transpose)."""
        return self.permute(*range(self.ndim - 1, -1, -1))

    @property
    def mT(self):
        """The last two dimensions swapped."""
        return self.transpose(-2, -1)

    def size(self, dim=None):
        """The shape, or its length along dim."""
        if dim is None:
            return self._data.shape
        return self._data.shape[dim]

    def dim(self):
        """Number of dimensions."""
        return self._data.ndim

    def numel(self):
        """Number of elements."""
        return self._data.size

    nelement = numel

    def element_size(self):
        """Bytes per element."""
        return self._data.itemsize

    def stride(self, dim=None):
        """Strides in elements."""
        s = tuple(x // self._data.itemsize for x in self._data.strides)
        return s if dim is None else s[dim]

    def is_floating_point(self):
        """Whether the dtype is a float type."""
        return _is_float_dtype(self._data.dtype) and self._data.dtype.kind != "c"

    def data_ptr(self):
        """Address of the first element."""
        return self._data.ctypes.data

    def get_device(self):
        """-1 (CPU), or the index of the emulated CUDA device."""
        return -1 if self._dev.type == "cpu" else self._dev.index

    # --- NumPy interop --------------------------------------------------------------------------
    def numpy(self, force=False):
        """The wrapped ndarray itself (no copy)."""
        return self._data

    def __array__(self, dtype=None, copy=None):
        a = self._data
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        if copy:
            return a.copy()
        return a

    def __dlpack__(self, *args, **kwargs):
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __buffer__(self, flags):  # PEP 688 (Python 3.12+)
        return memoryview(self._data)

    def item(self):
        """The single element as a Python number."""
        return self._data.item()

    def tolist(self):
        """Nested lists of Python numbers."""
        return self._data.tolist()

    def __repr__(self):
        """torch's format (precision, sci mode, summarisation: pyddp.set_printoptions)."""
        from ._str import tensor_repr
        return tensor_repr(self)

    __hash__ = object.__hash__

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    def __bool__(self):
        if self._data.size != 1:
            n = "no values" if not self._data.size else "more than one value"
            raise RuntimeError(f"Boolean value of Tensor with {n} is ambiguous")
        return _pybool(self._data.reshape(()).item())

    def __float__(self):
        return _pyfloat(self._scalar())

    def __int__(self):
        return _pyint(self._scalar())

    def _scalar(self):
        if self._data.size != 1:
            raise ValueError("only one element tensors can be converted to Python scalars")
        return self._data.reshape(()).item()

    def __index__(self):
        if self._data.size != 1 or self._data.dtype.kind not in "iub":
            raise TypeError("only integer tensors of a single element can be converted to an "
                            "index")
        return _pyint(self._data.reshape(()).item())

    def __format__(self, spec):
        if self._data.ndim == 0:
            return format(self._data.item(), spec)
        return object.__format__(self, spec)

    def __reduce_ex__(self, proto):
        return (_rebuild, (self._data, self._requires_grad))

    def __deepcopy__(self, memo):
        r = _new(self._data.copy(), self._requires_grad)
        if self._grad is not None:
            r._grad = _new(self._grad._data.copy())
        if type(self) is not Tensor:
            r.__class__ = type(self)
        if hasattr(self, "__dict__"):
            import copy as _copy
            r.__dict__.update(_copy.deepcopy(self.__dict__, memo))
        memo[id(self)] = r
        return r

    # --- autograd -------------------------------------------------------------------------------
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (see torch.Tensor.backward)."""
        backward(self, gradient, retain_graph, create_graph, inputs)

    def detach(self):
        """A new Tensor sharing the array, outside the graph."""
        return _place(_new(self._data), self._dev)

    def detach_(self):
        """Detach in place; returns self."""
        self.grad_fn = None
        self._requires_grad = False
        return self

    def register_hook(self, hook):
        """hook(grad) -> None or a replacement grad, run when this tensor's gradient is computed."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        node = self.grad_fn if self.grad_fn is not None else _edge(self)
        return node.register_prehook(hook)

    def register_post_accumulate_grad_hook(self, hook):
        """hook(tensor), run once per backward right after this leaf's .grad was accumulated."""
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf "
                               "tensors")
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._post_hooks is None:
            self._post_hooks = {}
        return _add_hook(self._post_hooks, hook)

    def retain_grad(self):
        """Keep this non-leaf tensor's gradient in ``.grad``."""
        if self.grad_fn is None:
            return
        if getattr(self, "_retains", False):
            return
        self._retains = True
        ref = self

        def hook(g):
            if ref._grad is None:
                ref._grad = _new(np.array(g._data))
            else:
                ref._grad._data += g._data
        self.grad_fn.register_prehook(hook)

    @property
    def retains_grad(self):
        """Whether retain_grad() was called on this non-leaf tensor."""
        return getattr(self, "_retains", False)

    def type(self, dtype=None):
        """type(): dtype name; type(dtype): converted tensor."""
        if dtype is None:
            return f"pyddp.{self._data.dtype.name}"
        return self.to(dtype)

    def type_as(self, other):
        """Converted to other's dtype."""
        return self.to(other.dtype)

    def float(self):
        """float32 copy (self when already float32)."""
        return self.to(_F32)

    def half(self):
        """float16 version."""
        return self.to(float16)

    def double(self):
        """float64 version."""
        return self.to(_F64)

    def bfloat16(self):
        """bfloat16 version (needs ml_dtypes)."""
        if bfloat16 is None:
            raise RuntimeError("bfloat16 needs the ml_dtypes package")
        return self.to(bfloat16)

    def long(self):
        """int64 version."""
        return self.to(int64)

    def int(self):
        """int32 version."""
        return self.to(int32)

    def bool(self):
        """bool version."""
        return self.to(bool)

    def cpu(self, memory_format=None):
        """self on the CPU (a copy of a tensor on an emulated CUDA device)."""
        _check_memory_format(memory_format, "cpu")
        return _to_device(self, _CPU)

    def cuda(self, device=None, non_blocking=False, memory_format=None):
        """Under PYDDP_CUDA_ON_CPU=1: this tensor on an emulated CUDA device (the current one
        by default), in host memory.  Otherwise raises as torch's CPU build does (an
        AssertionError, here also a RuntimeError): pyddp tensors live on the CPU."""
        from ..cuda import _emulation
        if not _emulation.enabled():
            raise _cuda_error("Tensor.cuda()")
        _check_memory_format(memory_format, "cuda")
        if device is None:
            device = "cuda"
        elif isinstance(device, (builtins.int, np.integer)) and not isinstance(device,
                                                                               builtins.bool):
            device = f"cuda:{device}"
        dev = _check_device(device)
        if dev.type != "cuda":
            raise RuntimeError(f"Invalid device, must be cuda device (got {str(device)!r})")
        return _to_device(self, dev)

    def record_stream(self, stream):
        """Under PYDDP_CUDA_ON_CPU=1: nothing to do (host memory, work in program order)."""
        from ..cuda import _emulation
        if not _emulation.enabled() or not self.is_cuda:
            raise RuntimeError("record_stream: the tensor must be on a CUDA device (pyddp "
                               "tensors are, only under PYDDP_CUDA_ON_CPU=1)")

    def pin_memory(self, device=None):
        """self's copy in (pageable) host memory; pyddp has no pinned tensors of its own."""
        if self.is_cuda:
            raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors "
                               "can be pinned")
        return self.clone()

    def is_pinned(self, device=None):
        """False."""
        return False

    def clone(self, memory_format=None):
        """A copy in the graph (its strides kept, or those of ``memory_format``)."""
        _check_memory_format(memory_format, "clone")
        a = self._data
        out = _layout(a, memory_format, copy=True) if memory_format is not None else \
            np.copy(a, order="K")
        return _mk(out, "CloneBackward0", lambda g: (g,), (self,), saves=False)

    def contiguous(self, memory_format=None):
        """self when already laid out in ``memory_format`` (C-contiguous by default), else a
        copy that is."""
        _check_memory_format(memory_format, "contiguous")
        out = _layout(self._data, memory_format if memory_format is not None else
                      _contiguous_format)
        if out is self._data:
            return self
        return _mk(out, "CloneBackward0", lambda g: (g,), (self,), saves=False)

    def is_contiguous(self, memory_format=None):
        """Whether the array is laid out in ``memory_format`` (C-contiguous by default)."""
        _check_memory_format(memory_format, "is_contiguous")
        if memory_format is channels_last or memory_format is channels_last_3d:
            rank = 4 if memory_format is channels_last else 5
            if self._data.ndim != rank:
                return False
            return self._data.transpose((0,) + tuple(range(2, rank)) + (1,)).flags.c_contiguous
        return self._data.flags.c_contiguous

    def __pos__(self):
        return self

    def __floordiv__(self, other):
        a, b = _binop_arrays(self, other)
        return _new_on(np.floor_divide(a, b), self)

    def __mod__(self, other):
        a, b = _binop_arrays(self, other)
        return _new_on(np.remainder(a, b), self)

    def _cmp(self, other, f):
        a, b = _binop_arrays(self, other)
        return _new_on(f(a, b), self, other)

    def __eq__(self, other):
        return self._cmp(other, np.equal)

    def __ne__(self, other):
        return self._cmp(other, np.not_equal)

    def __lt__(self, other):
        return self._cmp(other, np.less)

    def __le__(self, other):
        return self._cmp(other, np.less_equal)

    def __gt__(self, other):
        return self._cmp(other, np.greater)

    def __ge__(self, other):
        return self._cmp(other, np.greater_equal)

    eq = __eq__
    ne = __ne__
    lt = __lt__
    le = __le__
    gt = __gt__
    ge = __ge__

    def __and__(self, other):
        return self._cmp(other, np.bitwise_and)

    def __or__(self, other):
        return self._cmp(other, np.bitwise_or)

    def __xor__(self, other):
        return self._cmp(other, np.bitwise_xor)

    def __invert__(self):
        return _new_on(np.invert(self._data), self)

    def logical_not(self):
        """Elementwise not (bool)."""
        return _new_on(np.logical_not(self._data), self)

    def set_(self, source=None, storage_offset=0, size=None, stride=None):
        """Make this tensor share ``source``'s memory (torch's Tensor.set_): ``set_()`` empties it,
        ``set_(t)`` takes t's array, shape and strides, ``set_(t, offset, size, stride)`` a view of
        t's (contiguous) elements from ``offset`` with that size and stride (in elements).
        Returns self."""
        _check_inplace(self)
        if source is None:
            if storage_offset or size is not None or stride is not None:
                raise TypeError("set_(): storage_offset, size and stride need a source")
            self._data = np.empty((0,), dtype=self._data.dtype)
            return self
        if not isinstance(source, Tensor):
            raise TypeError("set_(): argument 'source' must be Tensor, not "
                            f"{type(source).__name__}")
        if source._data.dtype != self._data.dtype:
            raise RuntimeError(f"Could not set tensor of type {source._data.dtype} to a tensor "
                               f"of type {self._data.dtype}")
        if size is None:
            if storage_offset or stride is not None:
                raise TypeError("set_(): storage_offset and stride need a size")
            self._data = source._data
            return self
        size = tuple(_pyint(n) for n in size)
        if builtins.any(n < 0 for n in size) or _pyint(storage_offset) < 0:
            raise RuntimeError(f"set_(): negative size {list(size)} or storage_offset "
                               f"{storage_offset}")
        if stride is None:
            stride, acc = [], 1
            for n in reversed(size):
                stride.insert(0, acc)
                acc *= builtins.max(n, 1)
        stride = tuple(_pyint(s) for s in stride)
        if len(stride) != len(size):
            raise RuntimeError(f"mismatch in length of strides and shape: {len(stride)} and "
                               f"{len(size)}")
        if not source._data.flags.c_contiguous:
            raise RuntimeError("set_(source, storage_offset, size, stride): source must be "
                               "contiguous (its elements are the storage)")
        flat = source._data.reshape(-1)
        last = storage_offset + builtins.sum((n - 1) * s for n, s in zip(size, stride)) \
            if builtins.all(size) else storage_offset - 1
        if last >= flat.size or builtins.any(s < 0 for s in stride):
            raise RuntimeError(f"setStorage: sizes {list(size)}, strides {list(stride)}, storage "
                               f"offset {storage_offset} are out of bounds for storage of "
                               f"{flat.size} elements")
        item = flat.itemsize
        self._data = np.lib.stride_tricks.as_strided(
            flat[storage_offset:] if flat.size > storage_offset else flat[:0], shape=size,
            strides=tuple(s * item for s in stride))
        return self

    def zero_(self):
        """Fill with zeros in place."""
        _check_inplace(self, overlap=False)
        self._data[...] = 0
        return self

    def fill_(self, value):
        """Fill with value in place."""
        _check_inplace(self, overlap=False)
        self._data[...] = value._data if isinstance(value, Tensor) else value
        return self

    def uniform_(self, a=0.0, b=1.0, generator=None):
        """Fill with U(a, b) samples in place."""
        _check_inplace(self)
        g = _np_gen(generator)
        d = self._data
        wdt = d.dtype if d.dtype in (_F32, _F64) else _F32
        d[...] = (g.random(d.shape, dtype=wdt) * (b - a) + a)
        return self

    def normal_(self, mean=0.0, std=1.0, generator=None):
        """Fill with N(mean, std^2) samples in place."""
        _check_inplace(self)
        g = _np_gen(generator)
        d = self._data
        wdt = d.dtype if d.dtype in (_F32, _F64) else _F32
        d[...] = g.standard_normal(d.shape, dtype=wdt) * std + mean
        return self

    def addcmul_(self, t1, t2, value=1):
        """In-place self += value * t1 * t2."""
        _check_inplace(self)
        d = self._data
        d += value * (np.asarray(t1) * np.asarray(t2))
        return self

    def addcdiv_(self, t1, t2, value=1):
        """In-place self += value * t1 / t2."""
        _check_inplace(self)
        d = self._data
        d += value * (np.asarray(t1) / np.asarray(t2))
        return self

    def lerp_(self, end, weight):
        """In-place self += weight * (end - self)."""
        _check_inplace(self)
        d = self._data
        d += np.asarray(weight) * (np.asarray(end) - d)
        return self

    def sqrt_(self):
        """In-place square root."""
        _check_inplace(self)
        np.sqrt(self._data, out=self._data)
        return self

    def exp_(self):
        """In-place exp."""
        _check_inplace(self)
        np.exp(self._data, out=self._data)
        return self

    def neg_(self):
        """In-place negation."""
        _check_inplace(self)
        np.negative(self._data, out=self._data)
        return self

    def abs_(self):
        """In-place absolute value."""
        _check_inplace(self)
        np.abs(self._data, out=self._data)
        return self

    def masked_fill_(self, mask, value):
        """Set elements where mask is True to value, in place."""
        _check_inplace(self, overlap=False)
        np.copyto(self._data, value, where=np.asarray(mask), casting="unsafe")
        return self

    def isfinite(self):
        """Elementwise finiteness (bool)."""
        return _new_on(np.isfinite(self._data), self)

    def isnan(self):
        """Elementwise NaN test (bool)."""
        return _new_on(np.isnan(self._data), self)

    def view(self, *shape):
        """view(shape): the same memory seen with a new shape (-1 inferred), or torch's error
        when the strides do not allow it (``reshape`` copies then); view(dtype) reinterprets
        the bytes (no grad)."""
        if len(shape) == 1 and not isinstance(shape[0], (tuple, list, _pyint)) and \
                not isinstance(shape[0], np.integer):
            return _place(_new(self._data.view(_dtype(shape[0]))), self._dev)
        if not shape:
            raise TypeError("view() received an invalid combination of arguments - got (), but "
                            "expected one of: (dtype dtype), (tuple of ints size)")
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        xd = self._data
        out = xd.view()
        try:
            out.shape = tuple(_pyint(n) for n in shape)
        except AttributeError:   # numpy would have to copy
            raise RuntimeError("view size is not compatible with input tensor's size and stride "
                               "(at least one dimension spans across two contiguous subspaces). "
                               "Use .reshape(...) instead.") from None
        except ValueError:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size "
                               f"{xd.size}") from None
        ishape = xd.shape
        return _mk(out, "ViewBackward0", lambda g: (g.reshape(ishape),), (self,), saves=False)

    def view_as(self, other):
        """view with other's shape."""
        return self.view(other.shape)

    def ravel(self):
        """The elements as one dimension (a view when possible), as torch.ravel."""
        return self.reshape(-1)

    def expand(self, *sizes):
        """Broadcast to sizes (-1 keeps a dimension)."""
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = tuple(sizes[0])
        nd = len(sizes) - self.ndim
        shape = tuple(self.shape[i - nd] if s == -1 else s for i, s in enumerate(sizes))
        if shape == self.shape:
            return self
        xd = self._data
        if nd < 0:
            raise RuntimeError(f"expand(torch.FloatTensor{{{list(xd.shape)}}}, "
                               f"size={list(sizes)}): the number of sizes provided "
                               f"({len(sizes)}) must be greater or equal to the number of "
                               f"dimensions in the tensor ({xd.ndim})")
        for i, (n, s) in enumerate(zip(shape[nd:], xd.shape)):
            if n != s and s != 1:
                raise RuntimeError(f"The expanded size of the tensor ({n}) must match the existing "
                                   f"size ({s}) at non-singleton dimension {i + nd}.  Target "
                                   f"sizes: {list(sizes)}.  Tensor sizes: {list(xd.shape)}")
        # a view sharing the input's memory, writable where it is (as torch's): writes through
        # it reach the input; in-place ops over repeated elements raise (_check_overlap)
        strides = (0,) * nd + tuple(0 if n != s else st for n, s, st in
                                    zip(shape[nd:], xd.shape, xd.strides))
        d = np.lib.stride_tricks.as_strided(xd, shape, strides, writeable=xd.flags.writeable)
        ishape = self.shape
        return _mk(d, "ExpandBackward0", lambda g: (_unbc(g, ishape),), (self,), saves=False)

    def expand_as(self, other):
        """Broadcast to other's shape."""
        return self.expand(*other.shape)

    def repeat(self, *reps):
        """Tile the tensor reps times along each dimension."""
        if len(reps) == 1 and isinstance(reps[0], (tuple, list)):
            reps = tuple(reps[0])
        x = self
        nd = len(reps) - x.ndim
        if nd:
            x = x.reshape((1,) * nd + x.shape)
        # repeat = expand over new interleaved dims then reshape
        shp = []
        big = []
        for r, s in zip(reps, x.shape):
            shp += [1, s]
            big += [r, s]
        y = x.reshape(*shp).expand(*big)
        return y.reshape(*[r * s for r, s in zip(reps, x.shape)])

    def unbind(self, dim=0):
        """Tuple of slices along dim."""
        return tuple(self.select(dim, i) for i in range(self.shape[dim]))

    def select(self, dim, index):
        """The slice at index along dim (dim removed)."""
        idx = (slice(None),) * (dim % self.ndim) + (index,)
        return self[idx]

    def narrow(self, dim, start, length):
        """The slice start:start+length along dim."""
        idx = (slice(None),) * (dim % self.ndim) + (slice(start, start + length),)
        return self[idx]




def _grad_add(a, b):
    """a + b for two gradients of one node (the engine's accumulation): float16/bfloat16 arrays
    widened to float32 (exact), added and rounded once (the same bits as the half types' own
    addition, at memory speed instead of a scalar loop; overflow to inf without a warning, as
    _half_op)."""
    dt = a.dtype
    if dt in _HALFS and b.dtype == dt and a.shape == b.shape and a.size >= _CAST_MIN:
        a32 = _to(a, _F32)
        with np.errstate(over="ignore", invalid="ignore"):
            np.add(a32, _to(b, _F32), out=a32)
        return _to(a32, dt)
    return a + b


# the engine wraps gradients for hooks and .grad as Tensors, and sums gradients with _grad_add
_set_tensor_class(Tensor, _grad_add)
# The C array adapter views Tensors through their `_data` array where the interpreter has no PEP 688
# buffers (Python < 3.12), so they reach the collectives' C fast path on every supported Python.
_C._register_tensor_type(Tensor)


def _rebuild(data, requires_grad):
    return _new(data, requires_grad)


def _place(t, dev):
    """``t`` tagged with device ``dev`` (a host-memory placement; see _check_device)."""
    if dev is not _CPU and dev != _CPU:
        t._dev = dev
    return t


def _to_device(t, dev, copy=False):
    """torch's ``t.to(dev)``: t itself on the same device, else a copy on dev (in the graph)."""
    if dev == t._dev and not copy:
        return t
    r = _mk(t._data.copy(), "ToCopyBackward0", lambda g: (g,), (t,), saves=False)
    if dev == _CPU:
        r.__dict__.pop("_dev", None)
    else:
        r._dev = dev
    return r


def is_tensor(x):
    """True for pyddp Tensors."""
    return isinstance(x, Tensor)


def is_floating_point(t):
    """True for float tensors."""
    return t.is_floating_point()


def numel(t):
    """Number of elements."""
    return t.numel()


# ----------------------------------------------------------------------------------------------
# backward entry points

def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Compute gradients of tensors w.r.t. graph leaves (torch.autograd.backward)."""
    if create_graph:
        raise NotImplementedError("create_graph=True (higher-order gradients) is not supported")
    if isinstance(tensors, Tensor):
        tensors = (tensors,)
        grad_tensors = (grad_tensors,)
    elif grad_tensors is None:
        grad_tensors = (None,) * len(tensors)
    elif isinstance(grad_tensors, Tensor):
        grad_tensors = (grad_tensors,)
    roots, grads = _roots(tensors, grad_tensors)
    if inputs is not None:
        # accumulate only into the given leaves
        inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
        cap = {_edge(t): None for t in inputs}
        run_backward(roots, grads, _pybool(retain_graph), capture=cap)
        for t in inputs:
            g = cap[_edge(t)]
            if g is None:
                continue
            if t.grad_fn is None:
                if t._grad is None:
                    t._grad = _new(np.array(g, dtype=t.dtype))
                else:
                    t._grad._data += g
        return
    run_backward(roots, grads, _pybool(retain_graph))


def _roots(tensors, grad_tensors):
    roots, grads = [], []
    for t, g in zip(tensors, grad_tensors):
        if not t._requires_grad:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a "
                               "grad_fn")
        if g is None:
            if t._data.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            g = np.ones(t._data.shape, dtype=t._data.dtype)
        else:
            g = g._data if isinstance(g, Tensor) else np.asarray(g, dtype=t._data.dtype)
            if g.shape != t._data.shape:
                raise RuntimeError(f"Mismatch in shape: grad_output[0] has a shape of {g.shape} "
                                   f"and output[0] has a shape of {t._data.shape}.")
        roots.append(_edge(t))
        grads.append(g)
    return roots, grads


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False):
    """Gradients of outputs w.r.t. inputs, returned (not accumulated) (torch.autograd.grad)."""
    if create_graph:
        raise NotImplementedError("create_graph=True (higher-order gradients) is not supported")
    single = isinstance(inputs, Tensor)
    inputs = (inputs,) if single else tuple(inputs)
    outputs = (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)
    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = (grad_outputs,)
    for t in inputs:
        if not t._requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
    roots, grads = _roots(outputs, grad_outputs)
    cap = {_edge(t): None for t in inputs}
    run_backward(roots, grads, _pybool(retain_graph), capture=cap)
    res = []
    for t in inputs:
        g = cap[_edge(t)]
        if g is None and not allow_unused:
            raise RuntimeError("One of the differentiated Tensors appears to not have been used "
                               "in the graph. Set allow_unused=True if this is the desired "
                               "behavior.")
        res.append(None if g is None else _new(np.array(g, dtype=t.dtype)))
    return tuple(res)
