"""The checks of tests/distributed/test_backend_conformance.py, run by every rank of every backend.

``check(dist, rank, n, backend, dev, host)`` runs every collective kind at least once (async work,
point to point and object collectives included), the dtypes and ReduceOps the backend declares in
a few calls, and the error cases: what the backend's registry entry says it does not support must
be refused above the seam (naming the backend and what it supports) on every rank, before anything
moves, and the group must go on working after.  ``dev(a)`` turns a NumPy array into the backend's
array (a fakecuda.DeviceArray for nccl), ``host(x)`` reads one back.  Every result is compared with
NumPy.  Returns ``{"checks": number of comparisons, "bad": [what differed]}``.

Run as a script under mpirun (``python tests/_conformance.py mpi OUTDIR [exhaustive]``) each rank
writes OUTDIR/rank<r>.json.
"""
import json
import os
import sys
from datetime import timedelta

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 needs ml_dtypes
    BF16 = None

WAIT = timedelta(seconds=60)  # every Work.wait here is bounded
# the compact matrix: each dtype once in an all_reduce SUM, each op once on a dtype it applies to
DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int32", "int64", "bool"]
EVERY_DTYPE = DTYPES + ["int16", "uint16", "uint32", "uint64", "complex64", "complex128"]
FLOAT_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def _np_dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def _values(name, rank, count):
    """Rank ``rank``'s input: small values, exact in every dtype and under every op."""
    dt = _np_dtype(name)
    if name == "bool":
        return (np.arange(count) + rank) % 2 == 0
    return ((np.arange(count) % 3) + rank + 1).astype(dt)


def _reduce(name, op, arrays):
    """NumPy's reference of a reduction of ``arrays`` with ``op``."""
    dt = _np_dtype(name)
    if name == "bool":
        stack = np.stack(arrays)
        return stack.any(0) if op in ("SUM", "MAX", "BOR") else stack.all(0) \
            if op in ("PRODUCT", "MIN", "BAND") else np.logical_xor.reduce(stack, 0)
    wide = np.stack([a.astype(np.float64 if dt.kind in "fc" and dt != np.complex128
                                else dt) for a in arrays])
    if dt.kind == "c":
        wide = np.stack(arrays).astype(np.complex128)
    f = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
         "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
    if op == "AVG":
        return (wide.sum(0) / len(arrays)).astype(dt)
    return f[op].reduce(wide, 0).astype(dt)


class _Checker:
    def __init__(self, dist, rank, n, backend, dev, host):
        self.dist, self.rank, self.n, self.backend = dist, rank, n, backend
        self.dev, self.host = dev, host
        self.checks, self.bad = 0, []
        from pyddp.distributed.backends import lookup

        self.supports = lookup(backend).supports

    def same(self, what, got, want):
        self.checks += 1
        got, want = np.asarray(got), np.asarray(want)
        ok = got.shape == want.shape and (
            np.array_equal(got.astype(np.float64) if got.dtype == BF16 else got,
                           want.astype(np.float64) if want.dtype == BF16 else want)
            if want.dtype.kind not in "f" else
            np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2))
        if not ok:
            self.bad.append(f"{self.backend} rank {self.rank}: {what}: got {got.tolist()}, "
                            f"want {want.tolist()}")

    def raises(self, what, fn, types, words):
        """``fn()`` raises one of ``types`` whose text has every one of ``words``."""
        self.checks += 1
        try:
            fn()
        except types as e:
            missing = [w for w in words if w not in str(e)]
            if missing:
                self.bad.append(f"{self.backend}: {what}: {type(e).__name__}: {e} (lacks "
                                f"{missing})")
            return
        except Exception as e:  # noqa: BLE001 - a wrong type is what is reported
            self.bad.append(f"{self.backend}: {what}: {type(e).__name__}: {e} (wanted "
                            f"{'/'.join(t.__name__ for t in types)})")
            return
        self.bad.append(f"{self.backend}: {what}: nothing raised")

    # ------------------------------------------------------------ what is declared
    def kind_ok(self, kind):
        return self.supports.kinds is None or kind in self.supports.kinds

    def reduce_ok(self, dtype):
        s = self.supports
        return (s.dtypes is None or dtype in s.dtypes) and \
            (s.reduce_dtypes is None or dtype in s.reduce_dtypes)

    def op_ok(self, op):
        return self.supports.ops is None or op in self.supports.ops

    # ------------------------------------------------------------------- checks
    def all_reduce(self, dtype, op, count=5, async_op=False):
        d, r, n = self.dist, self.rank, self.n
        x = self.dev(_values(dtype, r, count))
        w = d.all_reduce(x, op=getattr(d.ReduceOp, op), async_op=async_op)
        if async_op:
            w.wait(WAIT)
            self.same(f"all_reduce async is_completed ({dtype})", w.is_completed(), True)
        want = _reduce(dtype, op, [_values(dtype, q, count) for q in range(n)])
        self.same(f"all_reduce {op} {dtype} x{count}", self.host(x), want)

    def every_kind(self, dtype="float32", count=6):
        d, r, n, dev, host = self.dist, self.rank, self.n, self.dev, self.host
        ins = [_values(dtype, q, count) for q in range(n)]
        dt = _np_dtype(dtype)
        # broadcast, from the last rank
        x = dev(ins[r].copy())
        d.broadcast(x, src=n - 1)
        self.same("broadcast", host(x), ins[n - 1])
        # reduce to rank 0
        x = dev(ins[r].copy())
        d.reduce(x, dst=0)
        if r == 0:
            self.same("reduce", host(x), _reduce(dtype, "SUM", ins))
        # all_gather: into a list and into one array
        outs = [dev(np.zeros(count, dt)) for _ in range(n)]
        d.all_gather(outs, dev(ins[r]))
        self.same("all_gather", np.stack([host(o) for o in outs]), np.stack(ins))
        big = dev(np.zeros(count * n, dt))
        d.all_gather_into_tensor(big, dev(ins[r]))
        self.same("all_gather_into_tensor", host(big), np.concatenate(ins))
        # gather to rank 0, scatter from rank 0
        lst = [dev(np.zeros(count, dt)) for _ in range(n)] if r == 0 else None
        d.gather(dev(ins[r]), lst, dst=0)
        if r == 0:
            self.same("gather", np.stack([host(o) for o in lst]), np.stack(ins))
        y = dev(np.zeros(count, dt))
        d.scatter(y, [dev(a) for a in ins] if r == 0 else None, src=0)
        self.same("scatter", host(y), ins[r])
        # reduce_scatter (of one array, and of a list)
        blocks = [_values(dtype, q + 2 * b, count) for b in range(n) for q in [r]]
        y = dev(np.zeros(count, dt))
        d.reduce_scatter_tensor(y, dev(np.concatenate(blocks)))
        want = _reduce(dtype, "SUM", [_values(dtype, q + 2 * r, count) for q in range(n)])
        self.same("reduce_scatter_tensor", host(y), want)
        y = dev(np.zeros(count, dt))
        d.reduce_scatter(y, [dev(b) for b in blocks])
        self.same("reduce_scatter", host(y), want)
        # all_to_all: equal blocks, and a list
        src = np.concatenate([_values(dtype, 10 * r + q, count) for q in range(n)])
        out = dev(np.zeros(count * n, dt))
        d.all_to_all_single(out, dev(src))
        self.same("all_to_all_single",
                  host(out), np.concatenate([_values(dtype, 10 * q + r, count) for q in range(n)]))
        outs = [dev(np.zeros(count, dt)) for _ in range(n)]
        d.all_to_all(outs, [dev(_values(dtype, 10 * r + q, count)) for q in range(n)])
        self.same("all_to_all", np.stack([host(o) for o in outs]),
                  np.stack([_values(dtype, 10 * q + r, count) for q in range(n)]))
        # barriers
        d.barrier()
        self.same("barrier", True, True)
        if self.kind_ok("monitored_barrier"):
            d.monitored_barrier(timeout=WAIT)
            self.same("monitored_barrier", True, True)
        # async work
        x = dev(ins[r].copy())
        w = d.broadcast(x, src=0, async_op=True)
        self.same("async broadcast wait", w.wait(WAIT), True)
        self.same("async broadcast", host(x), ins[0])
        # point to point: a ring, blocking and not
        if n > 1:
            right, left = (r + 1) % n, (r - 1) % n
            got = dev(np.zeros(count, dt))
            if r % 2 == 0:
                d.send(dev(ins[r]), dst=right)
                d.recv(got, src=left)
            else:
                d.recv(got, src=left)
                d.send(dev(ins[r]), dst=right)
            self.same("send/recv", host(got), ins[left])
            got = dev(np.zeros(count, dt))
            works = [d.isend(dev(ins[r]), dst=right), d.irecv(got, src=left)]
            for w in works:
                w.wait(WAIT)
            self.same("isend/irecv", host(got), ins[left])
            got = dev(np.zeros(count, dt))
            ops = [d.P2POp(d.isend, dev(ins[r]), right), d.P2POp(d.irecv, got, left)]
            for w in d.batch_isend_irecv(ops):
                w.wait(WAIT)
            self.same("batch_isend_irecv", host(got), ins[left])

    def objects(self):
        d, r, n = self.dist, self.rank, self.n
        got = [None] * n
        d.all_gather_object(got, {"rank": r, "x": [r] * 3})
        self.same("all_gather_object", [g["rank"] for g in got], list(range(n)))
        lst = [("from", r)]
        d.broadcast_object_list(lst, src=0)
        self.same("broadcast_object_list", lst[0][1], 0)

    def refusals(self):
        """What the entry declares it does not serve is refused, on every rank, with the
        backend's name and what it supports; nothing moved (the group then still agrees)."""
        d, s, name = self.dist, self.supports, self.backend
        x = self.dev(_values("float32", self.rank, 4))
        if s.reduce_dtypes is not None:
            bad = next(t for t in EVERY_DTYPE if t not in s.reduce_dtypes)
            self.raises(f"all_reduce of {bad}",
                        lambda: d.all_reduce(self.dev(_values(bad, self.rank, 4))),
                        (TypeError,), [f"backend {name!r}", bad, "reduces"])
        if s.ops is not None:
            bad = next(o for o in INT_OPS if o not in s.ops)
            self.raises(f"all_reduce {bad}",
                        lambda: d.all_reduce(self.dev(_values("int32", self.rank, 4)),
                                             op=getattr(d.ReduceOp, bad)),
                        (TypeError,), [f"backend {name!r}", f"ReduceOp.{bad}", "SUM"])
        if s.kinds is not None and "monitored_barrier" not in s.kinds:
            self.raises("monitored_barrier", lambda: d.monitored_barrier(timeout=WAIT),
                        (NotImplementedError,), [f"backend {name!r}", "monitored_barrier",
                                                 "all_reduce"])
        if not s.any_source and self.n > 1:
            self.raises("recv from any source", lambda: d.recv(x), (ValueError,),
                        [f"backend {name!r}", "any source"])
        # what every backend refuses (checked above the seam for all alike)
        self.raises("broadcast from a rank outside the group",
                    lambda: d.broadcast(x, src=self.n), (ValueError, RuntimeError), ["src"])
        self.raises("all_gather_into_tensor of a wrong size",
                    lambda: d.all_gather_into_tensor(self.dev(np.zeros(3, np.float32)), x),
                    (ValueError, RuntimeError), ["size"])

    def run(self, exhaustive=False):
        self.every_kind()
        if exhaustive:
            for dtype in (EVERY_DTYPE + (["bfloat16"] if BF16 is not None else [])):
                if not self.reduce_ok(dtype):
                    continue
                self.every_kind(dtype, count=3)
                kind = np.dtype(_np_dtype(dtype)).kind
                ops = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"] if kind == "f" or dtype == \
                    "bfloat16" else ["SUM", "AVG"] if kind == "c" else \
                    ["SUM", "PRODUCT", "MIN", "MAX"] if dtype == "bool" else INT_OPS
                for op in ops:
                    if self.op_ok(op):
                        self.all_reduce(dtype, op)
        else:
            # every dtype moved and reduced once, every op once, two of them async
            dtypes = DTYPES + (["bfloat16"] if BF16 is not None else [])
            for i, dtype in enumerate(dtypes):
                if self.reduce_ok(dtype):
                    self.all_reduce(dtype, "SUM", async_op=i % 3 == 0)
            for op in FLOAT_OPS:
                if self.op_ok(op):
                    self.all_reduce("float32", op)
            for op in INT_OPS[4:]:
                if self.op_ok(op):
                    self.all_reduce("int32", op)
            self.all_reduce("float32", "SUM", count=1 << 16)  # past the small-message path
        self.objects()
        self.refusals()
        self.all_reduce("float64", "SUM", async_op=True)  # the group goes on after refusals
        return {"checks": self.checks, "bad": self.bad}


def check(dist, rank, n, backend, dev=None, host=None, exhaustive=False):
    """Every check on an initialised default group of ``backend`` (see the module docstring)."""
    dev = dev or (lambda a: np.ascontiguousarray(a))
    host = host or (lambda x: np.asarray(x))
    return _Checker(dist, rank, n, backend, dev, host).run(exhaustive)


if __name__ == "__main__":  # one rank under mpirun
    backend, outdir = sys.argv[1], sys.argv[2]
    exhaustive = len(sys.argv) > 3 and sys.argv[3] == "exhaustive"
    import pyddp.distributed as dist

    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()
    try:
        report = check(dist, rank, n, backend, exhaustive=exhaustive)
    except Exception as e:  # noqa: BLE001 - reported, not lost in mpirun's output
        import traceback

        report = {"checks": 0, "bad": [f"rank {rank}: {traceback.format_exc()}"]}
        del e
    with open(os.path.join(outdir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(report, f)
    dist.destroy_process_group()
