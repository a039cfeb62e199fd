"""FileStore, HashStore, PrefixStore and the Store base class; compared with
torch where present."""
import datetime
import gc
import multiprocessing as mp
import os
import threading
import time

import pytest

from pyddp.distributed.store import (
    DistError,
    DistStoreError,
    FileStore,
    HashStore,
    PrefixStore,
    Store,
)

try:
    import torch.distributed as tdist
except Exception:  # pragma: no cover - torch is optional
    tdist = None

JOIN_TIMEOUT = 60
ms = lambda n: datetime.timedelta(milliseconds=n)  # noqa: E731
sec = lambda n: datetime.timedelta(seconds=n)  # noqa: E731


@pytest.fixture(params=["hash", "file"])
def store(request, tmp_path):
    if request.param == "hash":
        s = HashStore()
    else:
        s = FileStore(str(tmp_path / "store"), 1)
    yield s
    del s
    gc.collect()


def base_keys(s):
    return 1 if isinstance(s, FileStore) else 0  # FileStore counts "refcount"


def key_name(s, key):
    return f"/{key}" if isinstance(s, FileStore) else key


def test_methods(store):
    s = store
    assert s.num_keys() == base_keys(s)
    assert s.timeout == sec(300)
    s.set("a", "x")
    assert s.get("a") == b"x"
    s.set("b", b"\x00\xff")
    assert s.get("b") == b"\x00\xff"
    assert s.add("n", 5) == 5 and s.add("n", -2) == 3 and s.get("n") == b"3"
    assert s.compare_set("k", "", "v1") == b"v1"
    assert s.compare_set("k2", "zz", "v1") == b"zz" and not s.check(["k2"])
    assert s.compare_set("k", "v1", "v2") == b"v2"
    assert s.compare_set("k", "nope", "v3") == b"v2"
    assert s.check(["a", "k"]) and not s.check(["a", "zz"])
    assert s.num_keys() == base_keys(s) + 4
    assert s.delete_key("a") is True
    # torch's FileStore answers True for a missing key too; its HashStore False
    assert s.delete_key("a") is isinstance(s, FileStore)
    assert not s.check(["a"])
    s.wait(["b", "k"], sec(1))
    with pytest.raises(ValueError, match="not an integer"):
        s.add("b", 1)
    assert s.multi_get(["b", "k"]) == [b"\x00\xff", b"v2"]
    s.multi_set(["m1", "m2"], ["1", b"2"])
    assert s.get("m2") == b"2"


def test_timeouts_name_keys(store):
    store.set_timeout(ms(200))
    assert store.timeout == ms(200)
    t0 = time.monotonic()
    with pytest.raises(DistStoreError) as ei:
        store.get("missing")
    assert 0.19 < time.monotonic() - t0 < 3
    assert f"wait timeout after 200ms, keys: {key_name(store, 'missing')}" in str(ei.value)
    assert isinstance(ei.value, DistError)
    with pytest.raises(DistStoreError, match="keys: .*m1, .*m2"):
        store.wait(["m1", "m2"], ms(50))


def test_blocking_get_and_threads(store):
    t = threading.Timer(0.1, lambda: store.set("later", "v"))
    t.start()
    t0 = time.monotonic()
    assert store.get("later") == b"v"
    assert time.monotonic() - t0 > 0.05
    t.join(JOIN_TIMEOUT)

    errors = []

    def work():
        try:
            for _ in range(100):
                store.add("ctr", 1)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=work) for _ in range(8)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(JOIN_TIMEOUT)
    assert not errors and store.add("ctr", 0) == 800


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="file_name"):
        FileStore(5)
    with pytest.raises(ValueError, match="world_size"):
        FileStore(str(tmp_path / "f"), 0)
    with pytest.raises(DistError, match="nonexistent"):
        FileStore(str(tmp_path / "nonexistent" / "f"))
    h = HashStore()
    with pytest.raises(TypeError, match="key"):
        h.get(b"k")
    with pytest.raises(TypeError, match="timeout"):
        h.set_timeout(3)
    with pytest.raises(TypeError, match="value"):
        h.set("k", 3.0)


# ------------------------------------------------------------- FileStore


def test_file_store_shared_between_objects(tmp_path):
    path = str(tmp_path / "shared")
    a = FileStore(path)
    b = FileStore(path)
    assert a.path == path
    a.set("x", "1")
    assert b.get("x") == b"1"
    assert b.add("c", 2) == 2 and a.add("c", 3) == 5
    assert a.delete_key("x") and not b.check(["x"])


def _file_worker(path, rank, world, q):
    try:
        from pyddp.distributed.store import FileStore as F

        s = F(path, world)
        for _ in range(20):
            s.add("ctr", 1)
        s.set(f"r{rank}", str(rank))
        s.wait([f"r{r}" for r in range(world)], datetime.timedelta(seconds=30))
        q.put((rank, [s.get(f"r{r}").decode() for r in range(world)]))
        del s
    except BaseException as e:  # noqa: BLE001
        q.put((rank, repr(e)))


def test_file_store_processes_and_cleanup(tmp_path):
    path = str(tmp_path / "procs")
    world = 4
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    main = FileStore(path, world)
    procs = [ctx.Process(target=_file_worker, args=(path, r, world, q)) for r in range(1, world)]
    for p in procs:
        p.start()
    try:
        main.set("r0", "0")
        results = [q.get(timeout=JOIN_TIMEOUT) for _ in procs]
        for p in procs:
            p.join(JOIN_TIMEOUT)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    for rank, vals in results:
        assert vals == [str(r) for r in range(world)], (rank, vals)
    assert main.add("ctr", 0) == 20 * (world - 1)
    assert os.path.exists(path)  # main still has it open
    del main
    gc.collect()
    assert not os.path.exists(path)  # the last of world_size users removed it


def test_file_store_kept_without_world_size(tmp_path):
    path = str(tmp_path / "kept")
    s = FileStore(path)
    s.set("a", "b")
    del s
    gc.collect()
    assert os.path.exists(path)
    assert FileStore(path).get("a") == b"b"


def test_file_store_file_is_private_to_its_owner(tmp_path):
    # issue 35: the file holds the group token and the ranks' addresses; it was created 0644
    old = os.umask(0)  # even a permissive umask must not widen it
    try:
        path = str(tmp_path / "fs")
        s = FileStore(path, 2)
        s.set("k", "v")
        assert os.stat(path).st_mode & 0o777 == 0o600
        del s
    finally:
        os.umask(old)


def test_file_store_no_fd_leak(tmp_path):
    fds = len(os.listdir("/proc/self/fd"))
    for i in range(200):
        s = FileStore(str(tmp_path / "leak"), 1)
        s.set("k", str(i))
        del s
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds


# ------------------------------------------------------------ PrefixStore


def test_prefix_store(store):
    p = PrefixStore("grp", store)
    assert p.underlying_store is store
    p.set("x", "1")
    assert store.get("grp/x") == b"1"
    assert p.add("n", 1) == 1
    assert p.compare_set("x", "1", "2") == b"2"
    assert p.check(["x", "n"]) and not p.check(["y"])
    assert p.delete_key("n")
    assert p.delete_key("n") is isinstance(store, FileStore)  # as torch's stores answer
    with pytest.raises(DistStoreError, match="grp/zz"):
        p.wait(["zz"], ms(50))
    assert p.num_keys() == store.num_keys()
    with pytest.raises(TypeError, match="prefix"):
        PrefixStore(1, store)
    with pytest.raises(TypeError, match="store"):
        PrefixStore("p", object())


class DictStore(Store):
    """A user-written store, as torch users subclass torch's Store."""

    def __init__(self):
        super().__init__()
        self.d = {}

    def set(self, key, value):
        self.d[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key):
        return self.d[key]

    def add(self, key, value):
        v = int(self.d.get(key, b"0")) + value
        self.d[key] = str(v).encode()
        return v

    def check(self, keys):
        return all(k in self.d for k in keys)

    def num_keys(self):
        return len(self.d)


def test_user_subclass_with_prefix_store():
    s = DictStore()
    p = PrefixStore("a", PrefixStore("b", s))
    p.set("k", "v")
    assert s.d == {"b/a/k": b"v"}
    assert p.get("k") == b"v" and p.add("c", 2) == 2 and p.check(["k", "c"])
    assert s.timeout == sec(300)
    s.set_timeout(sec(5))
    assert s.timeout == sec(5)
    with pytest.raises(NotImplementedError):
        s.delete_key("k")
    with pytest.raises(NotImplementedError):
        Store().get("k")


# ------------------------------------------------------- against torch


def _scenario(s):
    out = [s.num_keys()]
    s.set("a", "x")
    out += [s.get("a"), s.add("c", 5), s.add("c", -7), s.add("c", 0), s.get("c"),
            s.add("fresh", 0), s.compare_set("k", "", "v1"),
            s.compare_set("k2", "zz", "v1"), s.check(["k2"]),
            s.compare_set("k", "v1", "v2"), s.compare_set("k", "nope", "v3"),
            s.compare_set("k", "v2", ""), s.get("k"), s.compare_set("k", "", "again"),
            s.check(["a", "k"]), s.check(["a", "nope"]), s.check([]), s.num_keys(),
            s.delete_key("a")]
    out.append(s.num_keys())
    s.set("b", b"\x00\x01")
    out.append(s.get("b"))
    return out


@pytest.mark.skipif(tdist is None, reason="torch is not installed")
def test_hash_store_same_results_as_torch():
    assert _scenario(HashStore()) == _scenario(tdist.HashStore())
    assert _scenario(PrefixStore("p", HashStore())) == _scenario(
        tdist.PrefixStore("p", tdist.HashStore()))


@pytest.mark.skipif(tdist is None, reason="torch is not installed")
def test_file_store_same_results_as_torch(tmp_path):
    ours = FileStore(str(tmp_path / "ours"), 1)
    theirs = tdist.FileStore(str(tmp_path / "theirs"), 1)
    assert _scenario(ours) == _scenario(theirs)
    # torch's FileStore.delete_key answers True for a missing key too (its other stores False)
    assert ours.delete_key("never") is theirs.delete_key("never") is True
