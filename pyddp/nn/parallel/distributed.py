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

This module holds construction, forward and the public API; the backward half (gradients as bucket
views, readiness, the buckets' reductions) is _ddp_backward.py, join (uneven inputs) _ddp_join.py,
both mixed into the class here.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import warnings
import weakref

import numpy as np

from ... import _config
from ...cuda import _emulation as _cuda_emulation
from ... import distributed as dist
from ...distributed._grad_bucket import GradBucket  # noqa: F401  (torch.nn.parallel has it here too)
from ...distributed import distributed_c10d as c10d
from . import _apex_ddp, _frameworks
from ._buckets import assign_buckets as _assign_buckets
from ._ddp_backward import _BackwardMixin
from ._ddp_join import _JoinMixin, _join_mod

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


class _DDPCore(_BackwardMixin, _JoinMixin):
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


_WRAPPERS = weakref.WeakKeyDictionary()  # module -> weakref to its current DDP


def _register_joinable():
    _join_mod().Joinable.register(_DDPCore)
    # outside any Join context (torch's disabled _JoinConfig)
    _DDPCore._join_config = _join_mod()._JoinConfig.construct_disabled_join_config()


_register_joinable()


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

