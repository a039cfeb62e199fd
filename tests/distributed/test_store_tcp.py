"""TCPStore: semantics, many concurrent clients (threads and processes),
timeouts, errors, authentication, leaks; compared with torch where present."""
import datetime
import gc
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from pyddp.distributed.store import (
    DistError,
    DistNetworkError,
    DistStoreError,
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    TCPStore,
)

import _paths

try:
    import torch.distributed as tdist
except Exception:  # pragma: no cover - torch is optional
    tdist = None

JOIN_TIMEOUT = 60
ms = lambda n: datetime.timedelta(milliseconds=n)  # noqa: E731
sec = lambda n: datetime.timedelta(seconds=n)  # noqa: E731


@pytest.fixture(autouse=True)
def _no_secret(monkeypatch):
    monkeypatch.delenv("PYDDP_SECRET", raising=False)


@pytest.fixture
def master():
    s = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    yield s
    del s
    gc.collect()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_fds():
    return len(os.listdir("/proc/self/fd"))


def count_tasks():
    return len(os.listdir("/proc/self/task"))


# --------------------------------------------------------------- semantics


def test_basic_methods(master):
    s = master
    assert isinstance(s, Store)
    assert s.port > 0 and s.host == "127.0.0.1"
    assert s.timeout == sec(10)
    assert s.num_keys() == 1  # the "init/" worker counter, as in torch
    s.set("a", "x")
    assert s.get("a") == b"x"
    s.set("b", b"\x00\xff")
    assert s.get("b") == b"\x00\xff"
    s.set("c", bytearray(b"ba"))
    assert s.get("c") == b"ba"
    s.set("e", "")
    assert s.get("e") == b""
    assert s.add("n", 5) == 5
    assert s.add("n", -2) == 3
    assert s.get("n") == b"3"
    assert s.compare_set("k", "", "v1") == b"v1"
    assert s.compare_set("k2", "zz", "v1") == b"zz"
    assert not s.check(["k2"])
    assert s.compare_set("k", "v1", "v2") == b"v2"
    assert s.compare_set("k", "nope", "v3") == b"v2"
    assert s.compare_set("k", b"v2", b"v4") == b"v4"
    assert s.check(["a", "k"]) and not s.check(["a", "zz"]) and s.check([])
    assert s.num_keys() == 7
    assert s.delete_key("a") is True
    assert s.delete_key("a") is False
    assert s.num_keys() == 6
    s.wait(["b", "k"])
    s.wait(["b"], sec(1))
    s.set_timeout(sec(2))
    assert s.timeout == sec(2)


def test_add_non_integer_is_value_error(master):
    master.set("s", "abc")
    with pytest.raises(ValueError, match="not an integer"):
        master.add("s", 1)
    assert master.get("s") == b"abc"  # the connection is still fine


def test_get_timeout_names_key(master):
    master.set_timeout(ms(200))
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match=r"wait timeout after 200ms, keys: /missing") as ei:
        master.get("missing")
    assert 0.19 < time.monotonic() - t0 < 3
    assert isinstance(ei.value, DistError) and isinstance(ei.value, RuntimeError)
    with pytest.raises(DistStoreError, match=r"wait timeout after 100ms, keys: /m1, /m2"):
        master.wait(["m1", "m2"], ms(100))
    # The same connection keeps working after timeouts.
    master.set("missing", "late")
    assert master.get("missing") == b"late"


def test_blocking_get_across_clients(master):
    c = TCPStore("127.0.0.1", master.port, timeout=sec(10))
    t = threading.Timer(0.2, lambda: master.set("later", "v"))
    t.start()
    t0 = time.monotonic()
    assert c.get("later") == b"v"
    assert time.monotonic() - t0 >= 0.15
    t.join(JOIN_TIMEOUT)


def test_gil_released_while_blocking(master):
    """A get waiting on the server must not hold the GIL."""
    done = threading.Event()

    def waiter():
        try:
            master.get("gil")
        finally:
            done.set()

    th = threading.Thread(target=waiter)
    th.start()
    spins = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:
        spins += 1
    assert spins > 1000
    master.set("gil", "1")
    assert done.wait(JOIN_TIMEOUT)
    th.join(JOIN_TIMEOUT)


def test_local_addr(master):
    assert master.local_addr() == "127.0.0.1"


def test_large_value(master):
    blob = os.urandom(8 << 20)
    c = TCPStore("127.0.0.1", master.port, timeout=sec(10))
    c.set("blob", blob)
    assert master.get("blob") == blob


# ---------------------------------------------------------- concurrency


def test_many_threads_each_with_a_client(master):
    n, iters = 16, 50
    errors = []
    clients = [TCPStore("127.0.0.1", master.port, timeout=sec(30)) for _ in range(n)]

    def work(i):
        try:
            c = clients[i]
            for _ in range(iters):
                c.add("ctr", 1)
            c.set(f"rank{i}", str(i))
            c.wait([f"rank{j}" for j in range(n)])
            assert [c.get(f"rank{j}") for j in range(n)] == [str(j).encode() for j in range(n)]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(JOIN_TIMEOUT)
        assert not t.is_alive()
    assert not errors, errors
    assert master.add("ctr", 0) == n * iters


def test_threads_share_one_client(master):
    n, iters = 8, 200
    errors = []

    def work():
        try:
            for _ in range(iters):
                master.add("shared", 1)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=work) for _ in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(JOIN_TIMEOUT)
    assert not errors and master.add("shared", 0) == n * iters


def _proc_worker(port, rank, world, q):
    try:
        from pyddp.distributed.store import TCPStore as T

        s = T("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=30))
        for _ in range(20):
            s.add("procs", 1)
        s.set(f"p{rank}", f"hello{rank}")
        s.wait([f"p{r}" for r in range(1, world)])
        vals = [s.get(f"p{r}").decode() for r in range(1, world)]
        q.put((rank, vals, s.local_addr()))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, repr(e), None))


def test_real_processes():
    world = 5  # master + 4 processes
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_proc_worker, args=(port, r, world, q)) for r in range(1, world)]
    for p in procs:
        p.start()
    try:
        # The master's constructor returns once all workers joined.
        m = TCPStore("127.0.0.1", port, world, True, timeout=sec(60))
        results = [q.get(timeout=JOIN_TIMEOUT) for _ in procs]
        for p in procs:
            p.join(JOIN_TIMEOUT)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    want = [f"hello{r}" for r in range(1, world)]
    for rank, vals, addr in results:
        assert vals == want, (rank, vals)
        assert addr == "127.0.0.1"
    assert m.add("procs", 0) == 20 * (world - 1)
    assert m.num_keys() == 1 + 1 + (world - 1)  # init/, procs, p1..p4


def test_wait_for_workers_timeout():
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match=r"1/3 clients joined"):
        TCPStore("127.0.0.1", 0, 3, True, timeout=ms(300))
    assert time.monotonic() - t0 < 5


def test_wait_for_workers_false_returns_at_once():
    s = TCPStore("127.0.0.1", 0, 4, True, timeout=sec(5), wait_for_workers=False)
    assert s.num_keys() == 0


# --------------------------------------------------------------- errors


def test_port_in_use_message(master):
    with pytest.raises(DistNetworkError) as ei:
        TCPStore("127.0.0.1", master.port, 1, True, timeout=sec(1))
    msg = str(ei.value)
    assert f"127.0.0.1:{master.port}" in msg and "address already in use" in msg


def test_port_in_use_by_other_socket():
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(DistNetworkError, match=f"{port}.*address already in use"):
            TCPStore("localhost", port, 1, True)


def test_client_without_server():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(DistNetworkError, match=f"127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, 1, False, timeout=ms(300))
    assert time.monotonic() - t0 < 5


def test_server_gone_fails_fast():
    m = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(30))
    c = TCPStore("127.0.0.1", m.port, timeout=sec(30))
    port = m.port
    del m
    gc.collect()
    t0 = time.monotonic()
    with pytest.raises(DistNetworkError, match=f"127.0.0.1:{port}"):
        c.get("x")
    with pytest.raises(DistNetworkError):
        c.set("x", "1")
    assert time.monotonic() - t0 < 5


def test_bad_arguments(master):
    with pytest.raises(TypeError, match="host_name"):
        TCPStore(5, 0, 1, True)
    with pytest.raises(ValueError, match="port"):
        TCPStore("127.0.0.1", 70000, 1, True)
    with pytest.raises(ValueError, match="port"):
        TCPStore("127.0.0.1", 0, 1, False)
    with pytest.raises(ValueError, match="world_size"):
        TCPStore("127.0.0.1", 0, 0, True)
    with pytest.raises(TypeError, match="timeout"):
        TCPStore("127.0.0.1", 0, 1, True, timeout=5)
    with pytest.raises(TypeError, match="key"):
        master.set(1, "x")
    with pytest.raises(TypeError, match="value"):
        master.set("k", 1)
    with pytest.raises(TypeError, match="value"):
        master.add("k", "1")
    with pytest.raises(TypeError, match="keys"):
        master.wait("abc")
    with pytest.raises(TypeError, match="key"):
        master.check([1])
    with pytest.raises(TypeError, match="timeout"):
        master.wait(["k"], 1.0)
    with pytest.raises(ValueError, match="timeout"):
        master.set_timeout(sec(-1))
    with pytest.raises(TypeError, match="expected_value"):
        master.compare_set("k", None, "x")
    with pytest.raises(ValueError, match="NUL"):
        master.set("a\0b", "x")


# ------------------------------------------------------------------ auth


def test_auth_matching_and_not(monkeypatch):
    monkeypatch.setenv("PYDDP_SECRET", "s3cret")
    m = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    good = TCPStore("127.0.0.1", m.port, timeout=sec(10))
    good.set("k", "v")

    monkeypatch.setenv("PYDDP_SECRET", "other")
    t0 = time.monotonic()
    with pytest.raises(DistNetworkError, match="authentication"):
        TCPStore("127.0.0.1", m.port, timeout=sec(10))
    monkeypatch.delenv("PYDDP_SECRET")
    with pytest.raises(DistNetworkError, match="requires a secret"):
        TCPStore("127.0.0.1", m.port, timeout=sec(10))
    assert time.monotonic() - t0 < 5  # rejected at once, no hang

    # The server keeps serving the others.
    assert m.get("k") == b"v"
    good.set("k2", "v2")
    assert m.get("k2") == b"v2"


def test_auth_secret_only_on_client(monkeypatch):
    m = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    monkeypatch.setenv("PYDDP_SECRET", "s3cret")
    with pytest.raises(DistNetworkError, match="does not use a secret"):
        TCPStore("127.0.0.1", m.port, timeout=sec(10))
    m.set("still", "ok")


def test_auth_across_processes(monkeypatch):
    monkeypatch.setenv("PYDDP_SECRET", "proc-secret")
    m = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    code = (
        "import sys, datetime\n"
        "from pyddp.distributed.store import TCPStore, DistNetworkError\n"
        "try:\n"
        f"    s = TCPStore('127.0.0.1', {m.port}, timeout=datetime.timedelta(seconds=10))\n"
        "    s.set('from_child', 'yes')\n"
        "    print('OK')\n"
        "except DistNetworkError as e:\n"
        "    print('REJECTED', e)\n"
    )
    root = _paths.ROOT
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=JOIN_TIMEOUT)
    assert out.stdout.startswith("OK"), out.stdout + out.stderr
    env["PYDDP_SECRET"] = "wrong"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=JOIN_TIMEOUT)
    assert out.stdout.startswith("REJECTED"), out.stdout + out.stderr
    assert m.get("from_child") == b"yes"


def test_stranger_does_not_block_server(master):
    # A connection that never authenticates, and one that sends junk.
    silent = socket.create_connection(("127.0.0.1", master.port))
    junk = socket.create_connection(("127.0.0.1", master.port))
    junk.sendall(b"GET / HTTP/1.0\r\n\r\n")
    c = TCPStore("127.0.0.1", master.port, timeout=sec(5))
    c.set("x", "1")
    assert master.get("x") == b"1"
    junk.settimeout(5)
    data = b""
    try:
        while True:  # the server sends its hello, then hangs up
            chunk = junk.recv(100)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass  # unread junk makes the kernel answer the close with a reset
    assert b"HTTP" not in data
    silent.close()
    junk.close()


# ------------------------------------------------- outsiders (issue 35): where the server listens


def _listening_addrs(port):
    """The addresses this process listens on at ``port`` (from /proc/net/tcp)."""
    import struct

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            hexip, hexport = parts[1].split(":")
            if parts[3] == "0A" and parts[9] in inodes and int(hexport, 16) == port:
                out.append(socket.inet_ntoa(struct.pack("<I", int(hexip, 16))))
    return out


def _host_ip():
    try:
        words = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        words = []
    ip = next((w for w in words if "." in w and not w.startswith("127.")), None)
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    return ip


def test_loopback_master_listens_on_loopback_only():
    m = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    assert _listening_addrs(m.port) == ["127.0.0.1"]     # it was 0.0.0.0
    with pytest.raises(OSError):
        socket.create_connection((_host_ip(), m.port), timeout=2).close()


def test_listener_beyond_loopback_without_a_secret_warns_once_naming_pyddp_secret(monkeypatch):
    import warnings

    from pyddp.distributed import store as store_mod

    ip = _host_ip()
    monkeypatch.setattr(store_mod, "_open_warned", [False])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = TCPStore(ip, 0, 1, True, timeout=sec(10))
        b = TCPStore(ip, 0, 1, True, timeout=sec(10))
        loop = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    said = [str(w.message) for w in seen if "PYDDP_SECRET" in str(w.message)]
    assert len(said) == 1, said
    assert ip in said[0] and "unpickle" in said[0], said[0]
    # bound to the address clients use, not every interface
    assert _listening_addrs(a.port) == [ip] and _listening_addrs(b.port) == [ip]
    assert _listening_addrs(loop.port) == ["127.0.0.1"]
    # with a secret it is not said
    monkeypatch.setattr(store_mod, "_open_warned", [False])
    monkeypatch.setenv("PYDDP_SECRET", "s3cret")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        TCPStore(ip, 0, 1, True, timeout=sec(10))
    assert not [w for w in seen if "PYDDP_SECRET" in str(w.message)]


@pytest.mark.timeout(60)
def test_stranger_without_the_secret_lists_sets_and_stores_nothing(monkeypatch):
    # without a secret a stranger once listed every key, set its own and stored 600 MB on rank 0
    sys.path.insert(0, os.path.join(_paths.TESTS, "fuzz"))
    import struct

    import _peers as P

    monkeypatch.setenv("PYDDP_SECRET", "job-secret")
    m = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    m.set("pg/0/token", "1234")
    keys = m.num_keys()
    before = P.vm_kib()
    # 1. the no-secret handshake: the server hangs up
    s = P.connect(m.port)
    with pytest.raises(ConnectionError):
        P.auth_client(s, None)
    s.close()
    # 2. a wrong secret
    s = P.connect(m.port)
    with pytest.raises((ConnectionError, OSError)):
        P.auth_client(s, "guess")
    s.close()
    # 3. no handshake at all: a SET frame claiming 600 MB, then data
    s = P.connect(m.port)
    try:
        s.sendall(struct.pack("<I", 600 << 20) + struct.pack("<BI", P.SET, 1) + b"x" * (1 << 20))
    except OSError:
        pass   # the server may hang up while we send
    got = P.drain(s, timeout=2)
    assert len(got) <= 40, f"the server answered a stranger: {got[:80]!r}"   # its hello + nonce only
    s.close()
    time.sleep(0.3)
    assert (P.vm_kib() - before) // 1024 < 256, "the server allocated what a stranger claimed"
    assert m.num_keys() == keys and m.get("pg/0/token") == b"1234"
    # 4. a stranger process with the pyddp client and no secret
    code = ("import datetime\nfrom pyddp.distributed.store import TCPStore\n"
            "try:\n"
            f"    s = TCPStore('127.0.0.1', {m.port}, timeout=datetime.timedelta(seconds=5))\n"
            "    print('IN', s.get('pg/0/token'))\n"
            "except Exception as e:\n"
            "    print('OUT', e)\n")
    root = _paths.ROOT
    env = {k: v for k, v in os.environ.items() if k != "PYDDP_SECRET"}
    env["PYTHONPATH"] = root
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=JOIN_TIMEOUT)
    assert out.stdout.startswith("OUT") and "secret" in out.stdout, out.stdout + out.stderr
    assert m.num_keys() == keys


# ----------------------------------------------------------------- leaks


def test_create_destroy_cycles_leak_nothing():
    gc.collect()
    fds, tasks, threads = count_fds(), count_tasks(), threading.active_count()
    for _ in range(1000):
        s = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(5))
        s.set("k", "v")
        del s
    gc.collect()
    assert count_fds() == fds
    assert count_tasks() == tasks
    assert threading.active_count() == threads


def test_client_cycles_leak_nothing(master):
    fds, tasks = count_fds(), count_tasks()
    for _ in range(300):
        c = TCPStore("127.0.0.1", master.port, timeout=sec(5))
        with pytest.raises(DistStoreError):
            c.wait(["never"], ms(1))
        del c
    gc.collect()
    assert count_fds() == fds and count_tasks() == tasks
    assert master.num_keys() == 1  # cancelled waits leave no entries


# ---------------------------------------------------------------- extras


def test_multi_tenant_port_zero_registers_chosen_port():
    a = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(5), multi_tenant=True)
    b = TCPStore("127.0.0.1", a.port, 1, True, timeout=sec(5), multi_tenant=True)
    b.set("k", "v")
    assert a.get("k") == b"v"


def test_multi_tenant_shares_server():
    a = TCPStore("127.0.0.1", free_port(), 1, True, timeout=sec(5), multi_tenant=True)
    b = TCPStore("127.0.0.1", a.port, 1, True, timeout=sec(5), multi_tenant=True)
    a.set("k", "v")
    assert b.get("k") == b"v"
    del a
    gc.collect()
    b.set("k2", "v2")  # the server lives while a tenant does
    assert b.get("k2") == b"v2"


def test_master_listen_fd():
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    port = sock.getsockname()[1]
    m = TCPStore("127.0.0.1", port, 1, True, timeout=sec(5), master_listen_fd=sock.fileno())
    assert m.port == port
    c = TCPStore("127.0.0.1", port, timeout=sec(5))
    c.set("a", "b")
    assert m.get("a") == b"b"
    sock.close()  # the store keeps its own copy
    c.set("c", "d")


def test_prefix_store_over_tcp(master):
    p = PrefixStore("grp", master)
    assert p.underlying_store is master
    p.set("x", "1")
    assert master.get("grp/x") == b"1" and p.get("x") == b"1"
    assert p.add("n", 2) == 2
    assert p.check(["x", "n"])
    with pytest.raises(DistStoreError, match="keys: /grp/zz"):
        p.wait(["zz"], ms(100))
    nested = PrefixStore("sub", p)
    nested.set("y", "2")
    assert master.get("grp/sub/y") == b"2"


# ------------------------------------------------------- against torch


def _scenario(s):
    out = []
    out.append(s.num_keys())
    s.set("a", "x")
    out.append(s.get("a"))
    out.append(s.add("c", 5))
    out.append(s.add("c", -7))
    out.append(s.add("c", 0))
    out.append(s.get("c"))
    out.append(s.add("fresh", 0))
    out.append(s.compare_set("k", "", "v1"))
    out.append(s.compare_set("k2", "zz", "v1"))
    out.append(s.check(["k2"]))
    out.append(s.compare_set("k", "v1", "v2"))
    out.append(s.compare_set("k", "nope", "v3"))
    out.append(s.compare_set("k", "v2", ""))
    out.append(s.get("k"))
    out.append(s.compare_set("k", "", "again"))
    out.append(s.check(["a", "k"]))
    out.append(s.check(["a", "nope"]))
    out.append(s.check([]))
    out.append(s.num_keys())
    out.append(s.delete_key("a"))
    out.append(s.delete_key("a"))
    out.append(s.num_keys())
    s.set("b", b"\x00\x01")
    out.append(s.get("b"))
    return out


@pytest.mark.skipif(tdist is None, reason="torch is not installed")
def test_same_results_as_torch():
    t = tdist.TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    ours = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    assert _scenario(ours) == _scenario(t)
    p_t = tdist.PrefixStore("pre", t)
    p_o = PrefixStore("pre", ours)
    assert _scenario(p_o) == _scenario(p_t)
    # Timeout messages read the same.
    t.set_timeout(ms(100))
    ours.set_timeout(ms(100))
    msgs = []
    for s in (t, ours):
        try:
            s.get("nokey")
        except Exception as e:  # noqa: BLE001
            msgs.append((type(e).__name__, str(e)))
    assert msgs[0] == msgs[1]


def test_port_held_by_another_job_says_so(monkeypatch):
    """Another pyddp job (its own secret) holds the port: the error names that cause and how to
    choose a free port, not only a secret mismatch."""
    monkeypatch.setenv("PYDDP_SECRET", "the-other-job")
    m = TCPStore("127.0.0.1", 0, 1, True, timeout=sec(10))
    monkeypatch.setenv("PYDDP_SECRET", "this-job")
    with pytest.raises(DistNetworkError) as e:
        TCPStore("127.0.0.1", m.port, timeout=sec(10))
    msg = str(e.value)
    assert "belongs to another job or service" in msg and "free port" in msg, msg
    assert "MASTER_PORT" in msg and "--master_port" in msg
    m.set("still", "serving")
