"""The Python face of pyddp's one array adapter.

The adapter is one entry with one rule per protocol, as mpi4py's ``asbuffer``: the C function
``pd_view_get`` (csrc/python/buffers.c), which the C fast paths call on the user's object and
Python reaches as ``_C.describe_array``.  Its rules, the first the object offers describing it:

1. the buffer protocol (NumPy, bytes, memoryview, array.array; pyddp Tensors on Python 3.12+);
2. a pyddp Tensor's ``_data`` array (Python < 3.12, no PEP 688 buffers);
3. DLPack (``__dlpack__``; CUDA arrays that also have rule 4 go there, no export needed);
4. ``__cuda_array_interface__`` (CuPy, Numba, JAX GPU arrays, ...).

This module adds no rule of its own.  ``describe(x)`` answers rules 1 and 2 itself for NumPy
arrays and pyddp Tensors (the hot path: the same answer without a call), handles torch tensors
with torch's own operations (a tensor that requires grad refuses ``__dlpack__``; conjugate and
bfloat16 tensors need torch's views; CUDA tensors are described from the tensor, no export), and
asks the C entry for everything else, adding NumPy's view of host memory.  Nothing here imports
torch, CuPy, JAX or a CUDA library: torch is recognised through ``sys.modules`` (it is loaded when
one of its tensors exists).

Its consumers: pyddp.distributed's collectives (``cpu_array``), the amp and optimizer kernels
(``host_array``), DistributedDataParallel and amp (``is_torch_tensor`` / ``is_torch_module``).
``describe(x)`` returns an ``ArrayView`` for any array, CPU or CUDA.  ``cpu_array`` and
``host_array`` return NumPy arrays sharing the memory and raise a clear error naming the argument
and its device for an array that is not in host memory.  bfloat16 reaches C as a uint16 view of
the same memory with the dtype code ``BFLOAT16``.
"""
from __future__ import annotations

import sys

import numpy as np

from . import _C
from ._detect import is_torch_module, is_torch_tensor, loaded_torch  # noqa: F401  (the one detector)

# ================================================================================ dtype table
# The C core's dtypes, as pyddp._C exports them from its table (csrc/kernels/dtype.c): codes in
# pd_dtype order and sizes.  Everything below derives from them; nothing in Python re-encodes a
# code (ReduceOp, in pyddp.distributed.distributed_c10d, reads _C.REDUCE_OPS the same way).

DTYPE_CODES = dict(_C.DTYPE_CODES)

# code -> name, in code order
DTYPE_NAMES = [n for n, _ in sorted(DTYPE_CODES.items(), key=lambda kv: kv[1])]
BOOL, INT8, UINT8, INT16, UINT16, INT32, UINT32, INT64, UINT64 = (
    DTYPE_CODES[n] for n in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                             "int64", "uint64"))
FLOAT16, BFLOAT16, FLOAT32, FLOAT64, COMPLEX64, COMPLEX128 = (
    DTYPE_CODES[n] for n in ("float16", "bfloat16", "float32", "float64", "complex64",
                             "complex128"))
# bytes per element, by name
ITEMSIZES = dict(_C.DTYPE_SIZES)
# NumPy dtype -> code.  bfloat16 has no NumPy dtype of its own (ml_dtypes.bfloat16 is matched by
# name): it travels as uint16 with the code BFLOAT16.
_NP_CODES = {np.dtype(n): c for n, c in DTYPE_CODES.items() if n != "bfloat16"}
_SUPPORTED = ", ".join(DTYPE_NAMES)
# ============================================================================ end of the table


def dtype_code(dt, name: str = "array") -> int:
    """The C dtype code of a NumPy dtype (ml_dtypes.bfloat16 included); TypeError otherwise."""
    dt = np.dtype(dt)
    code = _NP_CODES.get(dt)
    if code is None:
        if dt.name != "bfloat16":
            raise TypeError(f"{name} has unsupported dtype {dt}; supported: {_SUPPORTED}")
        code = BFLOAT16
    return code


# ------------------------------------------------------------------------------------ torch

def _torch_dtype_name(t) -> str:
    return str(t.dtype).rpartition(".")[2]


def _torch_host(t, name, consumer, strict):
    """(ndarray sharing a CPU torch tensor's memory, dtype code or None); bfloat16 as uint16."""
    torch = sys.modules["torch"]
    if t.device.type != "cpu":
        raise DeviceError(name, str(t.device), consumer, describe(t, name))
    if strict and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), BFLOAT16
    return t.numpy(), None


# ------------------------------------------------------------------------------------ views

class ArrayView:
    """What pyddp knows about one array, on any device.

    ``array`` is the NumPy array sharing its memory (host arrays; bfloat16 as a uint16 view) or
    None (device arrays); ``code`` the C dtype code (None for a dtype the C core does not have,
    ``dtype`` then names it); ``device`` 'cpu', 'cuda' or another DLPack device name, ``index``
    its ordinal; ``ptr`` the address of the first element; ``strides`` in bytes (None: C order);
    ``owner`` the object the memory belongs to, kept alive by this view; ``stream`` the CUDA
    stream its ``__cuda_array_interface__`` names (None: none); ``name`` the argument it was
    given as, once a collective has checked it.
    """

    __slots__ = ("array", "code", "dtype", "device", "index", "ptr", "shape", "strides",
                 "nbytes", "writable", "contiguous", "owner", "stream", "name")

    def __init__(self, array, code, dtype, device, index, ptr, shape, strides, nbytes,
                 writable, contiguous, owner):
        self.array = array
        self.code = code
        self.dtype = dtype
        self.device = device
        self.index = index
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.nbytes = nbytes
        self.writable = writable
        self.contiguous = contiguous
        self.owner = owner
        self.stream = None
        self.name = None

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return ITEMSIZES.get(self.dtype, 0)

    @property
    def device_str(self) -> str:
        return self.device if self.device == "cpu" else f"{self.device}:{self.index}"

    def checked(self, name, writable):
        """(self, dtype code) for a device array given to a collective as ``name`` (the name it
        keeps): a dtype the C core has, contiguous, writable when an output; the rules every
        caller (pyddp.distributed's groups, the torch bridge) applies, else TypeError or
        ValueError naming it."""
        if self.code is None:
            raise TypeError(f"{name} has unsupported dtype {self.dtype}; supported: "
                            f"{', '.join(DTYPE_NAMES)}")
        if not self.contiguous:
            raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
        if writable and not self.writable:
            raise ValueError(f"{name} is read-only; it is an output and must be writable")
        self.name = name
        return self, self.code

    def __repr__(self):
        return (f"ArrayView({self.dtype}{list(self.shape)} on {self.device_str}, "
                f"{'' if self.contiguous else 'non-'}contiguous, "
                f"{'writable' if self.writable else 'read-only'})")


class DeviceError(ValueError):
    """An array that is not in host memory was given where host memory is needed."""

    def __init__(self, name, device, consumer, view=None):
        self.name = name
        self.device = device
        self.view = view
        super().__init__(f"{name} is on device {device}; {consumer}")


# what the CPU paths say about a device array
CPU_BACKEND = "the 'cpu' backend takes CPU tensors (CUDA tensors need the nccl backend)"
KERNELS = "pyddp's kernels take CPU tensors"


def _c_contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _host_view(a, owner, code=None):
    if code is None:
        code = _NP_CODES.get(a.dtype)
        if code is None and a.dtype.name == "bfloat16":
            code, a = BFLOAT16, a.view(np.uint16)
    name = DTYPE_NAMES[code] if code is not None else str(a.dtype)
    return ArrayView(a, code, name, "cpu", 0, a.__array_interface__["data"][0], a.shape,
                     None if a.flags.c_contiguous else a.strides, a.nbytes, a.flags.writeable,
                     a.flags.c_contiguous, owner)


def _device_view(owner, dtype, device, index, ptr, shape, strides, readonly, contiguous=None):
    """A view of memory the host cannot read; strides in bytes or None (C order)."""
    shape = tuple(int(n) for n in shape)
    itemsize = ITEMSIZES.get(dtype, 0)
    strides = None if strides is None else tuple(int(s) for s in strides)
    n = 1
    for s in shape:
        n *= s
    if contiguous is None:
        contiguous = _c_contiguous(shape, strides, itemsize)
    return ArrayView(None, DTYPE_CODES.get(dtype), dtype, device, int(index), int(ptr), shape,
                     strides, n * itemsize, not readonly, contiguous, owner)


def _torch_device_view(t):
    dt = _torch_dtype_name(t)
    size = t.element_size()
    strides = None if t.is_contiguous() else tuple(s * size for s in t.stride())
    return _device_view(t, dt, t.device.type, t.device.index or 0, t.data_ptr(), tuple(t.shape),
                        strides, False)


def _c_describe(x, name, dlpack=True):
    """The C entry's description of x (a dict, see _C.describe_array); its errors are TypeErrors
    naming ``name``.  dlpack=False skips rule 3 (no ``__dlpack__`` call, whose producer would
    synchronise a stream)."""
    return _C.describe_array(x, dlpack=dlpack, name=name)


def _view_of(x, d):
    """An ArrayView (no ndarray) from the C entry's description ``d`` of x."""
    index = d["device_index"]
    if index < 0:
        # __cuda_array_interface__ has no device field: __dlpack_device__ tells it (torch, CuPy),
        # else the CUDA runtime when pyddp.cuda has loaded it
        index = _pointer_device(x, d["ptr"])
    # JAX arrays are immutable whatever their protocols say
    readonly = d["readonly"] or type(x).__module__.split(".", 1)[0] in ("jax", "jaxlib")
    v = _device_view(x, d["dtype"], d["device"], index, d["ptr"], d["shape"], d["strides"],
                     readonly, d["contiguous"])
    v.stream = d["stream"] or None
    return v


def _c_view(x, name, dlpack=True):
    """The C entry's view of x, without NumPy's view of its memory (``array`` None)."""
    return _view_of(x, _c_describe(x, name, dlpack))


def _pointer_device(x, ptr) -> int:
    dev_fn = getattr(x, "__dlpack_device__", None)
    if dev_fn is not None:
        try:
            return int(dev_fn()[1])
        except Exception:  # noqa: BLE001 - fall through to the runtime
            pass
    cuda = sys.modules.get("pyddp.cuda")
    if cuda is not None and cuda._lib.cudart_loaded():
        try:
            return int(_C.cuda_pointer_attributes(ptr)[1])
        except Exception:  # noqa: BLE001 - e.g. a pointer the runtime does not know
            pass
    return 0


def _ndarray_of(x, d, name):
    """NumPy's view of the host memory the C entry described as ``d``, or None for pinned host
    memory NumPy cannot take through DLPack (it stays a device view)."""
    if d["via"] == "buffer":
        try:
            return np.asarray(memoryview(x))
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"{name}: cannot read the buffer: {e}") from None
    try:
        return np.from_dlpack(x)
    except Exception as e:  # noqa: BLE001 - e.g. bfloat16, which NumPy cannot take
        if d["device"] == "cpu":
            raise TypeError(f"{name}: cannot view this array through DLPack: {e}") from None
    return None


def describe(x, name: str = "array") -> ArrayView:
    """An ArrayView of ``x`` (host or device), sharing its memory; TypeError naming ``name`` for
    what is not an array.  Device arrays are described from their protocols, never copied."""
    # rules 1 and 2 of the C entry, answered here for NumPy arrays and pyddp Tensors
    if type(x) is np.ndarray:
        return _host_view(x, x)
    d = getattr(x, "_data", None)
    if isinstance(d, np.ndarray):
        return _host_view(d, x)
    if isinstance(x, np.ndarray):
        return _host_view(x, x)
    if is_torch_tensor(x):
        if x.device.type != "cpu":
            return _torch_device_view(x)
        a, code = _torch_host(x, name, CPU_BACKEND, False)
        return _host_view(a, x, code)
    d = _c_describe(x, name)
    if d["device"] in ("cpu", "cuda_host"):  # host memory (cuda_host: CUDA pinned memory)
        a = _ndarray_of(x, d, name)
        if a is not None:
            return _host_view(a, x)
    return _view_of(x, d)


def host_view(x, name: str, consumer: str = CPU_BACKEND, strict: bool = True):
    """(ndarray sharing ``x``'s host memory, dtype code or None: look it up from the ndarray).

    A device array raises DeviceError (a ValueError) whose message names ``name``, the device and
    ``consumer``; its ``view`` describes the array."""
    d = getattr(x, "_data", None)
    if isinstance(d, np.ndarray):
        return d, None
    if isinstance(x, np.ndarray):
        return x, None
    if is_torch_tensor(x):
        return _torch_host(x, name, consumer, strict)
    v = describe(x, name)
    if v.array is None:
        raise DeviceError(name, v.device_str, consumer, v)
    return v.array, v.code


def cpu_array(x, name: str, writable: bool = False, on_device=None):
    """(C-contiguous ndarray sharing ``x``'s memory, dtype code), as the C collectives take it.

    TypeError or ValueError naming ``name`` for anything else: unsupported objects and dtypes,
    non-contiguous arrays, read-only outputs, device arrays (DeviceError) unless ``on_device`` is
    given: then ``on_device(view, name, writable)`` returns what to use for a device array (a
    process group's dispatch to the backend serving that device) or raises."""
    if type(x) is np.ndarray:
        a, code = x, None
    else:
        if on_device is not None:  # CUDA arrays straight to the device path (no exceptions)
            if is_torch_tensor(x):
                if x.is_cuda:
                    return on_device(_torch_device_view(x), name, writable)
            elif getattr(type(x), "__cuda_array_interface__", None) is not None and \
                    not hasattr(x, "__array_interface__"):
                try:
                    v = _c_view(x, name, dlpack=False)
                except TypeError:  # the class has the attribute, this object does not
                    v = None
                if v is not None and v.device != "cpu":
                    return on_device(v, name, writable)
        try:
            a, code = host_view(x, name)
        except DeviceError as e:
            if on_device is None or e.view is None:
                raise
            return on_device(e.view, name, writable)
    if code is None:
        code = _NP_CODES.get(a.dtype)
        if code is None:
            code = dtype_code(a.dtype, name)  # bfloat16, or TypeError
            a = a.view(np.uint16)
    if not a.flags.c_contiguous:
        raise ValueError(
            f"{name} must be C-contiguous (got strides {a.strides} for shape {a.shape})")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} is read-only; it is an output and must be writable")
    return a, code


def host_array(x, name: str = "array") -> np.ndarray:
    """The ndarray sharing memory with ``x``; bfloat16 comes back as a uint16 view.

    For the amp and optimizer kernels, which check dtypes and contiguity themselves: ``x`` may be
    anything ``describe`` takes on the host, or an object whose ``__array__`` returns its own
    memory.  Device arrays raise DeviceError.
    """
    # Called for every array of every kernel call: the common cases come first and cheaply.
    if type(x) is np.ndarray:
        a = x
    else:
        d = getattr(x, "_data", None)
        if isinstance(d, np.ndarray):
            a = d
        elif isinstance(x, np.ndarray):
            a = x
        elif is_torch_tensor(x):
            return _torch_host(x, name, KERNELS, False)[0]
        else:
            try:
                a = host_view(x, name, KERNELS, False)[0]
            except TypeError:
                if not hasattr(x, "__array__"):
                    raise TypeError(f"{name} must be an array or tensor, "
                                    f"got {type(x).__name__}") from None
                a = np.asarray(x)
    if a.dtype.kind == "V" and a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    return a
