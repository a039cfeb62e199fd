"""Fuzz target: DLPack capsules and __cuda_array_interface__ / __array_interface__
descriptions, as the C array adapter reads them (csrc/python/buffers.c pd_view_get, through
_C.describe_array).

- DLPack: a producer object whose __dlpack__ returns a real capsule ("dltensor", or
  "dltensor_versioned" with any version and flags) built with ctypes: the data pointer stays
  valid (a 4 KiB buffer) while ndim (shape and strides arrays as long as ndim says, as the ABI
  requires), shape, strides, dtype code/bits/lanes, byte_offset and device are fuzzed.  The
  deleter must run exactly once whatever the adapter decides.
- __cuda_array_interface__: a dict with fuzzed shape, strides, typestr, data, version, mask,
  readonly flag and stream, values of the wrong types included.
- __array_interface__: NumPy's own parser reads it (np.asarray), then the adapter views the
  result through the buffer protocol.

Checked: a description the adapter accepts is consistent (nbytes = count * itemsize, count the
product of the shape, both within Py_ssize_t), everything else is a clean ValueError /
TypeError / OverflowError; no crash (ASan + UBSan in CI: no signed overflow, no pointer
overflow).

    python tests/fuzz/fuzz_array_descriptions.py -runs=20000
"""
import ctypes
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402
import numpy as np  # noqa: E402

with atheris.instrument_imports(include=["_peers"]):
    import _peers as P  # noqa: E402

from pyddp import _C  # noqa: E402

ERRORS = (ValueError, TypeError, OverflowError, MemoryError, BufferError)
BUF = (ctypes.c_uint8 * 4096)()
I64_MAX = 2**63 - 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManaged(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManaged._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                      ("deleter", DELETER)]


class DLManagedV(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


PyCapsule_New = ctypes.pythonapi.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
DELETED = []


@DELETER
def _deleter(ptr):
    DELETED.append(ptr)


def i64(fdp):
    return fdp.PickValueInList([0, 1, 2, 3, 4, 7, 8, -1, -8, 2**31, 2**32, 2**62, 3 * 2**61,
                                I64_MAX, -2**63, fdp.ConsumeIntInRange(-2**63, I64_MAX)])


class Producer:
    def __init__(self, cap, kw_ok):
        self.cap, self.kw_ok = cap, kw_ok

    def __dlpack__(self, **kw):
        if kw and not self.kw_ok:
            raise TypeError("no max_version")
        cap, self.cap = self.cap, None
        if cap is None:
            raise BufferError("consumed")
        return cap


@atheris.instrument_func
def dlpack(fdp):
    ndim = fdp.PickValueInList([0, 1, 2, 3, 4, 8, -1, 64, 200])
    n = max(ndim, 0)
    shape = (ctypes.c_int64 * max(n, 1))(*[i64(fdp) if fdp.ConsumeIntInRange(0, 3) == 0
                                           else fdp.ConsumeIntInRange(0, 5) for _ in range(n)])
    strides = (ctypes.c_int64 * max(n, 1))(*[i64(fdp) for _ in range(n)])
    t = DLTensor()
    t.data = ctypes.addressof(BUF)
    t.device = DLDevice(fdp.PickValueInList([1, 2, 3, 0, 13, -1]), fdp.ConsumeIntInRange(-2, 8))
    t.ndim = ndim
    t.dtype = DLDataType(fdp.ConsumeIntInRange(0, 8), fdp.PickValueInList([0, 1, 8, 16, 32, 64,
                                                                          128, 255]),
                         fdp.PickValueInList([1, 1, 0, 2, 65535]))
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)) if (n or fdp.ConsumeBool()) \
        else None
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if fdp.ConsumeBool() \
        else None
    t.byte_offset = fdp.PickValueInList([0, 0, 8, 4095, 2**63, 2**64 - 1])
    versioned = fdp.ConsumeBool()
    if versioned:
        m = DLManagedV()
        m.major = fdp.PickValueInList([1, 1, 0, 2, 2**32 - 1])
        m.minor = fdp.ConsumeIntInRange(0, 5)
        m.flags = fdp.PickValueInList([0, 1, 2, 2**64 - 1])
        m.dl_tensor = t
        name = b"dltensor_versioned"
    else:
        m = DLManaged()
        m.dl_tensor = t
        name = b"dltensor"
    m.deleter = _deleter
    keep = (shape, strides, m)
    cap = PyCapsule_New(ctypes.addressof(m), name, None)
    prod = Producer(cap, kw_ok=versioned or fdp.ConsumeBool())
    del cap
    DELETED.clear()
    try:
        d = _C.describe_array(prod, fdp.ConsumeBool())
    except ERRORS:
        d = None
    # the adapter released the capsule it took: its deleter ran exactly once
    assert DELETED == [ctypes.addressof(m)], (DELETED, d)
    del keep
    return d


@atheris.instrument_func
def cai(fdp):
    ndim = fdp.ConsumeIntInRange(0, 6)
    shape = tuple(i64(fdp) if fdp.ConsumeIntInRange(0, 3) == 0 else fdp.ConsumeIntInRange(0, 6)
                  for _ in range(ndim))
    d = {}
    if fdp.ConsumeIntInRange(0, 7):
        d["shape"] = fdp.PickValueInList([shape, shape, list(shape), None, "3"])
    if fdp.ConsumeIntInRange(0, 7):
        d["typestr"] = fdp.PickValueInList(["<f4", "|u1", "<i8", "<c16", "|b1", "<f2", ">f4",
                                            "<V4", "<f", "", "<f999999999999999999999",
                                            "<u-8", "<f0", "x", b"<f4"])
    if fdp.ConsumeIntInRange(0, 7):
        d["data"] = fdp.PickValueInList([(ctypes.addressof(BUF), False), (0, True),
                                         (ctypes.addressof(BUF),), (2**64 - 1, False),
                                         (-1, False), (2**65, False), None, ("x", False)])
    if fdp.ConsumeBool():
        d["strides"] = fdp.PickValueInList([None, tuple(i64(fdp) for _ in range(ndim)),
                                            tuple(i64(fdp) for _ in range(ndim + 1)), "x"])
    if fdp.ConsumeBool():
        d["version"] = fdp.PickValueInList([2, 3, 0, -1, "3"])
    if fdp.ConsumeBool():
        d["mask"] = fdp.PickValueInList([None, None, 1, (1,)])
    if fdp.ConsumeBool():
        d["stream"] = fdp.PickValueInList([None, 1, 2, 0, -1, 2**64, "x"])
    attr = d if fdp.ConsumeIntInRange(0, 9) else fdp.PickValueInList([None, [], "x", 3])
    obj = type("CAI", (), {"__cuda_array_interface__": attr})()
    try:
        return _C.describe_array(obj, fdp.ConsumeBool(), False)
    except ERRORS:
        return None


@atheris.instrument_func
def array_interface(fdp):
    ndim = fdp.ConsumeIntInRange(0, 4)
    shape = tuple(fdp.ConsumeIntInRange(0, 8) for _ in range(ndim))
    ai = {"shape": shape, "typestr": fdp.PickValueInList(["|u1", "<f4", "<i2", "<c8", "|b1"]),
          "data": (ctypes.addressof(BUF), fdp.ConsumeBool()), "version": 3}
    if fdp.ConsumeBool():
        ai["strides"] = tuple(fdp.ConsumeIntInRange(-16, 16) for _ in range(ndim))
    obj = type("AI", (), {"__array_interface__": ai})()
    try:
        a = np.asarray(obj)
    except ERRORS:
        return None
    # keep every element inside the buffer, as a producer must
    lo, hi = np.lib.array_utils.byte_bounds(a) if hasattr(np.lib, "array_utils") \
        else np.byte_bounds(a)
    if a.size and (lo < ctypes.addressof(BUF) or hi > ctypes.addressof(BUF) + len(BUF)):
        return None
    try:
        return _C.describe_array(a, fdp.ConsumeBool())
    except ERRORS:
        return None


def consistent(d):
    assert 0 <= d["count"] <= 2**63 - 1 and 0 <= d["nbytes"] <= 2**63 - 1, d
    assert d["nbytes"] == d["count"] * d["itemsize"], d
    if d["via"] != "cuda_array_interface":
        assert math.prod(d["shape"]) == d["count"], d


@atheris.instrument_func
def test_one(data):
    fdp = atheris.FuzzedDataProvider(data)
    which = fdp.ConsumeIntInRange(0, 2)
    d = (dlpack, cai, array_interface)[which](fdp)
    if d is not None:
        consistent(d)


if __name__ == "__main__":
    P.main(test_one)
