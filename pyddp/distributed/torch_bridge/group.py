"""The torch bridge's process group: ``ProcessGroupPyddp``, the ``torch.distributed.ProcessGroup``
subclass torch uses as the whole group, whose methods turn torch's arguments into checked requests
of a pyddp ProcessGroup (see the package docstring).
"""
from __future__ import annotations

import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from ... import _C, _interop
from .. import _observe
from .._rendezvous import spawn_secret as _spawn_secret
from ..backends import registry as _registry
from ..backends.interface import BackendOptions
from ..process_group import ProcessGroup as _Group
from .nccl import _TorchNccl
from .work import Work, _Done, _seconds, _torch_error

BACKEND_NAME = "pyddp"
_OPS = dict(_C.REDUCE_OPS)  # torch's RedOpType name -> pyddp op code
# torch's RedOpType -> pyddp op code (the blocking fast path looks the op up with no string work)
# (indexed by RedOpType.value: reading the enum's int is cheaper than hashing the enum)
_OP_CODES = [-1] * (1 + max(t.value for t in _c10d.ReduceOp.RedOpType.__members__.values()))
for _n, _t in _c10d.ReduceOp.RedOpType.__members__.items():
    if _n in _OPS:
        _OP_CODES[_t.value] = _OPS[_n]
_OP_CODES = tuple(_OP_CODES)
_K_ALLREDUCE, _K_BROADCAST, _K_BARRIER = _C.K_ALLREDUCE, _C.K_BROADCAST, _C.K_BARRIER
_K_ALLGATHER, _K_REDUCE_SCATTER = _C.K_ALLGATHER, _C.K_REDUCE_SCATTER
_K_REDUCE, _K_GATHER, _K_SCATTER = _C.K_REDUCE, _C.K_GATHER, _C.K_SCATTER
_K_ALLTOALL = _C.K_ALLTOALL
_PREMUL_SUM = _c10d.ReduceOp.RedOpType.PREMUL_SUM
# what the group's messages name as its backends ("no backend of group 'torch' serves ...")
# (CUDA tensors: what pyddp's NCCL backend declares it supports, refused above the seam alike)
_PLAN = {"cpu": _registry.BackendEntry(BACKEND_NAME, ("cpu", "cuda"), None),
         "cuda": _registry.BackendEntry("nccl", ("cuda",), None,
                                        supports=_registry.lookup("nccl").supports)}
_SUM, _SUM_CODE = _c10d.ReduceOp.RedOpType.SUM, _OPS["SUM"]


def _op_code(reduce_op):
    """pyddp's op code of the ReduceOp in a torch options object (-1: none, e.g. PREMUL_SUM).
    SUM, nearly every call's op, is one comparison: each attribute read of torch's options and
    ReduceOp objects costs about 0.5-1 us, a tenth of a small collective."""
    return _SUM_CODE if reduce_op == _SUM else _OP_CODES[reduce_op.op.value]


def _host_list(x):
    """NumPy views of a list of CPU tensors (or None) for the fast path; TypeError when one is
    not a tensor NumPy can view without a copy (e.g. a CUDA array)."""
    if x is None:
        return None
    if type(x) is not list and type(x) is not tuple:
        raise TypeError("not a list of tensors")
    views = []
    for t in x:
        if not isinstance(t, torch.Tensor):
            raise TypeError("not a tensor")
        views.append(t.numpy())
    return views



def _op(reduce_op, what):
    op = getattr(reduce_op, "op", reduce_op)  # ReduceOp object -> RedOpType
    name = getattr(op, "name", str(op)).rpartition(".")[2]
    code = _OPS.get(name)
    if code is None:
        raise ValueError(f"{what}: reduce op {name} is not supported by the pyddp backend "
                         f"(supported: {', '.join(_OPS)})")
    return code



class ProcessGroupPyddp(dist.ProcessGroup):
    """One rank's member of a torch process group whose collectives run on pyddp's C core."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._timeout = _seconds(timeout) or 1800.0
        # torch's rendezvous is not pyddp's: a secret that pyddp.multiprocessing.spawn invented
        # for fewer processes than the group has is set aside here (_rendezvous.spawn_secret)
        _spawn_secret(rank, size)
        # the host group (backend 'cpu''s, registry.host_group) over the torch store
        self._cpg = _registry.host_group(
            BackendOptions(store, rank, size, timedelta(seconds=self._timeout), "torch",
                           range(size)), BACKEND_NAME, label="torch", backend=BACKEND_NAME)
        # pyddp's ProcessGroup routes every request to the backend of its arrays' device, as
        # for pyddp.distributed's functions: the C group for CPU tensors, pyddp's NCCL backend
        # (started at the first CUDA call) for CUDA tensors
        self._cuda = _TorchNccl(self, store)
        self._group = _Group({"cuda": self._cuda, "cpu": self._cpg}, range(size), BACKEND_NAME,
                             "torch", self._timeout, rank, plan=_PLAN)
        self._group._noun = "tensors"
        # the C group's inline path for small blocking collectives (False: not taken; its
        # declared ``fast``); not at debug level DETAIL, which logs every call from _submit
        self._fast = self._group._declared("cpu").fast
        if _observe.get_debug_level() >= _observe.DebugLevel.DETAIL:
            self._fast = None
        self._done = _Done((), [], self)  # what a blocking call done inline returns (_finished)
        # Asynchronous allreduces issued during a backward pass (torch DDP's bucket hooks) run on
        # the calling thread when this host has no core to spare for the progress thread: there
        # it would only take turns with backward on the same core, and the ranks' progress threads,
        # each descheduled in turn, would step through the collective's sync points out of phase
        # (pyddp's own DDP decides the same way; PYDDP_DDP_OVERLAP=0/1 overrides).
        self._backward_inline = self._fast is not None and not self._group._overlap()
        self._coalesced = None  # between _start_coalescing and _end_coalescing: the works
        self._q = None  # works whose futures the watcher completes, in submission order
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing

    def getBackendName(self):
        """The backend's name, "pyddp" (torch's ProcessGroup.getBackendName)."""
        return BACKEND_NAME

    @property
    def transport(self):
        """'shm', 'tcp' or 'local' (pyddp's C group)."""
        return self._group._transport

    # torch's ProcessGroup keeps its name and description in its registered C++ backends; this
    # group registers none (it is the whole group), so it keeps them itself: DeviceMesh (FSDP2,
    # DTensor) and torch's group registry read ``group_name``.
    def _set_group_name(self, name):
        self._group_name = str(name)

    @property
    def group_name(self):
        name = getattr(self, "_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def _set_group_desc(self, desc):
        self._group_desc = str(desc)

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", "undefined")

    def _watch(self, work):
        with self._lock:
            if self._q is None:
                self._q = queue.SimpleQueue()
                threading.Thread(target=self._watcher, args=(self._q,), daemon=True,
                                 name="pyddp-torch-futures").start()
            self._q.put(work)

    @staticmethod
    def _watcher(q):
        while True:
            work = q.get()
            if work is None:
                return
            # a CUDA wait here (a work mixing CPU and CUDA arrays) runs on the communicator's
            # device: on this thread's default device, CUDA would create a context on GPU 0
            dev = work._cuda_device()
            if dev is not None:
                try:
                    _C.cuda_set_device(dev)
                except RuntimeError:
                    pass  # the wait below reports what is wrong
            work._complete()

    def _array(self, t, name, writable):
        """(NumPy view of a CPU tensor, or the checked view of a CUDA array; dtype code): the
        group's device rule, as pyddp.distributed's functions apply it.  No copy."""
        return _interop.cpu_array(t, name, writable, on_device=self._group._on_device)

    def _submit(self, kind, code, arrays_in, arrays_out, result, *, op=0, root=0, tag=0,
                count=0, in_splits=None, out_splits=None, name="", blocking=False,
                timeout=0.0, wait_all=False, source=False):
        """One request to the group; a torch Work (of this call or of a coalescing block)."""
        try:
            w = self._group._submit(kind, code, op, root, tag, count, tuple(arrays_in),
                                    tuple(arrays_out), in_splits, out_splits, timeout, wait_all,
                                    name, async_op=not blocking, source=source)
        except _C.DistError as e:
            raise _torch_error(e) from None
        # the backend's handle (pyddp's Work adds nothing here: this group never stages, its
        # 'cuda' backend serves every CUDA array; the group keeps the handle until it is done)
        work = Work(() if w is None else (w._cw,), result, self)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _inline(self, opts, kind, out, arg, inp=None, root=0):
        """Run a blocking collective (torch's Python API passes ``opts.asyncOp`` False and waits
        for the Work only when one is returned) on this thread through the C group's fast path.
        ``out`` and ``inp`` are what the C group's ``fast`` takes: a tensor, a list of tensors
        (one per rank) or None (a rank outside the root of gather/scatter).
        1 when done: the method then returns the group's finished Work (one object reused,
        so a blocking call allocates nothing; torch's Python API only waits on it); 2 when an
        asynchronous call was done inline (during backward): it gets a Work of its own, its
        caller keeps it and asks for its future.
        0 when that path does not take it (async, coalescing, a busy group, a tensor NumPy
        cannot view, a CUDA array): the caller submits instead.  ``opts.asyncOp`` is read
        once (each read of torch's options costs about 0.3 us)."""
        async_op = opts.asyncOp
        if self._fast is None or self._coalesced is not None or (
                async_op and not (self._backward_inline and _graph_task_id() >= 0)):
            return 0
        try:  # no copy; Tensor.numpy() refuses bfloat16, tensors needing grad, devices
            a = out.numpy() if isinstance(out, torch.Tensor) else _host_list(out)
            b = inp.numpy() if isinstance(inp, torch.Tensor) else _host_list(inp)
        except (TypeError, RuntimeError):  # not viewable here: the general path says what
            return 0
        try:
            if b is None and (kind == _K_ALLREDUCE or kind == _K_BROADCAST):
                done = self._fast(kind, a, arg)
            else:
                done = self._fast(kind, a, arg, b, root)
        except _C.DistError as e:  # a RuntimeError too: never taken for a refused tensor
            raise _torch_error(e) from None
        return (2 if async_op else 1) if done else 0

    def _finished(self, result, how=1):
        if how == 2:  # an asynchronous call done inline (during backward): a Work of its own
            return Work((), result, self)
        done = self._done
        done._result = result
        return done

    def _many(self, works, result):
        """One Work for several submitted ones (coalesced calls)."""
        return Work(tuple(cw for w in works for cw in w._cws), result, self)

    @staticmethod
    def _blocking(opts):
        return not getattr(opts, "asyncOp", True)

    # --------------------------------------------------------------- collectives

    def allreduce(self, tensors, opts=None):
        # _inline written out for the most frequent call (torch's all_reduce of one CPU tensor,
        # blocking, SUM): each Python call and attribute read saved is 0.1-0.5 us of a 4 B
        # allreduce's 6-7 us
        fast = self._fast
        if fast is not None and opts is not None and len(tensors) == 1 \
                and self._coalesced is None:
            async_op = opts.asyncOp
            if not async_op or (self._backward_inline and _graph_task_id() >= 0):
                reduce_op = opts.reduceOp
                t = tensors[0]
                try:  # no copy; Tensor.numpy() refuses bfloat16, tensors needing grad, devices
                    # (only a torch tensor's: another array's numpy() may be a copy)
                    a = t.numpy() if isinstance(t, torch.Tensor) else None
                except (TypeError, RuntimeError):
                    a = None  # not viewable here: the general path says what
                if a is not None:
                    try:
                        done = fast(_K_ALLREDUCE, a, _SUM_CODE if reduce_op == _SUM
                                    else _OP_CODES[reduce_op.op.value])
                    except _C.DistError as e:
                        raise _torch_error(e) from None
                    if done:
                        if async_op:  # done inline during backward: a Work of its own
                            return Work((), list(tensors), self)
                        done = self._done
                        done._result = tensors
                        return done
        if opts is not None and opts.reduceOp.op == _PREMUL_SUM:
            return self._premul_sum("allreduce", opts, tensors, self.allreduce)
        opts = opts or _c10d.AllreduceOptions()
        op = _op(opts.reduceOp, "allreduce")
        works = []
        for i, t in enumerate(tensors):
            a, code = self._array(t, f"tensors[{i}]", True)
            works.append(self._submit(_C.K_ALLREDUCE, code, (), (a,), None, op=op, count=a.size,
                                      name="allreduce",
                                      blocking=self._blocking(opts) and len(tensors) == 1))
        return self._many(works, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or _c10d.AllreduceCoalescedOptions()
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        if opts is not None and len(tensors) == 1 and (how := self._inline(
                opts, _K_BROADCAST, tensors[0], opts.rootRank)):
            return self._finished(tensors, how)
        opts = opts or _c10d.BroadcastOptions()
        works = []
        for i, t in enumerate(tensors):
            a, code = self._array(t, f"tensors[{i}]", True)
            works.append(self._submit(_C.K_BROADCAST, code, (), (a,), None, root=opts.rootRank,
                                      count=a.size, name="broadcast",
                                      blocking=self._blocking(opts) and len(tensors) == 1))
        return self._many(works, tensors)

    def reduce(self, tensors, opts=None):
        if opts is not None and len(tensors) == 1 and (how := self._inline(
                opts, _K_REDUCE, tensors[0], _op_code(opts.reduceOp), None, opts.rootRank)):
            return self._finished(tensors, how)
        if opts is not None and opts.reduceOp.op == _PREMUL_SUM:
            return self._premul_reduce(tensors, opts)
        opts = opts or _c10d.ReduceOptions()
        op = _op(opts.reduceOp, "reduce")
        a, code = self._array(self._one(tensors, "reduce"), "tensor", True)
        return self._submit(_C.K_REDUCE, code, (a,), (a,), tensors, op=op, root=opts.rootRank,
                            count=a.size, name="reduce", blocking=self._blocking(opts))

    @staticmethod
    def _one(tensors, what):
        if len(tensors) != 1:
            raise ValueError(f"{what}: the pyddp backend takes one tensor per call, "
                             f"got {len(tensors)}")
        return tensors[0]

    def _rank_list(self, lst, t, what, name, writable):
        """(view of t, its code, views of lst: one tensor per rank, each like t)."""
        a, code = self._array(t, "tensor", not writable)
        if len(lst) != self.size():
            raise ValueError(f"{what}: {name} must have one tensor per rank ({self.size()}), "
                             f"got {len(lst)}")
        arrays = []
        for i, o in enumerate(lst):
            b, oc = self._array(o, f"{name}[{i}]", writable)
            if oc != code or b.size != a.size:
                raise ValueError(f"{what}: {name}[{i}] must match the tensor's dtype and "
                                 f"size ({t.dtype}, {a.size}), got {o.dtype}, {b.size}")
            arrays.append(b)
        return a, code, arrays

    def allgather(self, output_tensors, input_tensors, opts=None):
        if opts is not None and len(output_tensors) == 1 == len(input_tensors) and (
                how := self._inline(opts, _K_ALLGATHER, output_tensors[0], 0, input_tensors[0])):
            return self._finished(output_tensors, how)
        opts = opts or _c10d.AllgatherOptions()
        works = []
        for outs, t in zip(output_tensors, input_tensors):
            a, code, arrays = self._rank_list(outs, t, "allgather", "output_tensors", True)
            works.append(self._submit(_C.K_ALLGATHER, code, (a,), arrays, None, count=a.size,
                                      name="allgather",
                                      blocking=self._blocking(opts) and len(input_tensors) == 1))
        return self._many(works, output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self.allgather(output_lists, input_list, opts)

    def _allgather_base(self, output, input, opts=None):
        return self.allgather_into_tensor_coalesced([output], [input], opts)

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if opts is not None and len(outputs) == 1 == len(inputs) and (how := self._inline(
                opts, _K_ALLGATHER, outputs[0], 0, inputs[0])):
            return self._finished(outputs, how)
        opts = opts or _c10d.AllgatherOptions()
        works = []
        for o, t in zip(outputs, inputs):
            a, code = self._array(t, "input_tensor", False)
            b, oc = self._array(o, "output_tensor", True)
            if oc != code or b.size != a.size * self.size():
                raise ValueError(f"allgather_into_tensor: output_tensor must have the input's "
                                 f"dtype and world_size * {a.size} elements, got {o.dtype}, "
                                 f"{b.size}")
            works.append(self._submit(_C.K_ALLGATHER, code, (a,), (b,), None, count=a.size,
                                      name="allgather_into_tensor",
                                      blocking=self._blocking(opts) and len(inputs) == 1))
        return self._many(works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        if opts is not None and len(input_tensors) == 1 and len(output_tensors) <= 1 and \
                (how := self._inline(opts, _K_GATHER,
                                     output_tensors[0] if output_tensors else None,
                                     opts.rootRank, input_tensors[0])):
            return self._finished(output_tensors, how)
        opts = opts or _c10d.GatherOptions()
        t = self._one(input_tensors, "gather")
        if self.rank() == opts.rootRank:
            a, code, arrays = self._rank_list(self._one(output_tensors, "gather"), t, "gather",
                                              "gather_list", True)
        else:
            (a, code), arrays = self._array(t, "input_tensor", False), ()
        return self._submit(_C.K_GATHER, code, (a,), arrays, output_tensors, root=opts.rootRank,
                            count=a.size, name="gather", blocking=self._blocking(opts))

    def scatter(self, output_tensors, input_tensors, opts=None):
        if opts is not None and len(output_tensors) == 1 and len(input_tensors) <= 1 and \
                (how := self._inline(opts, _K_SCATTER, output_tensors[0], opts.rootRank,
                                     input_tensors[0] if input_tensors else None)):
            return self._finished(output_tensors, how)
        opts = opts or _c10d.ScatterOptions()
        o = self._one(output_tensors, "scatter")
        if self.rank() == opts.rootRank:
            b, code, arrays = self._rank_list(self._one(input_tensors, "scatter"), o, "scatter",
                                              "scatter_list", False)
        else:
            (b, code), arrays = self._array(o, "tensor", True), ()
        return self._submit(_C.K_SCATTER, code, arrays, (b,), output_tensors, root=opts.rootRank,
                            count=b.size, name="scatter", blocking=self._blocking(opts))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        if opts is not None and len(output_tensors) == 1 == len(input_tensors) and (
                how := self._inline(opts, _K_REDUCE_SCATTER, output_tensors[0],
                                    _op_code(opts.reduceOp), input_tensors[0])):
            return self._finished(output_tensors, how)
        if opts is not None and opts.reduceOp.op == _PREMUL_SUM:
            scaled = [[self._premul_copy(t, opts, "reduce_scatter") for t in lst]
                      for lst in input_tensors]
            return self._premul_sum("reduce_scatter", opts, None,
                                    lambda _, o: self.reduce_scatter(output_tensors, scaled, o),
                                    keep=scaled)
        opts = opts or _c10d.ReduceScatterOptions()
        op = _op(opts.reduceOp, "reduce_scatter")
        o = self._one(output_tensors, "reduce_scatter")
        ins = self._one(input_tensors, "reduce_scatter")
        b, code, arrays = self._rank_list(ins, o, "reduce_scatter", "input_list", False)
        return self._submit(_C.K_REDUCE_SCATTER, code, arrays, (b,), output_tensors, op=op,
                            count=b.size, name="reduce_scatter", blocking=self._blocking(opts))

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_tensor_coalesced([output], [input], opts)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        if opts is not None and len(outputs) == 1 == len(inputs) and (how := self._inline(
                opts, _K_REDUCE_SCATTER, outputs[0], _op_code(opts.reduceOp),
                inputs[0])):
            return self._finished(outputs, how)
        if opts is not None and opts.reduceOp.op == _PREMUL_SUM:
            scaled = [self._premul_copy(t, opts, "reduce_scatter_tensor") for t in inputs]
            return self._premul_sum(
                "reduce_scatter_tensor", opts, None,
                lambda _, o: self.reduce_scatter_single_coalesced(outputs, scaled, o), keep=scaled)
        opts = opts or _c10d.ReduceScatterOptions()
        op = _op(opts.reduceOp, "reduce_scatter_tensor")
        works = []
        for o, t in zip(outputs, inputs):
            a, code = self._array(t, "input", False)
            b, oc = self._array(o, "output", True)
            if oc != code or a.size != b.size * self.size():
                raise ValueError(f"reduce_scatter_tensor: input must have the output's dtype "
                                 f"and world_size * {b.size} elements, got {t.dtype}, {a.size}")
            works.append(self._submit(_C.K_REDUCE_SCATTER, code, (a,), (b,), None, op=op,
                                      count=b.size, name="reduce_scatter_tensor",
                                      blocking=self._blocking(opts) and len(inputs) == 1))
        return self._many(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if opts is not None and not output_split_sizes and not input_split_sizes and \
                (how := self._inline(opts, _K_ALLTOALL, output, 0, input)):
            return self._finished([output], how)
        opts = opts or _c10d.AllToAllOptions()
        b, code = self._array(output, "output", True)
        a, ic = self._array(input, "input", False)
        if ic != code:
            raise TypeError(f"all_to_all_single: input has dtype {input.dtype} but output has "
                            f"{output.dtype}")
        n = self.size()

        def splits(sizes, v, what):  # v: the NumPy array or CUDA view (torch-free: any array)
            dims = tuple(v.shape)
            row = v.itemsize * (v.size // dims[0] if dims and dims[0] else 1)
            rows = dims[0] if dims else 1
            if not sizes:
                if rows % n:
                    raise ValueError(f"all_to_all_single: {what} has {rows} rows, not divisible "
                                     f"by world size {n}")
                return tuple([rows // n * row] * n)
            if len(sizes) != n or sum(sizes) != rows:
                raise ValueError(f"all_to_all_single: {what}_split_sizes {list(sizes)} must have "
                                 f"{n} entries adding up to {rows}")
            return tuple(int(s) * row for s in sizes)

        ins = splits(input_split_sizes, a, "input")
        outs = splits(output_split_sizes, b, "output")
        return self._submit(_C.K_ALLTOALL, code, (a,), (b,), [output], in_splits=ins,
                            out_splits=outs, name="all_to_all_single",
                            blocking=self._blocking(opts))

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if opts is not None and (
                how := self._inline(opts, _K_ALLTOALL, output_tensors, 0, input_tensors)):
            return self._finished(output_tensors, how)
        opts = opts or _c10d.AllToAllOptions()
        ins = [self._array(t, f"input_tensors[{i}]", False) for i, t in enumerate(input_tensors)]
        outs = [self._array(t, f"output_tensors[{i}]", True) for i, t in enumerate(output_tensors)]
        code = ins[0][1]
        if any(c != code for _, c in ins + outs):
            raise TypeError("all_to_all: every tensor must have one dtype")
        return self._submit(_C.K_ALLTOALL, code, [a for a, _ in ins], [b for b, _ in outs],
                            output_tensors, name="all_to_all", blocking=self._blocking(opts))

    def barrier(self, opts=None):
        if opts is not None and self._fast is not None and self._coalesced is None \
                and not opts.asyncOp:
            try:
                if self._fast(_K_BARRIER, None, 0):
                    return self._finished([])
            except _C.DistError as e:
                raise _torch_error(e) from None
        blocking = self._blocking(opts) if opts is not None else False
        return self._submit(_C.K_BARRIER, 0, (), (), [], name="barrier", blocking=blocking)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier naming the ranks that did not arrive within ``timeout`` (torch's
        ``dist.monitored_barrier`` accepts only gloo groups; call this method directly)."""
        t = _seconds(timeout) or self._timeout
        self._submit(_C.K_MONITORED_BARRIER, 0, (), (), [], timeout=t, wait_all=wait_all_ranks,
                     name="monitored_barrier", blocking=True).wait()

    # ----------------------------------------------------------------- p2p

    def _p2p(self, kind, tensors, peer, tag, name):
        t = self._one(tensors, name)
        a, code = self._array(t, "tensor", kind == _C.K_RECV)
        ins, outs = ((a,), ()) if kind == _C.K_SEND else ((), (a,))
        return self._submit(kind, code, ins, outs, tensors, root=peer, tag=int(tag),
                            count=a.size, name=name, source=True)

    def send(self, tensors, dst, tag=0):
        return self._p2p(_C.K_SEND, tensors, dst, tag, "send")

    def recv(self, tensors, src, tag=0):
        return self._p2p(_C.K_RECV, tensors, src, tag, "recv")

    def recv_anysource(self, tensors, tag=0):
        return self._p2p(_C.K_RECV, tensors, -1, tag, "recv")

    # ----------------------------------------------------------------- coalescing

    def _start_coalescing(self, device=None):
        self._coalesced = []

    def _end_coalescing(self, device=None):
        self._cuda.flush()
        works, self._coalesced = self._coalesced or [], None
        return self._many(works, [t for w in works for t in w._result])

    # ------------------------------------------------ ReduceOp.PREMUL_SUM (NCCL's premul sum)

    @staticmethod
    def _premul_factor(opts, what, t):
        """The factor of a PREMUL_SUM op (``dist._make_nccl_premul_sum(factor)``, or
        ``ReduceOp.PREMUL_SUM(factor)`` as FSDP2 builds it); floating-point tensors only."""
        if not t.is_floating_point():
            raise TypeError(f"{what}: ReduceOp.PREMUL_SUM needs floating-point tensors, got "
                            f"{t.dtype}")
        op = opts.reduceOp
        # torch 2.13 has ReduceOp.factor, 2.11 has not; both pickle the factor as the state's
        # second item
        factor = op.factor if hasattr(op, "factor") else op.__getstate__()[1]
        if factor is None:
            raise ValueError(f"{what}: ReduceOp.PREMUL_SUM without a factor")
        return factor

    def _premul_copy(self, t, opts, what):
        """factor * t, a new tensor (the caller's input stays as it was)."""
        return t * self._premul_factor(opts, what, t)

    @staticmethod
    def _sum_opts(opts):
        """``opts`` (any reducing options type) with ReduceOp.SUM, same timeout and asyncOp."""
        new = type(opts)()
        new.reduceOp = dist.ReduceOp.SUM
        for f in ("rootRank", "rootTensor", "timeout", "asyncOp"):
            if hasattr(opts, f):
                setattr(new, f, getattr(opts, f))
        return new

    def _premul_sum(self, what, opts, tensors, call, keep=None):
        """PREMUL_SUM as NCCL computes it: sum over ranks of factor * input.  allreduce (in
        place) scales its tensors first; the others pass scaled copies (``keep``: held by the
        Work)."""
        if tensors is not None:
            factors = [self._premul_factor(opts, what, t) for t in tensors]
            with torch.no_grad():
                for t, f in zip(tensors, factors):
                    t.mul_(f)
        work = call(tensors, self._sum_opts(opts))
        work._premul_keep = keep
        return work

    def _premul_reduce(self, tensors, opts):
        """reduce with PREMUL_SUM: a scaled copy in, the tensor out (written on the root only;
        the other ranks' tensors stay as they were, as with NCCL)."""
        t = self._one(tensors, "reduce")
        scaled = self._premul_copy(t, opts, "reduce")
        a, code = self._array(scaled, "tensor", False)
        b, _ = self._array(t, "tensor", True)
        work = self._submit(_C.K_REDUCE, code, (a,), (b,), tensors, op=_OPS["SUM"],
                            root=opts.rootRank, count=a.size, name="reduce",
                            blocking=self._blocking(opts))
        work._premul_keep = scaled
        return work

    # ------------------------------------------------------------------ lifecycle

    def _destroy(self):
        group = self.__dict__.get("_group")
        self._cpg = self._fast = None
        if group is not None and group._backends is not None:
            group._destroy()  # the NCCL backend (its waiting sends and receives run), the C group
        with self._lock:
            if self._q is not None:
                self._q.put(None)

    def shutdown(self):
        self._destroy()

    def abort(self):
        self._destroy()

    def __del__(self):
        try:
            self._destroy()
        except Exception:
            pass


_graph_task_id = torch._C._current_graph_task_id  # >= 0 inside a backward pass
