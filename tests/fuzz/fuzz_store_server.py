"""Fuzz target: the TCPStore server's request parser (csrc/store/tcp_store_server.c).

An in-process TCPStore server with a job secret; every input opens a connection, completes the
secret handshake (so the bytes reach the request parser, not only the authentication), sends
requests built from the input (well-formed frames with fuzzed fields and lying length fields,
or raw bytes), half-closes, and reads the replies until the server closes (bounded by a
timeout).  Checked: no crash, every reply is a well-formed frame, no allocation sized by a
length field (virtual memory stays flat), no descriptor leak, and every 200 inputs a fresh real
client's set/get still works.

    python tests/fuzz/fuzz_store_server.py -runs=5000
    python tests/fuzz/fuzz_store_server.py -max_total_time=600 [corpus_dir]
"""
import datetime
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["_peers"]):
    import _peers as P  # noqa: E402

os.environ["PYDDP_SECRET"] = P.SECRET
from pyddp.distributed import TCPStore  # noqa: E402

STORE = None
GUARD = P.MemoryGuard()
FDS = [0]
CMDS = [P.SET, P.GET, P.ADD, P.CAS, P.WAIT, P.CHECK, P.DELETE, P.NUM_KEYS, P.PING, P.CANCEL,
        P.WILL]


def nfds():
    return len(os.listdir("/proc/self/fd"))


@atheris.instrument_func
def fuzz_request(fdp):
    """One request: a real command with fuzzed arguments; sometimes a lie in a length field."""
    cmd = fdp.PickValueInList(CMDS + [0, 11, 255])
    seq = fdp.ConsumeIntInRange(0, 2**32 - 1)
    key = b"k" + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12))
    val = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    if cmd == P.SET:
        args = P.s_str(key) + P.s_bytes(val)
    elif cmd in (P.GET, P.DELETE):
        args = P.s_str(key)
    elif cmd == P.ADD:
        args = P.s_str(key) + struct.pack("<q", fdp.ConsumeIntInRange(-2**63, 2**63 - 1))
    elif cmd == P.CAS:
        args = P.s_str(key) + P.s_bytes(val) + P.s_bytes(fdp.ConsumeBytes(8))
    elif cmd in (P.WAIT, P.CHECK):
        n = fdp.ConsumeIntInRange(0, 4)
        args = struct.pack("<I", n) + b"".join(P.s_str(key + bytes([i])) for i in range(n))
    elif cmd == P.CANCEL:
        args = struct.pack("<I", fdp.ConsumeIntInRange(0, 2**32 - 1))
    elif cmd == P.WILL:
        # a will (on 1) or its removal (0, or any other value): set when the connection closes
        args = struct.pack("<I", fdp.ConsumeIntInRange(0, 2)) + P.s_str(key) + P.s_bytes(val)
    else:
        args = b""
    lie = fdp.ConsumeIntInRange(0, 7)
    if lie == 1 and len(args) >= 4:
        # a length field inside the arguments claims far more than there is
        args = struct.pack("<I", fdp.PickValueInList([2**31, 2**32 - 1, 1 << 30, len(args)]))\
            + args[4:]
    elif lie == 2:
        args = args[:fdp.ConsumeIntInRange(0, len(args))]
    elif lie == 3:
        args += fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 16))
    body = struct.pack("<BI", cmd, seq) + args
    if lie == 4:
        # the frame's own length: up to the limit (1 GiB + 1 MiB) and past it; only a few bytes
        # follow, so the server must not allocate what the header claims
        claim = fdp.PickValueInList([(1 << 30) + (1 << 20), 1 << 30, 2**32 - 1, 4, 0,
                                     len(body) + 1])
        return struct.pack("<I", claim) + body
    return P.frame(body)


@atheris.instrument_func
def test_one(data):
    fdp = atheris.FuzzedDataProvider(data)
    raw = fdp.ConsumeIntInRange(0, 9) == 0
    if raw:
        payload = fdp.ConsumeBytes(fdp.remaining_bytes())
    else:
        payload = b"".join(fuzz_request(fdp) for _ in range(fdp.ConsumeIntInRange(1, 6)))
        payload += fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 8))
    s = P.connect(STORE.port)
    try:
        P.auth_client(s, P.SECRET)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server dropped a malformed stream
        got = P.drain(s, timeout=2.0)
        GUARD.check("after a request stream")
    finally:
        s.close()
    # what came back is a sequence of well-formed reply frames
    off = 0
    while len(got) - off >= 4:
        (n,) = struct.unpack_from("<I", got, off)
        assert 5 <= n <= (1 << 30) + (1 << 20), f"reply frame of {n} bytes"
        if len(got) - off - 4 < n:
            break
        assert got[off + 4] < 16, f"reply status {got[off + 4]}"
        off += 4 + n


def alive():
    """A fresh real client's set/get works, and neither memory nor descriptors pile up."""
    c = TCPStore("127.0.0.1", STORE.port, is_master=False, wait_for_workers=False,
                 timeout=datetime.timedelta(seconds=10))
    v = os.urandom(8)
    c.set("fuzz/alive", v)
    assert c.get("fuzz/alive") == v
    del c
    if GUARD.base is None:
        GUARD.arm()
        FDS[0] = nfds()
    GUARD.check("over the run")
    assert nfds() <= FDS[0] + 16, f"descriptors: {nfds()} open, {FDS[0]} after warm-up"


def setup():
    global STORE
    STORE = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=10))


if __name__ == "__main__":
    setup()
    P.main(test_one, every=alive)
