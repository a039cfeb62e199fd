"""Fuzz target: the TCPStore client's reply parser (csrc/store/tcp_store_client.c).

A fake server (a Python socket) authenticates a real TCPStore client with the job secret, reads
its request and answers with a reply built from the input (right or wrong sequence number, any
status, payloads with lying length fields, frame lengths up to the limit and past it, or raw
bytes), then closes.  The client call (get, set, add, compare_set, check, wait, delete_key,
num_keys) must return or raise a clean DistError / ValueError, never crash or wait past its
timeout, and a frame length alone must not make it allocate (virtual memory stays flat).

    python tests/fuzz/fuzz_store_client.py -runs=2000
"""
import datetime
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["_peers"]):
    import _peers as P  # noqa: E402

os.environ["PYDDP_SECRET"] = P.SECRET
from pyddp.distributed import TCPStore  # noqa: E402

LISTENER = socket.socket()
LISTENER.bind(("127.0.0.1", 0))
LISTENER.listen(16)
PORT = LISTENER.getsockname()[1]
GUARD = P.MemoryGuard()
ERRORS = None
TIMEOUT = 2.0
OPS = ["get", "set", "add", "compare_set", "check", "wait", "delete_key", "num_keys"]


@atheris.instrument_func
def build_reply(fdp, seq):
    if fdp.ConsumeIntInRange(0, 7) == 0:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    status = fdp.PickValueInList([0, 0, 0, 1, 5, 6, 7, 12, 13, 200])
    if fdp.ConsumeBool():
        seq = fdp.ConsumeIntInRange(0, 2**32 - 1)
    kind = fdp.ConsumeIntInRange(0, 5)
    if kind == 0:      # bytes, maybe with a lying length
        v = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 32))
        n = fdp.PickValueInList([len(v), len(v) + 1, 2**32 - 1, 1 << 30, 0])
        payload = struct.pack("<I", n) + v
    elif kind == 1:
        payload = struct.pack("<q", fdp.ConsumeIntInRange(-2**63, 2**63 - 1))
    elif kind == 2:
        payload = bytes([fdp.ConsumeIntInRange(0, 255)])
    elif kind == 3:    # an error message str, maybe without its NUL or with one inside
        msg = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
        payload = struct.pack("<I", fdp.PickValueInList([len(msg), len(msg) + 3, 2**31])) \
            + msg + fdp.PickValueInList([b"\0", b"", b"x"])
    else:
        payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16))
    body = struct.pack("<BI", status, seq) + payload
    claim = fdp.PickValueInList([len(body)] * 4 + [(1 << 30) + (1 << 20), (1 << 30) + (1 << 20) + 1,
                                                   2**32 - 1, 0, 4, len(body) + 7])
    return struct.pack("<I", claim) + body + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 8))


def serve(reply_of, out):
    """Accept the client, authenticate it, answer its first request, close."""
    try:
        LISTENER.settimeout(10)
        c, _ = LISTENER.accept()
    except OSError as e:
        out.append(e)
        return
    try:
        c.settimeout(P.IO_TIMEOUT)
        P.auth_server(c, P.SECRET)
        (n,) = struct.unpack("<I", P.recv_exact(c, 4))
        body = P.recv_exact(c, n)
        seq = struct.unpack_from("<I", body, 1)[0]
        c.sendall(reply_of(seq))
        c.shutdown(socket.SHUT_WR)
        P.drain(c, timeout=TIMEOUT + 1)   # until the client closes
    except OSError as e:
        out.append(e)
    finally:
        c.close()


@atheris.instrument_func
def test_one(data):
    fdp = atheris.FuzzedDataProvider(data)
    op = fdp.PickValueInList(OPS)
    out = []
    th = threading.Thread(target=serve, args=(lambda seq: build_reply(fdp, seq), out),
                          daemon=True)
    th.start()
    t0 = time.monotonic()
    store = None
    try:
        store = TCPStore("127.0.0.1", PORT, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=TIMEOUT))
        if op == "get":
            r = store.get("k")
            assert isinstance(r, bytes)
        elif op == "set":
            store.set("k", b"v")
        elif op == "add":
            assert isinstance(store.add("k", 1), int)
        elif op == "compare_set":
            assert isinstance(store.compare_set("k", b"a", b"b"), bytes)
        elif op == "check":
            assert store.check(["k"]) in (True, False)
        elif op == "wait":
            store.wait(["k"], datetime.timedelta(seconds=TIMEOUT))
        elif op == "delete_key":
            assert store.delete_key("k") in (True, False)
        else:
            assert isinstance(store.num_keys(), int)
        GUARD.check("after a reply")
    except ERRORS:
        pass
    finally:
        GUARD.check("after a reply")
        del store
        th.join(TIMEOUT + 15)
    assert not th.is_alive(), "fake server stuck"
    took = time.monotonic() - t0
    assert took < 3 * TIMEOUT + 5, f"client call took {took:.1f} s"


def warm():
    if GUARD.base is None:
        GUARD.arm()
    GUARD.check("over the run")


if __name__ == "__main__":
    ERRORS = P.allowed_errors()
    P.main(test_one, every=warm)
