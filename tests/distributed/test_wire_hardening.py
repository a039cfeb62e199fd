"""Regression tests for what the fuzz targets (tests/fuzz/) found or guard: bytes from another
process never crash pyddp, never make it allocate what a length field claims, and fail with a
clean exception.  Each test is the smallest input of its kind."""
import ctypes
import datetime
import os
import socket
import struct
import sys
import threading
import time

import numpy as np
import pytest

import _paths

sys.path.insert(0, os.path.join(_paths.TESTS, "fuzz"))
import _peers as P  # noqa: E402

from pyddp import _C  # noqa: E402
from pyddp.distributed import DistError, TCPStore  # noqa: E402
from pyddp.distributed import _object_collectives as oc  # noqa: E402

GIB = 1 << 30


@pytest.fixture
def no_secret(monkeypatch):
    monkeypatch.delenv("PYDDP_SECRET", raising=False)


def _grown_mib(before_kib):
    return (P.vm_kib() - before_kib) // 1024


@pytest.mark.timeout(60)
def test_store_server_does_not_allocate_a_claimed_frame(no_secret):
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=10))
    s = P.connect(store.port)
    try:
        P.auth_client(s, None)
        before = P.vm_kib()
        # a frame header claiming 1 GiB (within the protocol's limit), then 5 bytes
        s.sendall(struct.pack("<I", GIB) + struct.pack("<BI", P.SET, 1))
        time.sleep(0.2)
        s.sendall(b"x" * 100)   # the server reads again, knowing the claimed length
        time.sleep(0.3)
        assert _grown_mib(before) < 256
    finally:
        s.close()
    store.set("k", b"v")
    assert store.get("k") == b"v"


@pytest.mark.timeout(60)
def test_store_client_does_not_allocate_a_claimed_reply(no_secret):
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    lst.settimeout(20)
    done = threading.Event()

    def serve():
        c, _ = lst.accept()
        try:
            c.settimeout(10)
            P.auth_server(c, None)
            (n,) = struct.unpack("<I", P.recv_exact(c, 4))
            seq = struct.unpack_from("<I", P.recv_exact(c, n), 1)[0]
            c.sendall(struct.pack("<I", GIB) + struct.pack("<BI", 0, seq) + b"x" * 100)
            done.wait(20)
        finally:
            c.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        store = TCPStore("127.0.0.1", lst.getsockname()[1], is_master=False,
                         wait_for_workers=False, timeout=datetime.timedelta(seconds=1))
        before = P.vm_kib()
        with pytest.raises(DistError):
            store.set("k", b"v")   # the reply never completes: the store's timeout
        assert _grown_mib(before) < 256
        del store
    finally:
        done.set()
        th.join(20)
        lst.close()


def _post_recv(pg, out, tag, timeout):
    return pg.submit(_C.K_RECV, _C.DTYPE_CODES["uint8"], 0, 1, tag, out.size, (), (out,), None,
                     None, timeout, False, "recv", False)


@pytest.mark.timeout(60)
def test_unexpected_frame_does_not_allocate_its_claimed_size():
    peer = P.FakeRank1(None, timeout=10.0)
    try:
        before = P.vm_kib()
        out = np.zeros(4, np.uint8)
        w = _post_recv(peer.pg, out, 3, 10.0)
        # a frame for another tag (unexpected: buffered) claiming 16 GiB, of which 1000 come
        peer.data.sendall(P.frame_header(2, 0, 0, 0, 0, 5, 1, 0, 1 << 34, 1 << 34)
                          + b"x" * 1000)
        time.sleep(0.5)
        assert peer.pg.error is None
        assert _grown_mib(before) < 256
        peer.data.sendall(P.frame_header(2, 0, 0, 0, 0, 3, 1, 0, 4, 4) + b"abcd")
        peer.ctrl.close()
        peer.data.close()
        with pytest.raises(DistError):
            w.wait(30)   # rank 1 vanished in the middle of the 16 GiB frame
    finally:
        peer.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("status", [0, 2**32 - 1])
def test_peer_abort_with_any_status_fails_the_group(status):
    peer = P.FakeRank1(None, timeout=10.0)
    try:
        out = np.zeros(4, np.uint8)
        w = _post_recv(peer.pg, out, 3, 10.0)
        peer.ctrl.sendall(P.ctrl_msg(1, status, 0, b"boom \xff\xfe"))
        t0 = time.monotonic()
        with pytest.raises(DistError) as e:
            w.wait(30)
        assert time.monotonic() - t0 < 5
        assert "boom \ufffd\ufffd" in str(e.value)
        assert "boom" in peer.pg.error
    finally:
        peer.close()


def test_shm_ring_counters_from_a_peer_stay_in_the_ring():
    ring = _C._fuzz_shm_sizes()["ring"]
    ident = (1, 4, 0, 2, 11, 0, 0)
    # the peer's head far past what it could have written
    r = _C._fuzz_shm(b"", struct.pack("<Q", 1 << 50), ident, 0, 2 * ring, 0)
    assert r["read"] <= ring
    # the peer's tail past what this rank wrote: no space, rather than a write past the ring
    tail_entry = b"\0" * 64 + struct.pack("<Q", 12345)
    r = _C._fuzz_shm(b"", tail_entry, ident, 0, 0, 2 * ring)
    assert r["written"] == 0


def test_shm_peer_abort_text_is_not_utf8():
    sizes = _C._fuzz_shm_sizes()
    ctrl = struct.pack("<IIIi", 0, 0, 9, 0).ljust(128, b"\0") + b"\xc7" * sizes["errmsg"]
    r = _C._fuzz_shm(ctrl, b"", (1, 4, 0, 2, 11, 0, 0), 0, 0, 0)
    code, msg = r["sync"]
    assert code == 9 and "\ufffd" in msg


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedV(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("ctx", ctypes.c_void_p), ("deleter", _DELETER), ("flags", ctypes.c_uint64),
                ("t", _DLTensor)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("t", _DLTensor), ("ctx", ctypes.c_void_p), ("deleter", _DELETER)]


def _capsule(m, name):
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(m), name, None)


class _Producer:
    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, **kw):
        return self.cap


def test_dlpack_deleter_runs_without_the_pending_error():
    buf = (ctypes.c_uint8 * 16)()
    shape = (ctypes.c_int64 * 1)(16)
    deleted = []
    deleter = _DELETER(lambda p: deleted.append(p))
    m = _DLManagedV(major=0, minor=9, deleter=deleter)   # a version the adapter refuses
    m.t = _DLTensor(data=ctypes.addressof(buf), device_type=1, ndim=1, code=1, bits=8, lanes=1,
                    shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)))
    with pytest.raises(ValueError, match="DLPack version 0.9"):
        _C.describe_array(_Producer(_capsule(m, b"dltensor_versioned")))
    assert deleted == [ctypes.addressof(m)]


def test_dlpack_stride_in_bytes_overflow_is_a_value_error():
    buf = (ctypes.c_uint8 * 64)()
    shape = (ctypes.c_int64 * 2)(2, 2)
    strides = (ctypes.c_int64 * 2)(2**62, 1)
    deleter = _DELETER(lambda p: None)
    m = _DLManaged(deleter=deleter)
    m.t = _DLTensor(data=ctypes.addressof(buf), device_type=1, ndim=2, code=2, bits=64, lanes=1,
                    shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                    strides=ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)))
    with pytest.raises(ValueError, match="overflows"):
        _C.describe_array(_Producer(_capsule(m, b"dltensor")))


def test_cuda_array_interface_beyond_py_ssize_t_is_a_value_error():
    obj = type("CAI", (), {"__cuda_array_interface__": {
        "shape": (2**62, 3), "typestr": "|u1", "data": (4096, False), "version": 3}})()
    with pytest.raises(ValueError, match="shape"):
        _C.describe_array(obj, False, False)


def test_object_envelope_sizes_are_checked_before_allocating():
    with pytest.raises(DistError, match="rank 3 announced a pickle of -1 bytes"):
        oc._envelope_sizes(np.array([5, -1], np.int64), "broadcast_object_list", lambda i: 3)
    with pytest.raises(DistError, match=str(2**60)):
        oc._envelope_sizes(np.array([2**60], np.int64), "scatter_object_list", lambda i: 0)
    with pytest.raises(DistError):   # an int64 sum would wrap to 0
        oc._envelope_sizes(np.array([2**62] * 4, np.int64), "all_gather_object", lambda i: i)
    assert oc._envelope_sizes(np.array([3, 0, 7], np.int64), "x", lambda i: 0) == [3, 0, 7]
    with pytest.raises(DistError, match="10 bytes of pickles received"):
        oc._unpickle_concat(np.zeros(10, np.uint8), [4, 4], "broadcast_object_list")
    with pytest.raises(DistError, match="announced 9 bytes but 4 arrived"):
        oc._unpickle_rows([np.zeros(4, np.uint8)], [9], "gather_object")
