"""apex.parallel.DistributedDataParallel's keyword arguments on pyddp's DistributedDataParallel.

apex reduces each bucket as ``all_reduce(g / gradient_predivide_factor)`` then, with
``gradient_average``, multiplies by ``gradient_predivide_factor / world_size``; pyddp does the
same arithmetic in that order (an internal communication hook), so ``gradient_average=False``
leaves the sum divided by the predivide factor, as in apex. ``delay_allreduce=True`` starts every
bucket's allreduce at the end of backward (nothing overlaps backward); ``allreduce_always_fp32``
reduces float16/bfloat16 buckets in float32; ``retain_allreduce_buffers`` keeps the reduced flat
buckets in ``ddp.allreduce_buffers`` with the gradients as views of them; ``message_size``
(elements) sets the bucket size (``message_size * 4`` bytes); ``num_allreduce_streams`` /
``allreduce_communicators`` spread the buckets over that many process groups in turn;
``allreduce_trigger_params`` cuts the buckets after each of those parameters (in the order
gradients are expected: reverse parameter order; message_size is then ignored, as in apex) and
``prof`` is accepted (CUDA profiling ranges do not apply on the CPU). The combinations apex refuses raise its errors.
"""
from __future__ import annotations

from ...distributed import distributed_c10d as c10d
from ._buckets import assign_buckets

APEX_KWARGS = ("message_size", "delay_allreduce", "shared_param", "allreduce_trigger_params",
               "retain_allreduce_buffers", "allreduce_always_fp32", "num_allreduce_streams",
               "allreduce_communicators", "gradient_average", "gradient_predivide_factor",
               "gradient_average_split_factor", "prof")

_SHARED_PARAM_MSG = (
    "shared_param is no longer supported as an option.  It was misleadingly named from the start.  "
    "It turns out overlapping communication with computation should work fine with shared "
    "parameters.  If you still wish to delay communication to the end of the backward pass, use "
    "delay_allreduce=True|False instead.")


class ApexOptions:
    """The parsed apex arguments of one DistributedDataParallel."""

    def __init__(self, kw):
        self.message_size = kw.get("message_size")
        self.delay = bool(kw.get("delay_allreduce", False))
        self.trigger_params = kw.get("allreduce_trigger_params")
        self.retain = bool(kw.get("retain_allreduce_buffers", False))
        self.fp32 = bool(kw.get("allreduce_always_fp32", False))
        self.streams = kw.get("num_allreduce_streams", 1)
        self.communicators = kw.get("allreduce_communicators")
        self.average = bool(kw.get("gradient_average", True))
        self.predivide = kw.get("gradient_predivide_factor", 1.0)
        self.prof = bool(kw.get("prof", False))
        self.groups = None
        self.buffers = None
        self._queued_iter = None

    def validate(self, kw):
        if not isinstance(self.streams, int) or isinstance(self.streams, bool) or self.streams < 1:
            raise ValueError(f"num_allreduce_streams must be a positive int, got {self.streams!r}")
        if self.communicators:
            comm = self.communicators
            if not (isinstance(comm, (tuple, list)) and len(comm) == 2):
                raise ValueError("allreduce_communicators must be a pair (process groups, "
                                 "streams), as apex expects")
            if len(comm[0]) != self.streams or len(comm[0]) != len(comm[1]) or self.streams < 2:
                raise ValueError("allreduce_communicators must hold num_allreduce_streams (> 1) "
                                 "process groups and as many streams (apex asserts "
                                 "len(allreduce_communicators[0]) == num_allreduce_streams == "
                                 "len(allreduce_communicators[1]) and num_allreduce_streams > 1)")
        if self.streams > 1 and self.delay:
            raise ValueError("self.allreduce_different_streams may only be used if "
                             "delay_allreduce=False.")
        if kw.get("shared_param") is not None:
            raise ValueError(_SHARED_PARAM_MSG)
        if self.trigger_params is not None:
            if self.delay:
                raise ValueError("Setting allreduce_trigger_params is only valid if "
                                 "delay_allreduce=False.")
            self.trigger_params = list(self.trigger_params)
        split = kw.get("gradient_average_split_factor")
        if split is not None:
            print("Warning:  gradient_average_split_factor has been renamed to "
                  "gradient_predivide_factor.  For now, gradient_average_split_factor will also "
                  "work, but please update to gradient_predivide_factor instead.")
            self.predivide = split
        try:
            self.predivide = float(self.predivide)
        except (TypeError, ValueError):
            raise TypeError("gradient_predivide_factor must be a number, got "
                            f"{self.predivide!r}") from None
        if not self.predivide > 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {self.predivide}")
        if self.message_size is not None:
            if isinstance(self.message_size, bool) or not isinstance(
                    self.message_size, (int, float)) or self.message_size <= 0:
                raise ValueError(f"message_size must be a positive number of elements, got "
                                 f"{self.message_size!r}")

    def needs_hook(self) -> bool:
        return (self.delay or self.retain or self.fp32 or not self.average
                or self.predivide != 1.0 or self.streams > 1)


def parse(kwargs, bucket_cap_mb):
    """Split apex's arguments out of ``kwargs``; returns (bucket_cap_mb, ApexOptions or None)."""
    kw = {k: kwargs.pop(k) for k in APEX_KWARGS if k in kwargs}
    if not kw:
        return bucket_cap_mb, None
    opts = ApexOptions(kw)
    opts.validate(kw)
    if opts.message_size is not None:
        if bucket_cap_mb is not None:
            raise ValueError("DistributedDataParallel: pass bucket_cap_mb (torch's) or "
                             "message_size (apex's), not both")
        bucket_cap_mb = opts.message_size * 4 / (1024 * 1024)
    return bucket_cap_mb, opts


def install(ddp, opts):
    """Make ``ddp`` reduce as apex does (after its construction)."""
    ddp._apex = opts
    ddp.message_size = opts.message_size
    ddp.delay_allreduce = opts.delay
    ddp.gradient_average = opts.average
    ddp.gradient_predivide_factor = opts.predivide
    ddp.allreduce_always_fp32 = opts.fp32
    ddp.retain_allreduce_buffers = opts.retain
    ddp.num_allreduce_streams = opts.streams
    if opts.retain:
        ddp.allreduce_buffers = []
    if opts.message_size is not None:
        # apex has no smaller first bucket: every bucket holds message_size elements
        ddp._first_bucket_bytes = ddp.bucket_bytes_cap
        n = len(ddp._params)
        ddp._build_buckets(assign_buckets(range(n - 1, -1, -1), [a.nbytes for a in ddp._arrays],
                                           [a.dtype for a in ddp._arrays],
                                           [ddp.bucket_bytes_cap, ddp.bucket_bytes_cap]))
    if opts.trigger_params is not None:
        _trigger_buckets(ddp, opts.trigger_params)
    if opts.streams > 1:
        if opts.communicators:
            opts.groups = list(opts.communicators[0])
        else:  # apex makes one group per stream (a collective, as DDP's construction is)
            opts.groups = [c10d.new_group() for _ in range(opts.streams)]
    if opts.needs_hook():
        ddp._comm_hook = _apex_hook
        ddp._comm_state = opts


class _Deferred:
    """A work handle whose operation runs when first waited for (delay_allreduce)."""

    _ordered = True

    def __init__(self, fn):
        self._fn = fn
        self._done = False

    def wait(self, timeout=None):
        if not self._done:
            self._done = True
            self._fn()
        return True

    def is_completed(self):
        return self._done


def _apex_hook(opts, bucket):
    ddp = bucket._ddp
    ad = ddp._ad
    buf = bucket._array
    pg = ddp.process_group if opts.groups is None else \
        opts.groups[bucket.index() % len(opts.groups)]
    world = float(ddp._world)
    tensor = bucket.buffer()
    low = ad.is_low_float(buf)
    if opts.retain:
        _queue_retain(ddp, opts)

    def finish(t):
        if opts.average:
            ad.scale_(t, t, opts.predivide / world)
        if t is not buf:
            ad.copy_(buf, t)
        if opts.retain:
            opts.buffers[bucket.index()] = ad.clone(buf)
        return tensor

    def start(async_op):
        t = ad.to_float32(buf) if opts.fp32 and low else buf
        if opts.predivide != 1.0:
            ad.scale_(t, t, 1.0 / opts.predivide)
        work = c10d.all_reduce(t, op=c10d.ReduceOp.SUM, group=pg, async_op=async_op)
        return t, work

    if opts.delay:
        def run():
            t, _ = start(False)
            finish(t)
        return c10d.Future(_Deferred(run), lambda: tensor)
    t, work = start(True)
    return c10d.Future(work, lambda: finish(t))


def _queue_retain(ddp, opts):
    """Once per backward: after DDP wrote the gradients, make them views of the retained flat
    buffers (``ddp.allreduce_buffers``), as apex's retain_allreduce_buffers does."""
    if opts._queued_iter == ddp._iters:
        return
    opts._queued_iter = ddp._iters
    opts.buffers = [None] * len(ddp._buckets)

    def after():
        if any(b is None for b in opts.buffers):
            return  # the reduction did not complete (an error is on its way)
        ad = ddp._ad
        for b in ddp._buckets:
            flat = opts.buffers[b.index]
            for j, i in enumerate(b.params):
                v = b.views[j]
                o = b.offsets[j]
                if ad.grad_array(ddp._params[i]) is not None:
                    ad.set_grad(ddp._params[i], flat[o:o + ad.numel(v)].reshape(v.shape))
        ddp.allreduce_buffers = [ad.wrap(f) for f in opts.buffers]

    try:
        ddp._ad.queue_callback(after)
    except RuntimeError:  # not inside a backward (a joined rank shadowing the others)
        opts._queued_iter = None


def _trigger_buckets(ddp, trigger_params):
    """apex's allreduce_trigger_params: a bucket (per dtype) closes as soon as a trigger
    parameter's gradient is in it; the buckets are kept (no rebuild by size later)."""
    ids = {id(p) for p in trigger_params}
    done, open_ = [], {}
    for i in range(len(ddp._params) - 1, -1, -1):
        dt = ddp._arrays[i].dtype
        cur = open_.setdefault(dt, [])
        cur.append(i)
        if id(ddp._params[i]) in ids:
            done.append(cur)
            open_[dt] = []
    done.extend(c for c in open_.values() if c)
    ddp._build_buckets(done)
    ddp._rebuilt = True
