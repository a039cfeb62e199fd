"""Every collective on CUDA arrays (torch CUDA tensors and CuPy arrays) against NumPy: backend "nccl" and the
"cpu" backend staging CUDA arrays through host memory, one rank and two ranks on the machine's GPUs (two ranks
sharing one GPU when there is one: NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 for "nccl").

Each test starts one set of ranks; the loops over dtypes, ops, sizes, roots and sync/async run inside them
(tests/_ref.py computes every expected value with NumPy from every rank's deterministic input)."""
import time

import numpy as np
import pytest

import pyddp.distributed as dist
from _gpu import REDUCE_OPS, any_lib, call, gpu_run, need
from _ref import (Checker, assert_clean, garbage, input_kind, kind, large_count, mismatch, rank_input,
                  reduce_ref, same_bytes)

pytestmark = pytest.mark.timeout(300)

LIBS = ["torch", "cupy"]
BACKENDS = ["nccl", "cpu"]
SIZES = [0, 1, 7, 33]
ASYNC = (False, True)


def _op(name):
    return getattr(dist.ReduceOp, name)


def _move_kind(name):
    """Data movement: every bit pattern of integers, normal floats (bytes compared exactly)."""
    return "normal" if kind(name) == "float" else "full"


# ----------------------------------------------------------------------------------------------
# reductions: all_reduce, reduce, reduce_scatter, reduce_scatter_tensor


def _reductions_child(rank, ws, arrays):
    ck = Checker(rank)
    for name in arrays.dtypes:
        for op in REDUCE_OPS:
            ik = input_kind(name, op)
            exact = op != "AVG"
            for n in SIZES + [large_count(name)]:
                ins = [rank_input(name, n, r, ik) for r in range(ws)]
                want = reduce_ref(ins, op, name)
                for async_op in ASYNC:
                    a = arrays.to_device(ins[rank])
                    label = f"all_reduce {name} {op} n={n} async={async_op}"
                    if ck.call(label, lambda: call(dist.all_reduce, a, op=_op(op), async_op=async_op)):
                        ck.expect(label, mismatch(arrays.to_host(a), want, name, exact=exact))
            for n in SIZES:
                ins = [rank_input(name, n, r, ik) for r in range(ws)]
                want = reduce_ref(ins, op, name)
                for dst in range(ws):
                    for async_op in ASYNC:
                        a = arrays.to_device(ins[rank])
                        label = f"reduce {name} {op} n={n} dst={dst} async={async_op}"
                        if ck.call(label, lambda: call(dist.reduce, a, dst, op=_op(op), async_op=async_op)) \
                                and rank == dst:
                            ck.expect(label, mismatch(arrays.to_host(a), want, name, exact=exact))
                # reduce_scatter: rank q's list entry p is input q*ws+p; rank p gets the reduction of entries p
                lists = [[rank_input(name, n, q * ws + p, ik) for p in range(ws)] for q in range(ws)]
                want = reduce_ref([lists[q][rank] for q in range(ws)], op, name)
                # reduce_scatter_tensor: rank q's input holds ws blocks of n; rank p gets block p reduced
                flat = [rank_input(name, n * ws, 100 + q, ik) for q in range(ws)]
                want_t = reduce_ref([f[rank * n:(rank + 1) * n] for f in flat], op, name)
                for async_op in ASYNC:
                    out = arrays.to_device(garbage(name, n))
                    inl = [arrays.to_device(x) for x in lists[rank]]
                    label = f"reduce_scatter {name} {op} n={n} async={async_op}"
                    if ck.call(label, lambda: call(dist.reduce_scatter, out, inl, op=_op(op), async_op=async_op)):
                        ck.expect(label, mismatch(arrays.to_host(out), want, name, exact=exact))
                    out = arrays.to_device(garbage(name, n))
                    inp = arrays.to_device(flat[rank])
                    label = f"reduce_scatter_tensor {name} {op} n={n} async={async_op}"
                    if ck.call(label, lambda: call(dist.reduce_scatter_tensor, out, inp, op=_op(op),
                                                   async_op=async_op)):
                        ck.expect(label, mismatch(arrays.to_host(out), want_t, name, exact=exact))
    return ck.report()


@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lib", LIBS)
def test_reductions_every_dtype_and_op_match_numpy(lib, backend, ws):
    need(lib, backend, ws)
    assert_clean(gpu_run(_reductions_child, ws, lib, backend), min_checks=200)


# ----------------------------------------------------------------------------------------------
# data movement: broadcast, all_gather(_into_tensor), all_to_all(_single), gather, scatter


def _splits(ws, n):
    """rows[q][p]: rows rank q sends to rank p in all_to_all_single (some are 0)."""
    return [[(q + 2 * p + n) % 3 for p in range(ws)] for q in range(ws)]


def _movement_child(rank, ws, arrays):
    ck = Checker(rank)
    for name in arrays.dtypes:
        mk = _move_kind(name)
        for n in SIZES:
            ins = [rank_input(name, n, r, mk) for r in range(ws)]
            lists = [[rank_input(name, n, q * ws + p, mk) for p in range(ws)] for q in range(ws)]
            for async_op in ASYNC:
                tag = f"{name} n={n} async={async_op}"
                for src in range(ws):
                    a = arrays.to_device(ins[rank])
                    label = f"broadcast {tag} src={src}"
                    if ck.call(label, lambda: call(dist.broadcast, a, src, async_op=async_op)):
                        ck.expect(label, same_bytes(arrays.to_host(a), ins[src]))
                a = arrays.to_device(ins[rank])
                outs = [arrays.to_device(garbage(name, n)) for _ in range(ws)]
                label = f"all_gather {tag}"
                if ck.call(label, lambda: call(dist.all_gather, outs, a, async_op=async_op)):
                    for r in range(ws):
                        ck.expect(f"{label} [{r}]", same_bytes(arrays.to_host(outs[r]), ins[r]))
                for shape in [(ws * n,), (ws, n)]:
                    out = arrays.to_device(garbage(name, ws * n, shape))
                    label = f"all_gather_into_tensor {tag} out{shape}"
                    if shape == (ws, n) and dist.get_backend() == "cpu":
                        # as torch's gloo: the output's chunks must have the input's shape
                        ck.raises(label, RuntimeError, "invalid tensor size",
                                  lambda: dist.all_gather_into_tensor(out, a, async_op=async_op))
                        continue
                    if ck.call(label, lambda: call(dist.all_gather_into_tensor, out, a, async_op=async_op)):
                        ck.expect(label, same_bytes(arrays.to_host(out), np.concatenate(ins).reshape(shape)))
                inl = [arrays.to_device(x) for x in lists[rank]]
                outs = [arrays.to_device(garbage(name, n)) for _ in range(ws)]
                label = f"all_to_all {tag}"
                if ck.call(label, lambda: call(dist.all_to_all, outs, inl, async_op=async_op)):
                    for q in range(ws):
                        ck.expect(f"{label} [{q}]", same_bytes(arrays.to_host(outs[q]), lists[q][rank]))
                for dst in range(ws):
                    a = arrays.to_device(ins[rank])
                    outs = [arrays.to_device(garbage(name, n)) for _ in range(ws)] if rank == dst else None
                    label = f"gather {tag} dst={dst}"
                    if ck.call(label, lambda: call(dist.gather, a, outs, dst, async_op=async_op)) and rank == dst:
                        for r in range(ws):
                            ck.expect(f"{label} [{r}]", same_bytes(arrays.to_host(outs[r]), ins[r]))
                for src in range(ws):
                    out = arrays.to_device(garbage(name, n))
                    inl = [arrays.to_device(x) for x in lists[src]] if rank == src else None
                    label = f"scatter {tag} src={src}"
                    if ck.call(label, lambda: call(dist.scatter, out, inl, src, async_op=async_op)):
                        ck.expect(label, same_bytes(arrays.to_host(out), lists[src][rank]))
                _all_to_all_single(ck, arrays, rank, ws, name, n, tag, async_op)
    return ck.report()


def _all_to_all_single(ck, arrays, rank, ws, name, n, tag, async_op):
    """Even split of ws*n elements, and rows of 3 with split sizes (some 0)."""
    flat = [rank_input(name, ws * n, 200 + q, _move_kind(name)) for q in range(ws)]
    out = arrays.to_device(garbage(name, ws * n))
    inp = arrays.to_device(flat[rank])
    label = f"all_to_all_single {tag}"
    if ck.call(label, lambda: call(dist.all_to_all_single, out, inp, async_op=async_op)):
        want = np.concatenate([flat[q][rank * n:(rank + 1) * n] for q in range(ws)])
        ck.expect(label, same_bytes(arrays.to_host(out), want))
    rows = _splits(ws, n)
    mats = [rank_input(name, 3 * sum(rows[q]), 300 + q, _move_kind(name), shape=(sum(rows[q]), 3))
            for q in range(ws)]
    want = np.concatenate([mats[q][sum(rows[q][:rank]):sum(rows[q][:rank + 1])] for q in range(ws)])
    out = arrays.to_device(garbage(name, want.size, want.shape))
    inp = arrays.to_device(mats[rank])
    in_splits = rows[rank]
    out_splits = [rows[q][rank] for q in range(ws)]
    label = f"all_to_all_single {tag} splits in={in_splits} out={out_splits}"
    if ck.call(label, lambda: call(dist.all_to_all_single, out, inp, out_splits, in_splits, async_op=async_op)):
        ck.expect(label, same_bytes(arrays.to_host(out), want))


@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lib", LIBS)
def test_data_movement_every_dtype_matches_numpy(lib, backend, ws):
    need(lib, backend, ws)
    assert_clean(gpu_run(_movement_child, ws, lib, backend), min_checks=300)


# ----------------------------------------------------------------------------------------------
# point to point: send/recv, isend/irecv, batch_isend_irecv (two ranks)


def _p2p_child(rank, ws, arrays):
    ck = Checker(rank)
    peer = 1 - rank
    for name in arrays.dtypes:
        for n in SIZES + [large_count(name)]:
            mine, theirs = (rank_input(name, n, 400 + r, _move_kind(name)) for r in (rank, peer))
            tag = f"{name} n={n}"
            for sender in (0, 1):
                a = arrays.to_device(mine if rank == sender else garbage(name, n))
                label = f"send/recv {tag} from {sender}"
                if rank == sender:
                    ck.call(label, lambda: dist.send(a, peer))
                elif ck.call(label, lambda: dist.recv(a, peer)):
                    ck.expect(label, same_bytes(arrays.to_host(a), theirs))
            a, b = arrays.to_device(mine), arrays.to_device(garbage(name, n))
            label = f"isend/irecv {tag}"
            # both directions at once: rank 0 posts its send first, rank 1 its receive
            if ck.call(label, lambda: [w.wait() for w in ((dist.isend(a, peer), dist.irecv(b, peer)) if rank == 0
                                                          else (dist.irecv(b, peer), dist.isend(a, peer)))]):
                ck.expect(label, same_bytes(arrays.to_host(b), theirs))
            a, b = arrays.to_device(mine), arrays.to_device(garbage(name, n))
            label = f"batch_isend_irecv {tag}"
            ops = [dist.P2POp(dist.isend, a, peer), dist.P2POp(dist.irecv, b, peer)]
            if ck.call(label, lambda: [w.wait() for w in dist.batch_isend_irecv(ops)]):
                ck.expect(label, same_bytes(arrays.to_host(b), theirs))
    return ck.report()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lib", LIBS)
def test_point_to_point_every_dtype_matches_numpy(lib, backend):
    need(lib, backend, 2)
    assert_clean(gpu_run(_p2p_child, 2, lib, backend), min_checks=100)


# ----------------------------------------------------------------------------------------------
# object collectives and barrier


def _obj(r):
    return {"rank": r, "items": list(range(r + 3)), "text": "é" * (100 * r + 1), "blob": bytes([r]) * (1 << 20)}


def _objects_child(rank, ws, arrays):
    ck = Checker(rank)
    for src in range(ws):
        objs = [_obj(src), ("tuple", src)] if rank == src else [None, None]
        label = f"broadcast_object_list src={src}"
        if ck.call(label, lambda: dist.broadcast_object_list(objs, src)):
            ck.expect(label, None if objs == [_obj(src), ("tuple", src)] else f"got {str(objs)[:200]}")
    got = [None] * ws
    if ck.call("all_gather_object", lambda: dist.all_gather_object(got, _obj(rank))):
        ck.expect("all_gather_object", None if got == [_obj(r) for r in range(ws)] else f"got {str(got)[:200]}")
    for dst in range(ws):
        got = [None] * ws if rank == dst else None
        label = f"gather_object dst={dst}"
        if ck.call(label, lambda: dist.gather_object(_obj(rank), got, dst)) and rank == dst:
            ck.expect(label, None if got == [_obj(r) for r in range(ws)] else f"got {str(got)[:200]}")
    for src in range(ws):
        out = [None]
        label = f"scatter_object_list src={src}"
        inl = [_obj(10 * src + r) for r in range(ws)] if rank == src else None
        if ck.call(label, lambda: dist.scatter_object_list(out, inl, src)):
            ck.expect(label, None if out == [_obj(10 * src + rank)] else f"got {str(out)[:200]}")
    # barrier: rank 0 waits for the last rank, which arrives 0.5 s late
    for async_op in ASYNC:
        if rank == ws - 1:
            time.sleep(0.5)
        t0 = time.monotonic()
        label = f"barrier async={async_op}"
        if ck.call(label, lambda: call(dist.barrier, async_op=async_op)) and rank == 0 and ws > 1:
            took = time.monotonic() - t0
            ck.expect(label, None if took >= 0.4 else f"rank 0 left after {took:.3f} s, before rank {ws - 1} came")
    return ck.report()


@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_object_collectives_and_barrier(backend, ws):
    lib = any_lib()  # no arrays of the caller's: the library only selects the GPU
    need(lib, backend, ws)
    assert_clean(gpu_run(_objects_child, ws, lib, backend), min_checks=4 * ws + 2)
