"""The argument checks of a collective live in two places: the C fast path (``ProcessGroup.fast``: small
blocking calls on the default group, checked in C) and the Python path every other call takes (checked in
pyddp/distributed/distributed_c10d.py).  The same bad input must give the same exception, type and text,
on both: each case runs once blocking (the fast path) and once with ``async_op=True`` (the Python path),
on two ranks (one rank never takes the fast path).  They agree by construction where the fast path
declines whatever it does not fully accept, leaving the error to the Python checks; the control case
shows the fast path is taken for a good array."""
from datetime import timedelta

import numpy as np
import pytest

import pyddp.distributed as dist
from _mp import run


def _ro(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


f32 = np.float32
CASES = {
    "all_reduce non-contiguous": lambda: (dist.all_reduce, (np.zeros(8, f32)[::2],), {}),
    "all_reduce read-only": lambda: (dist.all_reduce, (_ro(np.zeros(4, f32)),), {}),
    "all_reduce object dtype": lambda: (dist.all_reduce, (np.array([1, "a"], dtype=object),), {}),
    "all_reduce a list": lambda: (dist.all_reduce, ([1.0, 2.0],), {}),
    "all_reduce BAND on floats": lambda: (dist.all_reduce, (np.zeros(4, f32),), {"op": dist.ReduceOp.BAND}),
    "all_reduce AVG on int64": lambda: (
        dist.all_reduce, (np.zeros(4, np.int64),), {"op": dist.ReduceOp.AVG}),
    "reduce AVG on int32": lambda: (dist.reduce, (np.zeros(4, np.int32), 0), {"op": dist.ReduceOp.AVG}),
    "reduce_scatter_tensor AVG on bool": lambda: (
        dist.reduce_scatter_tensor, (np.zeros(2, bool), np.zeros(4, bool)), {"op": dist.ReduceOp.AVG}),
    "broadcast src out of range": lambda: (dist.broadcast, (np.zeros(4, f32), 5), {}),
    "broadcast read-only": lambda: (dist.broadcast, (_ro(np.zeros(4, f32)), 0), {}),
    "reduce dst out of range": lambda: (dist.reduce, (np.zeros(4, f32), 3), {}),
    "all_gather_into_tensor output too small": lambda: (
        dist.all_gather_into_tensor, (np.zeros(3, f32), np.zeros(4, f32)), {}),
    "all_gather_into_tensor dtypes differ": lambda: (
        dist.all_gather_into_tensor, (np.zeros(4, np.float64), np.zeros(4, f32)), {}),
    "reduce_scatter_tensor input too small": lambda: (
        dist.reduce_scatter_tensor, (np.zeros(4, f32), np.zeros(3, f32)), {}),
    "all_to_all_single sizes differ": lambda: (
        dist.all_to_all_single, (np.zeros(4, f32), np.zeros(3, f32)), {}),
    "all_gather list of the wrong length": lambda: (
        dist.all_gather, ([np.zeros(4, f32)] * 3, np.zeros(4, f32)), {}),
}


def _both(rank, n):
    from pyddp import _C

    dist.init_process_group("cpu")
    pg = dist.distributed_c10d._world.default_pg
    out = {"control": [pg._fast(_C.K_ALLREDUCE, np.zeros(4, f32), 0)]}
    for name, make in CASES.items():
        got = []
        for async_op in (False, True):
            fn, args, kw = make()
            try:
                w = fn(*args, async_op=async_op, **kw)
                if w is not None:
                    w.wait(timeout=timedelta(seconds=30))
                got.append("no error")
            except Exception as e:  # noqa: BLE001 - the exception is what is compared
                got.append(f"{type(e).__name__}: {e}")
        out[name] = got
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(120)
def test_fast_path_and_python_path_raise_the_same():
    for out in run(_both, 2, init=False, timeout=90):
        assert out.pop("control") == [True], "the fast path did not take a good array"
        differ = {k: v for k, v in out.items() if v[0] != v[1]}
        assert differ == {}, differ
        assert all(v[0] != "no error" for v in out.values()), out
