"""Fuzz target: the rank transport's frame headers and control messages
(csrc/transport/engine.c over csrc/transport/tcp/).

Every input builds a group of 2: rank 0 is a C ProcessGroup member, rank 1 is this process,
connected the way tcp.c connects a peer (authenticated data and control sockets, rank hello).
Rank 1 writes frames built from the input on the data socket (48-byte headers with fuzzed
type, kind, dtype, op, root, tag, source, sequence number, count and nbytes up to 2**64-1,
payloads shorter or longer than claimed) and control messages on the control socket (abort
with any status and text, query, reply, bye, bad magic, lying lengths), then closes both.
Rank 0 runs a receive (from rank 1 or any rank) or a broadcast from rank 1.  It must complete
(the frame was right) or fail with a clean DistError, within its timeout; after a failure the
group's error is sticky (the next call fails at once); and a header's nbytes alone must not
make it allocate (virtual memory stays flat).

    python tests/fuzz/fuzz_tcp_frames.py -runs=500
"""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402
import numpy as np  # noqa: E402

with atheris.instrument_imports(include=["_peers"]):
    import _peers as P  # noqa: E402

from pyddp import _C  # noqa: E402

GUARD = P.MemoryGuard()
ERRORS = None
U8 = _C.DTYPE_CODES["uint8"]
OP_TIMEOUT = 2.0
KINDS = [_C.K_RECV, _C.K_BROADCAST, _C.K_RECV]


@atheris.instrument_func
def build_frames(fdp, kind, tag, count):
    out = b""
    first = None
    for i in range(fdp.ConsumeIntInRange(1, 3)):
        right = fdp.ConsumeIntInRange(0, 3) == 0
        if kind == _C.K_BROADCAST:
            t, k, dt, seq = 1, _C.K_BROADCAST, U8, 1
        else:
            t, k, dt, seq = 2, 0, 0, 0
        if right:
            hdr = P.frame_header(t, k, dt, 0, 1 if kind == _C.K_BROADCAST else 0,
                                 tag if kind != _C.K_BROADCAST else fdp.ConsumeIntInRange(0, 2),
                                 1, seq, count, count)
            payload = fdp.ConsumeBytes(count)
            if i == 0 and len(payload) == count:
                first = payload
        else:
            nbytes = fdp.PickValueInList([count, 0, 1, 2**20 + 1, 2**33, 2**40, 2**63,
                                          2**64 - 1, fdp.ConsumeIntInRange(0, 64)])
            hdr = P.frame_header(
                fdp.PickValueInList([t, 1, 2, 0, 3, 255]),
                fdp.PickValueInList([k, fdp.ConsumeIntInRange(0, 255)]),
                fdp.PickValueInList([dt, fdp.ConsumeIntInRange(0, 255)]),
                fdp.ConsumeIntInRange(0, 255),
                fdp.PickValueInList([0, 1, -1, 2**31 - 1, -2**31]),
                fdp.PickValueInList([tag, fdp.ConsumeIntInRange(-2**31, 2**31 - 1)]),
                fdp.PickValueInList([1, 1, 1, 0, 2, 2**32 - 1]),
                fdp.PickValueInList([seq, 0, 1, 2, 2**64 - 1]),
                fdp.PickValueInList([count, 0, 2**64 - 1]),
                nbytes)
            if fdp.ConsumeIntInRange(0, 7) == 0:
                hdr = hdr[:fdp.ConsumeIntInRange(0, 48)]
            payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 96))
        out += hdr + payload
    return out, first


@atheris.instrument_func
def build_ctrl(fdp):
    out = b""
    for _ in range(fdp.ConsumeIntInRange(0, 2)):
        text = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
        m = P.ctrl_msg(fdp.PickValueInList([1, 2, 3, 4, 0, 99]),
                       fdp.PickValueInList([0, 5, 6, 9, 13, 2**32 - 1]),
                       fdp.PickValueInList([0, 1, 2, 2**64 - 1]), text)
        how = fdp.ConsumeIntInRange(0, 5)
        if how == 1:   # a length that lies
            m = m[:12] + struct.pack("<I", fdp.PickValueInList([1024, 1025, 2**32 - 1])) + m[16:]
        elif how == 2:
            m = b"XXXX" + m[4:]
        elif how == 3:
            m = m[:fdp.ConsumeIntInRange(0, len(m))]
        out += m
    return out


def run(pg, args):
    w = pg.submit(*args, None, None, OP_TIMEOUT, False, "fuzz", True)
    if w is not None:   # it did not complete on this thread: wait for it, as the API does
        w.wait(OP_TIMEOUT * 4)


@atheris.instrument_func
def test_one(data):
    fdp = atheris.FuzzedDataProvider(data)
    kind = fdp.PickValueInList(KINDS)
    anysrc = kind == _C.K_RECV and fdp.ConsumeBool()
    tag = fdp.ConsumeIntInRange(0, 3)
    count = fdp.ConsumeIntInRange(0, 64)
    frames, first = build_frames(fdp, kind, tag, count)
    ctrl = build_ctrl(fdp)
    peer = P.FakeRank1(P.SECRET, timeout=OP_TIMEOUT)
    try:
        bye = fdp.ConsumeIntInRange(0, 3) != 0
        try:
            peer.data.sendall(frames)
            # then rank 1 leaves: with a goodbye (mostly: rank 0 then fails a receive it cannot
            # complete at once) or without (rank 0 sees a lost peer); either way it must not
            # wait for its timeout
            peer.ctrl.sendall(ctrl + (P.ctrl_msg(4, 0, 0) if bye else b""))
            peer.data.shutdown(socket.SHUT_WR)
            if not bye:
                peer.ctrl.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out = np.zeros(count, dtype=np.uint8)
        if kind == _C.K_RECV:
            args = (_C.K_RECV, U8, 0, -1 if anysrc else 1, tag, count, (), (out,))
        else:
            args = (_C.K_BROADCAST, U8, 0, 1, 0, count, (out,), (out,))
        t0 = time.monotonic()
        failed = False
        try:
            run(peer.pg, args)
        except ERRORS as e:
            failed = True
            assert str(e), "an error without a message"
        took = time.monotonic() - t0
        assert took < OP_TIMEOUT + 5, f"the receive took {took:.1f} s"
        GUARD.check("after a frame")
        if not failed and kind == _C.K_RECV and first is not None:
            # a right first frame is what the receive got: never other bytes
            assert out.tobytes() == first, "the receive completed with other bytes"
        if failed:
            # the error is sticky: the next call fails without waiting for its timeout
            t0 = time.monotonic()
            try:
                run(peer.pg, args)
            except ERRORS:
                pass
            took = time.monotonic() - t0
            assert took < OP_TIMEOUT + 5, f"the second receive took {took:.1f} s"
            err = peer.pg.error   # the group's sticky error, as text (a peer's bytes in it)
            assert err is None or isinstance(err, str)
    finally:
        peer.close()


def warm():
    if GUARD.base is None:
        GUARD.arm()
    GUARD.check("over the run")


if __name__ == "__main__":
    ERRORS = P.allowed_errors()
    P.main(test_one, every=warm, every_n=50)
