"""pyddp.distributed's object collectives (torch.distributed's, re-exported by distributed_c10d):
picklable objects sent as byte arrays through the array collectives, on the host arrays' backend
of the group (a device-only group's host group).
"""
from __future__ import annotations

import functools
import io
import pickle

import numpy as np

from .. import _C
from .process_group import _objects
from ._collectives import _list_arg, _root, all_gather_into_tensor, broadcast, gather, scatter
from ._groups import _resolve

DistError = _C.DistError


# ------------------------------------------------------------------------- object collectives


def _object_collective(fn):
    """Object collectives move their pickles in host arrays, on a device-only group (nccl) too:
    through the host group its backend keeps (torch moves them through the device instead)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = getattr(_objects, "active", False)
        _objects.active = True
        try:
            return fn(*args, **kwargs)
        finally:
            _objects.active = outer
    return wrapper


def _pickle(obj) -> np.ndarray:
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return np.frombuffer(buf.getbuffer(), dtype=np.uint8).copy()


def _unpickle(a: np.ndarray):
    return pickle.loads(a.tobytes())


# The envelope of an object collective: the pickles' sizes (int64, from the sending ranks), then
# the bytes.  The sizes are checked before anything is allocated from them; the bytes of each
# object are then exactly the size its sender announced.  What pickle itself runs is trusted, as
# in torch: only ranks that know the job secret (PYDDP_SECRET) reach this point.
_MAX_OBJECT_BYTES = 1 << 40  # no pickle of a real object comes near a terabyte


def _envelope_sizes(sizes, what, senders):
    """The announced pickle sizes as Python ints; a DistError naming the sender for a negative
    size or a total beyond _MAX_OBJECT_BYTES (a corrupt or mismatched collective)."""
    out = [int(x) for x in np.asarray(sizes, dtype=np.int64).reshape(-1)]
    total = 0
    for i, n in enumerate(out):
        total += max(n, 0)
        if n < 0 or total > _MAX_OBJECT_BYTES:
            raise DistError(f"{what}: rank {senders(i)} announced a pickle of {n} bytes for "
                            f"object {i} (sizes must be in [0, {_MAX_OBJECT_BYTES}] in all); "
                            f"the ranks called different object collectives or the data is "
                            f"corrupt")
    return out


def _unpickle_concat(data: np.ndarray, sizes, what):
    """Objects pickled back to back in `data` (broadcast_object_list)."""
    if sum(sizes) != data.size:
        raise DistError(f"{what}: {data.size} bytes of pickles received, the sizes announce "
                        f"{sum(sizes)}")
    objs, off = [], 0
    for n in sizes:
        objs.append(_unpickle(data[off:off + n]))
        off += n
    return objs


def _unpickle_rows(rows, sizes, what):
    """One object at the start of each row (padded to the longest: all_gather_object,
    gather_object, scatter_object_list)."""
    objs = []
    for i, (row, n) in enumerate(zip(rows, sizes)):
        if n > row.size:
            raise DistError(f"{what}: object {i} announced {n} bytes but {row.size} arrived")
        objs.append(_unpickle(row[:n]))
    return objs


@_object_collective
def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replace the items of ``object_list`` on every rank with those of rank ``src`` (any picklable
    objects; the lists must have equal lengths)."""
    pg = _resolve(group)
    if pg is None:
        return
    _list_arg(object_list, "object_list")
    root = _root(pg, group_src, src, "src")
    me = pg.rank()
    sizes = np.zeros(len(object_list), dtype=np.int64)
    if me == root:
        blobs = [_pickle(o) for o in object_list]
        sizes[:] = [b.size for b in blobs]
    broadcast(sizes, group=group, group_src=root)
    if me == root:
        data = np.concatenate(blobs) if blobs else np.zeros(0, np.uint8)
    else:
        ns = _envelope_sizes(sizes, "broadcast_object_list", lambda i: root)
        data = np.zeros(sum(ns), np.uint8)
    broadcast(data, group=group, group_src=root)
    if me != root:
        object_list[:] = _unpickle_concat(data, ns, "broadcast_object_list")


def _gather_blobs(obj, pg, group):
    blob = _pickle(obj)
    n = pg.size()
    sizes = np.zeros(n, dtype=np.int64)
    all_gather_into_tensor(sizes, np.array([blob.size], dtype=np.int64), group=group)
    sizes = _envelope_sizes(sizes, "object collective", lambda i: i)
    m = max(sizes) if n else 0
    padded = np.zeros(m, dtype=np.uint8)
    padded[:blob.size] = blob
    return sizes, m, padded


@_object_collective
def all_gather_object(object_list, obj, group=None):
    """Fill ``object_list`` (world_size items) with every rank's picklable ``obj``, on every rank."""
    pg = _resolve(group)
    if pg is None:
        return
    _list_arg(object_list, "object_list")
    if len(object_list) != pg.size():
        raise ValueError(f"object_list must have world_size ({pg.size()}) entries, got {len(object_list)}")
    sizes, m, padded = _gather_blobs(obj, pg, group)
    out = np.zeros(m * pg.size(), dtype=np.uint8)
    all_gather_into_tensor(out, padded, group=group)
    object_list[:] = _unpickle_rows(out.reshape(pg.size(), m), sizes, "all_gather_object")


@_object_collective
def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """Collect every rank's picklable ``obj`` into ``object_gather_list`` on rank ``dst`` (None
    elsewhere)."""
    pg = _resolve(group)
    if pg is None:
        return
    root = _root(pg, group_dst, dst, "dst")
    me = pg.rank()
    if me == root:
        _list_arg(object_gather_list, "object_gather_list")
        if len(object_gather_list) != pg.size():
            raise ValueError(f"object_gather_list must have world_size ({pg.size()}) entries, "
                             f"got {len(object_gather_list)}")
    sizes, m, padded = _gather_blobs(obj, pg, group)
    outs = [np.zeros(m, dtype=np.uint8) for _ in range(pg.size())] if me == root else None
    gather(padded, outs, group=group, group_dst=root)
    if me == root:
        object_gather_list[:] = _unpickle_rows(outs, sizes, "gather_object")


@_object_collective
def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None,
                        group=None, group_src=None):
    """Rank ``src`` sends ``scatter_object_input_list[i]`` to rank i, which receives it in
    ``scatter_object_output_list[0]``."""
    pg = _resolve(group)
    if pg is None:
        return
    _list_arg(scatter_object_output_list, "scatter_object_output_list")
    if len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_output_list must have at least one element")
    root = _root(pg, group_src, src, "src")
    me, n = pg.rank(), pg.size()
    sizes = np.zeros(n, dtype=np.int64)
    blobs = None
    if me == root:
        _list_arg(scatter_object_input_list, "scatter_object_input_list")
        if len(scatter_object_input_list) != n:
            raise ValueError(f"scatter_object_input_list must have world_size ({n}) entries, "
                             f"got {len(scatter_object_input_list)}")
        blobs = [_pickle(o) for o in scatter_object_input_list]
        sizes[:] = [b.size for b in blobs]
    broadcast(sizes, group=group, group_src=root)
    sizes = _envelope_sizes(sizes, "scatter_object_list", lambda i: root)
    m = max(sizes)
    ins = None
    if me == root:
        ins = []
        for b in blobs:
            p = np.zeros(m, dtype=np.uint8)
            p[:b.size] = b
            ins.append(p)
    out = np.zeros(m, dtype=np.uint8)
    scatter(out, ins, group=group, group_src=root)
    scatter_object_output_list[0] = _unpickle_rows([out], [sizes[me]], "scatter_object_list")[0]
