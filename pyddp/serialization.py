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
"""
import contextlib
import os
import pickle
import re
from collections import OrderedDict

import numpy as np

__all__ = ["save", "load", "add_safe_globals", "get_safe_globals", "clear_safe_globals",
           "safe_globals", "DEFAULT_PROTOCOL"]

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
        self._tensor_cls = Tensor

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
            kind = "Parameter" if type(obj).__name__ == "Parameter" else "Tensor"
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
    """Protocol 2-3 pickles write bytes as ``_codecs.encode(str, "latin1")``; only that is allowed."""
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
    """An Unpickler that resolves only pyddp's reconstructors, safe containers and allow-listed globals."""

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


def _open_for_read(f):
    if isinstance(f, (str, os.PathLike)):
        return open(f, "rb"), True
    if hasattr(f, "read"):
        return f, False
    raise TypeError(f"load() expected a path or a readable binary file, got {type(f).__name__}")


def load(f, map_location=None, pickle_module=None, *, weights_only=True, mmap=None,
         **pickle_load_args):
    """Load an object saved by :func:`save` from a path or a binary file object.

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
            raise pickle.UnpicklingError(
                "this is a torch.save() zip checkpoint; pyddp.load reads files written by "
                "pyddp.save. Convert it once with torch: "
                "pyddp.save({k: v.numpy() for k, v in torch.load(path).items()}, new_path)")
        if weights_only:
            unpickler = _WeightsOnlyUnpickler(fh, **pickle_load_args)
        else:
            unpickler = (pickle_module or pickle).Unpickler(fh, **pickle_load_args)
        return unpickler.load()
    finally:
        if close:
            fh.close()
