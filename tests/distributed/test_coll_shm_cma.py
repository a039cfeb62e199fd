"""Single copies between the ranks (cross-memory attach, process_vm_readv/writev) for large
shared-memory collectives: every collective against NumPy at sizes across the threshold, odd sizes
and views at byte offsets 1..7, with the single-copy path forced on (PYDDP_CMA_THRESHOLD=0) and off
(PYDDP_CMA=0); and a rank killed during a large transfer named on the survivors within seconds.
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


def _pg():
    return dist.distributed_c10d._default_pg()


def _view(n, dt, off, fill):
    """n elements of dtype dt starting off bytes into a fresh byte buffer (unaligned for off % size)."""
    raw = np.zeros(n * np.dtype(dt).itemsize + off + 8, np.uint8)
    v = raw[off:off + n * np.dtype(dt).itemsize].view(dt)
    v[...] = fill
    return v


def _inp(r, n, dt, salt):
    return ((np.arange(n) * (r + 3) + salt) % 11).astype(dt)


def _every_collective_child(rank, ws, want_single_copy, counts):
    assert _pg()._transport == "shm"
    assert _pg()._single_copy == want_single_copy
    checks = 0
    for i, count in enumerate(counts):
        off = i % 8  # byte offsets 0..7
        for dt in (np.float32, np.int64, np.float16) if i % 2 == 0 else (np.float64, np.uint8):
            acc = np.float32 if dt == np.float16 else dt
            if dt == np.uint8:
                acc = np.int64
            root = (i + 1) % ws
            x = _view(count, dt, off, _inp(rank, count, dt, 0))
            dist.all_reduce(x)
            want = sum(_inp(r, count, dt, 0).astype(acc) for r in range(ws)).astype(dt)
            assert np.array_equal(x, want), ("all_reduce", count, dt, off)
            # out of place through the MAX op into another view
            x = _view(count, dt, (off + 3) % 8, _inp(rank, count, dt, 1))
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            assert np.array_equal(x, np.max([_inp(r, count, dt, 1) for r in range(ws)], axis=0))
            x = _view(count, dt, off, _inp(rank, count, dt, 2))
            dist.reduce(x, dst=root)
            if rank == root:
                want = sum(_inp(r, count, dt, 2).astype(acc) for r in range(ws)).astype(dt)
                assert np.array_equal(x, want), ("reduce", count, dt, off)
            else:
                assert np.array_equal(x, _inp(rank, count, dt, 2)), "reduce changed a leaf's input"
            x = _view(count, dt, off, _inp(rank, count, dt, 3))
            dist.broadcast(x, src=root)
            assert np.array_equal(x, _inp(root, count, dt, 3)), ("broadcast", count, dt, off)
            out = _view(count * ws, dt, (off + 1) % 8, 99)
            dist.all_gather_into_tensor(out, _view(count, dt, off, _inp(rank, count, dt, 4)))
            assert np.array_equal(out, np.concatenate([_inp(r, count, dt, 4) for r in range(ws)]))
            outs = [_view(count, dt, (off + r) % 8, 0) for r in range(ws)]
            dist.all_gather(outs, _inp(rank, count, dt, 5))
            for r in range(ws):
                assert np.array_equal(outs[r], _inp(r, count, dt, 5)), ("all_gather list", count, dt)
            src = _view(count * ws, dt, off, _inp(rank, count * ws, dt, 6))
            out = _view(count, dt, (off + 5) % 8, 0)
            dist.reduce_scatter_tensor(out, src)
            full = sum(_inp(r, count * ws, dt, 6).astype(acc) for r in range(ws)).astype(dt)
            assert np.array_equal(out, full[rank * count:(rank + 1) * count]), ("rs", count, dt)
            g = [_view(count, dt, (off + r) % 8, 0) for r in range(ws)] if rank == root else None
            dist.gather(_view(count, dt, off, _inp(rank, count, dt, 7)), g, dst=root)
            if rank == root:
                for r in range(ws):
                    assert np.array_equal(g[r], _inp(r, count, dt, 7)), ("gather", count, dt)
            sl = [_view(count, dt, (off + r) % 8, _inp(r, count, dt, 8)) for r in range(ws)] \
                if rank == root else None
            o = _view(count, dt, off, 0)
            dist.scatter(o, sl, src=root)
            assert np.array_equal(o, _inp(rank, count, dt, 8)), ("scatter", count, dt, off)
            checks += 9
        # all_to_all with uneven blocks (some below, some above the threshold)
        sizes = [[(count * (1 + (s + 2 * d) % 3)) // 2 + s + d for d in range(ws)] for s in range(ws)]
        sends = [_view(sizes[rank][d], np.uint8, (off + d) % 8, (rank * 7 + d) % 251) for d in range(ws)]
        recvs = [_view(sizes[s][rank], np.uint8, off, 0) for s in range(ws)]
        dist.all_to_all(recvs, sends)
        for s in range(ws):
            assert np.array_equal(recvs[s], np.full(sizes[s][rank], (s * 7 + rank) % 251)), ("a2a", s)
        checks += 1
    dist.barrier()
    return checks


def _expected(counts):
    """The checks _every_collective_child makes: 9 per dtype (3 or 2 dtypes by position) + all_to_all."""
    return sum(9 * (3 if i % 2 == 0 else 2) + 1 for i in range(len(counts)))


# Sizes (elements) from empty through the bank size (256 KiB) to more than one reduction chunk in every
# dtype (2 MiB of pieces per chunk: 1 MiB each on 2 ranks, 682 KiB on 3), odd ones included.
_COUNTS = [0, 1, 7, 1000, 4097, 65_537, 100_003, 300_001, 700_001]


@pytest.mark.parametrize("ws", [2, *full(3)])
def test_every_collective_matches_numpy_with_single_copies_forced(ws):
    res = run(_every_collective_child, ws, True, _COUNTS,
              env={"PYDDP_TRANSPORT": "shm", "PYDDP_CMA": None, "PYDDP_CMA_THRESHOLD": "0"},
              timeout=200)
    assert res == [_expected(_COUNTS)] * ws, res


@FULL
def test_uneven_single_copy_shares_of_three_ranks_with_a_core_each_match_numpy():
    # with a core per rank, reduce gives its root a larger slice and gather's root reads the tail of
    # every sender's block (csrc/coll/allreduce_cma.c, gather_cma.c); this machine has 2 cores, so
    # PYDDP_TEST_SPIN=1 takes those paths with 3 ranks (every root, odd sizes, unaligned views)
    res = run(_every_collective_child, 3, True, _COUNTS,
              env={"PYDDP_TRANSPORT": "shm", "PYDDP_CMA": None, "PYDDP_CMA_THRESHOLD": "0",
                   "PYDDP_TEST_SPIN": "1"},
              timeout=300)
    assert res == [_expected(_COUNTS)] * 3, res


@FULL
def test_ranks_that_count_cores_differently_agree_on_the_shares():
    # whether the shares are uneven is agreed at attach (every rank's answer ANDed), never a rank's
    # own count: of 3 ranks on this 2-core machine one is told it has a core of its own, the others
    # count none; all take even shares
    res = run(_every_collective_child, 3, True, _COUNTS,
              env={"PYDDP_TRANSPORT": "shm", "PYDDP_CMA": None, "PYDDP_CMA_THRESHOLD": "0"},
              rank_env={0: {"PYDDP_TEST_SPIN": "1"}}, timeout=300)
    assert res == [_expected(_COUNTS)] * 3, res


def test_every_collective_matches_numpy_with_single_copies_off():
    counts = _COUNTS[::2] + [300_001]
    res = run(_every_collective_child, 2, False, counts,
              env={"PYDDP_TRANSPORT": "shm", "PYDDP_CMA": "0", "PYDDP_CMA_THRESHOLD": "0"},
              timeout=200)
    assert res == [_expected(counts)] * 2, res


@pytest.mark.parametrize("ws", [2, *full(3)])
def test_the_default_thresholds_mix_both_paths(ws):
    # unset: each collective's own threshold (all_reduce from 32 MiB, gather and scatter from 16 MiB
    # blocks, the others always the banks), in one job
    counts = [100, 70_000, 1 << 20]
    res = run(_every_collective_child, ws, True, counts,
              env={"PYDDP_TRANSPORT": "shm", "PYDDP_CMA": None, "PYDDP_CMA_THRESHOLD": None},
              timeout=200)
    assert res == [_expected(counts)] * ws, res


def _killed_child(rank, ws, kind):
    a = np.ones(16 << 20, np.float32)  # 64 MiB: each transfer takes milliseconds
    out = [np.zeros_like(a) for _ in range(ws)]
    dist.all_reduce(a[:1000])
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    t = time.monotonic()
    try:
        for _ in range(10_000):
            if kind == "broadcast":
                dist.broadcast(a, src=0)
            elif kind == "all_reduce":
                dist.all_reduce(a)
            else:
                dist.all_gather(out, a)
    except dist.DistError as e:
        return time.monotonic() - t, str(e)
    return None


@FULL
@pytest.mark.parametrize("kind", [*full("broadcast"), "all_reduce", *full("all_gather")])
def test_a_rank_killed_during_single_copies_is_named_within_seconds(kind):
    outs = run_outcomes(_killed_child, 3, kind,
                        env={"PYDDP_TRANSPORT": "shm", "PYDDP_CMA": None, "PYDDP_CMA_THRESHOLD": "1M"},
                        init_kwargs={"timeout": __import__("datetime").timedelta(seconds=60)},
                        timeout=90, expect_death=(1,))
    for o in outs:
        if o.rank == 1:
            continue
        assert o.ok, o
        assert o.value is not None, f"{kind} kept working without rank 1"
        elapsed, msg = o.value
        assert elapsed < 6.0, o.value
        assert "rank 1" in msg, msg


def _threshold_mismatch_child(rank, ws):
    a = np.ones(1 << 18, np.float32)  # 1 MiB: single copies on one rank, the banks on the other
    try:
        dist.broadcast(a, src=0)
    except dist.DistError as e:
        return str(e)
    return None


def test_ranks_with_different_thresholds_fail_clearly_instead_of_misreading_a_bank():
    outs = run_outcomes(_threshold_mismatch_child, 2,
                        env={"PYDDP_TRANSPORT": "shm", "PYDDP_CMA": None},
                        rank_env={0: {"PYDDP_CMA_THRESHOLD": "64K"}, 1: {"PYDDP_CMA_THRESHOLD": "4M"}},
                        timeout=60)
    for o in outs:
        assert o.ok, o
        assert o.value is not None and "PYDDP_CMA_THRESHOLD" in o.value, o.value


def _fallback_child(rank, ws):
    pg = _pg()
    x = np.arange(1 << 20, dtype=np.float32) + rank
    dist.all_reduce(x)
    want = sum(np.arange(1 << 20, dtype=np.float32) + r for r in range(ws))
    return pg._transport, pg._single_copy, bool(np.array_equal(x, want))


def test_a_rank_whose_kernel_refuses_makes_every_rank_fall_back_to_the_banks():
    # rank 1's probe fails as under Yama's ptrace_scope: every rank uses the banks, and says so at INFO
    outs = run(_fallback_child, 3, env={"PYDDP_TRANSPORT": "shm", "PYDDP_CMA": None,
                                         "PYDDP_CMA_THRESHOLD": "0"},
               rank_env={1: {"PYDDP_TEST_CMA_FAIL": "EPERM"}})
    assert outs == [("shm", False, True)] * 3, outs


def test_ranks_forked_after_the_parent_read_the_threshold_read_their_own():
    """The C core reads PYDDP_CMA_THRESHOLD once per process; a process forked after its parent read
    it (this harness forks every rank from pytest) must read its own environment again, or two ranks
    told different thresholds would silently agree on the parent's (a rule the mismatch check exists
    for).  The parent reads it here through a one-rank group's rules."""
    import pyddp.distributed as dist
    from pyddp.distributed.distributed_c10d import _world

    dist.init_process_group("cpu", store=dist.HashStore(), rank=0, world_size=1)
    try:
        _world.default_pg._cpg.rules  # noqa: B018 (reads the threshold in this process)
    finally:
        dist.destroy_process_group()
    test_ranks_with_different_thresholds_fail_clearly_instead_of_misreading_a_bank()

