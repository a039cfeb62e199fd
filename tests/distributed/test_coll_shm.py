"""The shared-memory transport: chosen for ranks on one host, every collective through it checked
against NumPy (with tiny banks, so every multi-round path runs), shared-memory buffers, nothing left in
/dev/shm after a normal exit, an exception or SIGKILL, and a dead peer found within 5 seconds.

tests/distributed/test_coll_cpu.py runs its whole matrix under both transports; this file covers what is
specific to shared memory.
"""
import os
import signal
import time

import numpy as np
import pytest

import pyddp.distributed as dist
from _mp import run, run_outcomes
from _tiers import FULL, full

pytestmark = pytest.mark.timeout(240)

SHM_DIR = "/dev/shm"


def _segments():
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith("pyddp.")}
    except FileNotFoundError:
        return set()


def _transport_child(rank, ws):
    return dist.distributed_c10d._default_pg()._transport


def test_ranks_on_one_host_use_shared_memory_and_tcp_can_be_forced():
    assert run(_transport_child, 2, env={"PYDDP_TRANSPORT": None}) == ["shm", "shm"]
    assert run(_transport_child, 2, env={"PYDDP_TRANSPORT": "tcp"}) == ["tcp", "tcp"]
    assert run(_transport_child, 3, env={"PYDDP_TRANSPORT": "shm"}) == ["shm"] * 3


def test_ranks_on_different_hosts_use_tcp_and_forcing_shm_fails_clearly():
    # PYDDP_NODE_ID stands for the host identity (hostname + boot id)
    res = run(_transport_child, 2, env={"PYDDP_TRANSPORT": None},
              rank_env={0: {"PYDDP_NODE_ID": "hostA"}, 1: {"PYDDP_NODE_ID": "hostB"}})
    assert res == ["tcp", "tcp"]
    outs = run_outcomes(_transport_child, 2, env={"PYDDP_TRANSPORT": "shm"},
                        rank_env={0: {"PYDDP_NODE_ID": "hostA"}, 1: {"PYDDP_NODE_ID": "hostB"}},
                        timeout=60)
    for o in outs:
        assert not o.ok, o
        assert "PYDDP_TRANSPORT=shm" in o.message and "host" in o.message, o.message


def _every_collective_child(rank, ws, seed, transport="shm"):
    """Every collective at sizes around the bank size, float32/float64/int32/float16."""
    assert dist.distributed_c10d._default_pg()._transport == transport
    rng = np.random.default_rng(seed)
    checks = 0
    for count in [0, 1, 7, 100, 1023, 1024, 1025, 3000, 5000, 20011]:
        for dt in (np.float32, np.float64, np.int32, np.float16):
            acc = np.float32 if dt == np.float16 else dt

            def inp(r, n=count, salt=0):
                return ((np.arange(n) * (r + 3) + salt) % 11).astype(dt)

            # all_reduce, every rank's input known to every rank
            x = inp(rank)
            dist.all_reduce(x)
            want = sum(inp(r).astype(acc) for r in range(ws)).astype(dt)
            assert np.array_equal(x, want), ("all_reduce", count, dt)
            # AVG / MAX
            if dt != np.int32:
                x = inp(rank)
                dist.all_reduce(x, op=dist.ReduceOp.AVG)
                want = (sum(inp(r).astype(np.float64) for r in range(ws)) / ws).astype(dt)
                assert np.allclose(x.astype(np.float64), want.astype(np.float64), rtol=1e-3), "avg"
            x = inp(rank)
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            assert np.array_equal(x, np.max([inp(r) for r in range(ws)], axis=0)), "max"
            # reduce to a random root
            root = int(rng.integers(ws))
            x = inp(rank, salt=1)
            dist.reduce(x, dst=root)
            if rank == root:
                want = sum(inp(r, salt=1).astype(acc) for r in range(ws)).astype(dt)
                assert np.array_equal(x, want), ("reduce", count, dt)
            # broadcast
            x = inp(rank, salt=2)
            dist.broadcast(x, src=root)
            assert np.array_equal(x, inp(root, salt=2)), ("broadcast", count, dt)
            # all_gather (tensor and list forms)
            out = np.full(count * ws, 99, dt)
            dist.all_gather_into_tensor(out, inp(rank, salt=3))
            assert np.array_equal(out, np.concatenate([inp(r, salt=3) for r in range(ws)])), "ag"
            outs = [np.zeros(count, dt) for _ in range(ws)]
            dist.all_gather(outs, inp(rank, salt=4))
            for r in range(ws):
                assert np.array_equal(outs[r], inp(r, salt=4)), "all_gather list"
            # reduce_scatter
            src = inp(rank, count * ws, salt=5)
            out = np.zeros(count, dt)
            dist.reduce_scatter_tensor(out, src)
            full = sum(inp(r, count * ws, salt=5).astype(acc) for r in range(ws)).astype(dt)
            assert np.array_equal(out, full[rank * count:(rank + 1) * count]), ("rs", count, dt)
            # gather / scatter
            g = [np.zeros(count, dt) for _ in range(ws)] if rank == root else None
            dist.gather(inp(rank, salt=6), g, dst=root)
            if rank == root:
                for r in range(ws):
                    assert np.array_equal(g[r], inp(r, salt=6)), "gather"
            sl = [inp(r, salt=7) for r in range(ws)] if rank == root else None
            o = np.zeros(count, dt)
            dist.scatter(o, sl, src=root)
            assert np.array_equal(o, inp(rank, salt=7)), "scatter"
            checks += 9
        # all_to_all with uneven splits (bytes per pair differ)
        splits = [(count + 3 * r + 5 * rank) % 17 + count // 3 for r in range(ws)]
        sends = [np.full(splits[r], rank * 100 + r, np.int64) for r in range(ws)]
        recv_sizes = [(count + 3 * rank + 5 * r) % 17 + count // 3 for r in range(ws)]
        recvs = [np.zeros(recv_sizes[r], np.int64) for r in range(ws)]
        dist.all_to_all(recvs, sends)
        for r in range(ws):
            assert np.array_equal(recvs[r], np.full(recv_sizes[r], r * 100 + rank)), "a2a"
        dist.barrier()
        checks += 1
    return checks


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_every_collective_matches_numpy_with_tiny_banks(ws):
    # 4 KiB banks: every size above a few hundred elements takes many rounds
    res = run(_every_collective_child, ws, 7, env={"PYDDP_TRANSPORT": "shm", "PYDDP_SHM_CHUNK": "4096"},
              timeout=200)
    assert all(r > 300 for r in res), res


def _p2p_child(rank, ws):
    """send/recv between every pair, any-source receives, sizes beyond the ring."""
    for count in (0, 1, 1000, 70_000, 300_001):
        for peer in range(ws):
            if peer == rank:
                continue
            if rank < peer:
                dist.send(np.arange(count, dtype=np.float64) + rank, dst=peer, tag=count % 5)
                buf = np.zeros(count)
                dist.recv(buf, src=peer, tag=count % 5)
            else:
                buf = np.zeros(count)
                dist.recv(buf, src=peer, tag=count % 5)
                dist.send(np.arange(count, dtype=np.float64) + rank, dst=peer, tag=count % 5)
            assert np.array_equal(buf, np.arange(count, dtype=np.float64) + peer), (count, peer)
        # rank 0 receives from anyone
        if rank == 0:
            got = set()
            for _ in range(ws - 1):
                buf = np.zeros(count + 1)
                src = dist.recv(buf, tag=9)
                assert np.array_equal(buf, np.full(count + 1, src)), src
                got.add(src)
            assert got == set(range(1, ws))
        else:
            dist.send(np.full(count + 1, rank, np.float64), dst=0, tag=9)
    return True


@pytest.mark.parametrize("ws", [2, 3])
def test_send_recv_through_shared_memory_rings(ws):
    assert run(_p2p_child, ws, env={"PYDDP_TRANSPORT": "shm"}) == [True] * ws


def _sender_leaves_child(rank, ws):
    """Messages sent before the sender destroyed its group are still received."""
    dist.init_process_group("cpu")
    if rank == 1:
        for i in range(5):
            dist.send(np.full(i * 1000, i, np.float32), dst=0, tag=i)
        dist.destroy_process_group()
        return True
    time.sleep(1.0)  # rank 1 has gone by now
    for i in (3, 0, 4, 1, 2):
        buf = np.zeros(i * 1000, np.float32)
        dist.recv(buf, src=1, tag=i)
        assert np.array_equal(buf, np.full(i * 1000, i, np.float32)), i
    buf = np.zeros(1, np.float32)
    try:
        dist.recv(buf, src=1)
    except dist.DistError as e:
        return str(e)
    finally:
        dist.destroy_process_group()
    return None


def test_messages_from_a_rank_that_left_can_still_be_received():
    res = run(_sender_leaves_child, 2, init=False, env={"PYDDP_TRANSPORT": "shm"})
    assert res[1] is True
    assert res[0] and "rank 1" in res[0] and "left" in res[0], res


def _mixed_child(rank, ws):
    assert dist.distributed_c10d._default_pg()._transport == "shm+tcp"
    _p2p_child(rank, ws)
    return _every_collective_child(rank, ws, 3, "shm+tcp")


def test_a_group_spanning_hosts_uses_shm_inside_each_host_and_tcp_between():
    # two "hosts" (PYDDP_NODE_ID) of two ranks each: frames between ranks of one host go through
    # shared-memory rings, between hosts through TCP; results equal NumPy's
    res = run(_mixed_child, 4, env={"PYDDP_TRANSPORT": None},
              rank_env={r: {"PYDDP_NODE_ID": f"host{r % 2}"} for r in range(4)}, timeout=200)
    assert all(r > 300 for r in res), res


def _shared_array_child(rank, ws):
    n = 300_001
    a = dist._shared_array(n, np.float32)
    assert a.shape == (n,) and a.dtype == np.float32 and a.flags.writeable
    out = []
    for it in range(3):
        a[:] = (np.arange(n) % 13 + rank + it).astype(np.float32)
        dist.all_reduce(a)
        want = sum((np.arange(n) % 13 + r + it).astype(np.float32) for r in range(ws))
        assert np.array_equal(a, want)
        # a contiguous slice at the same offset on every rank, AVG
        a[1000:2000] = rank
        dist.all_reduce(a[1000:2000], op=dist.ReduceOp.AVG)
        assert np.allclose(a[1000:2000], (ws - 1) / 2)
        out.append(float(a[5]))
    b = dist._shared_array((4, 5), np.float64)
    b[:] = rank + 1
    dist.all_reduce(b, op=dist.ReduceOp.PRODUCT)
    assert np.array_equal(b, np.full((4, 5), float(np.prod(np.arange(1, ws + 1)))))
    del a, b
    # a private array after shared ones were released
    c = np.ones(10)
    dist.all_reduce(c)
    assert np.array_equal(c, np.full(10, ws))
    return out


@pytest.mark.parametrize("ws", [2, 3])
def test_shared_arrays_allreduce_in_place_without_copy_in(ws):
    run(_shared_array_child, ws, env={"PYDDP_TRANSPORT": "shm"})


def _all_reduce_into_child(rank, ws, transport):
    """_all_reduce_into (DDP's buckets): the result lands in another array, from a shared buffer
    (read in place) or a private one; sizes of one and of many rounds; float16 through float32."""
    from pyddp.distributed import distributed_c10d as c10d

    checked = 0
    for n in (1, 7, 1000, 300_001):
        for dt in (np.float32, np.float64, np.float16):
            for shared in (True, False):
                if shared and transport == "tcp":
                    continue
                src = dist._shared_array((n,), dtype=dt) if shared else np.empty(n, dt)
                vals = [np.random.default_rng(r).integers(-5, 5, n).astype(dt) for r in range(ws)]
                for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                    src[...] = vals[rank]
                    dst = np.full(n, 99, dt)
                    work = c10d._all_reduce_into(src, dst, op=op, async_op=(n == 7))
                    if work is not None:
                        work.wait()
                    want = np.sum(np.array(vals, np.float64), 0)
                    if op == dist.ReduceOp.AVG:
                        want /= ws
                    np.testing.assert_allclose(dst.astype(np.float64), want, rtol=1e-3)
                    checked += 1
                del src
    bad = []
    for args in ((np.ones(4, np.float32), np.ones(5, np.float32)),
                 (np.ones(4, np.float32), np.ones(4, np.float64))):
        try:
            c10d._all_reduce_into(*args)
        except ValueError as e:
            bad.append("dst must match" in str(e))
    a = np.ones(8, np.float32)
    try:
        c10d._all_reduce_into(a[:4], a[2:6])
    except ValueError as e:
        bad.append("overlap" in str(e))
    return checked, bad


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_all_reduce_into_another_array_matches_numpy(transport):
    for checked, bad in run(_all_reduce_into_child, 3, transport, env={"PYDDP_TRANSPORT": transport},
                            timeout=120):
        assert checked == (48 if transport == "shm" else 24) and bad == [True, True, True]


def _shared_offset_mismatch_child(rank, ws):
    a = dist._shared_array(1000, np.float32)
    a[:] = 1
    try:
        dist.all_reduce(a[100 * rank:100 * rank + 100])
    except dist.DistError as e:
        return str(e)
    return None


def test_shared_array_slices_at_different_offsets_are_a_mismatch():
    res = run(_shared_offset_mismatch_child, 2, env={"PYDDP_TRANSPORT": "shm"})
    for msg in res:
        assert msg is not None and "mismatch" in msg, res


def _shared_array_tcp_child(rank, ws):
    try:
        dist._shared_array(10)
    except ValueError as e:
        return str(e)
    return None


def test_shared_array_needs_a_shared_memory_group():
    res = run(_shared_array_tcp_child, 2, env={"PYDDP_TRANSPORT": "tcp"})
    assert all(m and "shared-memory" in m for m in res), res


# ------------------------------------------------------------------ /dev/shm stays clean


def _listing_child(rank, ws, mode):
    a = np.ones(1000)
    dist.all_reduce(a)
    buf = dist._shared_array(1 << 16)
    buf[:] = 1
    dist.all_reduce(buf)
    left = sorted(n for n in os.listdir(SHM_DIR) if n.startswith("pyddp."))
    if mode == "raise":
        raise RuntimeError("user code failed")
    if mode == "kill" and rank == ws - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "kill":
        try:
            dist.all_reduce(np.ones(10))
        except dist.DistError:
            pass
    return left


def _three_rank_jobs(names):
    """The names of jobs of three ranks or more (a segment of rank 2 under the same job token): a
    test running beside this one (pytest -n) may have a job of two ranks whose segments exist for
    a moment."""
    def rank(name):  # pyddp.TOKEN.NODE.RANK (a rank's segment), pyddp.TOKEN.RANK.bID (an array's)
        parts = name.split(".")
        return parts[2] if parts[-1].startswith("b") else parts[-1]

    names = set(names)
    jobs = {n.split(".")[1] for n in names if n.count(".") >= 3 and rank(n) == "2"}
    return {n for n in names if n.split(".")[1] in jobs}


@pytest.mark.parametrize("mode", ["normal", "raise", *full("kill")])
def test_nothing_is_left_in_dev_shm(mode):
    before = _segments()
    outs = run_outcomes(_listing_child, 3, mode, env={"PYDDP_TRANSPORT": "shm"}, timeout=60,
                        expect_death=(2,) if mode == "kill" else ())
    for o in outs:
        if mode == "normal" or (mode == "kill" and o.rank != 2):
            assert o.ok, o
            # segments are unlinked once every rank mapped them: none visible while running
            # (besides any another, earlier run left behind before this test began)
            assert sorted(_three_rank_jobs(set(o.value) - before)) == [], o.value
        if mode == "raise":
            assert not o.ok and "user code failed" in o.message, o
    time.sleep(0.2)
    assert _three_rank_jobs(_segments() - before) == set()


def _allreduce_once(rank, ws):
    a = np.ones(10)
    dist.all_reduce(a)
    return float(a[0])


def test_a_segment_left_by_a_job_killed_during_start_up_is_removed():
    # every rank of a job SIGKILLed between creating its segment and unlinking it leaves the file;
    # the next group on the host removes it when its creator is gone (here: empty and old)
    import secrets

    name = f"pyddp.{secrets.token_hex(8)}.0000abcd.0"
    path = os.path.join(SHM_DIR, name)
    open(path, "wb").close()
    old = time.time() - 60
    os.utime(path, (old, old))
    try:
        assert run(_allreduce_once, 2, env={"PYDDP_TRANSPORT": "shm"}) == [2.0, 2.0]
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


# ------------------------------------------------------------------------------ dead peers


def _dead_peer_child(rank, ws, count):
    a = np.ones(count, np.float32)
    dist.all_reduce(a)
    if rank == 1:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    t = time.monotonic()
    try:
        for _ in range(1000):
            dist.all_reduce(a)
    except dist.DistError as e:
        return time.monotonic() - t, type(e).__name__, str(e)
    return None


@FULL
@pytest.mark.parametrize("count", [16, *full(4 << 20)])
def test_a_killed_peer_is_detected_within_five_seconds(count):
    outs = run_outcomes(_dead_peer_child, 3, count, env={"PYDDP_TRANSPORT": "shm"},
                        init_kwargs={"timeout": __import__("datetime").timedelta(seconds=60)},
                        timeout=60, expect_death=(1,))
    for o in outs:
        if o.rank == 1:
            continue
        assert o.ok, o
        assert o.value is not None, "all_reduce kept working without rank 1"
        elapsed, name, msg = o.value
        assert elapsed < 5.0, o.value
        assert "1" in msg, msg


# ------------------------------------------------------------------------- ordering, errors


def _order_child(rank, ws):
    arrays = [np.full(5000, i + rank, np.float64) for i in range(6)]
    works = [dist.all_reduce(a, async_op=True) for a in arrays[:5]]
    small = np.full(3, rank, np.float64)
    dist.all_reduce(small)  # must not overtake the queued ones
    dist.all_reduce(arrays[5])
    for w in works:
        w.wait(timeout=60)
    for i, a in enumerate(arrays):
        assert np.array_equal(a, np.full(5000, ws * i + ws * (ws - 1) / 2)), i
    assert np.array_equal(small, np.full(3, ws * (ws - 1) / 2))
    return True


def test_blocking_calls_keep_their_place_after_async_work():
    assert run(_order_child, 3, env={"PYDDP_TRANSPORT": "shm"}) == [True] * 3


def _mismatch_child(rank, ws):
    a = np.ones(10, np.float32)
    try:
        if rank == 0:
            dist.all_reduce(a)
        else:
            dist.broadcast(a, src=0)
    except dist.DistError as e:
        return str(e)
    return None


def test_different_collectives_raise_a_mismatch_on_every_rank():
    res = run(_mismatch_child, 2, env={"PYDDP_TRANSPORT": "shm"})
    for msg in res:
        assert msg and "mismatch" in msg and "all_reduce" in msg and "broadcast" in msg, res



def _eager_root_mismatch_child(rank, ws, kind):
    """With 3+ ranks a broadcast's or scatter's root publishes and returns at once (as Open MPI's
    eager root does): the ranks that read its data check its identity in the call, and every rank
    checks everybody's when it enters its next collective."""
    a = np.ones(10, np.float32)
    out = {}
    try:
        if rank == 2:
            dist.all_reduce(a)
        elif kind == "broadcast":
            dist.broadcast(a, src=0)
        else:
            dist.scatter(a, [np.full(10, i, np.float32) for i in range(ws)] if rank == 0 else None, src=0)
        out["first"] = None
    except dist.DistError as e:
        out["first"] = str(e)
    if out["first"] is None:
        try:
            dist.barrier()
            out["next"] = None
        except dist.DistError as e:
            out["next"] = str(e)
    return out


@pytest.mark.parametrize("kind", ["broadcast", "scatter"])
def test_an_eager_root_reports_a_mismatch_at_its_next_collective(kind):
    res = run(_eager_root_mismatch_child, 3, kind, env={"PYDDP_TRANSPORT": "shm"}, timeout=60)
    for rank, r in enumerate(res):
        msg = r["first"] or r.get("next")
        assert msg and "mismatch" in msg and "all_reduce" in msg and kind in msg, (rank, res)
    # the rank that called something else raises in the call itself (it reads the root's identity)
    assert res[2]["first"], res

def _destroy_during_inline_child(rank, ws):
    """destroy_process_group from another thread while a collective waits on this one."""
    import threading

    if rank == 1:
        time.sleep(3.0)  # never joins the all_reduce in time
        return "late"
    box = {}

    def waiter():
        try:
            dist.all_reduce(np.ones(10))
            box["r"] = "returned"
        except dist.DistError as e:
            box["r"] = str(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    dist.destroy_process_group()
    t.join(10)
    assert not t.is_alive(), "the waiting all_reduce did not return"
    assert time.monotonic() - t0 < 5
    return box["r"]


def test_destroying_the_group_while_another_thread_waits_in_a_collective():
    outs = run_outcomes(_destroy_during_inline_child, 2, init=True,
                        env={"PYDDP_TRANSPORT": "shm"}, timeout=60)
    assert outs[0].ok, outs[0].describe()
    assert "destroyed" in outs[0].value, outs[0].value


def _peer_leaves_child(rank, ws, count):
    if rank == 1:
        dist.destroy_process_group()  # leaves cleanly without joining the all_reduce
        return None
    t = time.monotonic()
    try:
        dist.all_reduce(np.ones(count, np.float32))
    except dist.DistError as e:
        return time.monotonic() - t, type(e).__name__, str(e)
    return "returned"


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("count", [10, 1 << 20])
def test_a_peer_that_left_fails_the_collective_at_once(transport, count):
    outs = run_outcomes(_peer_leaves_child, 2, count, env={"PYDDP_TRANSPORT": transport},
                        init_kwargs={"timeout": __import__("datetime").timedelta(seconds=60)},
                        timeout=60)
    assert outs[0].ok, outs[0].describe()
    elapsed, name, msg = outs[0].value
    assert elapsed < 5 and name == "DistNetworkError", outs[0].value
    assert "rank 1" in msg and "destroyed its process group" in msg, msg


def _bank_child(rank, ws):
    return dist.distributed_c10d._default_pg()._cpg.bank_bytes


def test_bank_size_follows_the_cores_unless_set():
    # 1 MiB banks where every rank of the host has a core of its own, 256 KiB where ranks
    # share cores (smaller rounds let one rank copy while another waits for the scheduler);
    # PYDDP_SHM_CHUNK overrides both
    from pyddp import _threads

    cores = _threads.cores()
    for ws in (2, 4):
        want = (1 << 20) if ws <= cores else (256 << 10)
        assert run(_bank_child, ws, env={"PYDDP_TRANSPORT": "shm", "PYDDP_SHM_CHUNK": None}) == [want] * ws
    assert run(_bank_child, 3, env={"PYDDP_TRANSPORT": "shm", "PYDDP_SHM_CHUNK": "64K"}) == [64 << 10] * 3
    # agreed at attach, never a rank's own count: one rank told it has a core of its own, the
    # others counting the cores as they are, all take the others' size
    # (more ranks than cores: on a machine of up to 8)
    ws = cores + 1
    if ws <= 9:
        assert run(_bank_child, ws, env={"PYDDP_TRANSPORT": "shm", "PYDDP_SHM_CHUNK": None},
                   rank_env={0: {"PYDDP_TEST_SPIN": "1"}}) == [256 << 10] * ws


def test_ranks_with_different_bank_sizes_fail_naming_the_variable():
    outs = run_outcomes(_bank_child, 2, env={"PYDDP_TRANSPORT": "shm"},
                        rank_env={0: {"PYDDP_SHM_CHUNK": "64K"}, 1: {"PYDDP_SHM_CHUNK": "128K"}},
                        timeout=60)
    assert not all(o.ok for o in outs), outs
    assert any("PYDDP_SHM_CHUNK" in o.message for o in outs), [o.message for o in outs]
