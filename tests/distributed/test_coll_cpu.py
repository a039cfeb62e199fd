"""Collectives on the cpu backend, 2, 3 and 4 real processes, against NumPy references.

Each test launches one set of processes; the loops over dtypes x ops x sizes run inside the children
(tests/_ref.py computes the expected values with NumPy from every rank's deterministic input).
"""
import gc
import hashlib
import importlib.util
import time
import weakref
from datetime import timedelta

import numpy as np
import pytest

import pyddp.distributed as dist
from _mp import run, run_outcomes
from _tiers import FULL, full
from _ref import (DTYPE_NAMES, LARGE_DTYPE_NAMES, OPS, SMALL_SIZES, Checker, assert_clean, dtype,
                  garbage, input_kind, kind, large_count, mismatch, op_error, op_valid, rank_input,
                  reduce_ref, same_bytes)

pytestmark = pytest.mark.timeout(240)

# quick tier: 2 and 3 ranks (3: uneven splits, rings that do not pair up); --full adds 4 (the 2-core
# machine oversubscribed) and the large arrays at 3 and 4 ranks
WORLD_SIZES = [2, 3, *full(4)]
WS_WHICH = [pytest.param(ws, which, id=f"{ws}-{which}",
                         marks=FULL if ws == 4 or (ws == 3 and which == "large") else ())
            for ws in (2, 3, 4) for which in ("small", "large")]


@pytest.fixture(autouse=True, params=["shm", "tcp"])
def transport(request, monkeypatch):
    """Every test runs over shared memory (ranks on one host) and over TCP (forced)."""
    monkeypatch.setenv("PYDDP_TRANSPORT", request.param)
    return request.param


def _op(name):
    return getattr(dist.ReduceOp, name)


def _none(ret):
    if ret is not None:
        raise AssertionError(f"a call without async_op returned {ret!r}, not None")


def _sizes(which, name):
    return SMALL_SIZES if which == "small" else [large_count(name)]


def _dtypes(which):
    return DTYPE_NAMES if which == "small" else LARGE_DTYPE_NAMES


def _inputs(name, n, ws, ikind, base=0):
    return [rank_input(name, n, base + r, ikind) for r in range(ws)]


# ----------------------------------------------------------------------------------------------
# all_reduce / reduce / broadcast


def _all_reduce_child(rank, ws, which):
    ck = Checker(rank)
    for name in DTYPE_NAMES:
        for op in OPS:
            if not op_valid(name, op):
                continue
            for n in _sizes(which, name):
                ins = _inputs(name, n, ws, input_kind(name, op))
                want = reduce_ref(ins, op, name)
                a = ins[rank].copy()
                label = f"all_reduce {name} {op} n={n}"
                if ck.call(label, lambda: _none(dist.all_reduce(a, op=_op(op)))):
                    ck.expect(label, mismatch(a, want, name, exact=(op != "AVG")))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_all_reduce_every_dtype_and_op_matches_numpy_small_sizes(ws):
    assert_clean(run(_all_reduce_child, ws, "small"), min_checks=300)


@FULL     # large arrays at 2 ranks: the other kinds' large cases in the quick tier
@pytest.mark.parametrize("ws", [2, 3, 4])
def test_all_reduce_every_dtype_and_op_matches_numpy_3mib(ws):
    # every dtype (not only the large subset): the large-message algorithm's chunking per element size
    assert_clean(run(_all_reduce_child, ws, "large", timeout=200), min_checks=70)


def _reduce_child(rank, ws, which):
    ck = Checker(rank)
    for name in _dtypes(which):
        for op in OPS:
            if not op_valid(name, op):
                continue
            for n in _sizes(which, name):
                ins = _inputs(name, n, ws, input_kind(name, op))
                want = reduce_ref(ins, op, name)
                dsts = range(ws) if which == "small" else [ws - 1]
                for dst in dsts:
                    a = ins[rank].copy()
                    label = f"reduce {name} {op} n={n} dst={dst}"
                    if ck.call(label, lambda: dist.reduce(a, dst, op=_op(op))) and rank == dst:
                        ck.expect(label, mismatch(a, want, name, exact=(op != "AVG")))
    return ck.report()


@pytest.mark.parametrize("ws,which", WS_WHICH)
def test_reduce_to_every_dst_matches_numpy(ws, which):
    assert_clean(run(_reduce_child, ws, which, timeout=200))


def _broadcast_child(rank, ws, which):
    ck = Checker(rank)
    for name in _dtypes(which):
        for n in _sizes(which, name):
            ins = _inputs(name, n, ws, "normal" if kind(name) in ("float", "complex") else "full")
            for src in range(ws):
                a = ins[rank].copy()
                label = f"broadcast {name} n={n} src={src}"
                if ck.call(label, lambda: dist.broadcast(a, src)):
                    ck.expect(label, same_bytes(a, ins[src]))
    return ck.report()


@pytest.mark.parametrize("ws,which", WS_WHICH)
def test_broadcast_from_every_src_is_bytewise_exact(ws, which):
    assert_clean(run(_broadcast_child, ws, which, timeout=200))


# ----------------------------------------------------------------------------------------------
# gather family


def _ikind(name):
    return "normal" if kind(name) in ("float", "complex") else "full"


def _all_gather_child(rank, ws, which):
    ck = Checker(rank)
    for name in _dtypes(which):
        for n in _sizes(which, name):
            ins = _inputs(name, n, ws, _ikind(name))
            x = ins[rank].copy()
            outs = [garbage(name, n) for _ in range(ws)]
            label = f"all_gather {name} n={n}"
            if ck.call(label, lambda: dist.all_gather(outs, x)):
                for i in range(ws):
                    ck.expect(f"{label} [{i}]", same_bytes(outs[i], ins[i]))
                ck.expect(label + " input untouched", same_bytes(x, ins[rank]))
            out = garbage(name, ws * n)
            label = f"all_gather_into_tensor {name} n={n}"
            if ck.call(label, lambda: dist.all_gather_into_tensor(out, x)):
                ck.expect(label, same_bytes(out, np.concatenate(ins)))
    return ck.report()


@pytest.mark.parametrize("ws,which", WS_WHICH)
def test_all_gather_and_all_gather_into_tensor_concatenate_every_rank(ws, which):
    assert_clean(run(_all_gather_child, ws, which, timeout=200))


def _gather_child(rank, ws, which):
    ck = Checker(rank)
    for name in _dtypes(which):
        for n in _sizes(which, name):
            ins = _inputs(name, n, ws, _ikind(name))
            for dst in range(ws) if which == "small" else [0, ws - 1]:
                x = ins[rank].copy()
                lst = [garbage(name, n) for _ in range(ws)] if rank == dst else None
                label = f"gather {name} n={n} dst={dst}"
                if ck.call(label, lambda: dist.gather(x, lst, dst=dst)) and rank == dst:
                    for i in range(ws):
                        ck.expect(f"{label} [{i}]", same_bytes(lst[i], ins[i]))
    return ck.report()


@pytest.mark.parametrize("ws,which", WS_WHICH)
def test_gather_to_every_dst_collects_every_rank(ws, which):
    assert_clean(run(_gather_child, ws, which, timeout=200))


def _scatter_child(rank, ws, which):
    ck = Checker(rank)
    for name in _dtypes(which):
        for n in _sizes(which, name):
            for src in range(ws) if which == "small" else [0, ws - 1]:
                chunks = _inputs(name, n, ws, _ikind(name), base=100 * (src + 1))
                lst = [c.copy() for c in chunks] if rank == src else None
                out = garbage(name, n)
                label = f"scatter {name} n={n} src={src}"
                if ck.call(label, lambda: dist.scatter(out, lst, src=src)):
                    ck.expect(label, same_bytes(out, chunks[rank]))
    return ck.report()


@pytest.mark.parametrize("ws,which", WS_WHICH)
def test_scatter_from_every_src_delivers_own_chunk(ws, which):
    assert_clean(run(_scatter_child, ws, which, timeout=200))


# ----------------------------------------------------------------------------------------------
# reduce_scatter family


def _reduce_scatter_child(rank, ws, which):
    ck = Checker(rank)
    for name in _dtypes(which):
        for op in OPS:
            if not op_valid(name, op):
                continue
            for n in _sizes(which, name):
                if which == "large":
                    n = max(1, n // ws)  # each rank's input is about 3 MiB
                bigs = _inputs(name, ws * n, ws, input_kind(name, op))
                want = reduce_ref([b[rank * n:(rank + 1) * n] for b in bigs], op, name)
                exact = op != "AVG"
                mine = bigs[rank].copy()
                lst = [mine[j * n:(j + 1) * n] for j in range(ws)]
                out = garbage(name, n)
                label = f"reduce_scatter {name} {op} n={n}"
                if ck.call(label, lambda: dist.reduce_scatter(out, lst, op=_op(op))):
                    ck.expect(label, mismatch(out, want, name, exact=exact))
                out = garbage(name, n)
                mine = bigs[rank].copy()
                label = f"reduce_scatter_tensor {name} {op} n={n}"
                if ck.call(label, lambda: dist.reduce_scatter_tensor(out, mine, op=_op(op))):
                    ck.expect(label, mismatch(out, want, name, exact=exact))
    return ck.report()


@pytest.mark.parametrize("ws,which", WS_WHICH)
def test_reduce_scatter_and_reduce_scatter_tensor_every_op_match_numpy(ws, which):
    assert_clean(run(_reduce_scatter_child, ws, which, timeout=200))


# ----------------------------------------------------------------------------------------------
# all_to_all family


def _a2a_split(i, j, scale, salt=0):
    """Elements rank i sends to rank j in the uneven tests (zero for some pairs)."""
    return ((3 * i + 5 * j + salt) % 4) * scale


def _all_to_all_child(rank, ws, which):
    ck = Checker(rank)
    for name in _dtypes(which):
        for n in _sizes(which, name):
            k = n if which == "small" else max(1, n // ws)
            # equal chunks: rank i's input is ws chunks of k elements, chunk j goes to rank j
            bigs = _inputs(name, ws * k, ws, _ikind(name))
            want = np.concatenate([b[rank * k:(rank + 1) * k] for b in bigs])
            inp = bigs[rank].copy()
            out = garbage(name, ws * k)
            label = f"all_to_all_single equal {name} k={k}"
            if ck.call(label, lambda: dist.all_to_all_single(out, inp)):
                ck.expect(label, same_bytes(out, want))
            ck.expect(label + " input untouched", same_bytes(inp, bigs[rank]))
            ins = [bigs[rank][j * k:(j + 1) * k].copy() for j in range(ws)]
            outs = [garbage(name, k) for _ in range(ws)]
            label = f"all_to_all equal {name} k={k}"
            if ck.call(label, lambda: dist.all_to_all(outs, ins)):
                for j in range(ws):
                    ck.expect(f"{label} [{j}]", same_bytes(outs[j], bigs[j][rank * k:(rank + 1) * k]))

            # uneven splits (some zero), in elements of dim 0
            scale = 1 if which == "small" else max(1, n // (2 * ws))
            for salt in (0, 1) if which == "small" else (0,):
                sp = [[_a2a_split(i, j, scale, salt) for j in range(ws)] for i in range(ws)]
                srcs = [rank_input(name, sum(sp[i]), 50 + i, _ikind(name)) for i in range(ws)]
                in_splits = sp[rank]
                out_splits = [sp[j][rank] for j in range(ws)]
                want = np.concatenate(
                    [srcs[j][sum(sp[j][:rank]):sum(sp[j][:rank]) + sp[j][rank]] for j in range(ws)])
                inp = srcs[rank].copy()
                out = garbage(name, sum(out_splits))
                label = f"all_to_all_single uneven {name} splits={sp}"[:120]
                if ck.call(label, lambda: dist.all_to_all_single(out, inp, out_splits, in_splits)):
                    ck.expect(label, same_bytes(out, want))
                ins = [srcs[rank][sum(sp[rank][:j]):sum(sp[rank][:j + 1])].copy() for j in range(ws)]
                outs = [garbage(name, sp[j][rank]) for j in range(ws)]
                label = f"all_to_all uneven {name} splits={sp}"[:120]
                if ck.call(label, lambda: dist.all_to_all(outs, ins)):
                    for j in range(ws):
                        off = sum(sp[j][:rank])
                        ck.expect(f"{label} [{j}]", same_bytes(outs[j], srcs[j][off:off + sp[j][rank]]))
    return ck.report()


@pytest.mark.parametrize("ws,which", WS_WHICH)
def test_all_to_all_and_all_to_all_single_equal_and_uneven_splits(ws, which):
    assert_clean(run(_all_to_all_child, ws, which, timeout=200))


def _multidim_child(rank, ws):
    """Shapes are kept and split sizes count rows (dim 0), as in torch."""
    ck = Checker(rank)
    name = "float32"
    x = rank_input(name, 24, rank, "small", shape=(2, 3, 4))
    a = x.copy()
    ck.call("all_reduce 3-d", lambda: dist.all_reduce(a))
    ck.expect("all_reduce 3-d", mismatch(a, reduce_ref(
        [rank_input(name, 24, r, "small", shape=(2, 3, 4)) for r in range(ws)], "SUM", name), name))
    mine = rank_input(name, 4 * 3, rank, "normal", shape=(4, 3))
    outs = [garbage(name, 12, shape=(4, 3)) for _ in range(ws)]
    if ck.call("all_gather 2-d", lambda: dist.all_gather(outs, mine)):
        for r in range(ws):
            ck.expect(f"all_gather 2-d [{r}]", same_bytes(outs[r], rank_input(name, 12, r, "normal", shape=(4, 3))))
    sq = rank_input(name, 2 * 5, rank, "normal", shape=(2, 5))
    out = garbage(name, ws * 10, shape=(ws * 2, 5))
    if ck.call("all_gather_into_tensor 2-d", lambda: dist.all_gather_into_tensor(out, sq)):
        ck.expect("all_gather_into_tensor 2-d", same_bytes(out, np.concatenate(
            [rank_input(name, 10, r, "normal", shape=(2, 5)) for r in range(ws)])))
    # all_to_all_single on (rows, 3): rank i sends (i + j) % 3 rows to rank j
    sp = [[(i + j) % 3 for j in range(ws)] for i in range(ws)]
    srcs = [rank_input(name, sum(sp[i]) * 3, 70 + i, "normal", shape=(sum(sp[i]), 3)) for i in range(ws)]
    out_rows = [sp[j][rank] for j in range(ws)]
    out = garbage(name, sum(out_rows) * 3, shape=(sum(out_rows), 3))
    want = np.concatenate([srcs[j][sum(sp[j][:rank]):sum(sp[j][:rank + 1])] for j in range(ws)])
    inp = srcs[rank].copy()
    if ck.call("all_to_all_single 2-d rows", lambda: dist.all_to_all_single(out, inp, out_rows, sp[rank])):
        ck.expect("all_to_all_single 2-d rows", same_bytes(out, want))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_multidimensional_arrays_keep_shape_and_split_along_dim0(ws):
    assert_clean(run(_multidim_child, ws))


# ----------------------------------------------------------------------------------------------
# barrier, monitored_barrier


def _barrier_child(rank, ws, monitored):
    times = []
    for late in range(ws):
        if rank == late:
            time.sleep(0.3)
        enter = time.time()
        if monitored:
            dist.monitored_barrier(timeout=timedelta(seconds=30))
        else:
            dist.barrier()
        times.append((enter, time.time()))
    return times


@pytest.mark.parametrize("monitored", [False, True], ids=["barrier", "monitored_barrier"])
@pytest.mark.parametrize("ws", [2, *full(3, 4)])
def test_barrier_returns_only_after_the_last_rank_arrives(ws, monitored):
    times = run(_barrier_child, ws, monitored)
    for late in range(ws):
        late_enter = times[late][late][0]
        for r in range(ws):
            left = times[r][late][1]
            assert left >= late_enter - 0.01, (
                f"round {late}: rank {r} left the barrier {late_enter - left:.3f} s before rank "
                f"{late} entered it")


def _monitored_barrier_missing_child(rank, ws):
    missing = ws - 1
    if rank == missing:
        time.sleep(5)  # never calls monitored_barrier while the others wait
        return None
    t0 = time.monotonic()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=True)
    except Exception as e:
        return ("raised", type(e).__name__, isinstance(e, RuntimeError), str(e), time.monotonic() - t0)
    return ("returned", time.monotonic() - t0)


@pytest.mark.parametrize("ws", [2, *full(3)])
def test_monitored_barrier_names_the_rank_that_did_not_arrive(ws):
    outs = run(_monitored_barrier_missing_child, ws, timeout=60)
    missing = ws - 1
    r0 = outs[0]
    assert r0[0] == "raised", f"rank 0 monitored_barrier returned although rank {missing} never came: {r0}"
    assert r0[2], f"rank 0 raised {r0[1]}, not a RuntimeError subclass"
    assert str(missing) in r0[3], f"rank 0's error does not name rank {missing}: {r0[3]!r}"
    assert 1.5 <= r0[4] < 10, f"rank 0 raised after {r0[4]:.2f} s with timeout=2 s"
    for r in range(1, missing):
        assert outs[r][0] == "raised", f"rank {r} passed a monitored_barrier that rank {missing} missed"
        # a timeout names the operation (pyddp's guarantee; torch's other ranks get a generic error)
        assert "monitored_barrier" in outs[r][3], f"rank {r}'s error does not name the operation: {outs[r][3]!r}"


# ----------------------------------------------------------------------------------------------
# invalid op / dtype combinations


def _invalid_ops_child(rank, ws):
    ck = Checker(rank)
    for name in DTYPE_NAMES:
        for op in OPS:
            if op_valid(name, op):
                continue
            for coll in ("all_reduce", "reduce", "reduce_scatter_tensor"):
                x = rank_input(name, 4 * ws, rank, "small")
                before = x.copy()
                out = garbage(name, 4)
                call = {
                    "all_reduce": lambda: dist.all_reduce(x, op=_op(op)),
                    "reduce": lambda: dist.reduce(x, 0, op=_op(op)),
                    "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out, x, op=_op(op)),
                }[coll]
                label = f"{coll} {name} {op}"
                ck.count += 1
                want = op_error(name, op, coll)
                try:
                    call()
                    ck.failures.append(f"{label}: did not raise")
                except Exception as e:
                    # torch's exception type (see tests/distributed/test_fidelity_torch.py for its messages)
                    if type(e) is not want or not str(e):
                        ck.failures.append(f"{label}: raised {type(e).__name__} (want "
                                           f"{want.__name__}): {e}")
                ck.expect(label + " input untouched", same_bytes(x, before))
    # the group still works and is in step afterwards
    a = np.full(5, rank + 1, dtype=np.int64)
    ck.call("all_reduce after rejected calls", lambda: dist.all_reduce(a))
    ck.expect("all_reduce after rejected calls", mismatch(a, np.full(5, ws * (ws + 1) // 2, np.int64), "int64"))
    return ck.report()


@pytest.mark.parametrize("ws", [2, 3])
def test_invalid_op_for_dtype_raises_torchs_error_on_every_rank(ws):
    # BAND/BOR/BXOR on floats, only SUM/AVG on complex, AVG on bool and integers
    assert_clean(run(_invalid_ops_child, ws), min_checks=20)


# ----------------------------------------------------------------------------------------------
# in place


def _in_place_child(rank, ws):
    """Outputs are written into the caller's arrays, including views at an offset into a bigger
    buffer, and nothing outside the view is touched."""
    ck = Checker(rank)
    name = "float64"
    n = 11
    sentinel = -777.0

    def framed(m, fill=None):
        buf = np.full(m + 6, sentinel)
        view = buf[3:-3]
        if fill is not None:
            view[:] = fill
        return buf, view

    def frame_ok(label, buf):
        ck.expect(label + " frame", None if (np.all(buf[:3] == sentinel) and np.all(buf[-3:] == sentinel))
                  else f"wrote outside the view: {buf[:3]} ... {buf[-3:]}")

    ins = [rank_input(name, n, r, "small") for r in range(ws)]
    buf, v = framed(n, ins[rank])
    ck.call("all_reduce view", lambda: dist.all_reduce(v))
    ck.expect("all_reduce view", mismatch(v, reduce_ref(ins, "SUM", name), name))
    ck.expect("all_reduce view is still a view", None if np.shares_memory(v, buf) else "view lost")
    frame_ok("all_reduce", buf)

    buf, v = framed(n, ins[rank])
    ck.call("broadcast view", lambda: dist.broadcast(v, 0))
    ck.expect("broadcast view", same_bytes(v, ins[0]))
    frame_ok("broadcast", buf)

    buf, v = framed(ws * n)
    outs = [v[i * n:(i + 1) * n] for i in range(ws)]
    ck.call("all_gather into views", lambda: dist.all_gather(outs, ins[rank].copy()))
    ck.expect("all_gather into views", same_bytes(v, np.concatenate(ins)))
    frame_ok("all_gather", buf)

    buf, v = framed(ws * n)
    ck.call("all_gather_into_tensor view", lambda: dist.all_gather_into_tensor(v, ins[rank].copy()))
    ck.expect("all_gather_into_tensor view", same_bytes(v, np.concatenate(ins)))
    frame_ok("all_gather_into_tensor", buf)

    bigs = [rank_input(name, ws * n, r, "small") for r in range(ws)]
    buf, v = framed(n)
    ck.call("reduce_scatter_tensor view", lambda: dist.reduce_scatter_tensor(v, bigs[rank].copy()))
    ck.expect("reduce_scatter_tensor view", mismatch(
        v, reduce_ref([b[rank * n:(rank + 1) * n] for b in bigs], "SUM", name), name))
    frame_ok("reduce_scatter_tensor", buf)

    buf, v = framed(ws * n)
    ck.call("all_to_all_single view", lambda: dist.all_to_all_single(v, bigs[rank].copy()))
    ck.expect("all_to_all_single view", same_bytes(
        v, np.concatenate([b[rank * n:(rank + 1) * n] for b in bigs])))
    frame_ok("all_to_all_single", buf)

    buf, v = framed(n)
    lst = [c.copy() for c in ins] if rank == 0 else None
    ck.call("scatter view", lambda: dist.scatter(v, lst, src=0))
    ck.expect("scatter view", same_bytes(v, ins[rank]))
    frame_ok("scatter", buf)

    # the same array object is updated (no copy swapped in)
    a = ins[rank].copy()
    addr = a.__array_interface__["data"][0]
    ck.call("all_reduce keeps buffer", lambda: dist.all_reduce(a))
    ck.expect("all_reduce keeps buffer", None if a.__array_interface__["data"][0] == addr else "buffer moved")
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_outputs_are_written_in_place_into_views_without_touching_neighbours(ws):
    assert_clean(run(_in_place_child, ws))


# ----------------------------------------------------------------------------------------------
# async_op=True


def _future_value(fut):
    """torch's future value for a collective is [output]; pyddp's may be the output itself."""
    v = fut.wait()
    return v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v


def _async_child(rank, ws):
    ck = Checker(rank)
    name = "float32"
    n = 1001
    ins = [rank_input(name, n, r, "small") for r in range(ws)]
    want = reduce_ref(ins, "SUM", name)

    # 1. is_completed() is False while a peer has not arrived; the call returns at once
    a = ins[rank].copy()
    if rank == ws - 1:
        time.sleep(0.5)
    t0 = time.monotonic()
    w = dist.all_reduce(a, async_op=True)
    dt = time.monotonic() - t0
    if rank == 0:
        ck.expect("async all_reduce returns at once", None if dt < 0.25 else f"took {dt:.3f} s")
        ck.expect("is_completed while a peer is late", None if not w.is_completed() else "already complete")
    ok = w.wait(timeout=timedelta(seconds=30))
    ck.expect("wait() returns True", None if ok is True else f"returned {ok!r}")
    ck.expect("is_completed after wait", None if w.is_completed() else "False after wait")
    ck.expect("async all_reduce result", mismatch(a, want, name))
    fut = w.get_future()
    v = _future_value(fut)
    ck.expect("future value is the output array", None if isinstance(v, np.ndarray) and np.shares_memory(v, a)
              else f"got {type(v).__name__}")
    ck.expect("future value", mismatch(np.asarray(v), want, name))
    if hasattr(fut, "result"):
        r = fut.result()
        r = r[0] if isinstance(r, (list, tuple)) and len(r) == 1 else r
        ck.expect("future.result()", None if isinstance(r, np.ndarray) and np.shares_memory(r, a)
                  else f"got {type(r).__name__}")
    if hasattr(fut, "done"):
        ck.expect("future.done()", None if fut.done() else "False after wait")
    w2 = dist.all_reduce(ins[rank].copy(), async_op=True)
    ck.expect("wait() without timeout", None if w2.wait() in (True, None) else "bad return")

    # 2. every collective accepts async_op=True and returns a Work with correct results
    works = []
    b = ins[rank].copy()
    works.append(("broadcast", dist.broadcast(b, 0, async_op=True), lambda: same_bytes(b, ins[0])))
    c = ins[rank].copy()
    works.append(("reduce", dist.reduce(c, 0, async_op=True),
                  lambda: mismatch(c, want, name) if rank == 0 else None))
    outs = [garbage(name, n) for _ in range(ws)]
    works.append(("all_gather", dist.all_gather(outs, ins[rank].copy(), async_op=True),
                  lambda: same_bytes(np.concatenate(outs), np.concatenate(ins))))
    agt = garbage(name, ws * n)
    works.append(("all_gather_into_tensor", dist.all_gather_into_tensor(agt, ins[rank].copy(), async_op=True),
                  lambda: same_bytes(agt, np.concatenate(ins))))
    gl = [garbage(name, n) for _ in range(ws)] if rank == 0 else None
    works.append(("gather", dist.gather(ins[rank].copy(), gl, dst=0, async_op=True),
                  lambda: same_bytes(np.concatenate(gl), np.concatenate(ins)) if rank == 0 else None))
    so = garbage(name, n)
    sl = [x.copy() for x in ins] if rank == 0 else None
    works.append(("scatter", dist.scatter(so, sl, src=0, async_op=True), lambda: same_bytes(so, ins[rank])))
    bigs = [rank_input(name, ws * n, r, "small") for r in range(ws)]
    rs_want = reduce_ref([x[rank * n:(rank + 1) * n] for x in bigs], "SUM", name)
    rso = garbage(name, n)
    mine = bigs[rank].copy()
    works.append(("reduce_scatter", dist.reduce_scatter(rso, [mine[j * n:(j + 1) * n] for j in range(ws)],
                                                        async_op=True), lambda: mismatch(rso, rs_want, name)))
    rst = garbage(name, n)
    works.append(("reduce_scatter_tensor", dist.reduce_scatter_tensor(rst, bigs[rank].copy(), async_op=True),
                  lambda: mismatch(rst, rs_want, name)))
    a2o = garbage(name, ws * n)
    a2a_want = np.concatenate([x[rank * n:(rank + 1) * n] for x in bigs])
    works.append(("all_to_all_single", dist.all_to_all_single(a2o, bigs[rank].copy(), async_op=True),
                  lambda: same_bytes(a2o, a2a_want)))
    a2l = [garbage(name, n) for _ in range(ws)]
    works.append(("all_to_all", dist.all_to_all(a2l, [bigs[rank][j * n:(j + 1) * n].copy() for j in range(ws)],
                                                async_op=True), lambda: same_bytes(np.concatenate(a2l), a2a_want)))
    works.append(("barrier", dist.barrier(async_op=True), lambda: None))
    for label, work, check in reversed(works):
        if work is None:
            ck.expect(label, "async_op=True returned None")
            continue
        if ck.call(label + " wait", lambda: work.wait()):
            ck.expect(label + " is_completed", None if work.is_completed() else "False after wait")
            ck.expect(label, check())

    # 3. many outstanding operations of different dtypes/ops, waited for in reverse order
    pend = []
    for i in range(24):
        nm = ["float32", "int64", "float16", "uint8", "complex128", "float64"][i % 6]
        op = ["SUM", "MAX", "SUM", "BOR", "SUM", "MIN"][i % 6]  # (torch: no PRODUCT on complex)
        xs = [rank_input(nm, 7 + i * 13, r, input_kind(nm, op)) for r in range(ws)]
        arr = xs[rank].copy()
        pend.append((f"outstanding #{i} {nm} {op}", dist.all_reduce(arr, op=_op(op), async_op=True),
                     arr, reduce_ref(xs, op, nm), nm))
    for label, work, arr, exp, nm in reversed(pend):
        if ck.call(label, lambda: work.wait()):
            ck.expect(label, mismatch(arr, exp, nm))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_async_op_returns_work_with_wait_is_completed_and_future(ws):
    assert_clean(run(_async_child, ws))


def _make_array(rank, n):
    return np.full(n, float(rank + 1))


def _keepalive_child(rank, ws):
    ck = Checker(rank)
    n = 1 << 18
    if rank == 0:
        a = _make_array(rank, n)
        ref = weakref.ref(a)
        w = dist.all_reduce(a, async_op=True)
        del a
        gc.collect()
        ck.expect("pending work keeps its array alive", None if ref() is not None else "array was freed")
        w.wait()
        out = _future_value(w.get_future())
        ck.expect("result of a work whose array the caller dropped",
                  mismatch(np.asarray(out), np.full(n, ws * (ws + 1) / 2), "float64"))
        del out, w
        gc.collect()
        ck.expect("array released once the work is gone", None if ref() is None else "array leaked")
    else:
        time.sleep(0.5)  # rank 0's work stays pending meanwhile
        # the only reference to the array is the work itself
        w = dist.all_reduce(_make_array(rank, n), async_op=True)
        gc.collect()
        w.wait()
        out = _future_value(w.get_future())
        ck.expect("result via future only", mismatch(np.asarray(out), np.full(n, ws * (ws + 1) / 2), "float64"))
    return ck.report()


@pytest.mark.parametrize("ws", [2, 3])
def test_async_work_keeps_its_arrays_alive_until_done_and_then_releases_them(ws):
    assert_clean(run(_keepalive_child, ws))


# ----------------------------------------------------------------------------------------------
# bitwise identical results, NaN


def _identical_child(rank, ws):
    ck = Checker(rank)
    digests = {}
    for name in [d for d in ("float16", "bfloat16", "float32", "float64", "complex64") if d in DTYPE_NAMES]:
        for n in (1, 7, 1000, 33333, large_count(name)):
            ins = [rank_input(name, n, r, "normal") for r in range(ws)]
            for op in ("SUM", "AVG"):
                a = ins[rank].copy()
                label = f"all_reduce {op} {name} n={n}"
                if ck.call(label, lambda: dist.all_reduce(a, op=_op(op))):
                    ck.expect(label, mismatch(a, reduce_ref(ins, op, name), name, exact=False))
                    digests[label] = hashlib.sha256(a.tobytes()).hexdigest()
    return {"report": ck.report(), "digests": digests}


@pytest.mark.parametrize("ws", [2, *full(3, 4)])
def test_float_sum_and_avg_results_are_bitwise_identical_on_every_rank(ws):
    res = run(_identical_child, ws, timeout=200)
    assert_clean([r["report"] for r in res])
    differing = [k for k in res[0]["digests"] if len({r["digests"].get(k) for r in res}) != 1]
    assert not differing, f"ranks hold different bits after: {differing}"


def _nan_child(rank, ws):
    ck = Checker(rank)
    for name in [d for d in ("float16", "bfloat16", "float32", "float64") if d in DTYPE_NAMES]:
        for n in (5, large_count(name)):
            xs = []
            for r in range(ws):
                x = rank_input(name, n, r, "normal")
                if r == 0:
                    x[0] = np.nan
                if r == ws - 1:
                    x[1] = np.nan
                    x[n - 1] = np.nan
                xs.append(x)
            for op in ("MIN", "MAX", "SUM"):
                a = xs[rank].copy()
                label = f"{op} with NaN {name} n={n}"
                if ck.call(label, lambda: dist.all_reduce(a, op=_op(op))):
                    ck.expect(label, None if np.isnan(a[[0, 1, n - 1]].astype(np.float32)).all()
                              else f"NaN lost: {a[[0, 1, n - 1]]}")
                    ck.expect(label, mismatch(a, reduce_ref(xs, op, name), name, exact=(op != "SUM")))
    return ck.report()


@pytest.mark.parametrize("ws", [2, *full(3)])
def test_nan_propagates_through_min_max_and_sum_like_numpy(ws):
    assert_clean(run(_nan_child, ws))


def test_bfloat16_dtype_is_available_for_the_dtype_loops():
    pytest.importorskip("ml_dtypes", reason="ml_dtypes missing: bfloat16 cases are skipped")
    assert "bfloat16" in DTYPE_NAMES


# ----------------------------------------------------------------------------------------------
# torch interop


def _torch_child(rank, ws):
    import torch

    ck = Checker(rank)
    t = torch.arange(10, dtype=torch.float32) + rank
    ptr = t.data_ptr()
    ck.call("all_reduce torch float32", lambda: dist.all_reduce(t))
    want = sum(np.arange(10, dtype=np.float32) + r for r in range(ws))
    ck.expect("all_reduce torch float32", mismatch(t.numpy(), want.astype(np.float32), "float32"))
    ck.expect("tensor updated in place", None if t.data_ptr() == ptr else "data_ptr changed")
    ck.expect("still a tensor", None if isinstance(t, torch.Tensor) else type(t).__name__)

    big = torch.full((1 << 19,), float(rank + 1), dtype=torch.float64)
    view = big[100:200]  # contiguous view at an offset
    ck.call("all_reduce torch view", lambda: dist.all_reduce(view, op=dist.ReduceOp.MAX))
    ck.expect("torch view", None if bool((big[100:200] == ws).all()) and bool((big[:100] == rank + 1).all())
              and bool((big[200:] == rank + 1).all()) else "wrong values around/in the view")

    i = torch.tensor([rank + 1, -(rank + 1), 7], dtype=torch.int64)
    ck.call("all_reduce torch int64", lambda: dist.all_reduce(i))
    s = ws * (ws + 1) // 2
    ck.expect("torch int64", None if i.tolist() == [s, -s, 7 * ws] else str(i.tolist()))

    b = torch.full((9,), 0.5 * (rank + 1), dtype=torch.bfloat16)
    ck.call("all_reduce torch bfloat16", lambda: dist.all_reduce(b))
    ck.expect("torch bfloat16", None if b.dtype == torch.bfloat16 and
              b.float().tolist() == [0.5 * s] * 9 else str(b))

    c = torch.full((3,), float(rank), dtype=torch.float32)
    ck.call("broadcast torch", lambda: dist.broadcast(c, ws - 1))
    ck.expect("broadcast torch", None if c.tolist() == [ws - 1.0] * 3 else str(c))

    d = torch.ones(8) * (rank + 1)
    w = dist.all_reduce(d, async_op=True)
    ck.call("async torch", lambda: w.wait())
    v = w.get_future().wait()
    v = v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v
    ck.expect("torch future value", None if isinstance(v, torch.Tensor) and v.data_ptr() == d.data_ptr()
              else f"future value is {type(v).__name__}")
    ck.expect("async torch values", None if d.tolist() == [float(s)] * 8 else str(d))

    outs = [torch.zeros(2) for _ in range(ws)]
    ck.call("all_gather torch", lambda: dist.all_gather(outs, torch.full((2,), float(rank))))
    ck.expect("all_gather torch", None if [o.tolist() for o in outs] == [[float(r)] * 2 for r in range(ws)]
              else str(outs))
    return ck.report()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
@pytest.mark.parametrize("ws", [2, 3])
def test_torch_cpu_tensors_are_reduced_in_place_without_copies(ws):
    assert_clean(run(_torch_child, ws, timeout=120))
