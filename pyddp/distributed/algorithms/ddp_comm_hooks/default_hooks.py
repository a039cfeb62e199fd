"""Built-in DDP communication hooks: allreduce_hook, fp16_compress_hook, bf16_compress_hook.

``ddp.register_comm_hook(process_group, hook)`` with these behaves as torch's hooks of the same
names: the bucket is divided by the group size and summed across ranks; the compress hooks send it
as float16 / bfloat16 (cast in C with round-to-nearest-even) and widen the sum back into the bucket.
"""
from __future__ import annotations

import numpy as np

from ... import distributed_c10d as c10d
from ...._interop import BFLOAT16, FLOAT16


def _group(process_group):
    return process_group if process_group is not None else c10d._default_pg()


def _world(pg) -> int:
    return pg.size()


def allreduce_hook(process_group, bucket):
    """Average the bucket across the group (what DDP does without a hook)."""
    pg = _group(process_group)
    buf = bucket._array
    # the sum and the division by the group size in one pass
    work = c10d.all_reduce(buf, op=c10d.ReduceOp.AVG, group=pg, async_op=True)
    tensor = bucket.buffer()
    return c10d.Future(work, lambda: tensor)


def _compress_hook(process_group, bucket, code):
    from .... import _C

    pg = _group(process_group)
    buf = bucket._array
    if not isinstance(buf, np.ndarray):
        return _torch_compress_hook(pg, bucket, buf, code)
    if buf.dtype != np.float32:
        raise TypeError(f"the compress hooks take float32 buckets, got {buf.dtype}")
    np.multiply(buf, 1.0 / _world(pg), out=buf)
    if code == FLOAT16:
        wire = np.empty(buf.size, dtype=np.float16)
    else:
        wire = np.empty(buf.size, dtype=np.uint16)  # bfloat16 bits
    _C.cast_([wire], [buf])
    work = c10d._all_reduce_as(wire, code, group=pg, async_op=True)
    tensor = bucket.buffer()

    def decompress():
        _C.cast_([buf], [wire])
        return tensor
    return c10d.Future(work, decompress)


def fp16_compress_hook(process_group, bucket):
    """Allreduce the bucket as float16 (halving the bytes sent), then widen it back."""
    return _compress_hook(process_group, bucket, FLOAT16)


def bf16_compress_hook(process_group, bucket):
    """Allreduce the bucket as bfloat16, then widen it back."""
    return _compress_hook(process_group, bucket, BFLOAT16)


def _torch_compress_hook(pg, bucket, buf, code):
    """The compress hooks on a torch model's bucket (any device), as torch's: cast to the wire
    dtype, divide by the group size there, sum, and copy the result back into the bucket."""
    import torch

    wire_dtype = torch.float16 if code == FLOAT16 else torch.bfloat16
    wire = buf.to(wire_dtype).div_(_world(pg))
    work = c10d.all_reduce(wire, op=c10d.ReduceOp.SUM, group=pg, async_op=True)
    tensor = bucket.buffer()

    def decompress():
        buf.copy_(wire)
        return tensor
    return c10d.Future(work, decompress)
