"""``pyddp.save`` / ``pyddp.load``: checkpoints of nested containers of Tensors, arrays and numbers.

The file is a pickle stream (protocol 5) in which every pyddp Tensor, Parameter,
NumPy array, NumPy scalar and dtype is written by pyddp's own small reconstructors
(dtype string, shape, raw bytes), never by a class's own ``__reduce__``.  That
makes the safe loader simple: with ``weights_only=True`` (the default, as in
torch >= 2.6) a restricted unpickler resolves only those reconstructors, the
built-in containers (``dict``, ``list``, ``tuple``, ``set``, ``frozenset``,
``collections.OrderedDict``), numbers, strings, bytes and None, plus whatever was
allow-listed with :func:`add_safe_globals`.  Anything else (a Module, a lambda,
an arbitrary class) raises ``pickle.UnpicklingError`` before any code of it can
run.  ``weights_only=False`` is ordinary pickle: only for files you trust.

What comes back: a pyddp Tensor comes back as a Tensor (``requires_grad`` kept), a
Parameter as a Parameter, a NumPy array as a NumPy array (writable, C-contiguous,
native byte order), a NumPy scalar as a NumPy scalar.  Arrays referenced several
times are stored once and come back as one shared array; distinct views of one
base are stored separately.  ``Module.load_state_dict`` accepts Tensors and arrays
alike, so ``model.load_state_dict(pyddp.load(path)["model"])`` works either way.

``pyddp.load`` also reads checkpoints written by ``torch.save`` (torch's zip format),
without torch: their tensors come back as pyddp Tensors sharing memory as they did in
torch, under the same weights-only rules.  ``torch.load`` does not read pyddp's own
format; :func:`save_for_torch` writes torch's zip format instead, for files meant for torch.
"""
import contextlib
import io
import os
import pickle
import re
import sys
from collections import OrderedDict

import numpy as np

__all__ = ["save", "load", "save_for_torch", "add_safe_globals", "get_safe_globals",
           "clear_safe_globals", "safe_globals", "DEFAULT_PROTOCOL"]

DEFAULT_PROTOCOL = 5

_DTYPE_RE = re.compile(r"^[<>=|]?[biufcmMUSV]\d+(\[[0-9a-zA-Z]+\])?$|^[<>=|]?[?]$")
_EXTRA_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e4m3b11fnuz",
                 "float8_e5m2", "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu",
                 "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "int4", "uint4", "int2",
                 "uint2")


# ------------------------------------------------------------------------------ reconstructors
def _dtype_code(dt):
    """A string naming ``dt`` that :func:`_parse_dtype` maps back to it."""
    if dt.kind == "V" and dt.names is None and dt.name in _EXTRA_DTYPES:
        return dt.name
    return dt.str


def _parse_dtype(code):
    if not isinstance(code, str):
        raise pickle.UnpicklingError(f"bad dtype code in checkpoint: {code!r}")
    if code in _EXTRA_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise pickle.UnpicklingError(
                f"the checkpoint holds {code} arrays; loading them needs the ml_dtypes "
                "package (pip install ml_dtypes)") from None
        return np.dtype(getattr(ml_dtypes, code))
    if not _DTYPE_RE.match(code):
        raise pickle.UnpicklingError(f"bad dtype code in checkpoint: {code!r}")
    dt = np.dtype(code)
    if dt.hasobject or dt.names is not None:
        raise pickle.UnpicklingError(f"refusing dtype {code!r} (objects or fields)")
    return dt


def _rebuild_array(dtype_code, shape, buf):
    """Reconstruct an ndarray from (dtype code, shape, raw C-order bytes)."""
    dt = _parse_dtype(dtype_code)
    if (not isinstance(shape, tuple)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise pickle.UnpicklingError(f"bad array shape in checkpoint: {shape!r}")
    if not isinstance(buf, (bytes, bytearray)):
        raise pickle.UnpicklingError(f"bad array data in checkpoint: {type(buf).__name__}")
    count = 1
    for s in shape:
        count *= s
    if count * dt.itemsize != len(buf):
        raise pickle.UnpicklingError(
            f"array data in checkpoint has {len(buf)} bytes, expected {count * dt.itemsize} "
            f"for shape {shape} of {dt}")
    if count == 0:
        arr = np.empty(shape, dtype=dt)
    else:
        arr = np.frombuffer(buf, dtype=dt, count=count)
        if not arr.flags.writeable:  # immutable bytes: own a writable copy
            arr = arr.copy()
        arr = arr.reshape(shape)
    if not dt.isnative:
        arr = arr.astype(dt.newbyteorder("="))
    return arr


def _rebuild_scalar(dtype_code, raw):
    """Reconstruct a NumPy scalar."""
    return _rebuild_array(dtype_code, (), raw)[()]


def _rebuild_dtype(dtype_code):
    """Reconstruct a NumPy dtype."""
    return _parse_dtype(dtype_code)


def _rebuild_tensor(kind, array, requires_grad):
    """Reconstruct a pyddp Tensor (kind "Tensor") or Parameter (kind "Parameter")."""
    if not isinstance(array, np.ndarray):
        raise pickle.UnpicklingError("bad tensor data in checkpoint")
    from ._tensor import Tensor
    t = Tensor(array)
    if kind == "Parameter":
        from .nn.parameter import Parameter
        return Parameter(t, requires_grad=bool(requires_grad))
    if kind != "Tensor":
        raise pickle.UnpicklingError(f"bad tensor kind in checkpoint: {kind!r}")
    if requires_grad:
        t.requires_grad_(True)
    return t


# ------------------------------------------------------------------------------ saving
class _Pickler(pickle.Pickler):
    def __init__(self, file, protocol):
        super().__init__(file, protocol=protocol)
        self._out_of_band_ok = protocol >= 5
        from ._tensor import Tensor
        from .nn.parameter import Parameter
        self._tensor_cls = Tensor
        self._param_cls = Parameter

    def _array_payload(self, arr):
        arr = np.ascontiguousarray(arr)
        flat = arr.reshape(-1).view(np.uint8)
        if self._out_of_band_ok:
            # In-band PickleBuffer: written straight from the array's memory, no extra copy,
            # and read back as a writable bytearray.
            return pickle.PickleBuffer(flat)
        return flat.tobytes()

    def reducer_override(self, obj):
        if isinstance(obj, self._tensor_cls):
            kind = "Parameter" if isinstance(obj, self._param_cls) else "Tensor"
            return _rebuild_tensor, (kind, obj._data, bool(obj.requires_grad))
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject or obj.dtype.names is not None or type(obj) is not np.ndarray:
                return NotImplemented  # ordinary pickle; refused by weights_only loading
            return _rebuild_array, (_dtype_code(obj.dtype), tuple(int(s) for s in obj.shape),
                                    self._array_payload(obj))
        if isinstance(obj, np.generic):
            if isinstance(obj, np.object_) or obj.dtype.names is not None:
                return NotImplemented
            return _rebuild_scalar, (_dtype_code(obj.dtype), np.asarray(obj).tobytes())
        if isinstance(obj, np.dtype):
            if obj.hasobject or obj.names is not None:
                return NotImplemented
            return _rebuild_dtype, (_dtype_code(obj),)
        return NotImplemented


def save(obj, f, pickle_module=None, pickle_protocol=DEFAULT_PROTOCOL,
         _use_new_zipfile_serialization=True, _disable_byteorder_record=False):
    """Save ``obj`` (e.g. ``{"model": model.state_dict(), "optimizer": opt.state_dict(),
    "epoch": 3}``) to ``f``, a path or a binary file object.

    Tensors, Parameters, arrays and NumPy scalars are stored as raw bytes with their
    dtype and shape; ``pickle_module`` and the ``_use_new_zipfile_serialization`` /
    ``_disable_byteorder_record`` flags are accepted for torch compatibility and ignored.
    """
    if pickle_protocol < 2:
        raise ValueError(f"pickle_protocol must be >= 2, got {pickle_protocol}")
    protocol = min(pickle_protocol, pickle.HIGHEST_PROTOCOL)
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            _Pickler(fh, protocol).dump(obj)
    elif hasattr(f, "write"):
        _Pickler(f, protocol).dump(obj)
    else:
        raise TypeError(f"save() expected a path or a writable binary file, got {type(f).__name__}")


# ------------------------------------------------------------------------------ loading
def _codecs_encode(obj, encoding="utf-8", errors="strict"):
    """Protocol 2-3 pickles write bytes as ``_codecs.encode(str, "latin1")``: only that."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError("_codecs.encode is only allowed for latin1 bytes")
    return obj.encode("latin1")


_OWN = {
    ("_codecs", "encode"): _codecs_encode,
    ("pyddp.serialization", "_rebuild_array"): _rebuild_array,
    ("pyddp.serialization", "_rebuild_scalar"): _rebuild_scalar,
    ("pyddp.serialization", "_rebuild_dtype"): _rebuild_dtype,
    ("pyddp.serialization", "_rebuild_tensor"): _rebuild_tensor,
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "slice"): slice,
    ("builtins", "range"): range,
}
_user_safe_globals = {}


def _global_key(obj):
    if isinstance(obj, tuple):
        obj, name = obj
        module, _, qualname = name.rpartition(".")
        return (module, qualname), obj
    return (obj.__module__, obj.__qualname__), obj


def add_safe_globals(safe_globals):
    """Allow-list classes/functions for ``weights_only=True`` loading (torch's API).

    Each entry is the object itself, or ``(object, "module.name")`` when it is
    pickled under another name.  Example: ``add_safe_globals([argparse.Namespace])``.
    """
    for entry in safe_globals:
        key, obj = _global_key(entry)
        _user_safe_globals[key] = obj


def get_safe_globals():
    """The objects allow-listed with :func:`add_safe_globals`."""
    return list(_user_safe_globals.values())


def clear_safe_globals():
    """Forget every object allow-listed with :func:`add_safe_globals`."""
    _user_safe_globals.clear()


@contextlib.contextmanager
def safe_globals(safe_globals):
    """Context manager: allow-list ``safe_globals`` only inside the ``with`` block."""
    saved = dict(_user_safe_globals)
    add_safe_globals(safe_globals)
    try:
        yield
    finally:
        _user_safe_globals.clear()
        _user_safe_globals.update(saved)


_WEIGHTS_ONLY_HELP = (
    "Weights only load failed. This file can still be loaded, to do so you have two options, "
    "do those steps only if you trust the source of the checkpoint.\n"
    "\t(1) Re-running `pyddp.load` with `weights_only` set to `False` will likely succeed, but it "
    "can result in arbitrary code execution. Do it only if you got the file from a trusted "
    "source.\n"
    "\t(2) Alternatively, to load with `weights_only=True` please check the recommended steps "
    "in the following error message.\n"
    "\tWeightsUnpickler error: ")


class _WeightsOnlyUnpickler(pickle.Unpickler):
    """An Unpickler resolving only pyddp's reconstructors, safe containers, allow-listed globals."""

    def find_class(self, module, name):
        obj = _OWN.get((module, name))
        if obj is None:
            obj = _user_safe_globals.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(
                _WEIGHTS_ONLY_HELP
                + f"Unsupported global: GLOBAL {module}.{name} was not an allowed global by "
                "default. Please use `pyddp.serialization.add_safe_globals"
                f"([{name}])` or the `pyddp.serialization.safe_globals([{name}])` context "
                "manager to allowlist this global if you trust this class/function.")
        return obj

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(_WEIGHTS_ONLY_HELP + "persistent ids are not supported")


# ------------------------------------------------------------------------------ torch checkpoints
# torch.save's zip format: <root>/data.pkl is a pickle whose tensors are calls of
# torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
# with storages given as persistent ids ("storage", torch.<Kind>Storage, key, location, numel) that
# name the raw little-endian file <root>/data/<key>.  They load as pyddp Tensors (Parameters stay
# Parameters); tensors that shared a storage in torch share one array here.
_TORCH_STORAGES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128",
    "UntypedStorage": "uint8",
}
_TORCH_DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16", "int64": "int64",
    "long": "int64", "int32": "int32", "int": "int32", "int16": "int16", "short": "int16",
    "int8": "int8", "uint8": "uint8", "bool": "bool", "complex64": "complex64",
    "complex128": "complex128",
}


def _np_dtype(name):
    if name == "bfloat16":
        return _parse_dtype("bfloat16")
    return np.dtype(name)


class _TorchStorageType:
    __slots__ = ("dtype",)

    def __init__(self, name):
        self.dtype = _np_dtype(_TORCH_STORAGES[name])


def _torch_strided(storage, offset, size, stride):
    if not isinstance(storage, np.ndarray):
        raise pickle.UnpicklingError("bad storage in torch checkpoint")
    size, stride = tuple(size), tuple(stride)
    ok_ints = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                  for v in size + stride + (offset,))
    if not ok_ints or len(size) != len(stride):
        raise pickle.UnpicklingError(f"bad tensor geometry in torch checkpoint: {size} {stride}")
    count = 1
    for n in size:
        count *= n
    if count == 0:
        return np.empty(size, dtype=storage.dtype)
    last = offset + sum((n - 1) * st for n, st in zip(size, stride))
    if last >= storage.size:  # never read outside the storage
        raise pickle.UnpicklingError("tensor exceeds its storage in torch checkpoint")
    item = storage.dtype.itemsize
    return np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=tuple(st * item for st in stride))


def _torch_rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False,
                             backward_hooks=None, metadata=None):
    return _rebuild_tensor("Tensor", _torch_strided(storage, offset, size, stride),
                           bool(requires_grad))


def _torch_rebuild_tensor_v3(storage, offset, size, stride, requires_grad, backward_hooks,
                             dtype, metadata=None):
    arr = storage.view(dtype) if isinstance(dtype, np.dtype) and storage.dtype != dtype else storage
    return _torch_rebuild_tensor_v2(arr, offset, size, stride, requires_grad)


def _torch_rebuild_parameter(data, requires_grad, backward_hooks=None, state=None):
    from ._tensor import Tensor
    if not isinstance(data, Tensor):
        raise pickle.UnpicklingError("bad parameter in torch checkpoint")
    return _rebuild_tensor("Parameter", data._data, bool(requires_grad))


def _torch_size(*args):
    return tuple(*args)


def _torch_device(*args):
    return ":".join(str(a) for a in args)


class _TorchZipUnpickler(pickle.Unpickler):
    def __init__(self, fh, zf, root, weights_only, **kw):
        super().__init__(fh, **kw)
        self._zf = zf
        self._root = root
        self._weights_only = weights_only
        self._storages = {}
        self._big = False
        name = root + "byteorder"
        if name in zf.namelist():
            self._big = zf.read(name).strip() == b"big"

    def find_class(self, module, name):
        if module == "torch" and name in _TORCH_STORAGES:
            return _TorchStorageType(name)
        if module == "torch" and name in _TORCH_DTYPES:
            return _np_dtype(_TORCH_DTYPES[name])
        table = {
            ("torch._utils", "_rebuild_tensor_v2"): _torch_rebuild_tensor_v2,
            ("torch._utils", "_rebuild_tensor_v3"): _torch_rebuild_tensor_v3,
            ("torch._utils", "_rebuild_parameter"): _torch_rebuild_parameter,
            ("torch._utils", "_rebuild_parameter_with_state"): _torch_rebuild_parameter,
            ("torch", "Size"): _torch_size,
            ("torch", "device"): _torch_device,
        }
        obj = table.get((module, name)) or _OWN.get((module, name)) \
            or _user_safe_globals.get((module, name))
        if obj is not None:
            return obj
        if not self._weights_only:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            _WEIGHTS_ONLY_HELP + f"Unsupported global: GLOBAL {module}.{name} in a torch "
            "checkpoint. pyddp reads tensors, parameters and plain containers from torch.save "
            "files; use `pyddp.serialization.add_safe_globals` for other trusted globals.")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _TorchStorageType)):
            raise pickle.UnpicklingError(f"unsupported persistent id in torch checkpoint: {pid!r}")
        _, stype, key, _location, numel = pid
        key = str(key)
        arr = self._storages.get(key)
        if arr is None:
            name = self._root + "data/" + key
            nbytes = self._zf.getinfo(name).file_size
            dt = stype.dtype.newbyteorder(">") if self._big else stype.dtype
            if nbytes % dt.itemsize:
                raise pickle.UnpicklingError(f"storage {key} has a partial element")
            raw = np.empty(nbytes, dtype=np.uint8)
            with self._zf.open(name) as src:  # straight into the array: one copy, not two
                got = src.readinto(memoryview(raw))
            if got != nbytes:
                raise pickle.UnpicklingError(f"storage {key} is truncated")
            arr = raw.view(dt)
            if self._big:
                arr = arr.astype(stype.dtype)
            self._storages[key] = arr
        return arr


def _load_torch_zip(fh, weights_only, pickle_load_args):
    import zipfile
    with zipfile.ZipFile(fh) as zf:
        pkl = [n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise pickle.UnpicklingError("not a torch.save() checkpoint: no <root>/data.pkl")
        root = pkl[0][:-len("data.pkl")]
        with zf.open(pkl[0]) as data:
            return _TorchZipUnpickler(io.BytesIO(data.read()), zf, root, weights_only,
                                      **pickle_load_args).load()


# ------------------------------------------------------------------------------ writing torch files
_TORCH_STORAGE_OF = {v: k for k, v in _TORCH_STORAGES.items() if k != "UntypedStorage"}
_TORCH_DTYPE_OF = {"float32": "float32", "float64": "float64", "float16": "float16",
                   "bfloat16": "bfloat16", "int64": "int64", "int32": "int32", "int16": "int16",
                   "int8": "int8", "uint8": "uint8", "bool": "bool", "complex64": "complex64",
                   "complex128": "complex128"}


class _TorchGlobal:
    """Stands for a torch global (written as a GLOBAL opcode; torch is never imported)."""

    __slots__ = ("module", "name")

    def __init__(self, module, name):
        self.module = module
        self.name = name

    def __call__(self, *args):  # pickle's save_reduce insists on a callable
        raise TypeError(f"{self.module}.{self.name} is only a name written into torch files")


class _TorchStorageRef:
    __slots__ = ("key", "kind", "numel", "array")


class _PlainTensor:
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


class _TorchFormatPickler(pickle._Pickler):
    """Pure-Python pickler (it must write GLOBALs of torch names) producing torch's data.pkl."""

    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, file):
        super().__init__(file, protocol=2)
        from ._tensor import Tensor
        from .nn.parameter import Parameter
        self._tensor_cls = Tensor
        self._param_cls = Parameter
        self.storages = []
        self._by_id = {}
        self._keep = []  # the arrays seen, so that their ids stay unique while pickling

    def persistent_id(self, obj):
        if type(obj) is _TorchStorageRef:
            return ("storage", _TorchGlobal("torch", obj.kind), obj.key, "cpu", obj.numel)
        return None

    def _save_torch_global(self, obj):
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("utf-8"))
        self.memoize(obj)

    dispatch[_TorchGlobal] = _save_torch_global

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, np.generic):  # numpy scalars become Python numbers
            obj = obj.item()
        elif isinstance(obj, np.dtype):
            name = _TORCH_DTYPE_OF.get(_dtype_code(obj) if obj.kind == "V" else obj.name)
            if name is None:
                raise pickle.PicklingError(f"torch has no dtype for {obj}")
            obj = _TorchGlobal("torch", name)
        super().save(obj, save_persistent_id)

    def _tensor_reduce(self, arr, requires_grad):
        ref = self._by_id.get(id(arr))
        if ref is None:
            name = _dtype_code(arr.dtype) if arr.dtype.kind == "V" else arr.dtype.name
            kind = _TORCH_STORAGE_OF.get(_TORCH_DTYPE_OF.get(name))
            if kind is None:
                raise pickle.PicklingError(f"torch has no storage type for {arr.dtype} arrays")
            ref = _TorchStorageRef()
            ref.key = str(len(self.storages))
            ref.kind = kind
            ref.numel = int(arr.size)
            contiguous = np.ascontiguousarray(arr)
            if not contiguous.dtype.isnative:
                contiguous = contiguous.astype(contiguous.dtype.newbyteorder("="))
            ref.array = contiguous
            self.storages.append(ref)
            self._by_id[id(arr)] = ref
            self._keep.append(arr)
        stride, acc = [], 1
        for n in reversed(arr.shape):
            stride.append(acc)
            acc *= n
        args = (ref, 0, tuple(int(n) for n in arr.shape), tuple(reversed(stride)),
                bool(requires_grad), OrderedDict())
        return _TorchGlobal("torch._utils", "_rebuild_tensor_v2"), args

    def reducer_override(self, obj):
        if isinstance(obj, self._param_cls):
            return (_TorchGlobal("torch._utils", "_rebuild_parameter"),
                    (_PlainTensor(obj._data), bool(obj.requires_grad), OrderedDict()))
        if isinstance(obj, self._tensor_cls):
            return self._tensor_reduce(obj._data, obj.requires_grad)
        if type(obj) is _PlainTensor:
            return self._tensor_reduce(obj.array, False)
        if type(obj) is np.ndarray:
            return self._tensor_reduce(obj, False)
        return NotImplemented


def save_for_torch(obj, f):
    """Write ``obj`` in ``torch.save``'s zip format, so that ``torch.load`` reads it without pyddp.

    pyddp Tensors and NumPy arrays become torch tensors (``requires_grad`` kept),
    Parameters become ``torch.nn.Parameter``, NumPy scalars become Python numbers and
    NumPy dtypes torch dtypes; containers and numbers are kept.  The result loads with
    ``torch.load(f)`` (weights_only, mmap included) and with :func:`load`.
    Example: ``pyddp.serialization.save_for_torch(model.state_dict(), "model.pt")``.
    """
    import zipfile
    data = io.BytesIO()
    pickler = _TorchFormatPickler(data)
    pickler.dump(obj)
    root = "archive/"
    own = isinstance(f, (str, os.PathLike))
    if not own and not hasattr(f, "write"):
        raise TypeError(f"save_for_torch() expected a path or a writable binary file, "
                        f"got {type(f).__name__}")
    fh = open(f, "wb") if own else f
    try:
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED) as zf:
            def record(name, payload, align=False):
                info = zipfile.ZipInfo(root + name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_STORED
                if align:  # storages start on 64-byte boundaries (torch.load(mmap=True))
                    # zipfile adds a 20-byte zip64 field when size * 1.05 > ZIP64_LIMIT
                    big = len(payload) * 1.05 > zipfile.ZIP64_LIMIT
                    base = zf.fp.tell() + 30 + len(info.filename.encode()) + 4 \
                        + (20 if big else 0)
                    pad = -base % 64
                    info.extra = b"FB" + pad.to_bytes(2, "little") + b"Z" * pad
                zf.writestr(info, payload)

            record("data.pkl", data.getvalue())
            record(".format_version", b"1")
            record(".storage_alignment", b"64")
            record("byteorder", sys.byteorder.encode())
            for ref in pickler.storages:
                record("data/" + ref.key, memoryview(ref.array.reshape(-1).view(np.uint8)),
                       align=True)
            record("version", b"3\n")
            record(".data/serialization_id", str(id(pickler)).encode())
    finally:
        if own:
            fh.close()


def _open_for_read(f):
    if isinstance(f, (str, os.PathLike)):
        return open(f, "rb"), True
    if hasattr(f, "read"):
        return f, False
    raise TypeError(f"load() expected a path or a readable binary file, got {type(f).__name__}")


def load(f, map_location=None, pickle_module=None, *, weights_only=True, mmap=None,
         **pickle_load_args):
    """Load an object saved by :func:`save` (or by ``torch.save``) from a path or a binary file.

    Checkpoints written by ``torch.save`` (its zip format) are read without torch:
    their tensors come back as pyddp Tensors, parameters as Parameters.

    With ``weights_only=True`` (default) only Tensors, Parameters, arrays, NumPy
    scalars/dtypes, numbers, strings, bytes, None, and dict/list/tuple/set/
    OrderedDict containers of them (plus :func:`add_safe_globals` entries) are
    accepted; anything else raises ``pickle.UnpicklingError``.  ``weights_only=False``
    unpickles arbitrary objects (trusted files only).  ``map_location`` and ``mmap``
    are accepted for torch compatibility: everything loads into host memory.
    """
    if weights_only is None:
        weights_only = True
    fh, close = _open_for_read(f)
    try:
        head = fh.peek(4)[:4] if hasattr(fh, "peek") else None
        if head is None and hasattr(fh, "seek") and hasattr(fh, "tell"):
            pos = fh.tell()
            head = fh.read(4)
            fh.seek(pos)
        if head == b"PK\x03\x04":
            return _load_torch_zip(fh, weights_only, pickle_load_args)
        if weights_only:
            unpickler = _WeightsOnlyUnpickler(fh, **pickle_load_args)
        else:
            unpickler = (pickle_module or pickle).Unpickler(fh, **pickle_load_args)
        return unpickler.load()
    finally:
        if close:
            fh.close()
