"""A test-only stand-in for libcudart and libnccl: CUDA arrays, streams and NCCL without a GPU.

    import fakecuda                                 # tests/ is on sys.path under pytest

    env = fakecuda.env(devices=2)                   # PYDDP_CUDART_LIBRARY, PYDDP_NCCL_LIBRARY, ...
    results = run(fn, 2, init=False, env=env)       # ranks load the fakes through pyddp's search

    x = fakecuda.DeviceArray(np.arange(4.0), device=0, stream=fakecuda.Stream())
    x.__cuda_array_interface__                      # v3, with the stream's handle
    x.numpy()                                       # read back after synchronising its stream

build() compiles fake_cudart.c and fake_nccl.c (what they model is described at their top) into
libcudart.so.13 and libnccl.so.2 under tests/fakecuda/build/<hash of the sources>/, once per source
version, safely when several processes build at once. The ctypes handles here load the same paths as
pyddp does, so the dynamic loader gives both the same library instance (one set of streams, events and
allocations). As with CUDA, a child forked after this process used CUDA gets cudaErrorInitializationError
(3) from every call but cudaGetDeviceCount: a test that uses CUDA here and in its ranks starts them with
spawn.
These libraries are never a fallback: nothing in pyddp's own search looks under tests/.
"""
import contextlib
import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading

import numpy as np

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 arrays need ml_dtypes
    BFLOAT16 = None

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.dirname(HERE)  # what a subprocess that imports fakecuda needs on sys.path
SOURCES = ("fakecuda.h", "fake_cudart.c", "fake_nccl.c")
CUDART = "libcudart.so.13"
_CUDART_FILE = "libpyddp_fakecudart.so"
NCCL = "libnccl.so.2"
_CFLAGS = ["-std=c11", "-shared", "-fPIC", "-pthread", "-O1", "-g", "-Wall", "-Wextra"]

# cudaMemcpyKind, stream handles, DLPack device types
H2H, H2D, D2H, D2D, DEFAULT = range(5)
LEGACY_STREAM, PER_THREAD_STREAM = 1, 2
KDLCUDA = 2

# ncclDataType_t and ncclRedOp_t
NCCL_DTYPES = {np.dtype(t): code for code, t in enumerate(
    (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64))}
if BFLOAT16 is not None:
    NCCL_DTYPES[BFLOAT16] = 9
SUM, PROD, MAX, MIN, AVG = range(5)
HOLD_LIMIT = 60.0  # seconds a Stream.hold() blocks at most


def build():
    """Compile both libraries (if this version of the sources is not built yet); return their folder."""
    cc = shlex.split(os.environ.get("CC") or "cc")
    digest = hashlib.sha256(" ".join(cc + _CFLAGS).encode())
    for name in SOURCES:
        with open(os.path.join(HERE, name), "rb") as f:
            digest.update(f.read())
    root = os.path.join(HERE, "build")
    out = os.path.join(root, digest.hexdigest()[:16])
    if os.path.isfile(os.path.join(out, NCCL)):
        return out
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=root)
    try:
        # The fake libnccl needs the fake libcudart (one set of streams) under a soname of its own: a
        # process that has loaded the real libcudart.so.13 would otherwise satisfy the dependency with it.
        # libcudart.so.13 is a link to that file, so a dlopen by either path gives the same library.
        nccl_links = [os.path.join(tmp, _CUDART_FILE), "-Wl,-rpath,$ORIGIN", "-lm"]
        for lib, src, extra in ((_CUDART_FILE, "fake_cudart.c", []), (NCCL, "fake_nccl.c", nccl_links)):
            cmd = [*cc, *_CFLAGS, f"-Wl,-soname,{lib}", os.path.join(HERE, src), "-o", os.path.join(tmp, lib),
                   *extra]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(f"building the fake CUDA libraries failed: {' '.join(cmd)}\n{r.stderr}")
        os.symlink(_CUDART_FILE, os.path.join(tmp, CUDART))
        try:
            os.rename(tmp, out)  # atomic: a folder that exists is complete
        except OSError:
            if not os.path.isfile(os.path.join(out, NCCL)):  # not another process winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def env(devices=2, **extra):
    """The environment that makes pyddp load the fakes: PYDDP_CUDART_LIBRARY, PYDDP_NCCL_LIBRARY and
    FAKECUDA_DEVICES, plus extra variables (FAKENCCL_VERSION=..., NCCL_MULTI_RANK_GPU_ENABLE=1, ...;
    None means "remove", as tests/_mp.py's env does)."""
    folder = build()
    e = {"PYDDP_CUDART_LIBRARY": os.path.join(folder, CUDART),
         "PYDDP_NCCL_LIBRARY": os.path.join(folder, NCCL),
         "FAKECUDA_DEVICES": str(devices)}
    e.update((k, None if v is None else str(v)) for k, v in extra.items())
    return e


# ------------------------------------------------------------------------------------------- ctypes

class PointerAttributes(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("devicePointer", ctypes.c_void_p),
                ("hostPointer", ctypes.c_void_p), ("reserved", ctypes.c_long * 8)]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * 128)]

    @property
    def segment(self):
        """The /dev/shm file the communicator's ranks share while they join."""
        name = bytes(self.internal)[8:].split(b"\0")[0].decode()
        return "/dev/shm" + name


class Config(ctypes.Structure):
    """ncclConfig_t, NCCL 2.18's layout; Config(blocking=0) is NCCL_CONFIG_INITIALIZER with blocking=0."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
                ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int)]

    def __init__(self, blocking=1):
        undef = -2 ** 31
        super().__init__(ctypes.sizeof(Config), 0xcafebeef, 21800, blocking, undef, undef, undef, None, undef)


HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_p, _i, _u, _z = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
_pi, _pp = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)

_CUDART_PROTOS = {
    "cudaGetDeviceCount": [_pi], "cudaGetDevice": [_pi], "cudaSetDevice": [_i], "cudaDeviceSynchronize": [],
    "cudaStreamCreateWithFlags": [_pp, _u], "cudaStreamDestroy": [_p], "cudaStreamSynchronize": [_p],
    "cudaStreamQuery": [_p], "cudaStreamWaitEvent": [_p, _p, _u], "cudaEventCreateWithFlags": [_pp, _u],
    "cudaEventDestroy": [_p], "cudaEventRecord": [_p, _p], "cudaEventQuery": [_p],
    "cudaEventSynchronize": [_p],
    "cudaMemcpyAsync": [_p, _p, _z, _i, _p], "cudaMemsetAsync": [_p, _i, _z, _p], "cudaMalloc": [_pp, _z],
    "cudaFree": [_p], "cudaHostAlloc": [_pp, _z, _u], "cudaFreeHost": [_p],
    "cudaPointerGetAttributes": [ctypes.POINTER(PointerAttributes), _p], "cudaGetLastError": [],
    "cudaRuntimeGetVersion": [_pi], "cudaDriverGetVersion": [_pi], "cudaLaunchHostFunc": [_p, HOST_FN, _p],
    "fakecudaStreamSleep": [_p, _u], "fakecudaStreamCount": [], "fakecudaFreeUnsynced": [_p],
    "fakecudaMemStats": [_pi, ctypes.POINTER(ctypes.c_size_t), _pi],
}
_NCCL_PROTOS = {
    "ncclGetVersion": [_pi], "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [_pp, _i, UniqueId, _i], "ncclCommInitRankConfig": [_pp, _i, UniqueId, _i,
                                                                           ctypes.POINTER(Config)],
    "ncclCommSplit": [_p, _i, _i, _pp, ctypes.POINTER(Config)], "ncclCommAbort": [_p],
    "ncclCommDestroy": [_p],
    "ncclCommFinalize": [_p], "ncclCommGetAsyncError": [_p, _pi], "ncclCommCount": [_p, _pi],
    "ncclCommCuDevice": [_p, _pi], "ncclCommUserRank": [_p, _pi],
    "ncclAllReduce": [_p, _p, _z, _i, _i, _p, _p], "ncclBroadcast": [_p, _p, _z, _i, _i, _p, _p],
    "ncclReduce": [_p, _p, _z, _i, _i, _i, _p, _p], "ncclAllGather": [_p, _p, _z, _i, _p, _p],
    "ncclReduceScatter": [_p, _p, _z, _i, _i, _p, _p], "ncclSend": [_p, _z, _i, _i, _p, _p],
    "ncclRecv": [_p, _z, _i, _i, _p, _p], "ncclGroupStart": [], "ncclGroupEnd": [], "fakencclCommCount": [],
}
_libs = {}


def _load(name, protos, restypes):
    if name not in _libs:
        lib = ctypes.CDLL(os.path.join(build(), name))
        for fn, args in protos.items():
            getattr(lib, fn).argtypes = args
            getattr(lib, fn).restype = ctypes.c_int
        for fn, (args, res) in restypes.items():
            getattr(lib, fn).argtypes = args
            getattr(lib, fn).restype = res
        _libs[name] = lib
    return _libs[name]


def cudart():
    """ctypes handle on the fake libcudart (argtypes set for every function it exports)."""
    s = ctypes.c_char_p
    return _load(CUDART, _CUDART_PROTOS, {"cudaGetErrorString": ([_i], s), "cudaGetErrorName": ([_i], s),
                                          "fakecudaClearError": ([], None),
                                          "fakecudaHostFreeCount": ([], ctypes.c_long),
                                          "fakecudaContexts": ([], ctypes.c_ulonglong)})


def contexts():
    """The devices with a primary context in this process (created by cudaSetDevice, or by any call
    that needs a device, on the calling thread's current device)."""
    mask = cudart().fakecudaContexts()
    return {d for d in range(64) if mask >> d & 1}


def nccl():
    """ctypes handle on the fake libnccl (argtypes set for every function it exports)."""
    s = ctypes.c_char_p
    return _load(NCCL, _NCCL_PROTOS, {"ncclGetErrorString": ([_i], s), "ncclGetLastError": ([_p], s)})


class CudaError(RuntimeError):
    def __init__(self, code, call):
        lib = cudart()
        self.code = code
        super().__init__(f"{call}: {lib.cudaGetErrorName(code).decode()} ({code}): "
                         f"{lib.cudaGetErrorString(code).decode()}")


class NcclError(RuntimeError):
    def __init__(self, code, call):
        lib = nccl()
        self.code = code
        self.last_error = lib.ncclGetLastError(None).decode()
        super().__init__(f"{call}: {code}: {lib.ncclGetErrorString(code).decode()}: {self.last_error}")


def cuda_call(fn, *args):
    """Call a libcudart function by name; raise CudaError unless it returns cudaSuccess."""
    rc = getattr(cudart(), fn)(*args)
    if rc:
        raise CudaError(rc, fn)


def nccl_call(fn, *args):
    """Call a libnccl function by name; raise NcclError unless it returns ncclSuccess."""
    rc = getattr(nccl(), fn)(*args)
    if rc:
        raise NcclError(rc, fn)


def unique_id():
    uid = UniqueId()
    nccl_call("ncclGetUniqueId", ctypes.byref(uid))
    return uid


@contextlib.contextmanager
def on_device(d):
    """Make d the calling thread's current device for the block (a no-op where it is already)."""
    old = ctypes.c_int()
    cuda_call("cudaGetDevice", ctypes.byref(old))
    if old.value == d:
        yield
        return
    cuda_call("cudaSetDevice", d)
    try:
        yield
    finally:
        cuda_call("cudaSetDevice", old.value)


def synchronize():
    cuda_call("cudaDeviceSynchronize")


def mem_stats():
    """(live cudaMalloc blocks, their bytes, live cudaHostAlloc blocks) in this process."""
    nd, nb, nh = ctypes.c_int(), ctypes.c_size_t(), ctypes.c_int()
    cudart().fakecudaMemStats(ctypes.byref(nd), ctypes.byref(nb), ctypes.byref(nh))
    return nd.value, nb.value, nh.value


def host_free_count():
    """cudaFreeHost calls that freed a block in this process (each one waits for every stream)."""
    return cudart().fakecudaHostFreeCount()


def stream_count():
    """Streams created and not destroyed in this process."""
    return cudart().fakecudaStreamCount()


def comm_count():
    """NCCL communicators created and not yet freed in this process."""
    return nccl().fakencclCommCount()


def clear_error():
    """Forget the sticky error (cudaErrorIllegalAddress) a test provoked."""
    cudart().fakecudaClearError()


def _addr(buf):
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if len(buf) else None


# ------------------------------------------------------------------------------------ events, streams

class Event:
    def __init__(self, flags=2):  # cudaEventDisableTiming
        h = ctypes.c_void_p()
        cuda_call("cudaEventCreateWithFlags", ctypes.byref(h), flags)
        self.handle = h.value

    def record(self, stream=None):
        cuda_call("cudaEventRecord", self.handle, _handle(stream))
        return self

    def query(self):
        """True when the recorded work is done (cudaEventQuery)."""
        rc = cudart().cudaEventQuery(self.handle)
        if rc not in (0, 600):
            raise CudaError(rc, "cudaEventQuery")
        return rc == 0

    def synchronize(self):
        cuda_call("cudaEventSynchronize", self.handle)

    def __del__(self):
        if _libs and self.__dict__.get("handle"):
            cudart().cudaEventDestroy(self.handle)


class Stream:
    """A CUDA stream: Stream(device) creates one (non-blocking unless nonblocking=False);
    Stream(handle=1) or Stream.legacy() wraps the legacy default stream (never destroyed)."""

    def __init__(self, device=0, nonblocking=True, handle=None):
        self.device = device
        self._owned = handle is None
        self._keep = []  # (event, host object) kept alive until the event completes
        if handle is None:
            h = ctypes.c_void_p()
            with on_device(device):
                cuda_call("cudaStreamCreateWithFlags", ctypes.byref(h), 1 if nonblocking else 0)
            handle = h.value
        self.handle = handle

    @classmethod
    def legacy(cls, device=0):
        return cls(device, handle=LEGACY_STREAM)

    def _on(self):
        return on_device(self.device)

    def sleep(self, ms):
        """A task that sleeps ms milliseconds: a slow kernel on this stream."""
        with self._on():
            cuda_call("fakecudaStreamSleep", self.handle, int(ms))

    def hold(self):
        """Block this stream (a kernel that runs until released) until the returned threading.Event
        is set; set it before the process ends.  Bounded: after HOLD_LIMIT seconds the stream goes on
        by itself, so a test that forgets to release it fails instead of hanging."""
        gate = threading.Event()
        cb = HOST_FN(lambda _: gate.wait(HOLD_LIMIT))
        with self._on():
            cuda_call("cudaLaunchHostFunc", self.handle, cb, None)
        self._hold(cb)
        return gate

    def synchronize(self):
        with self._on():
            cuda_call("cudaStreamSynchronize", self.handle)
        self._keep.clear()

    def query(self):
        """True when everything queued is done (cudaStreamQuery)."""
        with self._on():
            rc = cudart().cudaStreamQuery(self.handle)
        if rc not in (0, 600):
            raise CudaError(rc, "cudaStreamQuery")
        return rc == 0

    def record(self, event=None):
        """Record event (a new one if None) on this stream; return it."""
        with self._on():
            return (event or Event()).record(self)

    def wait_event(self, event):
        with self._on():
            cuda_call("cudaStreamWaitEvent", self.handle, event.handle, 0)

    def wait_stream(self, other):
        """Make this stream wait for the work queued on other so far."""
        self.wait_event(other.record())

    def _hold(self, obj):
        self._keep = [(e, o) for e, o in self._keep if not e.query()]
        self._keep.append((self.record(), obj))
        _orphans[:] = [(e, o) for e, o in _orphans if not e.query()]

    def copy_from(self, host, dst):
        """Queue a host-to-device copy of host into the (contiguous) DeviceArray dst; host is kept alive."""
        buf = bytearray(np.ascontiguousarray(host, dtype=dst.dtype).tobytes())
        if len(buf) != dst.nbytes or dst.strides is not None:
            raise ValueError(f"copy_from: {len(buf)} bytes into a {dst.nbytes}-byte array "
                             f"(strides {dst.strides})")
        with self._on():
            cuda_call("cudaMemcpyAsync", dst.ptr, _addr(buf), len(buf), H2D, self.handle)
        self._hold(buf)

    def copy_to(self, src, host):
        """Queue a device-to-host copy of the DeviceArray src into the writable, C-contiguous NumPy
        array host (kept alive); synchronize() before reading it."""
        if host.nbytes != src.nbytes or not host.flags.c_contiguous or not host.flags.writeable:
            raise ValueError("copy_to: host must be a writable C-contiguous array of the same size")
        with self._on():
            cuda_call("cudaMemcpyAsync", host.ctypes.data, src.ptr, src.nbytes, D2H, self.handle)
        self._hold(host)

    def close(self):
        if self._owned and self.handle:
            cudart().cudaStreamDestroy(self.handle)  # queued work still runs
            self.handle = None
        _orphans.extend(self._keep)
        self._keep = []

    def __del__(self):
        if _libs and self.__dict__.get("_owned"):
            self.close()


_orphans = []  # what closed streams' queued work still uses


def _handle(stream):
    """A stream argument (Stream, a raw handle or None for the legacy default) as a handle."""
    if stream is None:
        return None
    return stream.handle if isinstance(stream, Stream) else int(stream)


# ------------------------------------------------------------------------------------------- DLPack

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_exported = {}  # address of a DLManagedTensor[Versioned] -> what it keeps alive


def _dl_delete(addr):
    _exported.pop(addr, None)


_dl_deleter = _DELETER(_dl_delete)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capi = ctypes.PyDLL(None)  # our own prototypes, not ctypes.pythonapi's shared ones
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_capi.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_DLTENSOR, _DLTENSOR_VERSIONED = b"dltensor", b"dltensor_versioned"


def _capsule_destructor(cap):
    # A capsule nobody consumed (still named "dltensor[_versioned]") deletes its tensor.
    for name in (_DLTENSOR, _DLTENSOR_VERSIONED):
        if _capi.PyCapsule_IsValid(cap, name):
            _dl_delete(_capi.PyCapsule_GetPointer(cap, name))


_capsule_destructor_c = _CAPSULE_DESTRUCTOR(_capsule_destructor)


def _dl_dtype(dt):
    if BFLOAT16 is not None and dt == BFLOAT16:
        return _DLDataType(4, 16, 1)
    codes = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
    if dt.kind not in codes:
        raise BufferError(f"no DLPack type for {dt}")
    return _DLDataType(codes[dt.kind], dt.itemsize * 8, 1)


# ------------------------------------------------------------------------------------------- arrays

class DeviceArray:
    """An array in fake device memory (cudaMalloc on `device`).

    data: a NumPy array (or anything np.asarray takes) to upload, or a shape (int or tuple) for an
    uninitialised array of dtype (cudaMalloc fills it with 0xCB bytes). stream: the Stream its work
    is ordered on (None: the legacy default stream; the upload is synchronous either way); it is the
    `stream` of __cuda_array_interface__ and the stream __dlpack__ synchronises from. strides: bytes
    per dimension for a non-contiguous layout (None: C-contiguous). protocol: "cai" (the array exposes
    __cuda_array_interface__, version cai_version), "dlpack" (__dlpack__ and __dlpack_device__), or
    "both". dlpack_streams lists the stream arguments consumers passed to __dlpack__.
    """

    def __init__(self, data, dtype=None, device=0, stream=None, readonly=False, strides=None,
                 protocol="cai", cai_version=3):
        if protocol not in ("cai", "dlpack", "both"):
            raise ValueError(f"protocol must be 'cai', 'dlpack' or 'both', not {protocol!r}")
        host = None
        if isinstance(data, (int, tuple)):
            shape = (data,) if isinstance(data, int) else tuple(data)
            dt = np.dtype(dtype if dtype is not None else np.float32)
        else:
            host = np.asarray(data, dtype=dtype)
            shape, dt = host.shape, host.dtype
        self.shape, self.dtype, self.device, self.stream = shape, dt, device, stream
        self.readonly, self.protocol, self.cai_version = readonly, protocol, cai_version
        self.strides = None if strides is None else tuple(int(s) for s in strides)
        self.dlpack_streams = []
        if self.strides is None:
            self.nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        elif len(self.strides) != len(shape) or min(self.strides, default=0) < 0:
            raise ValueError(f"strides {strides} do not fit shape {shape} (non-negative bytes per dimension)")
        else:
            empty = 0 in shape
            self.nbytes = 0 if empty else sum((n - 1) * s for n, s in zip(shape, self.strides)) + dt.itemsize
        p = ctypes.c_void_p()
        with on_device(device):
            cuda_call("cudaMalloc", ctypes.byref(p), self.nbytes)
        self.ptr = p.value or 0
        if host is not None:
            layout = bytearray(self.nbytes)
            np.ndarray(shape, dt, buffer=layout, strides=self.strides)[...] = host
            self._transfer(layout, H2D)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def _transfer(self, buf, kind):
        h = _handle(self.stream)
        src, dst = (_addr(buf), self.ptr) if kind == H2D else (self.ptr, _addr(buf))
        with on_device(self.device):
            cuda_call("cudaMemcpyAsync", dst, src, self.nbytes, kind, h)
            cuda_call("cudaStreamSynchronize", h)

    def numpy(self):
        """A NumPy copy, read on this array's stream after the work queued there."""
        layout = bytearray(self.nbytes)
        self._transfer(layout, D2H)
        return np.ndarray(self.shape, self.dtype, buffer=layout, strides=self.strides).copy()

    @property
    def __cuda_array_interface__(self):
        if self.protocol == "dlpack":
            raise AttributeError("__cuda_array_interface__")
        if BFLOAT16 is not None and self.dtype == BFLOAT16:
            raise TypeError("bfloat16 has no __cuda_array_interface__ typestr; use protocol='dlpack'")
        cai = {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, self.readonly),
               "version": self.cai_version, "strides": self.strides}
        if self.cai_version >= 3:
            cai["stream"] = _handle(self.stream)
        return cai

    @property
    def __dlpack_device__(self):
        if self.protocol == "cai":
            raise AttributeError("__dlpack_device__")
        return lambda: (KDLCUDA, self.device)

    @property
    def __dlpack__(self):
        if self.protocol == "cai":
            raise AttributeError("__dlpack__")
        return self._dlpack

    def _dlpack(self, stream=None, max_version=None, dl_device=None, copy=None):
        if stream == 0:
            raise ValueError("stream=0 is ambiguous for CUDA (DLPack): pass 1 (legacy) or 2 (per-thread)")
        if copy:
            raise BufferError("DeviceArray exports without copying only")
        self.dlpack_streams.append(stream)
        if stream != -1 and self.stream is not None:  # the consumer's stream waits for ours
            consumer = Stream(self.device, handle=LEGACY_STREAM if stream is None else stream)
            consumer.wait_stream(self.stream if isinstance(self.stream, Stream)
                                 else Stream(self.device, handle=self.stream))
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        strides = None
        if self.strides is not None:
            if any(s % self.dtype.itemsize for s in self.strides):
                raise BufferError(f"strides {self.strides} are not whole elements")
            strides = (ctypes.c_int64 * len(self.shape))(*(s // self.dtype.itemsize for s in self.strides))
        tensor = _DLTensor(self.ptr, _DLDevice(KDLCUDA, self.device), len(self.shape), _dl_dtype(self.dtype),
                           shape, strides, 0)
        if max_version is not None and tuple(max_version) >= (1, 0):
            m, name = DLManagedTensorVersioned((1, 0), None, _dl_deleter, int(self.readonly), tensor), \
                _DLTENSOR_VERSIONED
        else:
            m, name = DLManagedTensor(tensor, None, _dl_deleter), _DLTENSOR
        addr = ctypes.addressof(m)
        _exported[addr] = (m, shape, strides, self)
        return _capi.PyCapsule_New(addr, name, _capsule_destructor_c)

    def free_unsynced(self):
        """Give the memory back without cudaFree's device synchronisation, as a caching allocator
        hands it to its pool: work still queued on it then touches an illegal address."""
        cuda_call("fakecudaFreeUnsynced", self.ptr)
        self.ptr = 0

    def __del__(self):
        if _libs and self.__dict__.get("ptr"):
            cudart().cudaFree(self.ptr)
            self.ptr = 0
