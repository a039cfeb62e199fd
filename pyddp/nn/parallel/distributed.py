"""DistributedDataParallel: bucketed gradient averaging overlapped with backward.

``DistributedDataParallel(model)`` behaves as torch's does, for pyddp.nn modules and for torch.nn
modules (pyddp then is the distributed runtime under a torch model: the buckets are torch tensors in
the parameters' dtype and on their device, every bucket operation is torch's own through the adapter
of _frameworks.py, so the same code runs on CPU and CUDA tensors; readiness comes from torch's
post-accumulate-grad hooks).

How a step runs:

* forward: a rank that did not finish the previous reduction (a parameter got no gradient, or
  its backward raised mid-way after some buckets were reduced) raises torch's "Expected to have
  finished reduction in the prior iteration ..." error (its peers, whose reductions it left
  unmatched, get the group's error instead); buckets are rebuilt once (second
  iteration) in the order gradients became ready on rank 0; buffers are broadcast from rank 0.
* backward: the hook of each parameter fires when its gradient is final. After the first
  reducing iteration ``param.grad`` *is* a view of the parameter's slot in its bucket, so autograd
  accumulates straight into the bucket (set_to_none=False, no_sync) or pyddp.nn's linear computes
  into it (offer_grad_dest); only a gradient elsewhere (a fresh one after zero_grad(set_to_none=True)
  on a torch model, or one the user assigned) is copied in, and ``.grad`` becomes the slot's view.
  A bucket whose gradients are all in is allreduced in place at once (on the progress thread when
  the host has a spare core), in bucket order on every rank, while backward goes on.
* end of backward (an autograd callback): the remaining buckets are waited for; the averaged
  gradients are already in ``param.grad``, nothing is copied back.

When every rank of the group is on this host the buckets live in the group's shared memory, so the
allreduce reduces straight from them without a copy-in.

A gradient DDP handed out is never overwritten behind a holder's back: before a step writes a slot
whose previous ``.grad`` is still referenced elsewhere (the caller kept it, then zero_grad set
``.grad`` to None), that tensor gets memory of its own (same values); an array or view taken from it
that still points into the bucket draws a warning.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import sys
import warnings
import weakref

import numpy as np

from ... import _C, _config
from ...cuda import _emulation as _cuda_emulation
from ... import distributed as dist
from ...distributed import _observe
from ...distributed._grad_bucket import GradBucket  # noqa: F401  (torch.nn.parallel has it here too)
from ...distributed import distributed_c10d as c10d
from . import _apex_ddp, _frameworks
from ._buckets import assign_buckets as _assign_buckets

__all__ = ["DistributedDataParallel"]

_DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
_DEFAULT_BUCKET_CAP_MB = 25
_BROADCAST_COALESCE_BYTES = 250 * 1024 * 1024

_UNFINISHED_MSG = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your module has parameters that were not used in producing loss. You can enable "
    "unused parameter detection by passing the keyword argument `find_unused_parameters=True` to "
    "`pyddp.nn.parallel.DistributedDataParallel`, and by \nmaking sure all `forward` function outputs "
    "participate in calculating loss. \nIf you already have done the above, then the distributed data "
    "parallel module wasn't able to locate the output tensors in the return value of your module's "
    "`forward` function. Please include the loss function and the structure of the return value of "
    "`forward` of your module when reporting this issue (e.g. list, dict, iterable).\n"
    "Parameter indices which did not receive grad for rank {rank}: {indices}\n"
    "Parameters which did not receive grad for rank {rank}: {names}")


class _Bucket:
    __slots__ = ("index", "params", "dtype", "buffer", "views", "pending", "work", "future", "shared",
                 "offsets", "t_launch", "fresh", "solo")

    def __init__(self, index, params, dtype, buffer, views, offsets, shared):
        self.index = index
        self.params = params        # parameter indices, in layout order
        self.dtype = dtype
        self.buffer = buffer        # 1-D array holding every gradient of the bucket
        self.views = views          # per parameter: a view of buffer shaped like the parameter
        self.pending = len(params)
        self.work = None
        self.future = None
        self.shared = shared
        self.offsets = offsets      # per parameter: its first element in buffer
        self.t_launch = 0.0         # timeline: when its allreduce started (wall clock)
        self.fresh = []             # (parameter index, gradient) still to copy into the bucket
        self.solo = False           # one gradient reduced where autograd put it (no buffer of its own)


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


class _DDPCore:
    """The framework-independent part of DistributedDataParallel (mixed into the module classes)."""

    _first_bucket_bytes = _DEFAULT_FIRST_BUCKET_BYTES  # apex's message_size: no smaller first bucket

    def _to_array(self, x):
        """GradBucket.set_buffer's conversion (a hook's tensor) to an array of the model's framework."""
        return self._ad.as_array(x)

    def _ddp_init(self, module, device_ids, output_device, dim, broadcast_buffers, init_sync,
                  process_group, bucket_cap_mb, find_unused_parameters, check_reduction,
                  gradient_as_bucket_view, static_graph):
        ad = _frameworks.adapter_for(module)
        self._ad = ad
        self._set_devices(module, device_ids, output_device)
        if check_reduction:
            warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is "
                          "deprecated. Please avoid using it.", FutureWarning, stacklevel=4)
        if process_group is None:
            if not dist.is_initialized():
                raise RuntimeError("Default process group has not been initialized, please make sure "
                                   "to call init_process_group.")
            pg = c10d._default_pg()
        else:
            pg = process_group
        if not isinstance(pg, c10d.ProcessGroup):
            raise TypeError(f"process_group must be a pyddp ProcessGroup or None, got "
                            f"{type(pg).__name__}")
        if bucket_cap_mb is None:
            bucket_cap_mb = _DEFAULT_BUCKET_CAP_MB
        if not isinstance(bucket_cap_mb, (int, float)) or bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        self.process_group = pg
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = bool(find_unused_parameters)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.static_graph = bool(static_graph)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)
        self._rank = pg.rank()
        self._world = pg.size()

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any "
                               "parameter that requires a gradient.")
        self._param_names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._arrays = [ad.array(p) for p in self._params]
        for name, a in zip(self._param_names, self._arrays):
            if not ad.contiguous(a):
                raise ValueError(f"DistributedDataParallel: parameter {name!r} is not contiguous")
        self._buffer_names = [n for n, _ in module.named_buffers()]
        self._buffers_list = [b for _, b in module.named_buffers()]

        if init_sync:
            self._verify_same_model()
            self._sync_params_and_buffers(0)

        # per-iteration state
        self._comm_hook = None
        self._comm_state = None
        self._join = None
        self._expect_hooks = False
        self._dests_offered = False
        self._warned_held = False
        self._unfinished = None
        self._unused_at_start = None  # find_unused_parameters: marked ready when backward starts
        self._ready = [False] * len(self._params)
        self._ready_order = []
        self._next_bucket = 0
        self._iters = 0
        self._rebuilt = self.find_unused_parameters and not self.static_graph
        self._div = float(self._world)
        self._avg = True
        self._used_local = np.zeros(len(self._params), dtype=np.int32)
        # shared buckets: the group's host backend maps memory every rank of it reads
        self._shared_ok = pg._shared_alloc() is not None and all(ad.on_host(a)
                                                                 for a in self._arrays)
        # Large gradients of a torch model on the CPU are reduced where autograd put them (single
        # copies read a peer's private memory by address), not copied into a shared bucket first:
        # that copy is a pass over the gradient every step once zero_grad() hands autograd None.
        # Every rank decides alike (same model, same group, the same PYDDP_DDP_IN_PLACE).
        solo = _config.get("PYDDP_DDP_IN_PLACE")
        self._solo_min = solo if (solo and ad.name == "torch" and self._shared_ok
                                  and not self.find_unused_parameters and not self.static_graph) else 0
        # a model on a GPU always launches its buckets asynchronously: on nccl the allreduce is
        # ordered on the streams and needs no spare host core
        self._overlap = self._ctl_device is not None or _overlap_default(pg)

        n = len(self._params)
        limits = [self._first_bucket_bytes, self.bucket_bytes_cap]
        self._build_buckets(_assign_buckets(range(n - 1, -1, -1), [a.nbytes for a in self._arrays],
                                            [a.dtype for a in self._arrays], limits))
        # One DDP per module at a time: a new wrapper of the same module (pyddp.elastic wraps it
        # again in each generation's group) takes the gradient hooks over from the previous one,
        # whose group may be gone; two sets of hooks would mark every parameter ready twice.
        # (A weak table, not an attribute: the module still pickles.)
        try:
            prev = _WRAPPERS.get(module)
            _WRAPPERS[module] = weakref.ref(self)
        except TypeError:  # a module that cannot be weakly referenced: no takeover
            prev = None
        prev = prev() if prev is not None else None
        if prev is not None and prev is not self:
            prev._detach_hooks()
        self._hook_handles = [ad.post_accumulate_hook(p, self._make_hook(i))
                              for i, p in enumerate(self._params)]

    def _detach_hooks(self):
        """Remove this wrapper's gradient hooks (a newer DDP of the same module replaced it)."""
        for h in getattr(self, "_hook_handles", ()):
            h.remove()
        self._hook_handles = []

    # ------------------------------------------------------------------ construction helpers

    def _set_devices(self, module, device_ids, output_device):
        """torch's device_ids / output_device: for a module on one CUDA device, ``device_ids`` is
        None or that one device (inputs are then moved there before forward); CPU modules ignore
        them with a warning (the seed scripts pass ``device_ids=[local_rank]``)."""
        ad = self._ad
        devs = ad.devices(module)
        self.device_ids = None
        self.output_device = None
        self._input_device = None
        self._ctl_device = None  # where the small control arrays go for collectives (None: host)
        if all(ad.is_cpu_device(d) for d in devs):
            self.device_type = "cpu"
            # torch raises here; seed scripts pass device_ids=[local_rank] for GPUs, so keep them
            # running and say what happens (PYDDP_CUDA_ON_CPU=1: silent, as on a GPU)
            if (device_ids is not None or output_device is not None) and \
                    not _cuda_emulation.enabled():
                warnings.warn("DistributedDataParallel: device_ids and output_device are ignored "
                              "for CPU modules (pyddp runs the model where its parameters are)",
                              stacklevel=5)
            return
        import torch

        if len({d.type for d in devs}) > 1 or (len(devs) > 1 and device_ids is not None):
            raise ValueError(
                "DistributedDataParallel device_ids and output_device arguments only work with "
                "single-device GPU modules or CPU modules, but got device_ids "
                f"{device_ids}, output_device {output_device}, and module parameters "
                f"{sorted(devs, key=str)}.")
        dev = next(iter(devs))
        self.device_type = dev.type
        self._ctl_device = dev
        if device_ids is not None:
            if not isinstance(device_ids, (list, tuple)) or len(device_ids) != 1:
                raise ValueError("device_ids can only be None or contain a single element, got "
                                 f"{device_ids!r}")
            want = torch.device(dev.type, dev.index if dev.index is not None else 0)
            d0 = device_ids[0]
            got = torch.device(want.type, d0) if isinstance(d0, int) else torch.device(d0)
            if got != want:
                raise ValueError(f"device_ids={list(device_ids)!r} names {got}, but the module's "
                                 f"parameters are on {want}; move the module there first "
                                 "(model.to(device)) or pass device_ids=[its index]")
            self.device_ids = [want.index]
            if output_device is None:
                output_device = want.index
            self.output_device = output_device if isinstance(output_device, int) else \
                torch.device(output_device).index
            self._input_device = want

    def _ctl_all_reduce(self, arr, op=None):
        """All-reduce a small host control array in place (on the model's device for CUDA models:
        the nccl backend takes device memory only)."""
        op = dist.ReduceOp.SUM if op is None else op
        if self._ctl_device is None:
            dist.all_reduce(arr, op=op, group=self.process_group)
            return arr
        import torch

        t = torch.from_numpy(arr).to(self._ctl_device)
        dist.all_reduce(t, op=op, group=self.process_group)
        arr[...] = t.cpu().numpy()
        return arr

    def _ctl_broadcast(self, arr, src):
        if self._ctl_device is None:
            dist.broadcast(arr, src, group=self.process_group)
            return arr
        import torch

        t = torch.from_numpy(arr).to(self._ctl_device)
        dist.broadcast(t, src, group=self.process_group)
        arr[...] = t.cpu().numpy()
        return arr

    def _verify_same_model(self):
        mine = [(n, tuple(a.shape), str(a.dtype).replace("torch.", ""))
                for n, a in zip(self._param_names, self._arrays)]
        everyone = [None] * self._world
        dist.all_gather_object(everyone, mine, group=self.process_group)
        ref = everyone[0]
        for r, theirs in enumerate(everyone):
            if r == 0:
                continue
            if len(theirs) != len(ref):
                raise RuntimeError(
                    f"DDP expects same model across all ranks, but Rank {r} has {len(theirs)} params, "
                    f"while rank 0 has inconsistent {len(ref)} params.")
            for k, (a, b) in enumerate(zip(ref, theirs)):
                if a[1:] != b[1:]:
                    raise RuntimeError(
                        f"DDP expects same model across all ranks, but Rank {r} has parameter {k} "
                        f"({b[0]!r}) of shape {list(b[1])} and dtype {b[2]}, while rank 0 has "
                        f"parameter {k} ({a[0]!r}) of shape {list(a[1])} and dtype {a[2]}.")

    def _broadcast_coalesced(self, arrays, src):
        """Broadcast a list of arrays from group rank ``src``, packed per dtype in 250 MiB chunks."""
        by_dtype = {}
        numel = self._ad.numel
        for a in arrays:
            if numel(a):
                by_dtype.setdefault(a.dtype, []).append(a)
        for dt, group in by_dtype.items():
            chunk, nbytes = [], 0
            for a in group + [None]:
                if a is not None and (not chunk or nbytes + a.nbytes <= _BROADCAST_COALESCE_BYTES):
                    chunk.append(a)
                    nbytes += a.nbytes
                    continue
                if chunk:
                    self._broadcast_chunk(chunk, dt, src)
                chunk, nbytes = ([a], a.nbytes) if a is not None else ([], 0)

    def _broadcast_chunk(self, chunk, dt, src):
        pg = self.process_group
        gsrc = pg._ranks[src]
        ad = self._ad
        if len(chunk) == 1 and ad.contiguous(chunk[0]) and ad.writeable(chunk[0]):
            dist.broadcast(chunk[0].reshape(-1), gsrc, group=pg)
            return
        sizes = [ad.numel(a) for a in chunk]
        flat = ad.empty(sum(sizes), dt, like=chunk[0])
        if self._rank == src:
            off = 0
            for a, n in zip(chunk, sizes):
                ad.copy_(flat[off:off + n], a.reshape(-1))
                off += n
        dist.broadcast(flat, gsrc, group=pg)
        if self._rank != src:
            off = 0
            for a, n in zip(chunk, sizes):
                ad.copy_(a, flat[off:off + n].reshape(a.shape))
                off += n

    def _buffer_arrays(self):
        return [self._ad.array(b) for b in self._buffers_list]

    def _sync_params_and_buffers(self, src):
        self._broadcast_coalesced(self._arrays + self._buffer_arrays(), src)

    def _alloc(self, n, dtype, like):
        ad = self._ad
        if self._shared_ok:
            hdt = ad.host_dtype(dtype)
            try:
                if hdt is None:
                    raise TypeError(f"no shared bucket for {dtype}")
                return ad.from_host(c10d._shared_array(n, hdt, group=self.process_group)), True
            except (dist.DistError, ValueError, TypeError):
                # every rank fails together (a collective, or the same dtype), so all fall back alike
                self._shared_ok = False
        return ad.zeros(n, dtype, like=like), False

    def _build_buckets(self, assignment):
        old = getattr(self, "_bucket_of", None)
        buckets = []
        bucket_of = [None] * len(self._params)
        views = [None] * len(self._params)
        ad = self._ad
        for idxs in self._split_solo(assignment):
            bi = len(buckets)
            if idxs[0] < 0:  # a gradient reduced in place: no buffer, no view
                i = -1 - idxs[0]
                b = _Bucket(bi, [i], self._arrays[i].dtype, None, [None], [0], False)
                b.solo = True
                buckets.append(b)
                bucket_of[i] = bi
                continue
            dt = self._arrays[idxs[0]].dtype
            total = sum(ad.numel(self._arrays[i]) for i in idxs)
            buf, shared = self._alloc(total, dt, self._arrays[idxs[0]])
            vs, offs = [], []
            off = 0
            for i in idxs:
                a = self._arrays[i]
                n = ad.numel(a)
                v = buf[off:off + n].reshape(a.shape)
                offs.append(off)
                off += n
                vs.append(v)
                views[i] = v
                bucket_of[i] = bi
            buckets.append(_Bucket(bi, list(idxs), dt, buf, vs, offs, shared))
        old_ptr = getattr(self, "_vptr", None)
        # gradients that are views of the old buckets move into the new ones
        moving = [] if old_ptr is None else \
            [i for i, p in enumerate(self._params) if ad.grad_ptr(p) == old_ptr[i]]
        self._buckets = buckets
        self._bucket_of = bucket_of
        self._views = views
        self._vptr = [ad.ptr(v) if v is not None and ad.numel(v) else -1 for v in views]
        # per parameter, the array handed out as its .grad's memory (a view of its slot; only that
        # object, so sys.getrefcount tells whether anything still refers to it) and a weak
        # reference to the tensor wrapping it
        self._marks = [ad.alias(v) if v is not None else None for v in views]
        self._wrefs = [None] * len(views)
        self._saved = {}
        for i in moving:
            if views[i] is None:  # now reduced in place: the gradient gets memory of its own
                ad.set_grad(self._params[i], ad.clone(ad.grad_array(self._params[i])))
                continue
            ad.copy_(views[i], ad.grad_array(self._params[i]))
            self._install(i)
        del old

    def _split_solo(self, assignment):
        """The buckets of ``assignment`` with every gradient of at least PYDDP_DDP_IN_PLACE bytes
        taken out into a bucket of its own, written [-1 - index], placed before the rest of the
        bucket it came from (the same order on every rank)."""
        lim = self._solo_min
        out = []
        for idxs in assignment:
            idxs = list(idxs)
            if lim:
                solo = [i for i in idxs if self._arrays[i].nbytes >= lim
                        and self._ad.host_dtype(self._arrays[i].dtype) is not None]
                out.extend([-1 - i] for i in solo)
                idxs = [i for i in idxs if i not in solo]
            if idxs:
                out.append(idxs)
        return out

    # ----------------------------------------------------------------------------- forward

    def _make_hook(self, i):
        # a partial, not a closure: one Python frame less per gradient (a step runs one per parameter)
        return functools.partial(self._autograd_hook, i)

    def _pre_forward(self):
        if self._unfinished is None and self._expect_hooks and self._hook_seen:
            # the last backward started reducing (a hook fired) but never reached its end (it
            # raised mid-way, so the end-of-backward callback never ran): as torch, this rank
            # cannot start a new iteration; the parameters whose gradients never came are named
            self._unfinished = [i for i, r in enumerate(self._ready) if not r]
            self._expect_hooks = False
        if self._unfinished is not None:
            idx = self._unfinished
            raise RuntimeError(_UNFINISHED_MSG.format(
                rank=self._rank, indices=" ".join(str(i) for i in idx),
                names=", ".join(self._param_names[i] for i in idx)))
        sync = self._ad.grad_enabled() and self.require_backward_grad_sync
        join = self._join
        if join is not None:
            if join.generic:
                _join_mod().Join.notify_join_context(self)
            self._join_notify(active=True)
        if sync or join is not None:
            self._maybe_rebuild()
        if self.broadcast_buffers and self._buffers_list:
            src = self._authoritative_rank if join is not None else 0
            self._broadcast_coalesced(self._buffer_arrays(), src)
        if join is not None:
            sync = self._join_sync_flag(sync) and sync
        self._expect_hooks = sync
        self._unused_at_start = None
        if sync:
            self._reset_iteration()
        self._offer_grad_dests(sync)

    def _post_forward(self, output):
        """With find_unused_parameters: the parameters the output does not depend on, found by
        walking its autograd graph (torch's prepare_for_backward); they are marked ready when
        backward starts, so a bucket holding one goes in its turn on every rank, not at the end
        of backward on the ranks that did not use it while the others reduce it earlier (out of
        order with collectives that run during backward, SyncBatchNorm's)."""
        if self._expect_hooks and self.find_unused_parameters and not self.static_graph:
            reached = _reachable_leaves(output)
            self._unused_at_start = [i for i, p in enumerate(self._params) if id(p) not in reached]
        return output

    def _offer_grad_dests(self, sync):
        """In a reducing iteration, offer every parameter without a gradient its bucket slot as the
        array to compute its gradient into (pyddp.nn: linear does), which saves copying it there."""
        ad = self._ad
        if not ad.offers_grad_dest or (not sync and not self._dests_offered):
            return
        self._dests_offered = sync
        for i, p in enumerate(self._params):
            if sync and ad.grad_ptr(p) == 0:
                self._reclaim(i)
                ad.offer_grad_dest(p, self._marks[i])
            else:
                ad.offer_grad_dest(p, None)

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

    # ------------------------------------------------------------------------- public API

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, backward does not reduce: gradients accumulate locally until the next backward
        outside the context, which reduces the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def disable_allreduce(self):
        """apex's name: backward stops reducing gradients (like ``no_sync``) until
        ``enable_allreduce()``."""
        self.require_backward_grad_sync = False

    def enable_allreduce(self):
        """apex's name: backward reduces gradients again."""
        self.require_backward_grad_sync = True

    def register_comm_hook(self, state, hook):
        """Replace the bucket allreduce by ``hook(state, bucket) -> Future`` (once, before training).

        With a hook the gradients are not pre-divided by the world size: the hook averages (as
        torch's allreduce_hook does). The future's value (a tensor or [tensor]) becomes the bucket.
        """
        if getattr(self, "_apex", None) is not None and self._comm_hook is not None:
            raise RuntimeError("register_comm_hook cannot be combined with apex's "
                               "delay_allreduce, gradient_average, gradient_predivide_factor, "
                               "allreduce_always_fp32, retain_allreduce_buffers or "
                               "num_allreduce_streams (they reduce through their own hook)")
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {type(hook).__name__}")
        self._comm_hook = hook
        self._comm_state = state

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


_WRAPPERS = weakref.WeakKeyDictionary()  # module -> weakref to its current DDP


def _register_joinable():
    _join_mod().Joinable.register(_DDPCore)
    # outside any Join context (torch's disabled _JoinConfig)
    _DDPCore._join_config = _join_mod()._JoinConfig.construct_disabled_join_config()


_register_joinable()


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


def _output_tensors(obj, out):
    """The tensors in a forward's output (torch's _find_tensors: nested lists, tuples, dicts and
    dataclasses)."""
    if hasattr(obj, "grad_fn") and hasattr(obj, "requires_grad"):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _output_tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _output_tensors(o, out)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _output_tensors(getattr(obj, f.name), out)
    return out


def _reachable_leaves(output) -> set:
    """ids of the leaf tensors (parameters) whose gradients backward from ``output`` computes:
    the AccumulateGrad nodes reached from its tensors' grad_fn (pyddp's graph and torch's have
    the same shape: next_functions, AccumulateGrad.variable)."""
    reached, seen = set(), set()
    stack = []
    for t in _output_tensors(output, []):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:
            reached.add(id(t))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if var is not None:
            reached.add(id(var))
        for nxt, _ in node.next_functions:
            if nxt is not None:
                stack.append(nxt)
    return reached


def _overlap_default(pg) -> bool:
    """Reduce buckets on the progress thread while backward goes on, or on the calling thread
    (the group decides: ProcessGroup._overlap)."""
    return pg._overlap()


class DistributedDataParallel(metaclass=abc.ABCMeta):
    """Data-parallel training of a pyddp.nn or torch.nn module (torch's signature and behaviour).

    ``DistributedDataParallel(module)`` returns a module wrapping ``module`` (``ddp.module``): a
    pyddp.nn.Module for pyddp models, a torch.nn.Module for torch models. ``isinstance(x,
    DistributedDataParallel)`` holds for both.
    """

    def __new__(cls, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                init_sync=True, process_group=None, bucket_cap_mb=None, find_unused_parameters=False,
                check_reduction=False, gradient_as_bucket_view=False, static_graph=False, **kwargs):
        # apex.parallel.DistributedDataParallel's keyword arguments (see _apex_ddp)
        bucket_cap_mb, apex = _apex_ddp.parse(kwargs, bucket_cap_mb)
        if kwargs:
            unknown = ", ".join(sorted(kwargs))
            raise TypeError(f"DistributedDataParallel got unexpected keyword argument(s): {unknown}")
        impl = _torch_impl() if _frameworks.is_torch_module(module) else _pyddp_impl()
        ddp = impl(module, device_ids, output_device, dim, broadcast_buffers, init_sync,
                   process_group, bucket_cap_mb, find_unused_parameters, check_reduction,
                   gradient_as_bucket_view, static_graph)
        if apex is not None:
            _apex_ddp.install(ddp, apex)
        return ddp


_impls = {}


def _torch_impl():
    cls = _impls.get("torch")
    if cls is None:
        import torch

        class _TorchDistributedDataParallel(_DDPCore, torch.nn.Module):
            __doc__ = DistributedDataParallel.__doc__

            def __init__(self, module, *args):
                torch.nn.Module.__init__(self)
                self.module = module
                self._ddp_init(module, *args)

            def forward(self, *inputs, **kwargs):
                self._pre_forward()
                if self._input_device is not None:
                    # device_ids=[i]: inputs move to the module's device, as torch's DDP does
                    inputs, kwargs = _to_device((inputs, kwargs), self._input_device)
                return self._post_forward(self.module(*inputs, **kwargs))

        _TorchDistributedDataParallel.__name__ = "DistributedDataParallel"
        _TorchDistributedDataParallel.__qualname__ = "DistributedDataParallel"
        DistributedDataParallel.register(_TorchDistributedDataParallel)
        cls = _impls["torch"] = _TorchDistributedDataParallel
    return cls


def _to_device(obj, device):
    """torch's DDP input move: tensors in nested tuples, lists and dicts go to ``device``."""
    if _frameworks.is_torch_tensor(obj):
        return obj if obj.device == device else obj.to(device, non_blocking=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_device(o, device) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device)) for k, v in obj.items())
    return obj


def _pyddp_impl():
    cls = _impls.get("pyddp")
    if cls is None:
        from ..modules.module import Module

        class _PyddpDistributedDataParallel(_DDPCore, Module):
            __doc__ = DistributedDataParallel.__doc__

            def __init__(self, module, *args):
                Module.__init__(self)
                self.module = module
                self._ddp_init(module, *args)

            def forward(self, *inputs, **kwargs):
                self._pre_forward()
                return self._post_forward(self.module(*inputs, **kwargs))

        _PyddpDistributedDataParallel.__name__ = "DistributedDataParallel"
        _PyddpDistributedDataParallel.__qualname__ = "DistributedDataParallel"
        DistributedDataParallel.register(_PyddpDistributedDataParallel)
        cls = _impls["pyddp"] = _PyddpDistributedDataParallel
    return cls

