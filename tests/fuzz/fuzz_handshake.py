"""Fuzz target: the connection handshake and secret challenge (csrc/util/auth.c), as the
TCPStore server, the TCPStore client and a rank accepting its peers (csrc/transport/tcp/tcp.c)
run it.

Three modes, chosen by the input:
- server: a stranger connects to an in-process TCPStore server (job secret set) and sends a
  hello word, nonce and proof built from the input (the right ones with bits flipped, wrong
  modes and versions, truncations, raw bytes), then a PING.  The server must answer the PING
  only when the proof was right, and must never crash or keep the connection past its deadline.
- client: a fake server answers a real TCPStore client's hello with a word, nonce and proof
  built from the input.  Creating the client must fail with a DistError unless the server's
  proof was right.
- rank: a stranger sends fuzzed handshake and rank-hello bytes to rank 0 of a C ProcessGroup
  that is accepting its peers, then the real rank 1 (this process) connects: the group must
  still connect (strangers are dropped), within its timeout.

    python tests/fuzz/fuzz_handshake.py -runs=2000
"""
import datetime
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["_peers"]):
    import _peers as P  # noqa: E402

os.environ["PYDDP_SECRET"] = P.SECRET
from pyddp import _C  # noqa: E402
from pyddp.distributed import TCPStore  # noqa: E402

STORE = None
LISTENER = None
GUARD = P.MemoryGuard()
ERRORS = None


@atheris.instrument_func
def mutate(fdp, good):
    """The right bytes, or a variation of them the input picks."""
    how = fdp.ConsumeIntInRange(0, 5)
    if how == 0:
        return good
    if how == 1 and good:      # flip one bit
        i = fdp.ConsumeIntInRange(0, len(good) - 1)
        return good[:i] + bytes([good[i] ^ (1 << fdp.ConsumeIntInRange(0, 7))]) + good[i + 1:]
    if how == 2:               # truncate
        return good[:fdp.ConsumeIntInRange(0, len(good))]
    if how == 3:               # extra bytes
        return good + fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 16))
    return fdp.ConsumeBytes(len(good))


def words(fdp):
    return fdp.PickValueInList([P.WORD_SECRET, P.WORD_NOSECRET, b"PDDP\x00\x02\x00\x01",
                                b"PDDP\x00\x01\x01\x01", b"PDDP\x00\x01\x00\x02",
                                b"GET / HTTP/1.1\r\n"[:8]])


@atheris.instrument_func
def as_server_stranger(fdp):
    s = P.connect(STORE.port)
    try:
        hello = mutate(fdp, words(fdp)) + mutate(fdp, os.urandom(32))
        try:
            s.sendall(hello)
            srv = P.recv_exact(s, 40)      # the server's hello and nonce come first anyway
        except (OSError, ConnectionError):
            return
        nonce_s = srv[8:]
        # the proof the server expects, for the nonce it read from us
        good = P._proof(P.SECRET, b"C", nonce_s, hello[8:40]) if len(hello) >= 40 else b""
        stream = hello + mutate(fdp, good)
        ping = P.request(P.PING, 7)
        try:
            s.sendall(stream[len(hello):] + ping)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        stream += ping
        got = P.drain(s, timeout=3.0)
        right = (len(stream) >= 72 and stream[:8] == P.WORD_SECRET
                 and stream[40:72] == P._proof(P.SECRET, b"C", nonce_s, stream[8:40]))
        if not right:
            assert got == b"", f"{len(got)} bytes after a wrong handshake"
        elif stream[72:] == ping:
            assert got == P._proof(P.SECRET, b"S", nonce_s, stream[8:40]) + \
                P.frame(b"\0" + struct.pack("<I", 7)), got
    finally:
        s.close()


@atheris.instrument_func
def as_fake_server(fdp):
    f = atheris.FuzzedDataProvider(fdp.ConsumeBytes(fdp.remaining_bytes()))
    sent = {}

    def serve():
        try:
            LISTENER.settimeout(10)
            c, _ = LISTENER.accept()
        except OSError:
            return
        try:
            c.settimeout(P.IO_TIMEOUT)
            nonce_c = P.recv_exact(c, 40)[8:]
            stream = mutate(f, words(f)) + mutate(f, os.urandom(32))
            good = P._proof(P.SECRET, b"S", stream[8:40], nonce_c) if len(stream) >= 40 else b""
            stream += mutate(f, good)
            sent["stream"], sent["nonce_c"] = stream, nonce_c
            c.sendall(stream)
            c.shutdown(socket.SHUT_WR)
            P.drain(c, timeout=3.0)
        except (OSError, ConnectionError):
            pass
        finally:
            c.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        TCPStore("127.0.0.1", LISTENER.getsockname()[1], is_master=False,
                 wait_for_workers=False, timeout=datetime.timedelta(seconds=2))
        ok = True
    except ERRORS:
        ok = False
    th.join(15)
    assert not th.is_alive()
    if ok:
        st = sent["stream"]
        assert st[:8] == P.WORD_SECRET and len(st) >= 72 and \
            st[40:72] == P._proof(P.SECRET, b"S", st[8:40], sent["nonce_c"]), \
            "the client accepted a server that does not know the secret"


@atheris.instrument_func
def as_rank_stranger(fdp):
    token = int.from_bytes(os.urandom(7), "little")
    pg = _C.ProcessGroup(0, 2, 10.0, P.SECRET)
    err = []

    def run():
        try:
            pg.connect(["127.0.0.1", "127.0.0.1"], [pg.port, 0], token, None, 1)
        except BaseException as e:  # noqa: BLE001
            err.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    socks = []
    stolen = None
    try:
        st = P.connect(pg.port)
        socks.append(st)
        try:
            if fdp.ConsumeBool():
                P.auth_client(st, P.SECRET)
                h = P.hello(fdp.ConsumeIntInRange(0, 3), fdp.ConsumeIntInRange(0, 2),
                            fdp.PickValueInList([2, 1, 3, 2**32 - 1]),
                            fdp.PickValueInList([token, token ^ 1, 0]))
                h = mutate(fdp, h)
                st.sendall(h)
                for ch in (0, 1):
                    if h[:24] == P.hello(1, ch, 2, token):   # (bytes after it are not read)
                        stolen = ch   # a right secret and hello: it is rank 1 for that channel
            else:
                st.sendall(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 120)))
            st.shutdown(socket.SHUT_WR)
        except (OSError, ConnectionError):
            pass
        for ch in (0, 1):
            if ch == stolen:
                continue
            s = P.connect(pg.port)
            socks.append(s)
            P.auth_client(s, P.SECRET)
            s.sendall(P.hello(1, ch, 2, token))
            P.recv_exact(s, 4)
    finally:
        th.join(20)
        for s in socks:
            s.close()
        pg.destroy()
    assert not th.is_alive(), "connect hung"
    assert not err, repr(err[0])


@atheris.instrument_func
def test_one(data):
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 9)
    if mode < 5:
        as_server_stranger(fdp)
    elif mode < 9:
        as_fake_server(fdp)
    else:
        as_rank_stranger(fdp)
    GUARD.check()


def alive():
    c = TCPStore("127.0.0.1", STORE.port, is_master=False, wait_for_workers=False,
                 timeout=datetime.timedelta(seconds=10))
    c.set("fuzz/alive", b"1")
    assert c.get("fuzz/alive") == b"1"
    if GUARD.base is None:
        GUARD.arm()


if __name__ == "__main__":
    ERRORS = P.allowed_errors() + (ConnectionError, OSError)
    STORE = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=10))
    LISTENER = socket.socket()
    LISTENER.bind(("127.0.0.1", 0))
    LISTENER.listen(16)
    P.main(test_one, every=alive)
