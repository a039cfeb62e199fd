"""What the fuzz targets share: a peer that speaks pyddp's wire formats from Python (the
connection handshake of csrc/util/auth.c, the TCPStore frames of csrc/store/tcp_proto.h, the
rank hello of csrc/transport/tcp/tcp.c), the memory check, and the atheris driver.

Every socket operation here has a timeout: a target never waits without bound."""
import hashlib
import hmac
import os
import socket
import struct
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SECRET = "fuzz-secret-0123456789"
IO_TIMEOUT = 5.0       # any single socket operation of a well-behaved exchange
WORD_NOSECRET = b"PDDP\x00\x01\x00\x00"
WORD_SECRET = b"PDDP\x00\x01\x00\x01"

# TCPStore commands (csrc/store/tcp_proto.h)
SET, GET, ADD, CAS, WAIT, CHECK, DELETE, NUM_KEYS, PING, CANCEL = range(1, 11)
WILL = 13  # (11 APPEND, 12 LIST)

HELLO_MAGIC = 0x50444448   # "PDDH"
FRAME_MAGIC = 0x50444450   # "PDDP"
CTRL_MAGIC = 0x50444443    # "PDDC"


def allowed_errors():
    """The clean Python exceptions a malformed input may raise."""
    from pyddp.distributed import DistError
    import pickle
    return (DistError, ValueError, TypeError, OverflowError, MemoryError, KeyError,
            IndexError, EOFError, pickle.UnpicklingError, UnicodeDecodeError, TimeoutError)


# ------------------------------------------------------------------ memory

def vm_kib(field="VmSize"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class MemoryGuard:
    """Fails when the process's virtual size grew by more than `limit_mib` over the baseline
    taken after warm-up: an allocation sized by a length field shows here even when its pages
    are never touched (a malloc of a gigabyte maps a gigabyte)."""

    def __init__(self, limit_mib=512):
        self.limit = limit_mib * 1024
        self.base = None

    def arm(self):
        self.base = vm_kib()

    def check(self, what=""):
        if self.base is None:
            return
        grown = vm_kib() - self.base
        assert grown < self.limit, (
            f"virtual memory grew by {grown // 1024} MiB {what}: an allocation sized by a "
            f"length field?")


# ------------------------------------------------------------------ sockets

def connect(port, timeout=IO_TIMEOUT):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(timeout)
    return s


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            raise ConnectionError("peer closed")
        out += b
    return out


def drain(s, timeout=0.05, limit=1 << 20):
    """What the peer sends within `timeout` (short: the answer to a request, an error, EOF)."""
    s.settimeout(timeout)
    got = b""
    try:
        while len(got) < limit:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except (socket.timeout, ConnectionError, OSError):
        pass
    return got


def _proof(secret, role, nonce_s, nonce_c):
    key = secret.encode()
    if len(key) > 64:
        key = hashlib.sha256(key).digest()
    return hmac.new(key, role + nonce_s + nonce_c, hashlib.sha256).digest()


def auth_client(s, secret):
    """The client side of csrc/util/auth.c, done right."""
    if secret:
        nonce_c = os.urandom(32)
        s.sendall(WORD_SECRET + nonce_c)
        word = recv_exact(s, 8)
        if word != WORD_SECRET:
            raise ConnectionError(f"server hello {word!r}")
        nonce_s = recv_exact(s, 32)
        s.sendall(_proof(secret, b"C", nonce_s, nonce_c))
        mac = recv_exact(s, 32)
        if mac != _proof(secret, b"S", nonce_s, nonce_c):
            raise ConnectionError("server proof")
    else:
        s.sendall(WORD_NOSECRET)
        word = recv_exact(s, 8)
        if word != WORD_NOSECRET:
            raise ConnectionError(f"server hello {word!r}")


def auth_server(s, secret):
    """The server side of csrc/util/auth.c, done right (for fake servers)."""
    if secret:
        nonce_s = os.urandom(32)
        s.sendall(WORD_SECRET + nonce_s)
        word = recv_exact(s, 8)
        if word != WORD_SECRET:
            raise ConnectionError(f"client hello {word!r}")
        rest = recv_exact(s, 64)
        nonce_c, mac = rest[:32], rest[32:]
        if mac != _proof(secret, b"C", nonce_s, nonce_c):
            raise ConnectionError("client proof")
        s.sendall(_proof(secret, b"S", nonce_s, nonce_c))
    else:
        s.sendall(WORD_NOSECRET)
        if recv_exact(s, 8) != WORD_NOSECRET:
            raise ConnectionError("client hello")


# ------------------------------------------------------------------ store frames

def frame(body):
    return struct.pack("<I", len(body)) + body


def s_str(b):
    return struct.pack("<I", len(b)) + b + b"\0"


def s_bytes(b):
    return struct.pack("<I", len(b)) + b


def request(cmd, seq, args=b""):
    return frame(struct.pack("<BI", cmd, seq) + args)


# ------------------------------------------------------------------ rank transport

def hello(rank, channel, size, token):
    return struct.pack("<IIIIQ", HELLO_MAGIC, rank, channel, size, token)


def frame_header(type_, kind, dtype, op, root, tag, src, seq, count, nbytes):
    """pd_hdr of csrc/transport/transport.h (48 bytes)."""
    return struct.pack("<IBBBBiiIIQQQ", FRAME_MAGIC, type_, kind, dtype, op, root, tag, src, 0,
                       seq, count, nbytes)


def ctrl_msg(type_, status, seq, text=b""):
    return struct.pack("<IIIIQ", CTRL_MAGIC, type_, status, len(text), seq) + text


class FakeRank1:
    """A C ProcessGroup member of rank 0 in a group of 2, and this object as rank 1: it connects
    both channels (data, control) the way tcp.c does, authenticated with `secret`."""

    def __init__(self, secret, timeout=10.0):
        from pyddp import _C
        self.token = int.from_bytes(os.urandom(7), "little")
        self.pg = _C.ProcessGroup(0, 2, timeout, secret)
        err = []

        def run():
            try:
                self.pg.connect(["127.0.0.1", "127.0.0.1"], [self.pg.port, 0], self.token,
                                None, 1)
            except BaseException as e:  # noqa: BLE001 - reported below
                err.append(e)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        self.socks = []
        try:
            for ch in (0, 1):
                s = connect(self.pg.port)
                self.socks.append(s)
                auth_client(s, secret)
                s.sendall(hello(1, ch, 2, self.token))
                ok = recv_exact(s, 4)
                assert struct.unpack("<I", ok)[0] == HELLO_MAGIC
        finally:
            th.join(timeout + 5)
        assert not th.is_alive(), "ProcessGroup.connect did not return"
        if err:
            self.close()
            raise err[0]
        self.data, self.ctrl = self.socks

    def close(self):
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        self.socks = []
        pg, self.pg = self.pg, None
        if pg is not None:
            pg.destroy()


# ------------------------------------------------------------------ driver

def main(test_one, every=None, every_n=200):
    """Run `test_one(data: bytes)` under atheris with the command line's libFuzzer flags
    (-runs=N, -max_total_time=S, a corpus directory, ...).  `every()` runs every
    `every_n` inputs and after the first (the liveness and memory checks).  libFuzzer ends the
    process itself and prints "Done N runs in S second(s)"."""
    import atheris

    count = [0]

    def one(data):
        test_one(data)
        count[0] += 1
        if every is not None and (count[0] == 1 or count[0] % every_n == 0):
            every()

    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
