"""pyddp.Tensor: a NumPy array with torch-style reverse-mode autograd.

A Tensor wraps one ndarray (``t._data``; ``t.numpy()`` and ``np.asarray(t)`` return it without a
copy).  Operations build a graph of ``pyddp.autograd`` nodes when grad mode is on and an input
requires grad; ``backward()`` walks it (see pyddp/autograd/_engine.py).  Type promotion follows
torch: float32 stays float32 with Python scalars, integer tensors with float scalars give the default
float dtype, 0-d tensors take part like scalars of their category.
"""
from __future__ import annotations

import builtins
from collections import namedtuple

import numpy as np

from .autograd._engine import AccumulateGrad, Node, _add_hook, run_backward

__all__ = [
    "Tensor", "device", "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "zeros_like",
    "ones_like", "empty_like", "full_like", "rand", "randn", "randint", "randperm", "rand_like",
    "randn_like", "arange", "linspace", "eye", "manual_seed", "seed", "initial_seed",
    "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "inference_mode",
    "get_default_dtype", "set_default_dtype", "is_tensor", "is_floating_point", "numel",
    "cat", "concat", "stack", "where", "matmul", "mm", "bmm", "exp", "log", "sqrt", "rsqrt", "abs",
    "neg", "sin", "cos", "tanh", "sigmoid", "relu", "clamp", "clip", "sum", "mean", "max", "min",
    "amax", "amin", "var", "std", "argmax", "argmin", "reshape", "flatten", "permute", "transpose",
    "squeeze", "unsqueeze", "softmax", "log_softmax", "maximum", "minimum", "pow", "add", "sub",
    "mul", "div", "allclose", "equal", "isfinite", "isnan", "isinf", "log1p", "expm1", "square",
    "split", "chunk", "all", "any", "logsumexp", "swapaxes", "default_generator", "sign", "floor",
    "ceil", "round", "outer",
    "float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8",
    "int16", "short", "int32", "int", "int64", "long", "bool", "complex64", "complex128",
]

# ----------------------------------------------------------------------------------------------
# dtypes (numpy dtype objects)
float16 = half = np.dtype(np.float16)
float32 = float = np.dtype(np.float32)  # noqa: A001  (torch's names)
float64 = double = np.dtype(np.float64)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)
int16 = short = np.dtype(np.int16)
int32 = int = np.dtype(np.int32)  # noqa: A001
int64 = long = np.dtype(np.int64)
bool = np.dtype(np.bool_)  # noqa: A001
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)
try:
    import ml_dtypes as _ml

    bfloat16 = np.dtype(_ml.bfloat16)
except ImportError:  # optional
    bfloat16 = None

_F32 = float32
_F64 = float64
_HALFS = {float16} | ({bfloat16} if bfloat16 is not None else set())
_pyfloat = builtins.float
_pyint = builtins.int
_pybool = builtins.bool


def _is_float_dtype(dt):
    return dt.kind in "fc" or (bfloat16 is not None and dt == bfloat16)


class _State:
    __slots__ = ("grad", "autocast", "default", "gen", "seed")


_st = _State()
_st.grad = True
_st.autocast = None      # the lower-precision dtype while pyddp.autocast is active
_st.default = _F32
_st.seed = 0
_st.gen = np.random.default_rng()


class device:
    """torch.device-like: ``device("cpu")``, ``device("cuda", 0)``; equal to its string form."""

    __slots__ = ("type", "index")

    def __init__(self, type="cpu", index=None):  # noqa: A002
        if isinstance(type, device):
            type, index = type.type, type.index
        s = str(type)
        if ":" in s:
            s, i = s.split(":", 1)
            index = _pyint(i)
        self.type = s
        self.index = index

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        return f"device(type='{self.type}')" if self.index is None else \
            f"device(type='{self.type}', index={self.index})"

    def __eq__(self, other):
        if isinstance(other, (device, str)):
            return str(self) == str(other)
        return NotImplemented

    def __hash__(self):
        return hash(str(self))


_CPU = device("cpu")


def _dtype(d):
    """Normalise a dtype argument (np.dtype, numpy type, string, Python type) or None."""
    if d is None:
        return None
    if d is _pyfloat:
        return _st.default
    if d is _pyint:
        return int64
    if d is _pybool:
        return bool
    return np.dtype(d)


# ----------------------------------------------------------------------------------------------
# grad mode

class _GradMode:
    """Base of no_grad / enable_grad / set_grad_enabled: context manager and decorator."""

    _value = True

    def __enter__(self):
        self._prev = _st.grad
        _st.grad = self._value

    def __exit__(self, *exc):
        _st.grad = self._prev
        return False

    def __call__(self, fn):
        import functools

        mode = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = _st.grad
            _st.grad = mode._value
            try:
                return fn(*args, **kwargs)
            finally:
                _st.grad = prev
        return wrapper


class no_grad(_GradMode):
    """Context manager / decorator disabling graph recording (torch.no_grad); ``@no_grad`` and
    ``@no_grad()`` both decorate."""

    _value = False

    def __new__(cls, orig_func=None):
        self = super().__new__(cls)
        if orig_func is not None and callable(orig_func):
            return self(orig_func)
        return self

    def __init__(self, orig_func=None):
        pass


class enable_grad(_GradMode):
    """Context manager / decorator enabling graph recording (torch.enable_grad)."""

    _value = True


class set_grad_enabled(_GradMode):
    """set_grad_enabled(mode): sets grad mode now and, as a context manager, restores it on exit."""

    def __init__(self, mode):
        self._prev = _st.grad
        self._value = _pybool(mode)
        _st.grad = self._value

    def __enter__(self):
        pass

    def __call__(self, fn):
        _st.grad = self._prev
        return _GradMode.__call__(self, fn)


class inference_mode(_GradMode):
    """inference_mode(mode=True): like no_grad here."""

    def __init__(self, mode=True):
        self._value = not mode


def is_grad_enabled():
    """True when operations record the autograd graph."""
    return _st.grad


def get_default_dtype():
    """The dtype of float tensors made from Python floats (float32 unless changed)."""
    return _st.default


def set_default_dtype(d):
    """Set the default float dtype (float32 or float64)."""
    _st.default = _dtype(d)


# ----------------------------------------------------------------------------------------------
# RNG

def manual_seed(seed):
    """Seed pyddp's default generator (randn, rand, dropout, init); returns it."""
    _st.seed = _pyint(seed)
    _st.gen = np.random.default_rng(_st.seed)
    return _st.gen


def seed():
    """Seed the default generator non-deterministically; returns the seed."""
    s = _pyint(np.random.SeedSequence().entropy % (1 << 63))
    manual_seed(s)
    return s


def initial_seed():
    """The seed last given to manual_seed (0 if none)."""
    return _st.seed


def default_generator():
    """pyddp's default numpy Generator."""
    return _st.gen


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


def _edge(t):
    n = t.grad_fn
    if n is not None:
        return n
    if t._requires_grad:
        a = t._accum
        if a is None:
            a = t._accum = AccumulateGrad(t)
        return a
    return None


def _mk(out, name, fn, inputs, saves=True):
    """Wrap an op's result; record a node when grad mode is on and an input requires grad."""
    r = _new(out)
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
        g = g.astype(dt)
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
                ad = ad.astype(dt)
            if bd.dtype != dt:
                bd = bd.astype(dt)
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


def _mm(x, y):
    """matmul; half types are computed on float32 BLAS and rounded back."""
    dt = x.dtype
    if dt in _HALFS:
        # overflow to inf is the float16 result (as on float16 hardware), not a warning
        with np.errstate(over="ignore"):
            return np.matmul(x.astype(_F32), y.astype(_F32)).astype(dt)
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


def _check_inplace(t):
    if _st.grad and t._requires_grad and t.grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation.")


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
        """device('cpu') (equal to the string 'cpu')."""
        return _CPU

    @property
    def is_cuda(self):
        """Always False."""
        return False

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
        return _new(self._data)

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

    def is_contiguous(self):
        """Whether the array is C-contiguous."""
        return self._data.flags.c_contiguous

    def is_floating_point(self):
        """Whether the dtype is a float type."""
        return _is_float_dtype(self._data.dtype) and self._data.dtype.kind != "c"

    def data_ptr(self):
        """Address of the first element."""
        return self._data.ctypes.data

    def get_device(self):
        """-1 (CPU)."""
        return -1

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
        body = np.array2string(self._data, separator=", ", prefix="tensor(")
        extra = ""
        if self._data.dtype not in (_F32, int64, bool):
            extra += f", dtype=pyddp.{self._data.dtype.name}"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{self.grad_fn.name()}>"
        elif self._requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

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
        return _pybool(self._data)

    def __float__(self):
        return _pyfloat(self._data)

    def __int__(self):
        return _pyint(self._data)

    def __index__(self):
        return self._data.__index__()

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
        return _new(self._data)

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

    # --- conversions ----------------------------------------------------------------------------
    def to(self, *args, **kwargs):
        """to(dtype) / to(device) / to(other): a converted tensor (self when nothing changes)."""
        dt = kwargs.get("dtype")
        copy = kwargs.get("copy", False)
        for a in args:
            if isinstance(a, Tensor):
                dt = a.dtype
            elif isinstance(a, str) or type(a).__name__ == "device":
                _check_device(a)
            elif a is not None:
                try:
                    dt = _dtype(a)
                except TypeError:
                    raise TypeError(f"to(): unexpected argument {a!r}") from None
        if "device" in kwargs and kwargs["device"] is not None:
            _check_device(kwargs["device"])
        dt = _dtype(dt)
        if dt is None or dt == self._data.dtype:
            return self.clone() if copy else self
        return _cast(self, dt)

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

    def cpu(self):
        """self (tensors live on the CPU)."""
        return self

    def cuda(self, *args, **kwargs):
        """Not available: pyddp tensors live on the CPU."""
        raise RuntimeError("pyddp tensors live on the CPU; there is no CUDA device")

    def clone(self, memory_format=None):
        """A copy in the graph."""
        return _mk(self._data.copy(), "CloneBackward0", lambda g: (g,), (self,), saves=False)

    def contiguous(self, memory_format=None):
        """self when C-contiguous, else a contiguous copy."""
        if self._data.flags.c_contiguous:
            return self
        return _mk(np.ascontiguousarray(self._data), "CloneBackward0", lambda g: (g,), (self,),
                   saves=False)

    def new_zeros(self, *size, dtype=None, requires_grad=False):
        """zeros with this tensor's dtype."""
        return zeros(*size, dtype=dtype or self.dtype, requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, requires_grad=False):
        """ones with this tensor's dtype."""
        return ones(*size, dtype=dtype or self.dtype, requires_grad=requires_grad)

    def new_empty(self, *size, dtype=None, requires_grad=False):
        """empty with this tensor's dtype."""
        return empty(*size, dtype=dtype or self.dtype, requires_grad=requires_grad)

    def new_full(self, size, fill_value, dtype=None, requires_grad=False):
        """full with this tensor's dtype."""
        return full(size, fill_value, dtype=dtype or self.dtype, requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, requires_grad=False):
        """tensor(data) with this tensor's dtype."""
        return tensor(data, dtype=dtype or self.dtype, requires_grad=requires_grad)

    # --- arithmetic -----------------------------------------------------------------------------
    def __add__(self, other):
        return add(self, other)

    def __radd__(self, other):
        return add(self, other)

    def __sub__(self, other):
        return sub(self, other)

    def __rsub__(self, other):
        return sub(_as_t(other, self), self)

    def __mul__(self, other):
        return mul(self, other)

    def __rmul__(self, other):
        return mul(self, other)

    def __truediv__(self, other):
        return div(self, other)

    def __rtruediv__(self, other):
        return div(_as_t(other, self), self)

    def __pow__(self, other):
        return pow(self, other)

    def __rpow__(self, other):
        return pow(_as_t(other, self), self)

    def __neg__(self):
        return neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return abs(self)

    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(_as_t(other), self)

    def __floordiv__(self, other):
        a, b = _binop_arrays(self, other)
        return _new(np.floor_divide(a, b))

    def __mod__(self, other):
        a, b = _binop_arrays(self, other)
        return _new(np.remainder(a, b))

    def _cmp(self, other, f):
        a, b = _binop_arrays(self, other)
        return _new(f(a, b))

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
        return _new(np.invert(self._data))

    def logical_not(self):
        """Elementwise not (bool)."""
        return _new(np.logical_not(self._data))

    def add(self, other, alpha=1):
        """self + alpha * other."""
        return add(self, other, alpha=alpha)

    def sub(self, other, alpha=1):
        """self - alpha * other."""
        return sub(self, other, alpha=alpha)

    def mul(self, other):
        """self * other."""
        return mul(self, other)

    def div(self, other):
        """self / other."""
        return div(self, other)

    def pow(self, other):
        """self ** other."""
        return pow(self, other)

    def neg(self):
        """-self."""
        return neg(self)

    def matmul(self, other):
        """self @ other."""
        return matmul(self, other)

    mm = matmul
    bmm = matmul

    # --- in-place (no graph recorded for leaves; checked like torch) ----------------------------
    def add_(self, other, alpha=1):
        """In-place self += alpha * other."""
        return _ip_binary(self, other, "add", alpha)

    def sub_(self, other, alpha=1):
        """In-place self -= alpha * other."""
        return _ip_binary(self, other, "sub", alpha)

    def mul_(self, other):
        """In-place self *= other."""
        return _ip_binary(self, other, "mul", 1)

    def div_(self, other):
        """In-place self /= other."""
        return _ip_binary(self, other, "div", 1)

    __iadd__ = add_
    __isub__ = sub_
    __imul__ = mul_
    __itruediv__ = div_

    def zero_(self):
        """Fill with zeros in place."""
        _check_inplace(self)
        self._data[...] = 0
        return self

    def fill_(self, value):
        """Fill with value in place."""
        _check_inplace(self)
        self._data[...] = value._data if isinstance(value, Tensor) else value
        return self

    def copy_(self, src, non_blocking=False):
        """Copy src's values into self (broadcasting, casting)."""
        _check_inplace(self)
        if _st.grad and isinstance(src, Tensor) and src._requires_grad:
            r = _cast(src, self._data.dtype) if src.dtype != self.dtype else src.clone()
            r = r.expand(*self.shape) if r.shape != self.shape else r
            self._data = np.array(r._data)
            self.grad_fn = r.grad_fn
            self._requires_grad = True
            return self
        np.copyto(self._data, src._data if isinstance(src, Tensor) else np.asarray(src),
                  casting="unsafe")
        return self

    def clamp_(self, min=None, max=None):
        """Clamp in place."""
        _check_inplace(self)
        if _st.grad and self._requires_grad:
            r = clamp(self, min, max)
            self._data, self.grad_fn = r._data, r.grad_fn
            return self
        np.clip(self._data, min, max, out=self._data)
        return self

    clip_ = clamp_

    def uniform_(self, a=0.0, b=1.0, generator=None):
        """Fill with U(a, b) samples in place."""
        _check_inplace(self)
        g = generator if isinstance(generator, np.random.Generator) else _st.gen
        d = self._data
        wdt = d.dtype if d.dtype in (_F32, _F64) else _F32
        d[...] = (g.random(d.shape, dtype=wdt) * (b - a) + a)
        return self

    def normal_(self, mean=0.0, std=1.0, generator=None):
        """Fill with N(mean, std^2) samples in place."""
        _check_inplace(self)
        g = generator if isinstance(generator, np.random.Generator) else _st.gen
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
        _check_inplace(self)
        np.copyto(self._data, value, where=np.asarray(mask), casting="unsafe")
        return self

    def masked_fill(self, mask, value):
        """Elements where mask is True replaced by value."""
        return where(mask, _as_t(value, self), self)

    # --- unary math -----------------------------------------------------------------------------
    def exp(self):
        """e ** self."""
        return exp(self)

    def log(self):
        """Natural log."""
        return log(self)

    def log1p(self):
        """log(1 + self)."""
        return log1p(self)

    def expm1(self):
        """exp(self) - 1."""
        return expm1(self)

    def sqrt(self):
        """Square root."""
        return sqrt(self)

    def rsqrt(self):
        """1 / sqrt."""
        return rsqrt(self)

    def square(self):
        """self * self."""
        return square(self)

    def abs(self):
        """Absolute value."""
        return abs(self)

    def sin(self):
        """Sine."""
        return sin(self)

    def cos(self):
        """Cosine."""
        return cos(self)

    def tanh(self):
        """Hyperbolic tangent."""
        return tanh(self)

    def sigmoid(self):
        """Logistic sigmoid."""
        return sigmoid(self)

    def relu(self):
        """max(self, 0)."""
        return relu(self)

    def clamp(self, min=None, max=None):
        """Clamp into [min, max]."""
        return clamp(self, min, max)

    clip = clamp

    def reciprocal(self):
        """1 / self."""
        return div(_as_t(1.0, self), self)

    def sign(self):
        """Sign (no gradient)."""
        return sign(self)

    def floor(self):
        """Floor (zero gradient)."""
        return floor(self)

    def ceil(self):
        """Ceil (zero gradient)."""
        return ceil(self)

    def round(self):
        """Round (zero gradient)."""
        return round(self)

    def isfinite(self):
        """Elementwise finiteness (bool)."""
        return _new(np.isfinite(self._data))

    def isnan(self):
        """Elementwise NaN test (bool)."""
        return _new(np.isnan(self._data))

    def softmax(self, dim):
        """softmax along dim."""
        return softmax(self, dim)

    def log_softmax(self, dim):
        """log_softmax along dim."""
        return log_softmax(self, dim)

    def maximum(self, other):
        """Elementwise max."""
        return maximum(self, other)

    def minimum(self, other):
        """Elementwise min."""
        return minimum(self, other)

    # --- reductions -----------------------------------------------------------------------------
    def sum(self, dim=None, keepdim=False, dtype=None):
        """Sum over dim (all when None)."""
        return sum(self, dim, keepdim, dtype=dtype)

    def mean(self, dim=None, keepdim=False, dtype=None):
        """Mean over dim (all when None)."""
        return mean(self, dim, keepdim, dtype=dtype)

    def max(self, dim=None, keepdim=False):
        """max(): the maximum; max(dim): (values, indices); max(tensor): elementwise."""
        return max(self, dim, keepdim)

    def min(self, dim=None, keepdim=False):
        """min(): the minimum; min(dim): (values, indices); min(tensor): elementwise."""
        return min(self, dim, keepdim)

    def amax(self, dim=None, keepdim=False):
        """Maximum over dim (ties share the gradient)."""
        return amax(self, dim, keepdim)

    def amin(self, dim=None, keepdim=False):
        """Minimum over dim (ties share the gradient)."""
        return amin(self, dim, keepdim)

    def var(self, dim=None, unbiased=None, keepdim=False, correction=None):
        """Variance (unbiased by default)."""
        return var(self, dim, unbiased, keepdim, correction=correction)

    def std(self, dim=None, unbiased=None, keepdim=False, correction=None):
        """Standard deviation (unbiased by default)."""
        return std(self, dim, unbiased, keepdim, correction=correction)

    def argmax(self, dim=None, keepdim=False):
        """Index of the maximum."""
        return argmax(self, dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        """Index of the minimum."""
        return argmin(self, dim, keepdim)

    def all(self, dim=None):
        """All true."""
        return all(self, dim)

    def any(self, dim=None):
        """Any true."""
        return any(self, dim)

    def norm(self, p=2, dim=None, keepdim=False):
        """p-norm (2 by default)."""
        if p == 2:
            return sqrt(sum(self * self, dim, keepdim))
        if p == 1:
            return sum(abs(self), dim, keepdim)
        return sum(abs(self) ** p, dim, keepdim) ** (1.0 / p)

    # --- shapes ---------------------------------------------------------------------------------
    def reshape(self, *shape):
        """Same data, new shape (-1 inferred)."""
        return reshape(self, *shape)

    def view(self, *shape):
        """view(shape) like reshape; view(dtype) reinterprets the bytes (no grad)."""
        if len(shape) == 1 and not isinstance(shape[0], (tuple, list, _pyint)) and \
                not isinstance(shape[0], np.integer):
            return _new(self._data.view(_dtype(shape[0])))
        return reshape(self, *shape)

    def view_as(self, other):
        """reshape to other's shape."""
        return reshape(self, other.shape)

    reshape_as = view_as

    def flatten(self, start_dim=0, end_dim=-1):
        """Merge dims start_dim..end_dim."""
        return flatten(self, start_dim, end_dim)

    def permute(self, *dims):
        """Reorder dimensions."""
        return permute(self, *dims)

    def transpose(self, dim0, dim1):
        """Swap two dimensions."""
        return transpose(self, dim0, dim1)

    def t(self):
        """2-D transpose."""
        return transpose(self, 0, 1) if self.ndim == 2 else self

    def squeeze(self, dim=None):
        """Drop size-1 dimensions."""
        return squeeze(self, dim)

    def unsqueeze(self, dim):
        """Insert a size-1 dimension."""
        return unsqueeze(self, dim)

    def expand(self, *sizes):
        """Broadcast to sizes (-1 keeps a dimension)."""
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = tuple(sizes[0])
        nd = len(sizes) - self.ndim
        shape = tuple(self.shape[i - nd] if s == -1 else s for i, s in enumerate(sizes))
        if shape == self.shape:
            return self
        d = np.broadcast_to(self._data, shape)
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

    def split(self, split_size, dim=0):
        """Chunks of split_size (int) or of the listed sizes along dim."""
        return split(self, split_size, dim)

    def chunk(self, chunks, dim=0):
        """Split into chunks pieces along dim."""
        return chunk(self, chunks, dim)

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

    def __getitem__(self, idx):
        return _getitem(self, idx)

    def __setitem__(self, idx, value):
        _setitem(self, idx, value)


def _rebuild(data, requires_grad):
    return _new(data, requires_grad)


def _check_device(d):
    s = str(d)
    if not (s == "cpu" or s.startswith("cpu:")):
        raise RuntimeError(f"pyddp tensors live on the CPU; cannot move to device {s!r}")


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


# ----------------------------------------------------------------------------------------------
# factories

def _size(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(size)


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of data (Python floats -> float32, ints -> int64)."""
    if device is not None:
        _check_device(device)
    dt = _dtype(dtype)
    a = _to_array(data, dt)
    if a is (data._data if isinstance(data, Tensor) else data):
        a = a.copy()
    elif isinstance(data, np.ndarray) and np.shares_memory(a, data):
        a = a.copy()
    t = _new(a)
    if requires_grad:
        t.requires_grad = True
    return t


def as_tensor(data, dtype=None, device=None):
    """A tensor sharing data's memory when possible."""
    if isinstance(data, Tensor):
        return data.to(dtype) if dtype is not None else data
    if isinstance(data, np.ndarray):
        return _new(data if dtype is None else data.astype(_dtype(dtype), copy=False))
    return tensor(data, dtype)


def from_numpy(a):
    """A tensor sharing the ndarray a."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(a).__name__})")
    return _new(a)


def _factory(fn, size, dtype, requires_grad, device=None):
    if device is not None:
        _check_device(device)
    t = _new(fn(_size(size), _dtype(dtype) or _st.default))
    if requires_grad:
        t.requires_grad = True
    return t


def zeros(*size, dtype=None, device=None, requires_grad=False, out=None):
    """Tensor of zeros."""
    return _factory(np.zeros, size, dtype, requires_grad, device)


def ones(*size, dtype=None, device=None, requires_grad=False, out=None):
    """Tensor of ones."""
    return _factory(np.ones, size, dtype, requires_grad, device)


def empty(*size, dtype=None, device=None, requires_grad=False, out=None, memory_format=None):
    """Uninitialised tensor."""
    return _factory(np.empty, size, dtype, requires_grad, device)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    """Tensor filled with fill_value (dtype inferred from it like torch)."""
    if dtype is None:
        dtype = bool if isinstance(fill_value, _pybool) else int64 if isinstance(
            fill_value, _pyint) else _st.default
    return _factory(lambda s, d: np.full(s, fill_value, d), (size,) if isinstance(size, _pyint)
                    else (tuple(size),), dtype, requires_grad, device)


def _like(fn, t, dtype, requires_grad):
    r = _new(fn(t.shape, _dtype(dtype) or t.dtype))
    if requires_grad:
        r.requires_grad = True
    return r


def zeros_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    """zeros shaped like t."""
    return _like(np.zeros, t, dtype, requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    """ones shaped like t."""
    return _like(np.ones, t, dtype, requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    """uninitialised, shaped like t."""
    return _like(np.empty, t, dtype, requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    """filled with fill_value, shaped like t."""
    return _like(lambda s, d: np.full(s, fill_value, d), t, dtype, requires_grad)


def _gen(generator):
    if generator is None:
        return _st.gen
    if isinstance(generator, np.random.Generator):
        return generator
    return getattr(generator, "_gen", _st.gen)


def _rand_arr(kind, shape, dt, generator):
    g = _gen(generator)
    wdt = dt if dt in (_F32, _F64) else _F32
    a = g.standard_normal(shape, dtype=wdt) if kind == "n" else g.random(shape, dtype=wdt)
    return a if a.dtype == dt else a.astype(dt)


def randn(*size, dtype=None, device=None, requires_grad=False, generator=None):
    """Standard normal samples (pyddp's generator; not bit-identical to torch)."""
    return _factory(lambda s, d: _rand_arr("n", s, d, generator), size, dtype, requires_grad,
                    device)


def rand(*size, dtype=None, device=None, requires_grad=False, generator=None):
    """Uniform [0, 1) samples."""
    return _factory(lambda s, d: _rand_arr("u", s, d, generator), size, dtype, requires_grad,
                    device)


def randn_like(t, dtype=None, requires_grad=False):
    """randn shaped like t."""
    return _like(lambda s, d: _rand_arr("n", s, d, None), t, dtype, requires_grad)


def rand_like(t, dtype=None, requires_grad=False):
    """rand shaped like t."""
    return _like(lambda s, d: _rand_arr("u", s, d, None), t, dtype, requires_grad)


def randint(low, high=None, size=None, dtype=None, generator=None, device=None):
    """Integers in [low, high) (int64)."""
    if high is None:
        low, high = 0, low
    return _new(_gen(generator).integers(low, high, size=tuple(size),
                                         dtype=_dtype(dtype) or int64))


def randperm(n, dtype=None, generator=None, device=None):
    """A random permutation of range(n) (int64)."""
    return _new(_gen(generator).permutation(n).astype(_dtype(dtype) or int64))


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    """Evenly spaced values in [start, end) (int64 for ints, float32 for floats)."""
    if end is None:
        start, end = 0, start
    dt = _dtype(dtype)
    if dt is None:
        dt = int64 if builtins.all(isinstance(v, (_pyint, np.integer))
                                   for v in (start, end, step)) else _st.default
    t = _new(np.arange(start, end, step).astype(dt, copy=False))
    if requires_grad:
        t.requires_grad = True
    return t


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    """steps values from start to end inclusive."""
    t = _new(np.linspace(start, end, steps).astype(_dtype(dtype) or _st.default))
    if requires_grad:
        t.requires_grad = True
    return t


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    """Identity matrix."""
    t = _new(np.eye(n, m, dtype=_dtype(dtype) or _st.default))
    if requires_grad:
        t.requires_grad = True
    return t


# ----------------------------------------------------------------------------------------------
# elementwise ops

def _bin_setup(a, b):
    if not isinstance(a, Tensor):
        a = _as_t(a, b if isinstance(b, Tensor) else None)
    return a


def add(a, b, alpha=1):
    """a + alpha * b."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    if alpha != 1:
        bd = bd * alpha
    out = ad + bd
    bt = b if isinstance(b, Tensor) else None
    if not (_st.grad and (a._requires_grad or (bt is not None and bt._requires_grad))):
        return _new(out)
    sa, sb, dta = a.shape, (bt.shape if bt is not None else None), a.dtype
    dtb = bt.dtype if bt is not None else None

    def bw(g):
        return (_red(g, sa, dta),
                None if sb is None else _red(g if alpha == 1 else g * alpha, sb, dtb))
    return _mk(out, "AddBackward0", bw, (a, bt), saves=False)


def sub(a, b, alpha=1):
    """a - alpha * b."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    if alpha != 1:
        bd = bd * alpha
    out = ad - bd
    bt = b if isinstance(b, Tensor) else None
    if not (_st.grad and (a._requires_grad or (bt is not None and bt._requires_grad))):
        return _new(out)
    sa, sb, dta = a.shape, (bt.shape if bt is not None else None), a.dtype
    dtb = bt.dtype if bt is not None else None

    def bw(g):
        return (_red(g, sa, dta), None if sb is None else _red(-g * alpha if alpha != 1 else -g,
                                                               sb, dtb))
    return _mk(out, "SubBackward0", bw, (a, bt), saves=False)


def mul(a, b):
    """a * b."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    out = ad * bd
    bt = b if isinstance(b, Tensor) else None
    ra = a._requires_grad
    rb = bt is not None and bt._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new(out)
    sa, dta = a.shape, a.dtype

    def bw(g):
        ga = _red(g * bd, sa, dta) if ra else None
        gb = _red(g * ad, bt.shape, bt.dtype) if rb else None
        return ga, gb
    return _mk(out, "MulBackward0", bw, (a, bt))


def div(a, b, rounding_mode=None):
    """a / b (true division; integer inputs give the default float dtype)."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    if rounding_mode is not None:
        f = np.floor_divide if rounding_mode == "floor" else (
            lambda x, y: np.trunc(np.true_divide(x, y)).astype(np.result_type(x, y)))
        return _new(f(ad, bd))
    if not _is_float_dtype(ad.dtype):
        ad = ad.astype(_st.default)
    out = np.true_divide(ad, bd)
    if out.dtype != ad.dtype and _is_float_dtype(ad.dtype) and not isinstance(b, Tensor):
        out = out.astype(ad.dtype)
    bt = b if isinstance(b, Tensor) else None
    ra = a._requires_grad
    rb = bt is not None and bt._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new(out)
    sa, dta = a.shape, a.dtype

    def bw(g):
        ga = _red(g / bd, sa, dta) if ra else None
        gb = _red(-g * out / bd, bt.shape, bt.dtype) if rb else None
        return ga, gb
    return _mk(out, "DivBackward0", bw, (a, bt))


def pow(a, b):
    """a ** b (either may be a Python number)."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    out = np.power(ad, bd)
    bt = b if isinstance(b, Tensor) else None
    ra = a._requires_grad
    rb = bt is not None and bt._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new(out)
    sa, dta = a.shape, a.dtype

    def bw(g):
        ga = gb = None
        if ra:
            if bt is None and bd == 2:
                ga = _red(g * (2 * ad), sa, dta)
            else:
                ga = _red(g * (bd * np.power(ad, bd - 1)), sa, dta)
        if rb:
            with np.errstate(divide="ignore", invalid="ignore"):
                lg = np.where(ad > 0, np.log(np.where(ad > 0, ad, 1)), np.where(ad == 0, 0, np.nan))
            gb = _red(g * out * lg.astype(out.dtype, copy=False), bt.shape, bt.dtype)
        return ga, gb
    return _mk(out, "PowBackward0", bw, (a, bt))


def neg(a):
    """-a."""
    return _mk(np.negative(a._data), "NegBackward0", lambda g: (-g,), (a,), saves=False)


def _unary(name, f, dfn, use_out=False):
    """Make an elementwise op: f(x) forward, dfn(g, x, out) -> grad."""
    def op(x):
        if not isinstance(x, Tensor):
            x = _as_t(x)
        xd = x._data
        if _st.autocast is not None and name in _FP32_OPS and xd.dtype in _HALFS:
            x = _cast(x, _F32)
            xd = x._data
        if not _is_float_dtype(xd.dtype):
            xd = xd.astype(_st.default)
        out = f(xd)
        if not (_st.grad and x._requires_grad):
            return _new(out)
        return _mk(out, name, lambda g: (dfn(g, xd, out),), (x,))
    op.__name__ = name
    return op


_FP32_OPS = {"ExpBackward0", "LogBackward0"}


def _recip_sqrt(x):
    return 1.0 / np.sqrt(x)


exp = _unary("ExpBackward0", np.exp, lambda g, x, o: g * o)
log = _unary("LogBackward0", np.log, lambda g, x, o: g / x)
log1p = _unary("Log1PBackward0", np.log1p, lambda g, x, o: g / (x + 1))
expm1 = _unary("Expm1Backward0", np.expm1, lambda g, x, o: g * (o + 1))
sqrt = _unary("SqrtBackward0", np.sqrt, lambda g, x, o: g / (2 * o))
rsqrt = _unary("RsqrtBackward0", _recip_sqrt, lambda g, x, o: g * (-0.5 * o * o * o))
sin = _unary("SinBackward0", np.sin, lambda g, x, o: g * np.cos(x))
cos = _unary("CosBackward0", np.cos, lambda g, x, o: -g * np.sin(x))
tanh = _unary("TanhBackward0", np.tanh, lambda g, x, o: g * (1 - o * o))
square = _unary("PowBackward0", np.square, lambda g, x, o: g * (2 * x))


def _sigmoid_f(x):
    # stable for both signs: 1/(1+exp(-x)) = exp(-log1p(exp(-x)))
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


sigmoid = _unary("SigmoidBackward0", _sigmoid_f, lambda g, x, o: g * (o * (1 - o)))

for _name, _what in (("exp", "e**x"), ("log", "the natural logarithm"), ("log1p", "log(1 + x)"),
                     ("expm1", "e**x - 1"), ("sqrt", "the square root"),
                     ("rsqrt", "1 / sqrt(x)"), ("sin", "the sine"), ("cos", "the cosine"),
                     ("tanh", "the hyperbolic tangent"), ("square", "x * x"),
                     ("sigmoid", "the logistic sigmoid 1 / (1 + e**-x)")):
    globals()[_name].__name__ = globals()[_name].__qualname__ = _name
    globals()[_name].__doc__ = f"{_name}(x): {_what}, elementwise (torch.{_name}; differentiable)."
del _name, _what


def abs(x):  # noqa: A001
    """|x| (gradient sign(x), 0 at 0)."""
    xd = x._data
    return _mk(np.abs(xd), "AbsBackward0", lambda g: (g * np.sign(xd),), (x,))


def relu(x):
    """max(x, 0)."""
    xd = x._data
    out = np.maximum(xd, 0)

    def bw(g):
        return (g * (out > 0),)  # a bool mask multiplies fast (np.where with a scalar does not)
    return _mk(out, "ReluBackward0", bw, (x,))


def _nograd_unary(f):
    def op(x):
        return _mk(f(x._data), "ZeroBackward", lambda g: (np.zeros_like(g),), (x,), saves=False)
    op.__name__ = f.__name__
    op.__doc__ = f"Elementwise {f.__name__} of a Tensor (NumPy's np.{f.__name__}); its gradient is zero."
    return op


sign = _nograd_unary(np.sign)
floor = _nograd_unary(np.floor)
ceil = _nograd_unary(np.ceil)
round = _nograd_unary(np.round)  # noqa: A001


def clamp(x, min=None, max=None):  # noqa: A002
    """Clamp x into [min, max] (either may be None or a Tensor); gradient passes inside."""
    xd = x._data
    lo = min._data if isinstance(min, Tensor) else min
    hi = max._data if isinstance(max, Tensor) else max
    out = np.clip(xd, lo, hi) if (lo is not None or hi is not None) else xd.copy()
    if out.dtype != xd.dtype:
        out = out.astype(xd.dtype)

    def bw(g):
        m = np.ones(xd.shape, dtype=np.bool_)
        if lo is not None:
            m &= xd >= lo
        if hi is not None:
            m &= xd <= hi
        return (g * m,)
    return _mk(out, "ClampBackward1", bw, (x,))


clip = clamp


def maximum(a, b):
    """Elementwise max (ties split the gradient like torch)."""
    return _minmax2(a, b, np.maximum, "MaximumBackward0")


def minimum(a, b):
    """Elementwise min."""
    return _minmax2(a, b, np.minimum, "MinimumBackward0")


def _minmax2(a, b, f, name):
    a = _bin_setup(a, b)
    b = _as_t(b, a)
    ad, bd = _binop_arrays(a, b)
    out = f(ad, bd)

    def bw(g):
        wa = np.where(ad == bd, 0.5, (out == ad)).astype(g.dtype)
        wa = np.broadcast_to(wa, out.shape)
        return (_red(g * wa, a.shape, a.dtype), _red(g * (1 - wa), b.shape, b.dtype))
    return _mk(out, name, bw, (a, b))


def where(cond, a=None, b=None):
    """where(cond, a, b): a where cond else b (a, b Tensors or numbers); where(cond): indices."""
    c = cond._data if isinstance(cond, Tensor) else np.asarray(cond)
    if a is None:
        return tuple(_new(i) for i in np.nonzero(c))
    if not isinstance(a, Tensor):
        a = _as_t(a, b if isinstance(b, Tensor) else None)
    if not isinstance(b, Tensor):
        b = _as_t(b, a)
    ad, bd = _binop_arrays(a, b)
    out = np.where(c, ad, bd)

    def bw(g):
        ga = _red(g * c, a.shape, a.dtype) \
            if a._requires_grad else None
        gb = _red(g * ~c, b.shape, b.dtype) \
            if b._requires_grad else None
        return ga, gb
    return _mk(out, "WhereBackward0", bw, (a, b))


def _cast(x, dt):
    src = x._data.dtype
    if dt in _HALFS:
        # values beyond float16's range become inf, as torch's casts do, without a NumPy warning
        # (amp's loss scaler expects and handles them)
        with np.errstate(over="ignore"):
            out = x._data.astype(dt)
    else:
        out = x._data.astype(dt)
    if not _is_float_dtype(dt):
        return _new(out)
    if src in _HALFS:
        def back(g):
            with np.errstate(over="ignore"):
                return (g.astype(src),)
    else:
        def back(g):
            return (g.astype(src),)
    return _mk(out, "ToCopyBackward0", back, (x,), saves=False)


def matmul(a, b):
    """Matrix product with NumPy/torch broadcasting (1-D operands as vectors)."""
    if _st.autocast is not None:
        a, b = _ac_low(a), _ac_low(b)
    ad, bd = a._data, b._data
    if ad.dtype != bd.dtype:
        dt = _promote(ad, bd)
        ad, bd = ad.astype(dt), bd.astype(dt)
    out = _mm(ad, bd)
    ra, rb = a._requires_grad, b._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new(out)

    def bw(g):
        A = ad[None, :] if ad.ndim == 1 else ad
        B = bd[:, None] if bd.ndim == 1 else bd
        G = g
        if bd.ndim == 1:
            G = np.expand_dims(G, -1)
        if ad.ndim == 1:
            G = np.expand_dims(G, -2)
        ga = gb = None
        if ra:
            ga = _mm(G, np.swapaxes(B, -1, -2))
            ga = _red(ga, A.shape, a.dtype).reshape(ad.shape)
        if rb:
            gb = _mm(np.swapaxes(A, -1, -2), G)
            gb = _red(gb, B.shape, b.dtype).reshape(bd.shape)
        return ga, gb
    return _mk(out, "MmBackward0", bw, (a, b))


mm = matmul
bmm = matmul


def outer(a, b):
    """Outer product of two vectors."""
    return matmul(a.reshape(-1, 1), b.reshape(1, -1))


def _ac_low(t):
    dt = _st.autocast
    if t._data.dtype != dt and t._data.dtype.kind == "f":
        return _cast(t, dt)
    return t


def _ac_f32(t):
    """Under autocast, lower-precision float inputs go up to float32 (fp32-list ops)."""
    if _st.autocast is not None and t._data.dtype in _HALFS:
        return _cast(t, _F32)
    return t


# ----------------------------------------------------------------------------------------------
# reductions

def _expand_grad(g, shape, dim, keepdim):
    if dim is not None and not keepdim:
        g = np.expand_dims(g, dim)
    return np.broadcast_to(g, shape)


def sum(x, dim=None, keepdim=False, dtype=None):  # noqa: A001
    """Sum over dim (int or tuple; all when None)."""
    x = _ac_f32(x)
    xd = x._data
    d = _dims(dim, xd.ndim)
    dt = _dtype(dtype)
    if dt is None and xd.dtype.kind in "biu":
        dt = int64
    out = np.sum(xd, axis=d, keepdims=keepdim, dtype=dt)
    if not isinstance(out, np.ndarray):
        out = np.asarray(out)
    shape, sdt = xd.shape, xd.dtype
    return _mk(out, "SumBackward1" if dim is not None else "SumBackward0",
               lambda g: (_expand_grad(g.astype(sdt, copy=False), shape, d, keepdim),), (x,),
               saves=False)


def mean(x, dim=None, keepdim=False, dtype=None):
    """Mean over dim (int or tuple; all when None)."""
    x = _ac_f32(x)
    xd = x._data
    if not _is_float_dtype(xd.dtype):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a "
                           f"floating point or complex dtype. Got: {xd.dtype}")
    d = _dims(dim, xd.ndim)
    out = np.mean(xd, axis=d, keepdims=keepdim, dtype=_dtype(dtype))
    if not isinstance(out, np.ndarray):
        out = np.asarray(out, dtype=xd.dtype)
    n = xd.size // builtins.max(out.size, 1) if out.size else 0
    shape = xd.shape

    def bw(g):
        return (_expand_grad(g / n if n else g, shape, d, keepdim),)
    return _mk(out, "MeanBackward1" if dim is not None else "MeanBackward0", bw, (x,),
               saves=False)


_MinMax = namedtuple("return_types", ["values", "indices"])


def _reduce_minmax(x, dim, keepdim, is_max):
    if isinstance(dim, Tensor):
        return (maximum if is_max else minimum)(x, dim)
    xd = x._data
    if dim is None:
        out = np.asarray(xd.max() if is_max else xd.min())

        def bw(g):
            m = (xd == out)
            return ((g / _pyint(m.sum())) * m,)
        return _mk(out, "MaxBackward1" if is_max else "MinBackward1", bw, (x,))
    d = dim % builtins.max(xd.ndim, 1)
    idx = np.argmax(xd, axis=d, keepdims=True) if is_max else np.argmin(xd, axis=d, keepdims=True)
    vals = np.take_along_axis(xd, idx, axis=d)
    if not keepdim:
        vals = np.squeeze(vals, d)

    def bw(g):
        gx = np.zeros(xd.shape, dtype=g.dtype)
        np.put_along_axis(gx, idx, g if keepdim else np.expand_dims(g, d), axis=d)
        return (gx,)
    v = _mk(vals, "MaxBackward0" if is_max else "MinBackward0", bw, (x,))
    return _MinMax(v, _new(idx if keepdim else np.squeeze(idx, d)))


def max(x, dim=None, keepdim=False):  # noqa: A001
    """max(x), max(x, dim, keepdim) -> (values, indices), max(x, other) elementwise."""
    return _reduce_minmax(x, dim, keepdim, True)


def min(x, dim=None, keepdim=False):  # noqa: A001
    """min(x), min(x, dim, keepdim) -> (values, indices), min(x, other) elementwise."""
    return _reduce_minmax(x, dim, keepdim, False)


def _amaxmin(x, dim, keepdim, is_max):
    xd = x._data
    d = _dims(dim, xd.ndim)
    f = np.max if is_max else np.min
    out = np.asarray(f(xd, axis=d, keepdims=keepdim))

    def bw(g):
        o = out if keepdim or d is None else np.expand_dims(out, d)
        m = (xd == o)
        cnt = m.sum(axis=d, keepdims=True)
        gg = g if keepdim or d is None else np.expand_dims(g, d)
        return ((gg / cnt).astype(g.dtype, copy=False) * m,)
    return _mk(out, "AmaxBackward0" if is_max else "AminBackward0", bw, (x,))


def amax(x, dim=None, keepdim=False):
    """Max over dim (tuple allowed); ties share the gradient evenly."""
    return _amaxmin(x, dim, keepdim, True)


def amin(x, dim=None, keepdim=False):
    """Min over dim (tuple allowed); ties share the gradient evenly."""
    return _amaxmin(x, dim, keepdim, False)


def _correction(unbiased, correction):
    if correction is not None:
        return correction
    if unbiased is None:
        return 1
    return 1 if unbiased else 0


def var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    """Variance over dim with Bessel's correction (correction=1) by default."""
    if isinstance(unbiased, (_pyint,)) and not isinstance(unbiased, _pybool) and dim is None:
        dim, unbiased = unbiased, None
    c = _correction(unbiased, correction)
    xd = x._data
    d = _dims(dim, xd.ndim)
    mu = np.mean(xd, axis=d, keepdims=True)
    diff = xd - mu
    n = xd.size // builtins.max(mu.size, 1)
    out = np.asarray(np.sum(diff * diff, axis=d, keepdims=keepdim) / builtins.max(n - c, 0),
                     dtype=xd.dtype)

    def bw(g):
        gg = g if keepdim or d is None else np.expand_dims(g, d)
        return ((gg * (2.0 / (n - c))) * diff,)
    return _mk(out, "VarBackward0", bw, (x,))


def std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    """Standard deviation over dim (correction=1 by default)."""
    return sqrt(var(x, dim, unbiased, keepdim, correction))


def argmax(x, dim=None, keepdim=False):
    """Index of the maximum (flattened when dim is None)."""
    xd = x._data
    if dim is None:
        return _new(np.asarray(np.argmax(xd), dtype=int64))
    return _new(np.argmax(xd, axis=dim, keepdims=keepdim).astype(int64, copy=False))


def argmin(x, dim=None, keepdim=False):
    """Index of the minimum (flattened when dim is None)."""
    xd = x._data
    if dim is None:
        return _new(np.asarray(np.argmin(xd), dtype=int64))
    return _new(np.argmin(xd, axis=dim, keepdims=keepdim).astype(int64, copy=False))


def all(x, dim=None):  # noqa: A001
    """All elements true."""
    return _new(np.asarray(np.all(x._data, axis=dim)))


def any(x, dim=None):  # noqa: A001
    """Any element true."""
    return _new(np.asarray(np.any(x._data, axis=dim)))


def isfinite(x):
    """Elementwise finiteness."""
    return _new(np.isfinite(x._data))


def isnan(x):
    """Elementwise NaN test."""
    return _new(np.isnan(x._data))


def isinf(x):
    """Elementwise infinity test."""
    return _new(np.isinf(x._data))


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Whether all elements are close."""
    return _pybool(np.allclose(np.asarray(a), np.asarray(b), rtol, atol, equal_nan))


def equal(a, b):
    """Same shape and elements."""
    return a.shape == b.shape and _pybool(np.array_equal(a._data, b._data))


# ----------------------------------------------------------------------------------------------
# shapes

def reshape(x, *shape):
    """Same elements, new shape."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    xd = x._data
    out = xd.reshape(shape)
    ishape = xd.shape
    return _mk(out, "ViewBackward0", lambda g: (g.reshape(ishape),), (x,), saves=False)


def flatten(x, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim into one."""
    nd = x.ndim
    if nd == 0:
        return reshape(x, 1)
    s, e = start_dim % nd, end_dim % nd
    shp = x.shape
    new = shp[:s] + (-1 if builtins.all(shp) else _prod(shp[s:e + 1]),) + shp[e + 1:]
    return reshape(x, new)


def _prod(t):
    p = 1
    for v in t:
        p *= v
    return p


def permute(x, *dims):
    """Reorder dimensions."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    dims = tuple(d % x.ndim for d in dims)
    inv = tuple(np.argsort(dims))
    return _mk(x._data.transpose(dims), "PermuteBackward0", lambda g: (g.transpose(inv),), (x,),
               saves=False)


def transpose(x, dim0, dim1):
    """Swap two dimensions."""
    return _mk(np.swapaxes(x._data, dim0, dim1), "TransposeBackward0",
               lambda g: (np.swapaxes(g, dim0, dim1),), (x,), saves=False)


swapaxes = transpose


def squeeze(x, dim=None):
    """Drop size-1 dimensions (only dim's when given and of size 1)."""
    xd = x._data
    if dim is None:
        out = np.squeeze(xd)
    else:
        ds = (dim,) if isinstance(dim, _pyint) else tuple(dim)
        ds = tuple(d % builtins.max(xd.ndim, 1) for d in ds if xd.ndim and xd.shape[d] == 1)
        out = np.squeeze(xd, ds) if ds else xd
    ishape = xd.shape
    return _mk(out, "SqueezeBackward0", lambda g: (g.reshape(ishape),), (x,), saves=False)


def unsqueeze(x, dim):
    """Insert a size-1 dimension at dim."""
    xd = x._data
    out = np.expand_dims(xd, dim % (xd.ndim + 1))
    ishape = xd.shape
    return _mk(out, "UnsqueezeBackward0", lambda g: (g.reshape(ishape),), (x,), saves=False)


def cat(tensors, dim=0):
    """Concatenate along dim."""
    tensors = list(tensors)
    arrs = [t._data for t in tensors]
    out = np.concatenate(arrs, axis=dim)
    nd = out.ndim
    d = dim % nd
    bounds = np.cumsum([a.shape[d] for a in arrs])[:-1]

    def bw(g):
        return tuple(np.split(g, bounds, axis=d))
    return _mk(out, "CatBackward0", bw, tuple(tensors), saves=False)


concat = cat


def stack(tensors, dim=0):
    """Stack along a new dim."""
    tensors = list(tensors)
    out = np.stack([t._data for t in tensors], axis=dim)
    d = dim % out.ndim

    def bw(g):
        return tuple(np.take(g, i, axis=d) for i in range(len(tensors)))
    return _mk(out, "StackBackward0", bw, tuple(tensors), saves=False)


def split(x, split_size, dim=0):
    """Split along dim into chunks of split_size, or of the listed sizes."""
    n = x.shape[dim]
    if isinstance(split_size, _pyint):
        sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    else:
        sizes = list(split_size)
    res, start = [], 0
    for s in sizes:
        res.append(x.narrow(dim, start, s))
        start += s
    return tuple(res)


def chunk(x, chunks, dim=0):
    """Split into chunks pieces (the last may be smaller)."""
    n = x.shape[dim]
    return split(x, -(-n // chunks), dim)


def _is_basic(idx):
    items = idx if isinstance(idx, tuple) else (idx,)
    for i in items:
        if not (i is None or i is Ellipsis or isinstance(i, (slice, _pyint, np.integer))):
            return False
    return True


def _conv_index(idx):
    if isinstance(idx, Tensor):
        return idx._data
    if isinstance(idx, tuple):
        return tuple(i._data if isinstance(i, Tensor) else i for i in idx)
    if isinstance(idx, list) and idx and builtins.any(isinstance(i, Tensor) for i in idx):
        return np.array([i._data if isinstance(i, Tensor) else i for i in idx])
    return idx


def _getitem(x, idx):
    idx = _conv_index(idx)
    xd = x._data
    out = xd[idx]
    if not isinstance(out, np.ndarray):
        out = np.asarray(out)
    shape = xd.shape
    basic = _is_basic(idx)

    def bw(g):
        gx = np.zeros(shape, dtype=g.dtype)
        if basic:
            gx[idx] = g
        else:
            np.add.at(gx, idx, g)
        return (gx,)
    return _mk(out, "SliceBackward0" if basic else "IndexBackward0", bw, (x,), saves=False)


def _setitem(x, idx, value):
    idx = _conv_index(idx)
    vt = value if isinstance(value, Tensor) else None
    vd = value._data if vt is not None else value
    if _st.grad and (x._requires_grad or (vt is not None and vt._requires_grad)):
        _check_inplace(x)
        new = x._data.copy()
        new[idx] = vd
        vshape = None if vt is None else vt.shape
        vdt = None if vt is None else vt.dtype
        basic = _is_basic(idx)

        def bw(g):
            gx = g.copy()
            gx[idx] = 0
            gv = None
            if vshape is not None:
                sel = g[idx]
                gv = _red(np.asarray(sel), vshape, vdt) if sel.shape != vshape or not basic \
                    else sel
            return gx, gv
        r = _mk(new, "CopySlices", bw, (x, vt), saves=False)
        x._data, x.grad_fn, x._requires_grad = r._data, r.grad_fn, True
        return
    x._data[idx] = vd


def _ip_binary(self, other, op, alpha):
    """In-place add/sub/mul/div: numpy in place when no graph; else recorded out of place."""
    _check_inplace(self)
    ot = other if isinstance(other, Tensor) else None
    if _st.grad and (self._requires_grad or (ot is not None and ot._requires_grad)):
        if op == "add":
            r = add(self, other, alpha=alpha)
        elif op == "sub":
            r = sub(self, other, alpha=alpha)
        elif op == "mul":
            r = mul(self, other)
        else:
            r = div(self, other)
        self._data = r._data.astype(self._data.dtype, copy=False)
        self.grad_fn, self._requires_grad = r.grad_fn, r._requires_grad
        return self
    d = self._data
    o = ot._data if ot is not None else other
    if alpha != 1:
        o = o * alpha
    f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide}[op]
    f(d, o, out=d, casting="unsafe")
    return self


# softmax / log_softmax live here so Tensor methods can use them

def softmax(x, dim=None, dtype=None):
    """exp(x) / sum(exp(x)) along dim."""
    x = _ac_f32(x)
    if dtype is not None:
        x = x.to(dtype)
    xd = x._data
    if dim is None:
        dim = 0 if xd.ndim in (0, 1, 3) else 1
    e = xd - xd.max(axis=dim, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=dim, keepdims=True)
    out = e

    def bw(g):
        s = (g * out).sum(axis=dim, keepdims=True)
        return (out * (g - s),)
    return _mk(out, "SoftmaxBackward0", bw, (x,))


def log_softmax(x, dim=None, dtype=None):
    """x - logsumexp(x) along dim."""
    x = _ac_f32(x)
    if dtype is not None:
        x = x.to(dtype)
    xd = x._data
    if dim is None:
        dim = 0 if xd.ndim in (0, 1, 3) else 1
    z = xd - xd.max(axis=dim, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=dim, keepdims=True))
    z -= lse
    out = z

    def bw(g):
        return (g - np.exp(out) * g.sum(axis=dim, keepdims=True),)
    return _mk(out, "LogSoftmaxBackward0", bw, (x,))


def logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) along dim, computed stably."""
    xd = x._data
    m = xd.max(axis=dim, keepdims=True)
    s = np.exp(xd - m)
    tot = s.sum(axis=dim, keepdims=True)
    out = np.log(tot) + m
    res = out if keepdim else np.squeeze(out, dim)

    def bw(g):
        gg = g if keepdim else np.expand_dims(g, dim)
        return (gg * (s / tot),)
    return _mk(res, "LogsumexpBackward0", bw, (x,))


def _logsumexp_method(self, dim, keepdim=False):
    """log(sum(exp(self))) along dim, computed stably."""
    return logsumexp(self, dim, keepdim)


Tensor.logsumexp = _logsumexp_method
