"""DistributedDataParallel's join: uneven inputs (torch's ``ddp.join()`` and the generic
``Join([ddp, ...])`` context).  A rank that ran out of inputs shadows the collectives of the ranks
still training (one forward's buffer broadcast and one backward's bucket reductions per step, with
zeros), so they never wait for it; at the end the model of a rank that joined last becomes
everyone's.  ``_JoinMixin`` is DDP's part of it (mixed into the DDP class).
"""
from __future__ import annotations


import numpy as np

from ... import distributed as dist
from ...distributed._grad_bucket import GradBucket


class _JoinState:
    def __init__(self, ddp, divide_by_initial_world_size, throw, generic=False):
        self.ddp = ddp
        self.divide_initial = divide_by_initial_world_size
        self.throw = throw
        self.active = True
        self.generic = generic  # inside pyddp.distributed.algorithms.join.Join


def _join_mod():
    from ...distributed.algorithms import join
    return join


class _DDPJoinHook:
    """DistributedDataParallel's JoinHook for the generic ``Join([ddp, ...])`` context: a joined
    rank shadows one forward and backward per main_hook, then takes the model of a rank that
    joined last (post_hook)."""

    def __init__(self, ddp, divide_by_initial_world_size=True):
        self._ddp = ddp
        self._state = _JoinState(ddp, divide_by_initial_world_size, False, generic=True)

    def _join_enter(self, enable):
        if enable:
            if self._ddp._join is not None:
                raise RuntimeError("DistributedDataParallel join contexts cannot be nested")
            self._ddp._join = self._state

    def _join_exit(self):
        if self._ddp._join is self._state:
            self._ddp._join = None
            self._ddp._div = float(self._ddp._world)

    def main_hook(self):
        self._ddp._join_shadow_step()

    def post_hook(self, is_last_joiner):
        self._ddp._join_finish(is_last_joiner)


class _DDPJoin:
    """``with ddp.join():`` context for uneven inputs (torch's Join with a DDP joinable).

    Each forward of a rank still in the loop allreduces "I am active"; a rank whose loop ended
    shadows the others' collectives (the active count, buffer broadcast, one zero allreduce per
    bucket) until every rank is done, then the model is broadcast from a rank that joined last.
    """

    def __init__(self, ddp, divide_by_initial_world_size=True, enable=True,
                 throw_on_early_termination=False):
        self._ddp = ddp
        self._enable = enable
        self._state = _JoinState(ddp, divide_by_initial_world_size, throw_on_early_termination)

    def __enter__(self):
        if self._enable:
            if self._ddp._join is not None:
                raise RuntimeError("DistributedDataParallel.join() contexts cannot be nested")
            self._ddp._join = self._state
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self._enable:
            return False
        ddp = self._ddp
        try:
            if exc_type is not None:
                return False
            ddp._join_shadow_loop(self._state)
        finally:
            ddp._join = None
        return False


class _JoinMixin:
    """The join methods of DistributedDataParallel (self is the DDP object)."""

    def join(self, divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False):
        """Context manager for uneven inputs: ranks that run out of data shadow the others'
        collectives until every rank is done (torch's ``ddp.join()``)."""
        return _DDPJoin(self, divide_by_initial_world_size, enable, throw_on_early_termination)

    # -------------------------------------------------------------------------------- join

    def join_hook(self, **kwargs):
        """The JoinHook of this model for ``pyddp.distributed.algorithms.join.Join``
        (``divide_by_initial_world_size`` as in ``join()``)."""
        divide = kwargs.get("divide_by_initial_world_size", True)
        return _DDPJoinHook(self, divide)

    @property
    def join_device(self):
        """The device of the join context's collectives (the model's device; the CPU for CPU models)."""
        return self._ctl_device if self._ctl_device is not None else "cpu"

    @property
    def join_process_group(self):
        """The process group the model reduces over."""
        return self.process_group

    def _join_notify(self, active):
        """One allreduce of every rank's "still active" flag; returns the number of active ranks."""
        flags = np.zeros(self._world, dtype=np.int32)
        flags[self._rank] = 1 if active else 0
        self._ctl_all_reduce(flags)
        alive = np.nonzero(flags)[0]
        st = self._join
        if len(alive):
            self._authoritative_rank = int(alive.max())
        if st is not None:
            if st.throw and len(alive) < self._world:
                raise RuntimeError("Detected at least one rank that exhausted inputs. Throwing across "
                                   "all ranks.")
            self._div = float(self._world if st.divide_initial else max(len(alive), 1))
        return len(alive)

    def _join_sync_flag(self, sync):
        flag = np.array([1 if sync else 0], dtype=np.int32)
        self._ctl_all_reduce(flag, dist.ReduceOp.MAX)
        return bool(flag[0])

    def _grads_out_of_buckets(self):
        ad = self._ad
        for i, p in enumerate(self._params):
            if ad.grad_ptr(p) == self._vptr[i]:
                ad.set_grad(p, ad.clone(self._views[i]))
            self._reclaim(i)

    def _join_shadow_loop(self, st):
        last_joiner = True
        while self._join_shadow_step():
            last_joiner = False
        self._join_finish(last_joiner)

    def _join_shadow_step(self):
        """One iteration of a joined rank: match the others' forward and backward collectives
        (this rank's ``param.grad`` stay as they are, as with torch's join hook). Returns False
        (having done nothing more) when no rank is active any more."""
        n = self._join_notify(active=False)
        if n == 0:
            return False
        self._maybe_rebuild()
        if self.broadcast_buffers and self._buffers_list:
            self._broadcast_coalesced(self._buffer_arrays(), self._authoritative_rank)
        if not self._join_sync_flag(False):
            return True
        # the others reduce their buckets: add zeros to each, in bucket order (this rank's
        # gradients stay as they are, as in torch: those that are bucket views move out first)
        self._grads_out_of_buckets()
        for b in self._buckets:
            if b.solo:  # the others reduce their gradient in place: this rank adds zeros
                i = b.params[0]
                b.buffer = self._ad.zeros(self._ad.numel(self._arrays[i]), b.dtype, like=self._arrays[i])
                b.views = [b.buffer.view(self._arrays[i].shape)]
            self._ad.zero_(b.buffer)
            if self._comm_hook is not None:
                b.future = self._comm_hook(self._comm_state, GradBucket(self, b))
            else:
                op = dist.ReduceOp.AVG if self._div == float(self._world) else dist.ReduceOp.SUM
                b.work = dist.all_reduce(b.buffer, op=op, group=self.process_group, async_op=True)
        for b in self._buckets:
            self._wait_bucket(b)
        if self.find_unused_parameters or self.static_graph:
            self._ctl_all_reduce(np.zeros(len(self._params), dtype=np.int32), dist.ReduceOp.MAX)
        self._iters += 1
        return True

    def _join_finish(self, last_joiner):
        # every rank is done: the model of a rank that joined last becomes everyone's
        who = np.array([self._rank if last_joiner else -1], dtype=np.int64)
        self._ctl_all_reduce(who, dist.ReduceOp.MAX)
        self._sync_params_and_buffers(int(who[0]))
        self._div = float(self._world)
