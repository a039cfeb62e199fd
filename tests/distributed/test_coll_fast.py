"""The one-call fast path (ProcessGroup.fast, C) of blocking collectives on the default group: every
collective with blocks (reduce, gather, scatter, all_gather, reduce_scatter, all_to_all and their
single-array forms) gives NumPy's answer through it and through the general path (a subgroup of
every rank), on 2 and 3 ranks, at several sizes, dtypes and roots; input the general path refuses is
refused by the fast path too (it hands the call back, and the general path raises its error)."""
import numpy as np
import pytest

import pyddp.distributed as dist
from _mp import run

pytestmark = pytest.mark.timeout(240)


def _record_fast():
    """Make the default group's fast path record what it returned."""
    pg = dist.distributed_c10d._default_pg()
    real = pg._fast
    rec = []

    def fast(*args):
        r = real(*args)
        rec.append(r)
        return r

    pg._fast = fast
    return rec


def _inputs(rank, ws, count, dt, salt):
    rng = np.random.default_rng(1000 * salt + rank)
    return (rng.integers(-50, 50, size=(ws, count)) if np.issubdtype(dt, np.integer)
            else rng.standard_normal((ws, count))).astype(dt)


def _every_block_collective_child(rank, ws):
    rec = _record_fast()
    sub = dist.new_group(list(range(ws)))
    checks = 0
    for count in (1, 3, 1024, 5000):
        for dt in (np.float32, np.float64, np.int32):
            for root in range(ws):
                salt = count * 7 + root
                mine = _inputs(rank, ws, count, dt, salt)
                every = [_inputs(r, ws, count, dt, salt) for r in range(ws)]
                for group, fast in ((None, True), (sub, False)):
                    n0 = len(rec)
                    # reduce
                    t = mine[0].copy()
                    dist.reduce(t, dst=root, group=group)
                    if rank == root:
                        np.testing.assert_allclose(t, sum(e[0] for e in every), rtol=1e-5, atol=1e-5)
                    # gather
                    out = [np.zeros(count, dt) for _ in range(ws)] if rank == root else None
                    dist.gather(mine[0], out, dst=root, group=group)
                    if rank == root:
                        for r in range(ws):
                            np.testing.assert_array_equal(out[r], every[r][0])
                    # scatter
                    t = np.zeros(count, dt)
                    dist.scatter(t, list(mine) if rank == root else None, src=root, group=group)
                    np.testing.assert_array_equal(t, every[root][rank])
                    # all_gather (list) and all_gather_into_tensor
                    out = [np.zeros(count, dt) for _ in range(ws)]
                    dist.all_gather(out, mine[1 % ws], group=group)
                    for r in range(ws):
                        np.testing.assert_array_equal(out[r], every[r][1 % ws])
                    whole = np.zeros(ws * count, dt)
                    dist.all_gather_into_tensor(whole, mine[0], group=group)
                    np.testing.assert_array_equal(whole, np.concatenate([e[0] for e in every]))
                    stacked = np.zeros((ws, 1, count), dt)  # 2-D rows: (ws * 1, count)
                    dist.all_gather_into_tensor(stacked.reshape(ws, count), mine[0].reshape(1, count),
                                                group=group)
                    np.testing.assert_array_equal(stacked[:, 0], np.stack([e[0] for e in every]))
                    # reduce_scatter (list) and reduce_scatter_tensor, MAX
                    t = np.zeros(count, dt)
                    dist.reduce_scatter(t, list(mine), op=dist.ReduceOp.MAX, group=group)
                    np.testing.assert_array_equal(t, np.max([e[rank] for e in every], axis=0))
                    t = np.zeros(count, dt)
                    dist.reduce_scatter_tensor(t, mine.reshape(-1), group=group)
                    np.testing.assert_allclose(t, sum(e[rank] for e in every), rtol=1e-5, atol=1e-5)
                    # all_to_all (lists) and all_to_all_single (rows)
                    outs = [np.zeros(count, dt) for _ in range(ws)]
                    dist.all_to_all(outs, list(mine), group=group)
                    for r in range(ws):
                        np.testing.assert_array_equal(outs[r], every[r][rank])
                    o2 = np.zeros_like(mine)
                    dist.all_to_all_single(o2, mine, group=group)
                    np.testing.assert_array_equal(o2, np.stack([e[rank] for e in every]))
                    took = rec[n0:]
                    if fast:
                        assert took == [True] * 10, took
                    else:
                        assert took == [], took
                    checks += 1
    return checks


@pytest.mark.parametrize("ws", [2, 3])
def test_every_block_collective_through_the_fast_path_matches_numpy(ws):
    assert run(_every_block_collective_child, ws, timeout=200) == [4 * 3 * ws * 2] * ws


def _refusals_child(rank, ws):
    """Input every rank gets wrong alike (so no rank waits for another): the fast path hands it
    back and the general path's error is raised."""
    rec = _record_fast()
    f32 = np.zeros(4, np.float32)
    errors = []

    def expect(exc, fn, *args, **kw):
        n0 = len(rec)
        with pytest.raises(exc) as e:
            fn(*args, **kw)
        assert rec[n0:] in ([False], []), rec[n0:]
        errors.append(str(e.value))

    # a list of the wrong length on the root, a list on a rank that is not the root
    expect(ValueError, dist.gather, f32, [np.zeros(4, np.float32)] * (ws + 1) if rank == 0
           else [f32], dst=0)
    expect(ValueError, dist.scatter, np.zeros(4, np.float32),
           [np.zeros(4, np.float32)] * (ws - 1) if rank == 0 else [f32], src=0)
    # a dtype unlike the others
    expect(TypeError, dist.all_gather, [np.zeros(4, np.float64)] * ws, f32)
    expect(TypeError, dist.all_to_all, [np.zeros(4, np.float32)] * ws,
           [np.zeros(4, np.float32)] * (ws - 1) + [np.zeros(4, np.int32)])
    # an element count unlike the others
    expect(ValueError, dist.reduce_scatter, f32, [np.zeros(5, np.float32)] * ws)
    # a read-only output, a non-contiguous one
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    expect(ValueError, dist.reduce, ro, dst=0)
    expect(ValueError, dist.scatter, np.zeros(8, np.float32)[::2],
           [np.zeros(4, np.float32)] * ws if rank == 0 else None, src=0)
    # rows that do not split evenly although the bytes would: (ws + 1, 2 * ws) float32
    a = np.zeros((ws + 1, 2 * ws), np.float32)
    expect(ValueError, dist.all_to_all_single, np.zeros_like(a), a)
    # an all_gather_into_tensor output of the right size but not torch's shape (flat for 2-D)
    expect(RuntimeError, dist.all_gather_into_tensor, np.zeros(ws * 6, np.float32),
           np.zeros((2, 3), np.float32))
    # a root out of range, an op the dtype refuses
    expect(ValueError, dist.reduce, f32, dst=ws)
    expect(ValueError, dist.gather, f32, None, dst=-1)
    expect((TypeError, ValueError, RuntimeError), dist.reduce, np.zeros(4, np.int32), dst=0,
           op=dist.ReduceOp.AVG)
    # the group still works after every refusal
    t = np.full(3, rank + 1.0, np.float32)
    dist.reduce(t, dst=0)
    return (float(t[0]) if rank == 0 else None), len(errors)


@pytest.mark.parametrize("ws", [2, 3])
def test_the_fast_path_refuses_what_the_general_path_refuses(ws):
    res = run(_refusals_child, ws, timeout=120)
    assert res[0] == (ws * (ws + 1) / 2, 12)
    assert all(r == (None, 12) for r in res[1:])


def _torch_child(rank, ws):
    import torch

    rec = _record_fast()
    t = torch.arange(6, dtype=torch.float32) + rank
    out = [torch.zeros(6) for _ in range(ws)] if rank == 0 else None
    dist.gather(t, out, dst=0)
    o = torch.zeros(ws * 2, 3)
    dist.all_to_all_single(o, torch.arange(ws * 6, dtype=torch.float32).reshape(ws * 2, 3) + 100 * rank)
    return rec, [x.tolist() for x in out] if out else None, o.tolist()


def test_torch_tensors_take_the_fast_path():
    pytest.importorskip("torch")
    res = run(_torch_child, 2, timeout=120)
    for rank, (rec, gathered, a2a) in enumerate(res):
        assert rec == [True, True]
        ref = np.stack([np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * r for r in range(2)])
        np.testing.assert_array_equal(np.array(a2a), np.concatenate([ref[r][2 * rank:2 * rank + 2]
                                                                    for r in range(2)]))
    assert res[0][1] == [[float(i + r) for i in range(6)] for r in range(2)]
