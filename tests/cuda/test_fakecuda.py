"""The test-only CUDA/NCCL stand-in (tests/fakecuda) itself, through ctypes, no pyddp: streams, events,
memory, the array exports, and NCCL across real processes checked against NumPy."""
import ctypes
import gc
import glob
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fakecuda as fc
import _paths
from _mp import run
from fakecuda import (AVG, D2D, MAX, MIN, PROD, SUM, DeviceArray, Stream, cuda_call, nccl_call)

DTYPES = [np.dtype(t) for t in fc.NCCL_DTYPES]
NOCOLOR = -1
byref = ctypes.byref


def _async_error(comm):
    r = ctypes.c_int()
    nccl_call("ncclCommGetAsyncError", comm, byref(r))
    return r.value


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def _release_later(gate, seconds):
    threading.Timer(seconds, gate.set).start()


def _assert_clean(uid):
    assert not glob.glob(uid.segment + "*"), "a shared-memory segment was left in /dev/shm"


def _comms_here(n, devices=None, wait=True):
    """n ranks of one communicator in this process (nonblocking init; rank r on devices[r])."""
    uid = fc.unique_id()
    comms = []
    for r in range(n):
        with fc.on_device(r if devices is None else devices[r]):
            c = ctypes.c_void_p()
            rc = fc.nccl().ncclCommInitRankConfig(byref(c), n, uid, r, byref(fc.Config(blocking=0)))
            assert rc in (0, 7) and c.value
            comms.append(c.value)
    if wait:
        _wait(lambda: all(_async_error(c) != 7 for c in comms))
    _assert_clean(uid)
    return comms


def _spawn(fn, world, *args, env=None, timeout=60):
    # Ranks that use CUDA start as fresh interpreters: this process has used it (a forked child could
    # not, as with CUDA).
    return run(fn, world, *args, init=False, env=env or fc.env(), timeout=timeout, start_method="spawn")


def _allreduce(comm, x, stream, op=SUM, check=True):
    """ncclAllReduce, then (a non-blocking communicator of 2+ ranks answers ncclInProgress and
    launches from a job thread, as NCCL's) polled until the call is no longer in progress."""
    rc = fc.nccl().ncclAllReduce(x.ptr, x.ptr, x.size, fc.NCCL_DTYPES[x.dtype], op, comm, stream.handle)
    if rc == 7:
        _wait(lambda: _async_error(comm) != 7)
        rc = _async_error(comm)
    if rc and check:
        raise fc.NcclError(rc, "ncclAllReduce")


# ---------------------------------------------------------------------------------- the runtime

def test_build_is_cached_and_safe_in_parallel():
    d = fc.build()
    assert fc.build() == d and os.path.isfile(os.path.join(d, fc.CUDART))
    e = fc.env(devices=3, NCCL_DEBUG="WARN", FOO=None)
    assert e["PYDDP_NCCL_LIBRARY"] == os.path.join(d, fc.NCCL) and e["FAKECUDA_DEVICES"] == "3"
    assert e["FOO"] is None
    # two processes building a new version at once both get the same, complete folder
    tests = _paths.TESTS
    cc = f"cc -DFAKECUDA_RACE_{os.getpid()}_{time.monotonic_ns()}"
    code = "import fakecuda; print(fakecuda.build())"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=tests, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, CC=cc, PYTHONPATH=tests)) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    try:
        assert [p.returncode for p in procs] == [0, 0] and outs[0] == outs[1] != d
        assert sorted(os.listdir(outs[0])) == sorted([fc.CUDART, fc._CUDART_FILE, fc.NCCL])
    finally:
        for o in set(outs):
            if o and o != d:
                shutil.rmtree(o, ignore_errors=True)


def _cudawrap_fields(struct):
    """{field: number of parameters} of a function-pointer table in csrc/cuda/cudawrap.h."""
    root = _paths.ROOT
    with open(os.path.join(root, "csrc", "cuda", "cudawrap.h")) as f:
        text = f.read()
    body = re.search(r"struct %s \{(.*?)\n\};" % struct, text, re.S).group(1)
    fields = re.findall(r"\(\*(\w+)\)\(([^)]*)\)", body)
    return {name: 0 if params.strip() == "void" else params.count(",") + 1 for name, params in fields}


@pytest.mark.parametrize("struct, prefix, lib",
                         [("pd_cudart", "cuda", fc.cudart), ("pd_nccl", "nccl", fc.nccl)])
def test_every_cudawrap_entry_point_is_exported(struct, prefix, lib):
    fields = _cudawrap_fields(struct)
    assert len(fields) > 20
    handle = lib()
    for name, nparams in fields.items():
        fn = getattr(handle, prefix + name)  # AttributeError: the fake lacks it
        assert len(fn.argtypes) == nparams, name


def test_devices_versions_and_errors(monkeypatch):
    lib = fc.cudart()
    n, v = ctypes.c_int(), ctypes.c_int()
    assert lib.cudaGetDeviceCount(byref(n)) == 0 and n.value == 2
    assert lib.cudaRuntimeGetVersion(byref(v)) == 0 and v.value == 13000
    assert lib.cudaDriverGetVersion(byref(v)) == 0 and v.value == 13000
    assert lib.cudaSetDevice(2) == 101 and lib.cudaGetLastError() == 101 and lib.cudaGetLastError() == 0
    assert lib.cudaGetErrorName(101) == b"cudaErrorInvalidDevice"
    assert lib.cudaGetErrorString(600) == b"device not ready"
    assert lib.cudaGetErrorString(12345) == b"unrecognized error code"

    def on_thread():  # the current device is per thread
        cuda_call("cudaSetDevice", 1)
        cuda_call("cudaGetDevice", byref(v))
    with fc.on_device(0):
        t = threading.Thread(target=on_thread)
        t.start()
        t.join(10)
        cuda_call("cudaGetDevice", byref(n))
        assert (n.value, v.value) == (0, 1)

    monkeypatch.setenv("FAKECUDA_DEVICES", "0")
    p = ctypes.c_void_p()
    assert lib.cudaGetDeviceCount(byref(n)) == 100 and n.value == 0
    assert lib.cudaMalloc(byref(p), 8) == 100
    c = ctypes.c_void_p()
    assert fc.nccl().ncclCommInitRank(byref(c), 1, fc.unique_id(), 0) == 1
    assert fc.nccl().ncclGetLastError(None) == b"Cuda failure 'no CUDA-capable device is detected'"
    monkeypatch.setenv("FAKECUDA_DEVICES", "3")
    assert lib.cudaSetDevice(2) == 0 and lib.cudaSetDevice(0) == 0


def test_memory_and_pointer_attributes():
    with fc.on_device(0):  # this thread on device 0 (with a context) throughout: see the legacy test
        gc.collect()
        x = DeviceArray(np.arange(6, dtype=np.int32), device=1)
        attrs = fc.PointerAttributes()
        cuda_call("cudaPointerGetAttributes", byref(attrs), x.ptr + 4)
        assert (attrs.type, attrs.device, attrs.devicePointer) == (2, 1, x.ptr + 4)
        assert x.ptr % 256 == 0
        host = ctypes.c_void_p()
        cuda_call("cudaHostAlloc", byref(host), 64, 0)
        cuda_call("cudaPointerGetAttributes", byref(attrs), host)
        assert (attrs.type, attrs.hostPointer) == (1, host.value)
        plain = np.zeros(4)
        cuda_call("cudaPointerGetAttributes", byref(attrs), plain.ctypes.data)
        assert attrs.type == 0 and not attrs.devicePointer
        blocks, nbytes, hosts = fc.mem_stats()
        assert fc.cudart().cudaFreeHost(host) == 0 and fc.cudart().cudaFreeHost(host) == 1
        assert fc.cudart().cudaFree(x.ptr + 4) == 1  # not the start of a block
        del x
        assert fc.mem_stats() == (blocks - 1, nbytes - 24, hosts - 1)
        # uninitialised memory is 0xCB bytes; copies must stay inside their block
        y = DeviceArray(3, dtype=np.uint8)
        assert y.numpy().tolist() == [0xCB] * 3
        lib = fc.cudart()
        assert lib.cudaMemcpyAsync(y.ptr, plain.ctypes.data, 4, fc.H2D, None) == 1
        assert lib.cudaMemcpyAsync(plain.ctypes.data, y.ptr, 3, 7, None) == 21
        assert lib.cudaMemsetAsync(plain.ctypes.data, 0, 8, None) == 1
        cuda_call("cudaMemsetAsync", y.ptr, 0x105, 3, None)
        assert y.numpy().tolist() == [5, 5, 5]


def test_stream_fifo_events_and_wait_event():
    a, b = Stream(), Stream()
    data = np.arange(1000, dtype=np.float64)
    src, dst = DeviceArray(data.shape, dtype=np.float64), DeviceArray(data.shape, dtype=np.float64, stream=b)
    gate = a.hold()                    # a kernel still running, then the copy it guards
    a.copy_from(data, src)
    ev = a.record()
    never = fc.Event()                 # waiting on a never-recorded event does nothing
    b.wait_event(never)
    assert b.query()
    b.wait_event(ev)
    cuda_call("cudaMemcpyAsync", dst.ptr, src.ptr, src.nbytes, D2D, b.handle)
    assert not ev.query() and not a.query() and not b.query()
    t0 = time.monotonic()
    _release_later(gate, 0.1)
    np.testing.assert_array_equal(dst.numpy(), data)  # numpy() synchronises b, which waited for a
    assert time.monotonic() - t0 >= 0.1 and ev.query() and a.query()
    ev.synchronize()
    # tasks run in order: later copies overwrite earlier ones
    for k in range(5):
        a.copy_from(np.full(1000, k, np.float64), src)
    a.synchronize()
    assert set(src.numpy().tolist()) == {4.0}
    lib = fc.cudart()
    assert lib.cudaEventDestroy(ev.handle) == 0 and lib.cudaEventQuery(ev.handle) == 400
    ev.handle = None
    h = a.handle
    a.close()
    assert lib.cudaStreamSynchronize(h) == 400 and lib.cudaStreamDestroy(None) == 400


def test_an_event_is_recorded_only_on_a_stream_of_its_device():
    lib = fc.cudart()
    with fc.on_device(0):
        ev = fc.Event()
    other = Stream(device=1)
    with fc.on_device(1):
        assert lib.cudaEventRecord(ev.handle, other.handle) == 400  # cudaErrorInvalidResourceHandle
        assert lib.cudaEventRecord(ev.handle, None) == 400          # device 1's legacy stream
        assert lib.cudaGetLastError() == 400
    with fc.on_device(0):
        assert lib.cudaEventRecord(ev.handle, None) == 0
    # waiting on another device's event is allowed (CUDA: "event may be from a different device")
    gate = Stream(device=0).hold()
    other.wait_event(Stream(device=0).record())
    _release_later(gate, 0.05)
    other.synchronize()


def test_free_host_waits_for_every_stream_and_is_counted():
    with fc.on_device(0):  # device 0 current (with a context), so the thread is left on it
        busy = Stream(device=1)
        gate = busy.hold()
        host = ctypes.c_void_p()
        cuda_call("cudaHostAlloc", byref(host), 64, 0)
        before = fc.host_free_count()
        _release_later(gate, 0.2)
        t0 = time.monotonic()
        cuda_call("cudaFreeHost", host)  # another device's stream is waited for too
    assert time.monotonic() - t0 >= 0.15 and busy.query()
    assert fc.cudart().cudaFreeHost(None) == 0
    assert fc.host_free_count() == before + 1


_FORK_SCRIPT = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import fakecuda as fc
from _mp import in_forked_child

lib, ref = fc.cudart(), ctypes.byref


def in_child(calls):
    return in_forked_child(lambda: [f() for f in calls])


n, v, p, h, ev = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
lib.cudaRuntimeGetVersion(ref(v))  # a version query initialises nothing
print(in_child([lambda: lib.cudaGetDeviceCount(ref(n)), lambda: lib.cudaMalloc(ref(p), 16)]))
print(lib.cudaMalloc(ref(p), 16), lib.cudaHostAlloc(ref(h), 16, 0), lib.cudaEventCreateWithFlags(ref(ev), 2))
print(in_child([lambda: lib.cudaGetDeviceCount(ref(n)), lambda: lib.cudaSetDevice(0),
                lambda: lib.cudaMalloc(ref(ctypes.c_void_p()), 16), lambda: lib.cudaFree(p),
                lambda: lib.cudaFreeHost(h), lambda: lib.cudaStreamSynchronize(None),
                lambda: lib.cudaEventRecord(ev, None), lambda: lib.cudaEventDestroy(ev),
                lambda: lib.cudaDeviceSynchronize(), lambda: lib.cudaRuntimeGetVersion(ref(v)),
                lambda: lib.cudaGetErrorName(3).decode()]))
print(lib.cudaFree(p), lib.cudaFreeHost(h), lib.cudaEventDestroy(ev))
"""


def test_a_child_forked_after_cuda_was_initialised_cannot_use_it():
    r = subprocess.run([sys.executable, "-c", _FORK_SCRIPT, fc.TESTS_DIR], capture_output=True, text=True,
                       timeout=60, env={**os.environ, **fc.env(devices=2)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "[0, 0]",  # forked before CUDA was initialised: the child may use it
        "0 0 0",
        # cudaGetDeviceCount still answers there (CUDA 13 on an H100: [0, 3, 3, 3] for it, cudaSetDevice,
        # cudaMalloc, cudaGetDevice)
        "[0, 3, 3, 3, 3, 3, 3, 3, 3, 0, 'cudaErrorInitializationError']",
        "0 0 0",   # the parent goes on
    ]


def test_legacy_default_stream_synchronises_with_blocking_streams():
    # the legacy stream and the blocking one on the same device: a test before may have left this thread
    # on device 1 (on_device restores only a device with a context)
    with fc.on_device(0):
        blocking, nonblocking = Stream(nonblocking=False), Stream()
        x = DeviceArray(4, dtype=np.float32)
        y = DeviceArray(4, dtype=np.float32)
        blocking.sleep(50)
        blocking.copy_from(np.full(4, 7, np.float32), x)
        legacy = Stream.legacy()
        cuda_call("cudaMemcpyAsync", y.ptr, x.ptr, 16, D2D, legacy.handle)  # waits for `blocking`
        legacy.synchronize()
        assert y.numpy().tolist() == [7] * 4
        gate = nonblocking.hold()
        cuda_call("cudaMemsetAsync", y.ptr, 0, 16, None)                    # does not wait for it
        legacy.synchronize()
        assert not nonblocking.query() and y.numpy().tolist() == [0] * 4
        t0 = time.monotonic()
        _release_later(gate, 0.1)
        fc.synchronize()                                                     # the whole device
        assert nonblocking.query() and time.monotonic() - t0 >= 0.1


def test_host_functions_run_in_stream_order():
    s = Stream()
    seen = []
    cb = fc.HOST_FN(lambda data: seen.append(data))
    gate = s.hold()
    cuda_call("cudaLaunchHostFunc", s.handle, cb, 1)
    cuda_call("cudaLaunchHostFunc", s.handle, cb, 2)
    time.sleep(0.05)
    assert seen == []
    gate.set()
    s.synchronize()
    assert seen == [1, 2]


def test_use_after_free_is_an_illegal_address():
    s = Stream()
    x = DeviceArray(1024, dtype=np.uint8)
    gate = s.hold()
    cuda_call("cudaMemsetAsync", x.ptr, 1, 1024, s.handle)
    x.free_unsynced()                      # back to a caching allocator before the memset runs
    gate.set()
    lib = fc.cudart()
    try:
        assert lib.cudaStreamSynchronize(s.handle) == 700
        assert lib.cudaGetLastError() == 700 and lib.cudaMalloc(byref(ctypes.c_void_p()), 8) == 700
    finally:
        fc.clear_error()
    assert lib.cudaStreamSynchronize(s.handle) == 0


def test_cuda_array_interface():
    s = Stream(device=1)
    x = DeviceArray(np.arange(12, dtype=np.int16).reshape(3, 4), device=1, stream=s, readonly=True)
    cai = x.__cuda_array_interface__
    assert cai == {"shape": (3, 4), "typestr": "<i2", "data": (x.ptr, True), "version": 3, "strides": None,
                   "stream": s.handle}
    assert not hasattr(x, "__dlpack__")
    assert "stream" not in DeviceArray([1.0], cai_version=2).__cuda_array_interface__
    assert DeviceArray([1.0]).__cuda_array_interface__["stream"] is None
    # a strided layout: every other column of a 3x4 int32 array
    y = DeviceArray(np.arange(6, dtype=np.int32).reshape(3, 2), strides=(16, 8))
    assert y.__cuda_array_interface__["strides"] == (16, 8) and y.nbytes == 2 * 16 + 8 + 4
    np.testing.assert_array_equal(y.numpy(), np.arange(6).reshape(3, 2))
    if fc.BFLOAT16 is not None:
        with pytest.raises(TypeError, match="bfloat16"):
            DeviceArray(np.ones(2, fc.BFLOAT16)).__cuda_array_interface__


def _capi(name, restype, *argtypes):
    fn = ctypes.pythonapi[name]  # a fresh function object: fakecuda's own prototypes stay as they are
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def _capsule_tensor(cap, name, cls):
    return cls.from_address(_capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        cap, name))


def test_dlpack_capsules_and_consumer_stream():
    producer, consumer = Stream(), Stream()
    x = DeviceArray(np.zeros(8, np.float32), stream=producer, protocol="dlpack", readonly=True)
    assert not hasattr(x, "__cuda_array_interface__") and x.__dlpack_device__() == (2, 0)
    gate = producer.hold()
    producer.copy_from(np.arange(8, dtype=np.float32), x)
    n0 = len(fc._exported)
    cap = x.__dlpack__(stream=consumer.handle)
    out = DeviceArray(8, dtype=np.float32, stream=consumer)
    cuda_call("cudaMemcpyAsync", out.ptr, x.ptr, 32, D2D, consumer.handle)  # after the producer's work
    assert not consumer.query()
    gate.set()
    np.testing.assert_array_equal(out.numpy(), np.arange(8))
    assert x.dlpack_streams == [consumer.handle]
    m = _capsule_tensor(cap, b"dltensor", fc.DLManagedTensor)
    t = m.dl_tensor
    assert (t.data, t.device.device_type, t.device.device_id, t.ndim) == (x.ptr, 2, 0, 1)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes, t.shape[0], bool(t.strides)) == (2, 32, 1, 8, False)
    # a consumer renames the capsule and calls the deleter; x stays alive until then
    _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(cap, b"used_dltensor")
    assert len(fc._exported) == n0 + 1
    m.deleter(ctypes.addressof(m))
    assert len(fc._exported) == n0
    del cap
    # versioned, read-only, strided; an unconsumed capsule deletes its tensor when dropped
    y = DeviceArray(np.arange(6, dtype=np.int64).reshape(2, 3), strides=(32, 8), protocol="both",
                    readonly=True)
    cap = y.__dlpack__(stream=-1, max_version=(1, 1))
    v = _capsule_tensor(cap, b"dltensor_versioned", fc.DLManagedTensorVersioned)
    assert (v.version.major, v.flags, v.dl_tensor.strides[0], v.dl_tensor.strides[1]) == (1, 1, 4, 1)
    assert len(fc._exported) == n0 + 1
    del cap, v
    assert len(fc._exported) == n0
    with pytest.raises(ValueError):
        y.__dlpack__(stream=0)


# ------------------------------------------------------------------------------ NCCL in-process

def test_nccl_versions_ids_and_strings(monkeypatch):
    lib = fc.nccl()
    v = ctypes.c_int()
    assert lib.ncclGetVersion(byref(v)) == 0 and v.value == 23203
    monkeypatch.setenv("FAKENCCL_VERSION", "21703")
    assert lib.ncclGetVersion(byref(v)) == 0 and v.value == 21703
    a, b = fc.unique_id(), fc.unique_id()
    assert a.segment != b.segment and a.segment.startswith(f"/dev/shm/fakenccl-{os.getpid()}-")
    assert lib.ncclGetErrorString(6) == b"remote process exited or there was a network error"
    assert lib.ncclGetErrorString(7) == b"NCCL operation in progress"
    assert lib.ncclGroupEnd() == 5 and lib.ncclGetLastError(None) == b"ncclGroupEnd: not in a group call."


def test_nccl_argument_checks(monkeypatch):
    monkeypatch.setenv("NCCL_CHECK_POINTERS", "1")  # NCCL checks pointers only when asked
    c0, c1 = _comms_here(2)
    lib = fc.nccl()
    s = Stream()
    x = DeviceArray(np.ones(4, np.float32))
    on1 = DeviceArray(np.ones(4, np.float32), device=1)
    host = np.ones(4, np.float32)

    def fails(code, message, fn, *args):
        assert getattr(lib, fn)(*args) == code
        assert message in lib.ncclGetLastError(None).decode()

    fails(4, "AllReduce : sendbuff (nil) is not a valid pointer", "ncclAllReduce", None, x.ptr, 4, 7, SUM,
          c0, s.handle)
    fails(4, f"AllReduce : recvbuff {hex(host.ctypes.data)} is not a valid pointer", "ncclAllReduce", x.ptr,
          host.ctypes.data, 4, 7, SUM, c0, s.handle)
    fails(4, "AllGather : sendbuff allocated on device 1 mismatchs with NCCL device 0", "ncclAllGather",
          on1.ptr, x.ptr, 2, 7, c0, s.handle)
    monkeypatch.delenv("NCCL_CHECK_POINTERS")
    # by default, as NCCL: a bad pointer is accepted by the call (it would fault on the device);
    # the bad type fails the group, so nothing of it runs
    nccl_call("ncclGroupStart")
    assert lib.ncclAllReduce(x.ptr, host.ctypes.data, 4, 7, SUM, c0, s.handle) == 0
    assert lib.ncclAllReduce(x.ptr, x.ptr, 4, 10, SUM, c0, s.handle) == 4
    assert lib.ncclGroupEnd() == 4 and s.query()
    monkeypatch.setenv("NCCL_CHECK_POINTERS", "1")
    fails(4, "AllReduce : invalid type 10", "ncclAllReduce", x.ptr, x.ptr, 4, 10, SUM, c0, s.handle)
    fails(4, "Reduce : invalid reduction operation 5", "ncclReduce", x.ptr, x.ptr, 4, 7, 5, 0, c0, s.handle)
    fails(4, "Broadcast : invalid root 2 (root should be in the 0..2 range)", "ncclBroadcast", x.ptr, x.ptr,
          4, 7, 2, c0, s.handle)
    fails(4, "Send : invalid root -1", "ncclSend", x.ptr, 4, 7, -1, c0, s.handle)
    fails(4, "AllReduce : comm argument is NULL", "ncclAllReduce", x.ptr, x.ptr, 4, 7, SUM, None, s.handle)
    fails(1, "Cuda failure 'invalid resource handle'", "ncclAllReduce", x.ptr, x.ptr, 4, 7, SUM, c0, 12345)
    # only the root's buffer matters; empty operations need no buffers
    nccl_call("ncclAllReduce", None, None, 0, 7, SUM, c0, s.handle)
    # an error inside a group fails its ncclGroupEnd, and nothing of the group runs
    nccl_call("ncclGroupStart")
    assert lib.ncclSend(x.ptr, 4, 7, 1, c0, s.handle) == 0
    assert lib.ncclRecv(None, 4, 7, 1, c0, s.handle) == 4
    assert lib.ncclGroupEnd() == 4 and s.query()
    bad = fc.Config()
    bad.magic = 0
    c = ctypes.c_void_p()
    assert lib.ncclCommInitRankConfig(byref(c), 1, fc.unique_id(), 0, byref(bad)) == 4
    assert lib.ncclCommInitRank(byref(c), 2, fc.unique_id(), 2) == 4
    assert lib.ncclGetLastError(None) == b"Invalid rank requested : 2/2"
    nccl_call("ncclCommDestroy", c0)
    nccl_call("ncclCommDestroy", c1)


@pytest.mark.parametrize("enable, version, ok",
                         [(None, None, False), ("1", None, True), ("1", "22903", False)])
def test_nccl_duplicate_gpu(monkeypatch, enable, version, ok):
    for name, value in (("NCCL_MULTI_RANK_GPU_ENABLE", enable), ("FAKENCCL_VERSION", version)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    comms = _comms_here(2, devices=[0, 0])
    errs = [_async_error(c) for c in comms]
    if ok:
        assert errs == [0, 0]
    else:
        assert errs == [5, 5]
        assert fc.nccl().ncclGetLastError(None).decode() in (
            "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1000",
            "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000",
            "Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to "
            "enable this configuration.")
    for c in comms:
        nccl_call("ncclCommAbort", c)


def test_nccl_abort_releases_a_hung_operation_and_destroy_waits():
    n0 = fc.comm_count()
    c0, c1 = _comms_here(2)
    s0, s1 = Stream(0), Stream(1)
    x0 = DeviceArray(np.ones(4, np.float32), stream=s0)
    x1 = DeviceArray(np.ones(4, np.float32), device=1, stream=s1)
    # rank 1 joins late: destroy on rank 0 waits for the outstanding work, as NCCL's does
    _allreduce(c0, x0, s0)
    done = threading.Event()
    t = threading.Thread(target=lambda: (nccl_call("ncclCommDestroy", c0), done.set()))
    t.start()
    assert not done.wait(0.3) and not s0.query()
    _allreduce(c1, x1, s1)
    assert done.wait(10)
    t.join(10)
    assert x0.numpy().tolist() == [2] * 4
    # rank 1's next operation never finds its peer: it spins, and destroy with it, until aborted
    _allreduce(c1, x1, s1)
    ev = s1.record()
    done.clear()
    t = threading.Thread(target=lambda: (nccl_call("ncclCommDestroy", c1), done.set()))
    t.start()
    assert not done.wait(0.2) and not ev.query()
    nccl_call("ncclCommAbort", c1)  # what a watchdog does
    assert done.wait(10)
    t.join(10)
    ev.synchronize()
    assert x1.numpy().tolist() == [2] * 4
    _wait(lambda: fc.comm_count() == n0)


def test_nccl_injected_async_error(monkeypatch):
    monkeypatch.setenv("FAKENCCL_ASYNC_ERROR_AFTER", "1")
    monkeypatch.setenv("FAKENCCL_ASYNC_ERROR_RANK", "1")
    c0, c1 = _comms_here(2)
    s0, s1 = Stream(0), Stream(1)
    xs = [DeviceArray(np.ones(2, np.float32), device=d, stream=s) for d, s in ((0, s0), (1, s1))]
    for k in range(2):
        _allreduce(c0, xs[0], s0)
        _allreduce(c1, xs[1], s1, check=k == 0)   # the second may see the error already
        if k == 0:
            first = s0.record()
    first.synchronize()  # both ranks' first operation completes
    _wait(lambda: _async_error(c1) == 6)
    assert _async_error(c0) == 0 and not s1.query() and not s0.query()
    assert "injected remote error after 1 operations" in fc.nccl().ncclGetLastError(None).decode()
    assert fc.nccl().ncclAllReduce(xs[1].ptr, xs[1].ptr, 2, 7, SUM, c1, s1.handle) == 6
    for c in (c0, c1):
        nccl_call("ncclCommAbort", c)
    s0.synchronize()
    s1.synchronize()
    assert xs[0].numpy().tolist() == xs[1].numpy().tolist() == [2, 2]


def test_nccl_finalize_nonblocking():
    c0, c1 = _comms_here(2)
    s0, s1 = Stream(0), Stream(1)
    x0, x1 = DeviceArray(np.ones(2, np.float32)), DeviceArray(np.ones(2, np.float32), device=1)
    _allreduce(c0, x0, s0)
    assert fc.nccl().ncclCommFinalize(c0) == 7 and _async_error(c0) == 7
    _allreduce(c1, x1, s1)
    _wait(lambda: _async_error(c0) == 0)
    assert fc.nccl().ncclCommFinalize(c1) in (0, 7)
    _wait(lambda: _async_error(c1) == 0)
    for c in (c0, c1):
        nccl_call("ncclCommDestroy", c)


# --------------------------------------------------------------------------- NCCL across processes

def _rank_input(rank, count, dt):
    rng = np.random.default_rng(100 + rank)
    if dt.kind == "f" or dt == fc.BFLOAT16:
        return rng.standard_normal(count).astype(dt)
    low = -20 if dt.kind == "i" else 0
    return rng.integers(low, low + 40, count).astype(dt)


def _reduce_ref(inputs, op):
    ufunc = {SUM: np.add, PROD: np.multiply, MAX: np.maximum, MIN: np.minimum, AVG: np.add}[op]
    acc = inputs[0].copy()
    for x in inputs[1:]:  # rank order, rounding to the dtype at each step
        acc = ufunc(acc, x)
    if op == AVG:  # integers truncate; floats divide in float32 (float64 for float64), then round
        n, dt = len(inputs), acc.dtype
        if dt.kind in "iu":
            return np.fix(acc.astype(np.float64) / n).astype(dt)
        wide = np.float64 if dt == np.float64 else np.float32
        return (acc.astype(wide) / wide(n)).astype(dt)
    return acc


def _init_rank(rank, world, uid_bytes, device=None):
    cuda_call("cudaSetDevice", rank if device is None else device)
    comm = ctypes.c_void_p()
    nccl_call("ncclCommInitRank", byref(comm), world, fc.UniqueId.from_buffer_copy(uid_bytes), rank)
    return comm.value


def _collectives(rank, world, uid_bytes):
    comm = _init_rank(rank, world, uid_bytes)
    s = Stream(rank)
    bad = []

    def check(what, got, want):
        if got.dtype != want.dtype or got.tobytes() != want.tobytes():
            bad.append(f"rank {rank}: {what}: got {got[:6]}, want {want[:6]}")

    def dev(a):
        return DeviceArray(a, device=rank, stream=s)

    for dt in DTYPES:
        code = fc.NCCL_DTYPES[dt]
        for count in (7, 70001) if dt in (np.float16, np.float32, np.int64) else (7,):
            ins = [_rank_input(r, count * world, dt) for r in range(world)]
            firsts = [x[:count] for x in ins]
            for op in (SUM, PROD, MAX, MIN, AVG):
                x = dev(firsts[rank])
                nccl_call("ncclAllReduce", x.ptr, x.ptr, count, code, op, comm, s.handle)  # in place
                check(f"allreduce {dt} {count} op {op}", x.numpy(), _reduce_ref(firsts, op))
                x, out = dev(firsts[rank]), dev(np.zeros(count, dt))
                nccl_call("ncclReduce", x.ptr, out.ptr, count, code, op, world - 1, comm, s.handle)
                if rank == world - 1:
                    check(f"reduce {dt} {count} op {op}", out.numpy(), _reduce_ref(firsts, op))
                x, out = dev(ins[rank]), dev(np.zeros(count, dt))
                nccl_call("ncclReduceScatter", x.ptr, out.ptr, count, code, op, comm, s.handle)
                want = _reduce_ref([a[rank * count:(rank + 1) * count] for a in ins], op)
                check(f"reduce_scatter {dt} {count} op {op}", out.numpy(), want)
            x = dev(firsts[rank] if rank == 1 else np.zeros(count, dt))
            nccl_call("ncclBroadcast", x.ptr, x.ptr, count, code, 1, comm, s.handle)
            check(f"broadcast {dt} {count}", x.numpy(), firsts[1])
            x, out = dev(firsts[rank]), dev(np.zeros(count * world, dt))
            nccl_call("ncclAllGather", x.ptr, out.ptr, count, code, comm, s.handle)
            check(f"all_gather {dt} {count}", out.numpy(), np.concatenate(firsts))
    nccl_call("ncclCommDestroy", comm)
    return bad


@pytest.mark.parametrize("world", [2, 3])
def test_nccl_collectives_every_dtype_against_numpy(world):
    uid = fc.unique_id()
    results = _spawn(_collectives, world, bytes(uid), env=fc.env(devices=world), timeout=120)
    assert results == [[]] * world
    _assert_clean(uid)


def _p2p(rank, world, uid_bytes):
    comm = _init_rank(rank, world, uid_bytes)
    s = Stream(rank)
    big = 300_000  # bytes: several times a ring, both ways at once

    def payload(src, dst, n):
        return np.random.default_rng(src * 10 + dst).integers(0, 255, n, dtype=np.uint8)

    peers = range(world)  # self included
    sends = [DeviceArray(payload(rank, p, big), device=rank) for p in peers]
    recvs = [DeviceArray(big, dtype=np.uint8, device=rank) for p in peers]
    small = [DeviceArray(np.full(3, 10 * rank + k, np.uint8), device=rank) for k in range(2)]
    small_in = [DeviceArray(3, dtype=np.uint8, device=rank) for k in range(2)]
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    nccl_call("ncclGroupStart")
    for p in peers:
        nccl_call("ncclSend", sends[p].ptr, big, 1, p, comm, s.handle)
    for p in reversed(peers):
        nccl_call("ncclRecv", recvs[p].ptr, big, 1, p, comm, s.handle)
    for k in range(2):  # two messages to one peer arrive in order
        nccl_call("ncclSend", small[k].ptr, 3, 1, nxt, comm, s.handle)
        nccl_call("ncclRecv", small_in[k].ptr, 3, 1, prv, comm, s.handle)
    nccl_call("ncclGroupEnd")
    s.synchronize()
    bad = [p for p in peers if not np.array_equal(recvs[p].numpy(), payload(p, rank, big))]
    bad += [k for k in range(2) if small_in[k].numpy().tolist() != [10 * prv + k] * 3]
    # outside a group: rank 0 sends to the last rank
    if rank in (0, world - 1):
        x = DeviceArray(np.arange(5, dtype=np.float64) * (rank + 1), device=rank, stream=s)
        fn = "ncclSend" if rank == 0 else "ncclRecv"
        nccl_call(fn, x.ptr, 5, 8, world - 1 - rank, comm, s.handle)
        if rank == world - 1 and x.numpy().tolist() != list(np.arange(5.0)):
            bad.append("send/recv")
    nccl_call("ncclCommDestroy", comm)
    return bad


@pytest.mark.parametrize("world", [2, 3])
def test_nccl_group_send_recv(world):
    uid = fc.unique_id()
    assert _spawn(_p2p, world, bytes(uid), env=fc.env(devices=world)) == [[]] * world
    _assert_clean(uid)


def _split(rank, world, uid_bytes):
    comm = _init_rank(rank, world, uid_bytes)
    s = Stream(rank)
    lib = fc.nccl()
    out = []
    for color, key in (([0, NOCOLOR, 0][rank], [5, 0, 1][rank]), (rank, 0)):
        sub = ctypes.c_void_p()
        nccl_call("ncclCommSplit", comm, color, key, byref(sub), None)
        if color == NOCOLOR:
            out.append(sub.value)
            continue
        n, r, d = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        for fn, v in (("ncclCommCount", n), ("ncclCommUserRank", r), ("ncclCommCuDevice", d)):
            assert getattr(lib, fn)(sub, byref(v)) == 0
        x = DeviceArray(np.array([rank + 1.0]), device=rank, stream=s)
        _allreduce(sub, x, s)
        out.append((n.value, r.value, d.value, x.numpy().tolist()))
        nccl_call("ncclCommDestroy", sub)
    nccl_call("ncclCommDestroy", comm)
    return out


def test_nccl_split():
    uid = fc.unique_id()
    res = _spawn(_split, 3, bytes(uid), env=fc.env(devices=3))
    # ranks 0 and 2 (keys 5 and 1: rank 2 comes first), rank 1 left out; then each rank alone
    assert res == [[(2, 1, 0, [4.0]), (1, 0, 0, [1.0])],
                   [None, (1, 0, 1, [2.0])],
                   [(2, 0, 2, [4.0]), (1, 0, 2, [3.0])]]
    _assert_clean(uid)


def _late_nonblocking(rank, world, uid_bytes, flag):
    cuda_call("cudaSetDevice", rank)
    lib = fc.nccl()
    if rank == 1:  # joins once rank 0 has looked at its half-made communicator
        _wait(lambda: os.path.exists(flag))
    comm = ctypes.c_void_p()
    rc = lib.ncclCommInitRankConfig(byref(comm), world, fc.UniqueId.from_buffer_copy(uid_bytes), rank,
                                    byref(fc.Config(blocking=0)))
    s = Stream(rank)
    x = DeviceArray(np.array([rank + 1.0], np.float32), device=rank, stream=s)
    early = None
    if rank == 0:
        early = (rc, _async_error(comm.value), lib.ncclAllReduce(x.ptr, x.ptr, 1, 7, SUM, comm, s.handle),
                 lib.ncclGetLastError(None).decode())
        open(flag, "w").close()
    _wait(lambda: _async_error(comm.value) == 0)
    _allreduce(comm.value, x, s)
    result = x.numpy().tolist()
    nccl_call("ncclCommDestroy", comm)
    return early, result


def test_nccl_nonblocking_init_across_processes(tmp_path):
    uid = fc.unique_id()
    res = _spawn(_late_nonblocking, 2, bytes(uid), str(tmp_path / "flag"))
    early = "Attempt to use communicator before the previous operation returned ncclSuccess"
    assert res == [((7, 7, 4, early), [3.0]), (None, [3.0])]
    _assert_clean(uid)


def _duplicate(rank, world, uid_bytes):
    cuda_call("cudaSetDevice", 0)
    comm = ctypes.c_void_p()
    rc = fc.nccl().ncclCommInitRank(byref(comm), world, fc.UniqueId.from_buffer_copy(uid_bytes), rank)
    return rc, comm.value, fc.nccl().ncclGetLastError(None).decode()


def test_nccl_duplicate_gpu_blocking_init_across_processes():
    uid = fc.unique_id()
    res = _spawn(_duplicate, 2, bytes(uid))
    multi = ("Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable "
             "this configuration.")  # NCCL 2.30 and later (the stand-in answers 2.32.3)
    assert res == [(5, None, multi), (5, None, multi)]
    _assert_clean(uid)
