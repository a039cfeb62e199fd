"""Backend "mpi": each collective kind as MPI calls (the ``Kinds`` part of MpiBackend).  Arrays go
to MPI without copies; the list forms move each array with its own message (on ``aux``); float16
and bfloat16 reduce on float32 copies rounded once at the end; where this MPI's SUM saturates small
integers they reduce on int32 copies; AVG divides after the sum.
"""
from __future__ import annotations

import numpy as np

from .... import _C
from . import library as _lib
from .work import _poll
from .library import (
    _K_BROADCAST, _K_ALLREDUCE, _K_REDUCE, _K_ALLGATHER, _K_GATHER, _K_SCATTER, _K_REDUCE_SCATTER,
    _K_ALLTOALL, _K_BARRIER, _K_MONITORED, _K_SEND, _K_RECV, _DTYPE_NAMES, _OP_NAMES, _F16, _BF16,
    _BOOL, _AVG, _SUM, _TAG_LIST, _TAG_MON, _TAG_MON_OK, _INT_MAX)


def _bytes(a):
    """A view of host array ``a`` MPI can take as a buffer (ml_dtypes' bfloat16 exports none)."""
    if a.dtype.isbuiltin == 1 or a.dtype.char in "?bBhHiIlLqQefdFD":
        return a
    return a.view(f"u{a.dtype.itemsize}")


def _float32(a, code):
    """float32 copy of a float16 or bfloat16 host array (bfloat16 possibly as a uint16 view)."""
    if code == _F16:
        return a.astype(np.float32)
    u = a.view(np.uint16).astype(np.uint32) << 16
    return u.view(np.float32)


def _store_half(dst, f, code):
    """Round float32 ``f`` into the float16 / bfloat16 host array ``dst`` (nearest even)."""
    if code == _F16:
        np.copyto(dst, f, casting="unsafe")
        return
    u = np.ascontiguousarray(f, np.float32).view(np.uint32)
    nan = np.isnan(f)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    np.copyto(dst.view(np.uint16), r.reshape(dst.shape))


class Kinds:
    """MpiBackend's collectives, kind by kind (mixed into it: self is the backend)."""

    def _unit(self, a):
        """(MPI type, count) moving ``a``'s bytes."""
        n = a.nbytes
        for size in (16, 8, 4, 2):
            if n % size == 0 and a.dtype.itemsize % size == 0:
                return self.units[size], n // size
        return self.units[1], n


    def _reduce_prep(self, dtype, op, arrays):
        """(MPI type, MPI op, arrays to reduce, copied) for a reduction on ``arrays`` (the first
        is the output; ``copied``: they are copies): float32 copies for the half types, int32
        ones where this MPI's SUM saturates small integers; _finisher writes them back and
        applies AVG's division."""
        mop = (self.bool_ops if dtype == _BOOL else self.ops)[op]
        if mop is None:
            raise ValueError(f"op {_OP_NAMES[op]} is not supported for {_DTYPE_NAMES[dtype]}")
        if dtype in (_F16, _BF16):
            return self.types[dtype], mop, [_float32(a, dtype) for a in arrays], True
        if op == _SUM and dtype in self.widen:  # this MPI's SUM saturates them: int32 copies
            wide = np.int32 if _DTYPE_NAMES[dtype].startswith("int") else np.uint32
            return (_lib.MPI.INT32_T if wide is np.int32 else _lib.MPI.UINT32_T), mop, \
                [a.astype(wide) for a in arrays], True
        return self.types[dtype], mop, arrays, False

    def _run(self, kind, dtype, op, root, tag, count, inputs, outputs, in_splits, out_splits,
             timeout, wait_all, name, blocking, back):
        coll = self.coll
        n = self.size
        if kind == _K_ALLREDUCE:
            out = outputs[0]
            src = inputs[0] if inputs else None
            t, mop, arrs, copied = self._reduce_prep(dtype, op, [out] + ([src] if src is not None
                                                                      else []))
            o = arrs[0]
            sbuf = _lib.MPI.IN_PLACE if src is None else [arrs[1], t]
            after = self._finisher(out, o, dtype, op, copied, back)
            if blocking:
                coll.Allreduce(sbuf, [o, t], mop)
                if after is not None:
                    after()
                return None
            req = coll.Iallreduce(sbuf, [o, t], mop)
            return self._done([req], after, name, (inputs, outputs, arrs), False)
        if kind == _K_BROADCAST:
            a = _bytes(outputs[0])
            if blocking:
                coll.Bcast(self._buf(a), root)
                if back is not None:
                    back()
                return None
            return self._done([coll.Ibcast(self._buf(a), root)], back, name, outputs, False)
        if kind == _K_REDUCE:
            a = outputs[0]
            t, mop, arrs, copied = self._reduce_prep(dtype, op, [a])
            x = arrs[0]
            me = self.rank == root
            after = self._finisher(a, x, dtype, op, copied, back) if me else None
            sbuf = _lib.MPI.IN_PLACE if me else [x, t]
            rbuf = [x, t] if me else None
            if blocking:
                coll.Reduce(sbuf, rbuf, mop, root)
                if after is not None:
                    after()
                return None
            return self._done([coll.Ireduce(sbuf, rbuf, mop, root)], after, name,
                              (inputs, outputs, arrs), False)
        if kind == _K_ALLGATHER:
            a = _bytes(inputs[0])
            if len(outputs) == 1:
                o = _bytes(outputs[0])
                t, c = self._unit(a)
                if blocking:
                    coll.Allgather([a, c, t], [o, c, t])
                    if back is not None:
                        back()
                    return None
                return self._done([coll.Iallgather([a, c, t], [o, c, t])], back, name,
                                  (inputs, outputs), False)
            return self._list_ops(a, outputs, None, None, name, blocking, back, gather_to=-1)
        if kind == _K_GATHER:
            a = _bytes(inputs[0])
            return self._list_ops(a, outputs, None, None, name, blocking, back, gather_to=root)
        if kind == _K_SCATTER:
            o = _bytes(outputs[0])
            return self._list_ops(None, None, inputs, o, name, blocking, back, scatter_from=root)
        if kind == _K_REDUCE_SCATTER:
            out = outputs[0]
            if len(inputs) == 1:
                t, mop, arrs, copied = self._reduce_prep(dtype, op, [out, inputs[0]])
                after = self._finisher(out, arrs[0], dtype, op, copied, back)
                c = out.size
                if blocking:
                    coll.Reduce_scatter_block([arrs[1], c, t], [arrs[0], c, t], mop)
                    if after is not None:
                        after()
                    return None
                req = coll.Ireduce_scatter_block([arrs[1], c, t], [arrs[0], c, t], mop)
                return self._done([req], after, name, (inputs, outputs, arrs), False)
            # a list: one MPI_Reduce per destination rank, straight from each array
            t, mop, arrs, copied = self._reduce_prep(dtype, op, [out, *inputs])
            o = arrs[0]
            reqs = []
            for r in range(n):
                x = arrs[1 + r]
                if blocking:
                    if r == self.rank:
                        coll.Reduce([x, t], [o, t], mop, r)
                    else:
                        coll.Reduce([x, t], None, mop, r)
                else:
                    reqs.append(coll.Ireduce([x, t], [o, t] if r == self.rank else None, mop, r))
            after = self._finisher(out, o, dtype, op, copied, back)
            if blocking:
                if after is not None:
                    after()
                return None
            return self._done(reqs, after, name, (inputs, outputs, arrs), False)
        if kind == _K_ALLTOALL:
            if len(inputs) == 1 and len(outputs) == 1:
                a, o = _bytes(inputs[0]), _bytes(outputs[0])
                return self._alltoallv(a, o, in_splits, out_splits, name, blocking, back)
            return self._list_ops(None, outputs, inputs, None, name, blocking, back,
                                  alltoall=True)
        if kind == _K_BARRIER:
            if blocking:
                coll.Barrier()
                return None
            return self._done([coll.Ibarrier()], None, name, None, False)
        if kind == _K_MONITORED:
            self._monitored_barrier(timeout if timeout > 0 else self.timeout, wait_all)
            return None
        if kind == _K_SEND:
            a = _bytes(inputs[0])
            req = self.p2p.Isend(self._buf(a), dest=root, tag=tag)
            return self._done([req], None, f"{name} to rank {self.ranks[root]}", inputs, blocking)
        if kind == _K_RECV:
            a = _bytes(outputs[0])
            st = _lib.MPI.Status()
            src = _lib.MPI.ANY_SOURCE if root < 0 else root
            req = self.p2p.Irecv(self._buf(a), source=src, tag=tag)
            what = f"{name} from {'any rank' if root < 0 else f'rank {self.ranks[root]}'}"
            return self._done([req], back, what, outputs, blocking, st, root)
        raise ValueError(f"{name}: backend 'mpi' does not know operation kind {kind}")

    def _buf(self, a):
        t, c = self._unit(a)
        return [a, c, t]

    def _finisher(self, out, x, dtype, op, copied, back):
        """What to run once a reduction into ``x`` is done: ``out`` itself, or (``copied``) its
        float32 / int32 copy, written back."""
        avg = op == _AVG
        if not copied and not avg and back is None:
            return None
        n = self.size

        def finish():
            if avg:
                if dtype in (_F16, _BF16) or np.issubdtype(x.dtype, np.inexact):
                    np.divide(x, n, out=x)
                else:
                    np.floor_divide(x, n, out=x)  # never reached: AVG is refused on integers
            if copied and dtype in (_F16, _BF16):
                _store_half(out, x, dtype)
            elif copied:
                np.copyto(out, x, casting="unsafe")  # wraps, as C's integer arithmetic
            if back is not None:
                back()
        return finish

    def _alltoallv(self, a, o, in_splits, out_splits, name, blocking, back):
        n = self.size
        if in_splits is None:
            in_splits = (a.nbytes // n,) * n
        if out_splits is None:
            out_splits = (o.nbytes // n,) * n
        g = 0
        for s in (*in_splits, *out_splits):
            g = np.gcd(g, int(s))
        isz = a.dtype.itemsize
        size = next((k for k in (16, 8, 4, 2) if isz % k == 0 and (g % k == 0)), 1)
        t = self.units[size]
        sc = [int(s) // size for s in in_splits]
        rc = [int(s) // size for s in out_splits]
        sd = np.concatenate(([0], np.cumsum(sc)[:-1])).astype(np.int64).tolist()
        rd = np.concatenate(([0], np.cumsum(rc)[:-1])).astype(np.int64).tolist()
        if max(sd + rd + sc + rc + [0]) > _INT_MAX:
            raise ValueError(f"{name}: backend 'mpi' moves at most 2**31-1 elements of "
                             f"{size} bytes per rank and offset (MPI's int counts)")
        sbuf, rbuf = [a, (sc, sd), t], [o, (rc, rd), t]
        if blocking:
            self.coll.Alltoallv(sbuf, rbuf)
            if back is not None:
                back()
            return None
        return self._done([self.coll.Ialltoallv(sbuf, rbuf)], back, name, (a, o), False)

    def _list_ops(self, a, outs, ins, o, name, blocking, back, gather_to=None,
                  scatter_from=None, alltoall=False):
        """all_gather / gather into a list, scatter from a list, all_to_all of lists: one
        message per array (no packing copy), on ``aux`` with their own tag."""
        aux, me, n = self.aux, self.rank, self.size
        reqs = []
        keep = (a, outs, ins, o)
        if gather_to is not None:  # all_gather (gather_to == -1) or gather to a root
            for r in range(n):
                if r != me and (gather_to == -1 or gather_to == r):
                    reqs.append(aux.Isend(self._buf(a), dest=r, tag=_TAG_LIST))
            if gather_to == -1 or gather_to == me:
                for r in range(n):
                    dst = _bytes(outs[r])
                    if r == me:
                        np.copyto(dst.reshape(-1).view(np.uint8), a.reshape(-1).view(np.uint8))
                    else:
                        reqs.append(aux.Irecv(self._buf(dst), source=r, tag=_TAG_LIST))
        elif scatter_from is not None:
            if me == scatter_from:
                for r in range(n):
                    src = _bytes(ins[r])
                    if r == me:
                        np.copyto(o.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))
                    else:
                        reqs.append(aux.Isend(self._buf(src), dest=r, tag=_TAG_LIST))
            else:
                reqs.append(aux.Irecv(self._buf(o), source=scatter_from, tag=_TAG_LIST))
        else:  # all_to_all of lists
            for r in range(n):
                dst = _bytes(outs[r])
                if r == me:
                    np.copyto(dst.reshape(-1).view(np.uint8),
                              _bytes(ins[r]).reshape(-1).view(np.uint8))
                else:
                    reqs.append(aux.Irecv(self._buf(dst), source=r, tag=_TAG_LIST))
            for r in range(n):
                if r != me:
                    reqs.append(aux.Isend(self._buf(_bytes(ins[r])), dest=r, tag=_TAG_LIST))
        if not reqs:
            if back is not None:
                back()
            return None
        return self._done(reqs, back, name, keep, blocking)

    def _monitored_barrier(self, t, wait_all):
        """torch's monitored_barrier: rank 0 waits (at most ``t`` s) for every rank's arrival and
        names those that did not come; then it releases them."""
        aux, me, n = self.aux, self.rank, self.size
        if n == 1:
            return
        token = np.zeros(1, np.int32)
        deadline = _C.monotonic() + t
        if me != 0:
            s = aux.Isend([token, _lib.MPI.INT32_T], dest=0, tag=_TAG_MON)
            ok = np.zeros(1, np.int32)
            r = aux.Irecv([ok, _lib.MPI.INT32_T], source=0, tag=_TAG_MON_OK)
            if not _poll(lambda: _lib.MPI.Request.Testall([s, r]), deadline):
                for q in (s, r):
                    q.Cancel()
                msg = (f"monitored_barrier on {self._where()}: rank {self.ranks[me]} was not "
                       f"released by rank {self.ranks[0]} within {t:g} s (rank 0 reports the "
                       "ranks that did not arrive)")
                self._fail(msg, _C.ST_TIMEOUT)
                raise _C.DistBackendError(msg)
            if ok[0] != 0:
                raise _C.DistBackendError(f"monitored_barrier on {self._where()}: rank "
                                          f"{self.ranks[0]} reported a failure")
            return
        bufs = [np.zeros(1, np.int32) for _ in range(n)]
        reqs = {r: aux.Irecv([bufs[r], _lib.MPI.INT32_T], source=r, tag=_TAG_MON)
                for r in range(1, n)}
        missing = []
        for r in range(1, n):
            if not _poll(reqs[r].Test, deadline):
                missing.append(r)
                if not wait_all:
                    break
        ms = int(round(t * 1000))
        if missing:
            for r in range(1, n):
                if not reqs[r].Test():
                    reqs[r].Cancel()
            names = ", ".join(str(self.ranks[r]) for r in missing)
            if wait_all:
                msg = (f"[Rank 0]: Ranks {names} failed to pass monitoredBarrier in {ms} ms")
            else:
                msg = (f"[Rank 0]: Rank {names} failed to pass monitoredBarrier in {ms} ms")
            raise _C.DistBackendError(msg)
        zero = np.zeros(1, np.int32)
        sends = [aux.Isend([zero, _lib.MPI.INT32_T], dest=r, tag=_TAG_MON_OK) for r in range(1, n)]
        _poll(lambda: _lib.MPI.Request.Testall(sends), deadline + t)
