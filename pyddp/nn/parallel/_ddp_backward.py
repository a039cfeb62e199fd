"""DistributedDataParallel's backward: gradients as views of their bucket's slots, the autograd
hooks that mark each parameter ready, the buckets' allreduces launched in bucket order as they fill
(on the progress thread when the host has a spare core), and the end of backward that waits for
them.  ``_BackwardMixin`` is mixed into the DDP class (self is the DDP object).
"""
from __future__ import annotations

import sys
import warnings
import weakref

import numpy as np

from ... import _C
from ... import distributed as dist
from ...distributed import _observe
from ...distributed._grad_bucket import GradBucket
from ._buckets import assign_buckets as _assign_buckets


_READY_TWICE_MSG = (
    "Expected to mark a variable ready only once. This error is caused by one of the following "
    "reasons: 1) Use of a module parameter outside the `forward` function. Please make sure model "
    "parameters are not shared across multiple concurrent forward-backward passes. or try to use "
    "_set_static_graph() as a workaround if this module graph does not change during training "
    "loop.2) Reused parameters in multiple reentrant backward passes. For example, if you use "
    "multiple `checkpoint` functions to wrap the same part of your model, it would result in the "
    "same set of parameters been used by different reentrant backward passes multiple times, and "
    "hence marking a variable ready multiple times. DDP does not support such use cases in "
    "default. You can try to use _set_static_graph() as a workaround if your module graph does "
    "not change over iterations. Parameter {index} ({name!r}) has been marked as ready twice.")


class _BackwardMixin:
    """The backward half of DistributedDataParallel (see the module docstring)."""

    # ------------------------------------------------------------- gradients as bucket views

    def _install(self, i):
        """Make parameter i's .grad the view of its bucket slot."""
        t = self._ad.set_grad(self._params[i], self._marks[i])
        self._wrefs[i] = weakref.ref(t)

    def _held(self, i) -> bool:
        """Whether the .grad handed out for slot i is still referenced (by anything but DDP)."""
        w = self._wrefs[i]
        return sys.getrefcount(self._marks[i]) > 2 or (w is not None and w() is not None)

    def _reclaim(self, i):
        """Before slot i is written while parameter i's .grad is not its view: a .grad handed out
        earlier and still held (kept by the caller across zero_grad(set_to_none=True)) gets memory
        of its own, so the holder never sees it change."""
        if self._marks[i] is None or not self._held(i):  # (reduced in place: nothing handed out)
            return
        ad = self._ad
        ad.offer_grad_dest(self._params[i], None)  # DDP's own offer is no holder
        if not self._held(i):
            return
        w = self._wrefs[i]
        t = w() if w is not None else None
        if t is not None:
            ad.evacuate(t)
        del t
        self._wrefs[i] = None
        if sys.getrefcount(self._marks[i]) > 2 and not self._warned_held:
            self._warned_held = True
            warnings.warn(
                f"DistributedDataParallel: an array or view sharing memory with an earlier .grad of "
                f"parameter {self._param_names[i]!r} is still referenced; that gradient is a view of "
                "DDP's bucket, which this backward overwrites (copy a gradient you keep, e.g. "
                "with .clone(), before the next step)", RuntimeWarning, stacklevel=2)
        self._marks[i] = self._ad.alias(self._views[i])  # what was handed out stays with its holder

    def _reset_iteration(self):
        # the timeline (PYDDP_TIMELINE), asked once per iteration: off, the hooks pay nothing
        self._tl = _C.timeline_enabled()
        self._avg = self._comm_hook is None and self._div == float(self._world)
        self._hook_seen = False
        self._ready = [False] * len(self._params)
        self._next_bucket = 0
        self._used_local[:] = 0
        for b in self._buckets:
            b.pending = len(b.params)
            b.fresh = []
            if b.solo:  # the last step's gradient: not kept past its iteration
                b.buffer = None
                b.views = [None]
            b.work = None
            b.future = None

    def _maybe_rebuild(self):
        """Once, at the second iteration: rebuild buckets in the order rank 0's gradients were ready."""
        if self._rebuilt or self._iters < 1:
            return
        self._rebuilt = True
        n = len(self._params)
        order = np.full(n, -1, dtype=np.int64)
        if self._rank == 0 and len(self._ready_order) == n:
            order[:] = self._ready_order
        self._ctl_broadcast(order, self.process_group._ranks[0])
        self._ready_order = []
        if order[0] < 0 or sorted(order.tolist()) != list(range(n)):
            return
        if [i for b in self._buckets for i in b.params] == order.tolist():
            return
        limits = [self._first_bucket_bytes, self.bucket_bytes_cap]
        self._build_buckets(_assign_buckets(order.tolist(), [a.nbytes for a in self._arrays],
                                            [a.dtype for a in self._arrays], limits))

    # ---------------------------------------------------------------------------- backward

    def _autograd_hook(self, i, *_):
        if not self._expect_hooks:
            return
        if not self._hook_seen:
            self._hook_seen = True
            self._ad.queue_callback(self._finalize_backward)
            if getattr(self, "_tl", False):
                self._tl_backward = _C.wall()
            for j in self._unused_at_start or ():
                self._mark_ready(j, False)
        if self._ready[i]:
            raise RuntimeError(_READY_TWICE_MSG.format(index=i, name=self._param_names[i]))
        self._mark_ready(i, True)

    def _mark_ready(self, i, used):
        """Parameter i's gradient is final (``used``: its hook fired) and goes into its slot."""
        self._ready[i] = True
        if not self._rebuilt:
            self._ready_order.append(i)
        view = self._views[i]
        b = self._buckets[self._bucket_of[i]]
        ad = self._ad
        if b.solo:
            self._solo_ready(b, i)
            return
        gp = ad.grad_ptr(self._params[i])
        ours = gp == self._vptr[i]
        # Averaging: when every rank divides by the group size, the allreduce does it (AVG, in the
        # same pass as the sum); otherwise (join with divide_by_initial_world_size=False) the
        # gradient is scaled here. Comm hooks get it unscaled.
        scale = self._comm_hook is None and not self._avg
        if not used:
            # as torch: a gradient the parameter already has (from earlier steps) goes in, else zeros
            if ours:  # restored should no rank use the parameter (_finalize_backward)
                self._saved[i] = ad.clone(view)
                if scale:
                    ad.scale_(view, view, 1.0 / self._div)
            elif gp:
                g = ad.grad_array(self._params[i])
                self._reclaim(i)
                if scale:
                    ad.scale_(view, g, 1.0 / self._div)
                else:
                    ad.copy_(view, g)
                del g
            else:
                self._reclaim(i)
                ad.zero_(view)
        else:
            self._used_local[i] = 1
            if ours:
                # accumulated (or computed) straight into the slot: nothing to copy
                if scale:
                    ad.scale_(view, view, 1.0 / self._div)
                t = ad.grad_tensor(self._params[i])  # (a new one when linear computed into the slot)
                w = self._wrefs[i]
                if w is None or w() is not t:
                    self._wrefs[i] = weakref.ref(t)
                del t
            elif scale:
                g = ad.grad_array(self._params[i])
                self._reclaim(i)
                ad.scale_(view, g, 1.0 / self._div)
                del g
                self._install(i)
            else:
                # copied in with the rest of the bucket's fresh gradients, in one call, once the
                # bucket is complete (one kernel launch per bucket on a GPU, not one per gradient)
                b.fresh.append((i, ad.grad_array(self._params[i])))
        b.pending -= 1
        if b.pending == 0:
            if b.fresh:
                self._copy_fresh(b)
            self._launch_ready_buckets()

    def _solo_ready(self, b, i):
        """Parameter i's gradient, in a bucket of its own, is final: it is the bucket (in place)."""
        p = self._params[i]
        g = p.grad  # (only used gradients get here: no unused-parameter detection with in-place)
        if not g.is_contiguous() or g.requires_grad:
            g = g.detach().contiguous()
            p.grad = g
        if self._comm_hook is None and not self._avg:
            g.mul_(1.0 / self._div)
        self._used_local[i] = 1
        b.buffer = g.detach().view(-1)
        b.views = [g.detach()]
        b.pending -= 1
        self._launch_ready_buckets()

    def _copy_fresh(self, b):
        """Copy bucket b's fresh gradients into their slots, then make them the slots' views."""
        idx = [i for i, _ in b.fresh]
        grads = [g for _, g in b.fresh]
        b.fresh = []
        for i in idx:
            self._reclaim(i)
        self._ad.copy_many([self._views[i] for i in idx], grads)
        del grads
        for i in idx:
            self._install(i)

    def _launch_ready_buckets(self):
        bs = self._buckets
        while self._next_bucket < len(bs) and bs[self._next_bucket].pending == 0:
            self._launch(bs[self._next_bucket])
            self._next_bucket += 1

    def _launch(self, b):
        if getattr(self, "_tl", False):
            b.t_launch = _C.wall()
            _observe.timeline_instant(f"bucket {b.index} ready", "ddp",
                                      {"bucket": b.index, "params": len(b.params),
                                       "bytes": int(b.buffer.nbytes)})
        if self._comm_hook is not None:
            b.future = self._comm_hook(self._comm_state, GradBucket(self, b))
        else:
            op = dist.ReduceOp.AVG if self._avg else dist.ReduceOp.SUM
            # in place: the bucket's slots are the parameters' .grad
            if self._overlap:
                b.work = dist.all_reduce(b.buffer, op=op, group=self.process_group, async_op=True)
            else:
                dist.all_reduce(b.buffer, op=op, group=self.process_group)
                self._tl_bucket_done(b)

    def _tl_bucket_done(self, b):
        if getattr(self, "_tl", False) and b.t_launch:
            _observe.timeline_span(f"bucket {b.index} allreduce", "ddp", b.t_launch, _C.wall(),
                                   {"bucket": b.index, "bytes": int(b.buffer.nbytes),
                                    "iteration": self._iters})
            b.t_launch = 0.0

    def _finalize_backward(self):
        if not all(self._ready):
            if self.find_unused_parameters or self.static_graph:
                for i, r in enumerate(self._ready):
                    if not r:
                        self._mark_ready(i, False)
            else:
                self._unfinished = [i for i, r in enumerate(self._ready) if not r]
                self._expect_hooks = False
                return
        self._expect_hooks = False
        for b in self._buckets:
            self._wait_bucket(b)
            self._tl_bucket_done(b)
            if b.solo and self._comm_hook is None:
                # let the gradient go with its .grad (a hook's callbacks may still read the bucket:
                # then at the next iteration): zero_grad(set_to_none=True) frees it before forward,
                # so the allocator reuses its memory, as without DDP
                b.buffer = None
                b.views = [None]
        used = None
        if self.find_unused_parameters or self.static_graph:
            used = self._ctl_all_reduce(self._used_local.copy(), dist.ReduceOp.MAX)
        saved, self._saved = self._saved, {}
        if used is not None:
            # the gradients computed here are views of their slots already; a parameter this rank
            # did not use gets the averaged gradient unless no rank used it, when it stays as it was
            ad = self._ad
            for i in np.flatnonzero(self._used_local == 0).tolist():
                if not used[i]:
                    if i in saved:
                        ad.copy_(self._views[i], saved[i])
                elif ad.grad_ptr(self._params[i]) != self._vptr[i]:
                    self._install(i)
        if getattr(self, "_tl", False) and getattr(self, "_tl_backward", 0.0):
            _observe.timeline_span("backward (first gradient ready to all reduced)", "backward",
                                   self._tl_backward, _C.wall(), {"iteration": self._iters})
            self._tl_backward = 0.0
        self._iters += 1

    def _wait_bucket(self, b):
        if b.work is not None:
            b.work.wait()
            b.work = None
        elif b.future is not None:
            res = b.future.wait()
            b.future = None
            if isinstance(res, (list, tuple)):
                res = res[0]
            ad = self._ad
            arr = ad.as_array(res).reshape(-1)
            buf = b.buffer
            if not (arr is buf or (arr.shape == buf.shape and arr.dtype == buf.dtype
                                   and ad.ptr(arr) == ad.ptr(buf))):
                ad.copy_(buf, arr)
