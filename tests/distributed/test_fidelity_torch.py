"""Where the README says "same", it is the same as torch 2.13: the store extended API, PrefixStore
timeouts, torch's errors for reductions and all_gather_into_tensor shapes, group queries on ranks
outside a group, barrier(timeout=), new_group(sort_ranks=), DataLoader timeouts, PYDDP_EXIT_TIMEOUT=0.

Store behaviour is compared with torch's stores in this process; collective errors with the
exception types torch's gloo backend raises for the same calls (2 and 3 ranks)."""
import datetime
import os
import tempfile
import time

import numpy as np
import pytest

import pyddp.distributed as dist
from _mp import run, run_outcomes
from _tiers import FULL

td = datetime.timedelta


# ----------------------------------------------------------------------------------- stores

def _store_pairs(tmp_path):
    """(name, pyddp store, torch store) for each kind both offer."""
    tdist = pytest.importorskip("torch.distributed")
    pairs = [
        ("hash", dist.HashStore(), tdist.HashStore()),
        ("file", dist.FileStore(str(tmp_path / "p.store"), 1),
         tdist.FileStore(str(tmp_path / "t.store"), 1)),
        ("tcp", dist.TCPStore("127.0.0.1", 0, 1, True, timeout=td(seconds=5)),
         tdist.TCPStore("127.0.0.1", 0, 1, True, timeout=td(seconds=5))),
    ]
    pairs += [(f"prefix-{n}", dist.PrefixStore("pre", p), tdist.PrefixStore("pre", t))
              for n, p, t in list(pairs)]
    return pairs


def _outcome(f):
    try:
        return ("ok", f())
    except Exception as e:  # the kind of error, compared between pyddp and torch
        for kind in (NotImplementedError, ValueError, TypeError, RuntimeError):
            if isinstance(e, kind):
                return ("raise", kind.__name__)
        return ("raise", type(e).__name__)


def _keys(s):
    # torch's FileStore lists its reference counter too, mangled ("efcount/"); pyddp lists only
    # the user's keys (see the README)
    return sorted(k for k in s.list_keys() if k != "efcount/")


def _script(s):
    """The same calls on a pyddp or a torch store: their answers (key lists sorted)."""
    return [
        _outcome(lambda: s.has_extended_api()),
        _outcome(lambda: s.append("a", "x")),
        _outcome(lambda: s.append("a", b"yz")),
        _outcome(lambda: s.get("a")),
        _outcome(lambda: s.add("n", 2)),
        _outcome(lambda: s.append("n", "1")),
        _outcome(lambda: s.add("n", 1)),
        _outcome(lambda: s.multi_set(["m1", "m2"], ["1", b"2"])),
        _outcome(lambda: s.multi_get(["m1", "m2", "a"])),
        _outcome(lambda: _keys(s)),
        _outcome(lambda: s.delete_key("missing")),
        _outcome(lambda: s.queue_push("q", "v1")),
        _outcome(lambda: s.queue_push("q", b"v2")),
        _outcome(lambda: s.queue_len("q")),
        _outcome(lambda: s.queue_pop("q")),
        _outcome(lambda: s.queue_pop("q", False)),
        _outcome(lambda: s.queue_len("q")),
        _outcome(lambda: s.queue_pop("q", False)),
        _outcome(lambda: s.barrier("b", 1)),
        _outcome(lambda: s.barrier("b2", 1, td(seconds=2))),
        _outcome(lambda: [k for k in _keys(s) if not k.startswith("b")]),
    ]


def test_store_extended_api_as_torch(tmp_path):
    for name, p, t in _store_pairs(tmp_path):
        assert _script(p) == _script(t), name


def test_store_queue_errors_and_clone(tmp_path):
    tdist = pytest.importorskip("torch.distributed")
    for name, s in [("hash", dist.HashStore()),
                    ("tcp", dist.TCPStore("127.0.0.1", 0, 1, True, timeout=td(seconds=5)))]:
        with pytest.raises(dist.QueueEmptyError, match="queue is empty"):
            s.queue_pop("empty", block=False)
        assert issubclass(dist.QueueEmptyError, dist.DistStoreError)
        assert issubclass(tdist.QueueEmptyError, tdist.DistStoreError)
        s.set_timeout(td(seconds=0.5))
        t0 = time.monotonic()
        with pytest.raises(dist.DistStoreError, match="timeout"):
            s.queue_pop("empty")
        assert 0.4 < time.monotonic() - t0 < 3, name
        c = s.clone()
        s.set("k", "v")
        assert c.get("k") == b"v"
        c.queue_push("cq", "from clone")
        assert s.queue_pop("cq") == b"from clone"
        with pytest.raises(dist.DistStoreError, match="same size"):
            s.multi_set(["a", "b"], ["1"])
    # a queue shared by threads: every pushed item popped exactly once
    import threading

    s = dist.HashStore()
    got, lock = [], threading.Lock()

    def popper():
        for _ in range(50):
            v = s.queue_pop("shared")
            with lock:
                got.append(v)

    threads = [threading.Thread(target=popper) for _ in range(4)]
    for th in threads:
        th.start()
    for i in range(200):
        s.queue_push("shared", str(i))
    for th in threads:
        th.join(timeout=60)
    assert sorted(int(v) for v in got) == list(range(200))


def _store_queue_across_ranks(rank, world_size, port):
    s = dist.TCPStore("127.0.0.1", port, world_size, rank == 0, timeout=td(seconds=30))
    late = None
    if rank == 0:
        for i in range(30):
            s.queue_push("work", str(i))
        s.set("all_pushed", "1")
        s.barrier("popping", world_size)
        time.sleep(0.5)
        s.queue_push("late", "for rank 1")  # rank 1 is blocked in queue_pop by now
    else:
        s.wait(["all_pushed"])
        s.barrier("popping", world_size)
        if rank == 1:
            late = s.queue_pop("late")
    mine = []
    while True:
        try:
            mine.append(int(s.queue_pop("work", block=False)))
        except dist.QueueEmptyError:
            break
    s.append("log", f"{rank}:{len(mine)};")
    s.barrier("popped", world_size)
    keys = sorted(s.list_keys())
    log = s.get("log")
    # the server (rank 0) must outlive every other rank's calls: the others check out once their
    # last call returned, and rank 0 waits for them before it exits (a barrier alone is not
    # enough: its last arriver returns while the others still wait for its answer)
    s.barrier("end", world_size)
    if rank == 0:
        deadline = time.monotonic() + 30
        while s.add("checked_out", 0) < world_size - 1:
            assert time.monotonic() < deadline, "the other ranks never checked out"
            time.sleep(0.01)
    else:
        s.add("checked_out", 1)
    return mine, keys, log, late


def test_store_queue_across_ranks():
    from _mp import free_port

    port = free_port()
    res = run(_store_queue_across_ranks, 3, port, init=False)
    popped = sorted(v for r in res for v in r[0])
    assert popped == list(range(30))
    keys, log = res[0][1], res[0][2]
    assert "log" in keys and not any(k.startswith("__pyddp") for k in keys)
    assert sorted(log.decode().rstrip(";").split(";")) == \
        sorted(f"{rank}:{len(r[0])}" for rank, r in enumerate(res))
    assert res[1][3] == b"for rank 1"


def test_prefix_store_set_timeout_sets_the_base_store():
    base = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=td(seconds=60))
    p = dist.PrefixStore("x", base)
    p.set_timeout(td(seconds=0.5))
    assert base.timeout == td(seconds=0.5) and p.timeout == td(seconds=0.5)
    t0 = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        p.get("missing")
    assert time.monotonic() - t0 < 5
    tdist = pytest.importorskip("torch.distributed")
    tb = tdist.HashStore()
    tp = tdist.PrefixStore("x", tb)
    tp.set_timeout(td(seconds=0.5))
    assert tb.timeout == td(seconds=0.5)


def test_file_store_delete_missing_key_as_torch(tmp_path):
    tdist = pytest.importorskip("torch.distributed")
    p = dist.FileStore(str(tmp_path / "a"), 1)
    t = tdist.FileStore(str(tmp_path / "b"), 1)
    assert p.delete_key("nothing") == t.delete_key("nothing")
    p.set("k", "v")
    t.set("k", "v")
    assert p.delete_key("k") == t.delete_key("k")
    assert p.check(["k"]) == t.check(["k"]) is False


# ----------------------------------------------------------------------------- collectives

def _reduce_errors(rank, world_size):
    ws = world_size
    R = dist.ReduceOp
    out = {}

    def t(name, f):
        try:
            f()
            out[name] = None
        except Exception as e:
            out[name] = (type(e).__name__, str(e))

    for op in ("SUM", "AVG"):
        t(f"int {op}", lambda: dist.all_reduce(np.array([3, 4], dtype=np.int64), op=getattr(R, op)))
    t("bool AVG", lambda: dist.all_reduce(np.array([True]), op=R.AVG))
    t("float AVG", lambda: dist.all_reduce(np.array([3.0]), op=R.AVG))
    for op in ("PRODUCT", "MIN", "BAND", "SUM", "AVG"):
        t(f"complex {op}", lambda: dist.all_reduce(np.array([1 + 1j]), op=getattr(R, op)))
    for op in ("BAND", "BOR", "BXOR"):
        t(f"float {op}", lambda: dist.all_reduce(np.array([1.0], dtype=np.float32), op=getattr(R, op)))
        t(f"bool {op}", lambda: dist.all_reduce(np.array([True]), op=getattr(R, op)))
    t("reduce int AVG", lambda: dist.reduce(np.array([3], dtype=np.int64), 0, op=R.AVG))
    t("async int AVG", lambda: dist.all_reduce(np.array([3], dtype=np.int16), op=R.AVG, async_op=True))
    t("reduce_scatter int AVG", lambda: dist.reduce_scatter(
        np.zeros(2, np.int32), [np.ones(2, np.int32)] * ws, op=R.AVG))
    t("rst uint8 AVG", lambda: dist.reduce_scatter_tensor(
        np.zeros(1, np.uint8), np.ones(ws, np.uint8), op=R.AVG))
    t("reduce complex PRODUCT", lambda: dist.reduce(np.array([1j]), 0, op=R.PRODUCT))
    t("rst complex PRODUCT", lambda: dist.reduce_scatter_tensor(
        np.zeros(1, np.complex64), np.ones(ws, np.complex64), op=R.PRODUCT))
    for shape in [(ws * 2,), (ws, 2), (2, ws), (ws * 2 + 1,), (1, ws * 2)]:
        t(f"agit {shape}", lambda: dist.all_gather_into_tensor(np.zeros(shape), np.ones(2)))
    t("agit 2d", lambda: dist.all_gather_into_tensor(np.zeros((ws * 2, 3)), np.ones((2, 3))))
    t("agit scalar", lambda: dist.all_gather_into_tensor(np.zeros(ws), np.array(1.0)))
    dist.barrier()
    return out


@pytest.mark.parametrize("ws", [2, 3])
def test_reduction_and_gather_errors_as_torch_gloo(ws):
    out = run(_reduce_errors, ws)[0]
    # the exception types (and messages) torch 2.13's gloo backend gives for the same calls
    cast = "result type Float can't be cast to the desired output type"
    assert out["int SUM"] is None and out["float AVG"] is None
    # AVG on integers: torch's exception type and words, after the call, op and dtype (issue 50)
    avg = "Cannot use ReduceOp.AVG with non-floating point dtype"
    fix = "use a floating point array, or SUM and divide"
    assert out["int AVG"] == ("RuntimeError", f"all_reduce: {avg} int64 ({fix}; torch: {cast} Long)")
    assert out["bool AVG"] == ("RuntimeError", f"all_reduce: {avg} bool ({fix}; torch: {cast} Bool)")
    assert out["reduce int AVG"] == ("RuntimeError", f"reduce: {avg} int64 ({fix}; torch: {cast} Long)")
    assert out["async int AVG"] == ("RuntimeError", f"all_reduce: {avg} int16 ({fix}; torch: {cast} Short)")
    assert out["reduce_scatter int AVG"] == (
        "RuntimeError", f"reduce_scatter: {avg} int32 ({fix}; torch: {cast} Int)")
    assert out["rst uint8 AVG"] == (
        "RuntimeError", f"reduce_scatter_tensor: {avg} uint8 ({fix}; torch: {cast} Byte)")
    for op in ("PRODUCT", "MIN", "BAND"):
        assert out[f"complex {op}"] == (
            "ValueError", f"all_reduce does not support RedOpType.{op} on complex tensors")
    assert out["complex SUM"] is None and out["complex AVG"] is None
    assert out["reduce complex PRODUCT"][0] == "RuntimeError"
    assert out["rst complex PRODUCT"][0] == "RuntimeError"
    for op in ("BAND", "BOR", "BXOR"):
        assert out[f"float {op}"] == ("RuntimeError", f"Cannot use ReduceOp.{op} with non-integral dtype")
        assert out[f"bool {op}"] is None
    assert out[f"agit {(ws * 2,)}"] is None and out["agit 2d"] is None
    # a wrongly shaped output: torch's exception type (RuntimeError), in pyddp's words naming
    # output_tensor and the shapes, then torch's own words
    size = "; torch: ProcessGroupGloo::allgather: invalid tensor size at index"
    head = f"all_gather_into_tensor: output_tensor must have shape ({ws * 2}) (world size {ws} times "
    assert out[f"agit {(ws, 2)}"] == (
        "RuntimeError", f"{head}input_tensor's (2) along dim 0), got ({ws}, 2){size} 0 (expected (2), got (1, 2))")
    assert out[f"agit {(2, ws)}"][0] == "RuntimeError"
    assert out[f"agit {(ws * 2 + 1,)}"] == (
        "RuntimeError", f"{head}input_tensor's (2) along dim 0), got ({ws * 2 + 1}){size} 0 (expected (2), got (3))")
    assert out[f"agit {(1, ws * 2)}"] == (
        "RuntimeError", f"{head}input_tensor's (2) along dim 0), got (1, {ws * 2}); torch: "
        f"ProcessGroupGloo::allgather: invalid output tensor list at index 0 (expected length {ws}, got 1)")
    assert out["agit scalar"][0] == "RuntimeError" and out["agit scalar"][1].endswith(
        f"shape ({ws})); torch: ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (), got (1))")


class _Index:
    """An object with __index__ that is not an integer (torch.device refuses it)."""

    def __index__(self):
        return 0


BARRIER_DEVICE_IDS = {  # what torch 2.13's barrier (gloo) does with each device_ids (None: no error)
    "[0]": ([0], None), "[0, 1]": ([0, 1], None), "[np.int64(0)]": ([np.int64(0)], None),
    "[index]": ([_Index()], "TypeError"),
    # not a list: torch 2.13 ignores it (torch 2.0-2.5 raised TypeError)
    "'x'": ("x", None), "0": (0, None), "(0,)": ((0,), None),
    "['x']": (["x"], "TypeError"), "[0.0]": ([0.0], "TypeError"), "[None]": ([None], "TypeError"),
    "[True]": ([True], "TypeError"), "[]": ([], "IndexError"), "[-1]": ([-1], "RuntimeError"),
}


def _barrier_device_ids(rank, world_size):
    out = {}
    for name, (ids, _) in BARRIER_DEVICE_IDS.items():
        for async_op in (False, True):
            try:
                w = dist.barrier(device_ids=ids, async_op=async_op)
                if w is not None:
                    w.wait(timeout=30)
                out[name, async_op] = None
            except Exception as e:  # noqa: BLE001 - the exception is what is compared
                out[name, async_op] = (type(e).__name__, str(e))
    dist.barrier()
    return out


def test_barrier_checks_device_ids_as_torch():
    """issue 50 (item 6): barrier's device_ids get torch 2.13's checks, on every rank before the
    barrier (the fast path for the blocking call included), with pyddp's message."""
    for out in run(_barrier_device_ids, 2):
        for (name, async_op), got in out.items():
            want = BARRIER_DEVICE_IDS[name][1]
            assert (got and got[0]) == want, (name, async_op, got)
            if got:
                assert got[1].startswith("barrier: device_ids"), got
        assert out["['x']", False][1] == ("barrier: device_ids type should be List[int], got ['x'] "
                                         "(an entry of type str)")


def test_supports_complex_and_backend_availability_as_torch():
    tdist = pytest.importorskip("torch.distributed")
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        assert dist.supports_complex(getattr(dist.ReduceOp, name)) == \
            tdist.supports_complex(getattr(tdist.ReduceOp, name)), name
    for b in ("gloo", "GLOO", "ucc", "no-such-backend"):
        assert dist.is_backend_available(b) == tdist.is_backend_available(b), b
    # "mpi": torch answers whether it was built with MPI, pyddp whether mpi4py is installed
    import importlib.util

    assert dist.is_backend_available("mpi") == (importlib.util.find_spec("mpi4py") is not None)
    assert dist.get_pg_count() == tdist.get_pg_count() == 0
    assert dist.GradBucket.__name__ == tdist.GradBucket.__name__
    for m in ("index", "buffer", "gradients", "parameters", "is_last", "set_buffer"):
        assert hasattr(dist.GradBucket, m) and hasattr(tdist.GradBucket, m), m


def test_reduce_op_and_debug_level_print_as_torch():
    """str(), repr() and f-strings of ReduceOp and DebugLevel members read as torch 2.13's (Python 3.11
    made IntEnum's str() the bare number): the text as written here; the next test compares with torch."""
    ours = [(dist.ReduceOp.SUM, "RedOpType.SUM", "<RedOpType.SUM: 0>"),
            (dist.ReduceOp.BXOR, "RedOpType.BXOR", f"<RedOpType.BXOR: {int(dist.ReduceOp.BXOR)}>"),
            (dist.DebugLevel.OFF, "DebugLevel.OFF", "<DebugLevel.OFF: 0>"),
            (dist.DebugLevel.DETAIL, "DebugLevel.DETAIL", "<DebugLevel.DETAIL: 2>")]
    for member, text, rep in ours:
        assert (str(member), f"{member}", repr(member)) == (text, text, rep)
    assert dist.ReduceOp.SUM == 0 and dist.ReduceOp("sum") is dist.ReduceOp.SUM   # still an int


def test_reduce_op_and_debug_level_text_equals_torchs():
    tdist = pytest.importorskip("torch.distributed")
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        t, p = getattr(tdist.ReduceOp, name), getattr(dist.ReduceOp, name)
        assert (str(p), f"{p}", repr(p)) == (str(t), f"{t}", repr(t)), name
    for name in ("OFF", "INFO", "DETAIL"):
        t, p = getattr(tdist.DebugLevel, name), getattr(dist.DebugLevel, name)
        assert (str(p), f"{p}", repr(p)) == (str(t), f"{t}", repr(t)), name


def _groups(rank, world_size):
    ws = world_size
    out = {"pg_count0": dist.get_pg_count()}
    g = dist.new_group([ws - 1, 0], sort_ranks=False)
    out["unsorted"] = dist.get_process_group_ranks(g) if g is not dist.GroupMember.NON_GROUP_MEMBER \
        else None
    out["unsorted_rank"] = dist.get_rank(g)
    g0 = dist.new_group([0])
    out["ranks0"] = dist.get_process_group_ranks(g0)
    out["global0"] = dist.get_global_rank(g0, 0)
    out["group_rank0"] = dist.get_group_rank(g0, 0)
    try:
        dist.get_global_rank(g0, 5)
    except ValueError as e:
        out["bad"] = "Group rank 5 is not part of group" in str(e)
    out["pg_count"] = dist.get_pg_count()
    out["sorted"] = dist.get_process_group_ranks(dist.new_group([ws - 1, 0]))
    a = np.array([float(rank)])
    if g is not dist.GroupMember.NON_GROUP_MEMBER:
        dist.all_reduce(a, group=g)
    out["sum"] = float(a[0])
    dist.barrier(timeout=td(seconds=30))
    return out


@pytest.mark.parametrize("ws", [2, 3])
def test_group_queries_on_non_members_and_sort_ranks(ws):
    res = run(_groups, ws)
    for rank, out in enumerate(res):
        assert out["pg_count0"] == 1
        assert out["ranks0"] == [0] and out["global0"] == 0 and out["group_rank0"] == 0
        assert out["bad"] is True
        assert out["pg_count"] == 3
        assert out["sorted"] == [0, ws - 1]
        if rank in (0, ws - 1):
            assert out["unsorted"] == [ws - 1, 0]
            assert out["unsorted_rank"] == (1 if rank == 0 else 0)
            assert out["sum"] == ws - 1
        else:
            assert out["unsorted_rank"] == -1


def _barrier_timeout(rank, world_size):
    if rank == 1:
        time.sleep(4)
        return None
    t0 = time.monotonic()
    try:
        dist.barrier(timeout=td(seconds=1))
    except Exception as e:
        return type(e).__name__, time.monotonic() - t0
    return None, time.monotonic() - t0


def test_barrier_timeout_raises_after_the_timeout():
    outs = run_outcomes(_barrier_timeout, 2, timeout=60, env={"PYDDP_EXIT_TIMEOUT": "0"})
    kind, took = outs[0].value
    assert kind is not None and issubclass(getattr(dist, kind, RuntimeError), RuntimeError)
    assert took < 3.5


# -------------------------------------------------------------------------- exit, DataLoader

def _exit_no_wait(rank, world_size):
    dist.init_process_group("cpu")
    dist.barrier()
    if rank == 1:
        time.sleep(4)
    t0 = time.monotonic()
    dist.destroy_process_group()
    return time.monotonic() - t0


@FULL
def test_exit_timeout_zero_does_not_wait_for_the_peer():
    took = run(_exit_no_wait, 2, init=False, env={"PYDDP_EXIT_TIMEOUT": "0"}, timeout=60)
    assert took[0] < 2.0


class _Slow:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(8)
        return np.zeros(2)


@FULL
def test_dataloader_timeout_raises_at_the_timeout():
    from pyddp.utils.data import DataLoader

    it = iter(DataLoader(_Slow(), batch_size=1, num_workers=1, timeout=1))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
        next(it)
    assert time.monotonic() - t0 < 2.5
    it._shutdown_workers()


def test_exit_timeout_values(monkeypatch):
    from pyddp.distributed.distributed_c10d import _exit_timeout

    monkeypatch.delenv("PYDDP_EXIT_TIMEOUT", raising=False)
    assert _exit_timeout(5.0) == 5.0
    for raw, want in (("0", 0.0), ("2.5", 2.5), (" ", 5.0)):
        monkeypatch.setenv("PYDDP_EXIT_TIMEOUT", raw)
        assert _exit_timeout(5.0) == want, raw
    for raw in ("-1", "soon", "nan", "inf"):
        monkeypatch.setenv("PYDDP_EXIT_TIMEOUT", raw)
        with pytest.warns(RuntimeWarning, match="PYDDP_EXIT_TIMEOUT"):
            assert _exit_timeout(5.0) == 5.0, raw
