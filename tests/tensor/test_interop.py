"""pyddp._interop: the one adapter from user arrays (NumPy, pyddp Tensors, torch, buffer objects,
DLPack, __cuda_array_interface__) to what the C core takes."""
import array
import sys

import numpy as np
import pytest

import pyddp
from pyddp import _C, _interop as I
from pyddp.distributed import distributed_c10d as c10d

torch = pytest.importorskip("torch")

NP_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]


class FakeCuda:
    """A CUDA array as CuPy/Numba/JAX expose it: __cuda_array_interface__ v3 (+ DLPack device)."""

    def __init__(self, shape=(4,), typestr="<f4", strides=None, readonly=False, ptr=0x7f0000,
                 dlpack_device=(2, 0)):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, readonly), "version": 3,
                                         "strides": strides}
        self._dev = dlpack_device

    def __dlpack_device__(self):
        return self._dev

    def __dlpack__(self, stream=None):  # pragma: no cover - the adapter must not call it
        raise AssertionError("a CUDA array must be described without exporting it")


class CaiOnly:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = dict({"version": 3, "strides": None}, **cai)


class DLPackOnly:
    """A CPU array reachable through DLPack only."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dtype_table():
    assert I.DTYPE_NAMES == ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                             "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
                             "complex128"]
    assert [I.DTYPE_CODES[n] for n in I.DTYPE_NAMES] == list(range(15))
    for n in NP_DTYPES:
        assert I.ITEMSIZES[n] == np.dtype(n).itemsize
        assert I.dtype_code(n) == I.DTYPE_CODES[n]
    assert I.ITEMSIZES["bfloat16"] == 2
    assert (I.BOOL, I.FLOAT16, I.BFLOAT16, I.FLOAT32, I.COMPLEX128) == (0, 9, 10, 11, 14)
    exported = getattr(_C, "DTYPE_CODES", None)
    if exported:
        assert I.DTYPE_CODES == dict(exported)
    with pytest.raises(TypeError, match="unsupported dtype"):
        I.dtype_code("U3", "x")


def test_reduce_op_values():
    assert [(o.name, int(o)) for o in c10d.ReduceOp] == [
        ("SUM", 0), ("AVG", 1), ("PRODUCT", 2), ("MIN", 3), ("MAX", 4), ("BAND", 5), ("BOR", 6),
        ("BXOR", 7)]
    assert c10d.ReduceOp("max") is c10d.ReduceOp.MAX
    assert c10d.ReduceOp.RedOpType is c10d.ReduceOp


@pytest.mark.parametrize("dt", NP_DTYPES)
def test_every_dtype_numpy_tensor_buffer(dt):
    a = np.zeros(5, dtype=dt)
    code = I.DTYPE_CODES[dt]
    for x in (a, pyddp.from_numpy(a), memoryview(a), DLPackOnly(a) if dt != "bool" else a):
        got, c = I.cpu_array(x, "t", True)
        assert c == code and np.shares_memory(got, a) and got.dtype == a.dtype
        v = I.describe(x)
        assert (v.device, v.index, v.code, v.dtype, v.shape, v.nbytes, v.writable,
                v.contiguous) == ("cpu", 0, code, dt, (5,), a.nbytes, True, True)
        assert v.ptr == a.__array_interface__["data"][0] and v.owner is x
        assert I.host_array(x) is not None


@pytest.mark.parametrize("dt", ["bool", "int8", "uint8", "int16", "int32", "int64", "float16",
                                "bfloat16", "float32", "float64", "complex64", "complex128"])
def test_every_dtype_torch(dt):
    t = torch.zeros(3, dtype=getattr(torch, dt))
    a, code = I.cpu_array(t, "t", True)
    assert code == I.DTYPE_CODES[dt] and a.ctypes.data == t.data_ptr()
    if dt == "bfloat16":
        assert a.dtype == np.uint16
        assert I.host_array(t).dtype == np.uint16
    v = I.describe(t)
    assert (v.device, v.dtype, v.code, v.owner) == ("cpu", dt, I.DTYPE_CODES[dt], t)
    p = torch.nn.Parameter(torch.zeros(2))
    assert I.is_torch_tensor(t) and I.is_torch_tensor(p)
    assert np.shares_memory(I.cpu_array(p, "p", True)[0], p.detach().numpy())


def test_bfloat16_ml_dtypes():
    ml = pytest.importorskip("ml_dtypes")
    a = np.zeros(4, dtype=ml.bfloat16)
    got, code = I.cpu_array(a, "t")
    assert code == I.BFLOAT16 and got.dtype == np.uint16 and np.shares_memory(got, a)
    assert I.host_array(a).dtype == np.uint16
    assert I.describe(a).dtype == "bfloat16"


def test_buffer_objects():
    got, code = I.cpu_array(array.array("i", [1, 2, 3]), "x", True)
    assert code == I.INT32 and list(got) == [1, 2, 3]
    got, code = I.cpu_array(bytearray(b"ab"), "x", True)
    assert code == I.UINT8
    with pytest.raises(ValueError, match="x is read-only"):
        I.cpu_array(b"ab", "x", True)
    assert I.cpu_array(b"ab", "x")[1] == I.UINT8


def test_torch_detection_no_import():
    assert not I.is_torch_tensor(np.zeros(1)) and not I.is_torch_tensor(pyddp.tensor([1.0]))
    assert I.is_torch_module(torch.nn.Linear(1, 1)) and not I.is_torch_module(object())
    assert I.loaded_torch() is sys.modules["torch"]


def test_readonly_and_noncontiguous():
    a = np.arange(6.0)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="tensor is read-only"):
        I.cpu_array(a, "tensor", True)
    assert I.describe(a).writable is False
    b = np.arange(12.0).reshape(3, 4)[:, ::2]
    with pytest.raises(ValueError, match="must be C-contiguous"):
        I.cpu_array(b, "tensor")
    v = I.describe(b)
    assert not v.contiguous and v.strides == b.strides
    t = torch.zeros(3, 4).t()
    with pytest.raises(ValueError, match=r"must be contiguous \(call .contiguous"):
        I.cpu_array(t, "tensor")
    assert not I.describe(t).contiguous


def test_unsupported():
    with pytest.raises(TypeError, match="tensor must be an array"):
        I.cpu_array([1, 2], "tensor")
    with pytest.raises(TypeError, match="unsupported dtype"):
        I.cpu_array(np.array(["a"]), "tensor")
    with pytest.raises(TypeError, match="x must be an array or tensor"):
        I.host_array(object(), "x")
    # the kernels' adapter still takes objects whose __array__ returns their memory
    a = np.zeros(3, np.float32)

    class Wrap:
        def __array__(self, dtype=None, copy=None):
            return a
    assert I.host_array(Wrap()) is a


def test_cuda_array_interface_description():
    x = FakeCuda(shape=(2, 3), typestr="<f2", ptr=0x1000, dlpack_device=(2, 1))
    v = I.describe(x, "t")
    assert (v.array, v.device, v.index, v.ptr, v.shape, v.dtype, v.code, v.nbytes,
            v.contiguous, v.writable, v.owner) == (None, "cuda", 1, 0x1000, (2, 3), "float16",
                                                  I.FLOAT16, 12, True, True, x)
    assert v.device_str == "cuda:1" and v.size == 6 and v.ndim == 2
    v = I.describe(FakeCuda(shape=(2, 3), strides=(4, 8), readonly=True))
    assert not v.contiguous and not v.writable and v.strides == (4, 8)
    v = I.describe(FakeCuda(shape=(2, 3), strides=(12, 4)))
    assert v.contiguous  # C-order strides given explicitly
    v = I.describe(CaiOnly(shape=(5,), typestr="<i8", data=(0x2000, False)))
    assert (v.device, v.index, v.dtype, v.nbytes) == ("cuda", 0, "int64", 40)
    v = I.describe(CaiOnly(shape=(5,), typestr="|V3", data=(0x2000, False)))
    assert v.code is None


def test_cuda_arrays_rejected_by_cpu_paths():
    msg = (r"tensor is on device cuda:0; the 'cpu' backend takes CPU tensors \(CUDA tensors need "
           r"the nccl backend\)")
    for x in (FakeCuda(), CaiOnly(shape=(1,), typestr="<f4", data=(1, False))):
        with pytest.raises(ValueError, match=msg) as e:
            I.cpu_array(x, "tensor", True)
        assert isinstance(e.value, I.DeviceError) and e.value.view.device == "cuda"
        with pytest.raises(ValueError, match="pyddp's kernels take CPU tensors"):
            I.host_array(x, "tensor")


def test_dlpack_capsule_description():
    # the C adapter's capsule reader, checked on a CPU array (a CUDA capsule has the same layout)
    a = np.arange(12, dtype=np.int16).reshape(3, 4)[:, 1:]

    class Dl:  # DLPack only: no buffer protocol
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kw):
            return self.arr.__dlpack__(**kw)

    v = I._c_view(Dl(a), "tensor")
    assert (v.device, v.dtype, v.shape, v.strides, v.ptr, v.contiguous, v.writable) == (
        "cpu", "int16", (3, 3), a.strides, a.__array_interface__["data"][0], False, True)
    r = np.zeros(3)
    r.flags.writeable = False
    try:
        r.__dlpack__(max_version=(1, 0))
    except (TypeError, BufferError):
        return
    assert I._c_view(Dl(r), "tensor").writable is False  # the versioned capsule's read-only flag


def test_dlpack_device_without_cai_uses_capsule():
    a = np.arange(4, dtype=np.float32)

    class FakeDL:
        def __dlpack__(self, stream=None):
            return a.__dlpack__()

        def __dlpack_device__(self):
            return (13, 0)  # CUDA managed memory: described, not viewed
    v = I.describe(FakeDL())
    assert v.array is None and v.shape == (4,) and v.dtype == "float32"


def test_dlpack_other_device():
    class Rocm(DLPackOnly):
        def __dlpack_device__(self):
            return (10, 0)
    with pytest.raises(ValueError, match="is on device"):
        I.cpu_array(Rocm(np.zeros(2)), "t")


def test_kernels_and_arrays_use_interop():
    from pyddp import _kernels
    from pyddp.amp import _fw
    from pyddp.nn.parallel import _frameworks

    assert _kernels.as_array is I.host_array
    assert c10d.as_array is I.cpu_array
    assert _fw.is_torch is I.is_torch_tensor and _fw.is_torch_module is I.is_torch_module
    assert _frameworks.is_torch_module is I.is_torch_module
