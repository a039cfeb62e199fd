"""The C array adapter (csrc/python/buffers.c), through pyddp._C.describe_array: the buffer
protocol, then DLPack, then __cuda_array_interface__; one view with a device field.
The reference for every field is NumPy's own description of the same memory."""
import numpy as np
import pytest

from pyddp import _C

ALL = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
       "float16", "float32", "float64", "complex64", "complex128"]


@pytest.mark.parametrize("name", ALL)
def test_buffer_protocol_every_dtype(name):
    a = np.arange(12).astype(name).reshape(3, 4)
    d = _C.describe_array(a)
    assert d["via"] == "buffer"
    assert d["dtype"] == name
    assert d["ptr"] == a.ctypes.data
    assert (d["nbytes"], d["count"], d["itemsize"]) == (a.nbytes, a.size, a.itemsize)
    assert d["device"] == "cpu" and d["contiguous"] and not d["readonly"]
    assert _C.DTYPE_SIZES[name] == a.itemsize


def test_non_contiguous_and_read_only_are_reported():
    a = np.zeros((4, 6), np.float32)
    assert not _C.describe_array(a[:, ::2])["contiguous"]
    assert not _C.describe_array(a.T)["contiguous"]
    assert _C.describe_array(a[1:3])["contiguous"]
    r = np.zeros(3)
    r.flags.writeable = False
    assert _C.describe_array(r)["readonly"]
    assert _C.describe_array(b"abc")["readonly"]
    with pytest.raises(ValueError):
        _C.describe_array(r, writable=True)


def test_not_an_array():
    for bad in (3, "text", None, [1, 2]):
        with pytest.raises(TypeError, match="expected an array"):
            _C.describe_array(bad)


def test_bfloat16_buffer_has_no_format():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    d = _C.describe_array(np.zeros(5, ml_dtypes.bfloat16))
    assert d["dtype"] == "unknown" and d["nbytes"] == 10


class _DL:
    """A DLPack exporter around a NumPy array (only __dlpack__: no buffer protocol)."""

    def __init__(self, a, legacy=False):
        self.a = a
        self.legacy = legacy

    def __dlpack__(self, **kw):
        if self.legacy:
            if kw:
                raise TypeError("no max_version")
            return self.a.__dlpack__()
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("legacy", [False, True])
def test_dlpack(legacy):
    a = np.arange(10, dtype=np.int64)
    d = _C.describe_array(_DL(a, legacy))
    assert d["via"] == "dlpack" and d["dtype"] == "int64"
    assert d["ptr"] == a.ctypes.data and d["count"] == 10 and d["contiguous"]
    s = _C.describe_array(_DL(a[::2], legacy))
    assert not s["contiguous"] and s["count"] == 5


def test_dlpack_torch_bfloat16_and_transposed():
    torch = pytest.importorskip("torch")
    t = torch.zeros(3, 5, dtype=torch.bfloat16)
    d = _C.describe_array(t)
    assert d["via"] == "dlpack" and d["dtype"] == "bfloat16" and d["ptr"] == t.data_ptr()
    assert not _C.describe_array(torch.zeros(4, 3).t())["contiguous"]


class _CAI:
    def __init__(self, **kw):
        d = {"shape": (2, 3), "typestr": "<f4", "data": (4096, False), "version": 3,
             "strides": None}
        d.update(kw)
        self.__cuda_array_interface__ = d


def test_cuda_array_interface():
    d = _C.describe_array(_CAI())
    assert d["via"] == "cuda_array_interface" and d["device"] == "cuda"
    assert (d["ptr"], d["nbytes"], d["dtype"], d["readonly"]) == (4096, 24, "float32", False)
    assert d["stream"] == 0 and d["contiguous"]
    assert _C.describe_array(_CAI(data=(8, True), stream=7))["readonly"]
    assert _C.describe_array(_CAI(stream=7))["stream"] == 7
    assert not _C.describe_array(_CAI(strides=(4, 8)))["contiguous"]
    assert _C.describe_array(_CAI(strides=(12, 4)))["contiguous"]
    assert _C.describe_array(_CAI(typestr="|b1"))["dtype"] == "bool"


@pytest.mark.parametrize("bad", [
    {"shape": [2, 3]}, {"typestr": 4}, {"data": (1,)}, {"mask": object()},
    {"stream": 0}, {"typestr": "<f0"}, {"shape": (-1, 3)}, {"strides": (4,)},
    {"shape": (2**40, 2**40)},
])
def test_cuda_array_interface_malformed(bad):
    with pytest.raises((ValueError, TypeError)):
        _C.describe_array(_CAI(**bad))


def test_tables():
    assert list(_C.DTYPE_CODES) == ALL[:9] + ["float16", "bfloat16"] + ALL[10:]
    assert list(_C.DTYPE_CODES.values()) == list(range(15))
    assert list(_C.REDUCE_OPS) == ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    k = _C.KINDS
    assert k["all_reduce"]["code"] == _C.K_ALLREDUCE and k["all_reduce"]["reduces"]
    assert {n for n, v in k.items() if v["rooted"]} == {
        "broadcast", "reduce", "gather", "scatter", "send", "recv"}
    assert {n for n, v in k.items() if v["reduces"]} == {"all_reduce", "reduce", "reduce_scatter"}
    assert not k["monitored_barrier"]["shm"] and k["all_to_all"]["splits"]
    assert (k["gather"]["in"], k["gather"]["out"]) == ("one", "root_all")
    assert "_shared_array" not in k and "none" not in k


def test_shape_and_strides():
    a = np.zeros((4, 6), np.float64)
    d = _C.describe_array(a[:, ::2])
    assert d["shape"] == (4, 3) and d["strides"] == a[:, ::2].strides
    d = _C.describe_array(_DL(a[1:, ::3]))
    assert d["shape"] == (3, 2) and d["strides"] == a[1:, ::3].strides
    d = _C.describe_array(_CAI(strides=(12, 4)))
    assert d["shape"] == (2, 3) and d["strides"] == (12, 4)
    assert _C.describe_array(_CAI())["strides"] is None


def test_dlpack_can_be_skipped():
    class Both(_CAI):
        def __dlpack__(self, **kw):
            raise AssertionError("__dlpack__ must not be called")

    assert _C.describe_array(Both(), dlpack=False)["via"] == "cuda_array_interface"
    with pytest.raises(AssertionError):
        _C.describe_array(Both())
