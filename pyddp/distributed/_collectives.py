"""pyddp.distributed's collectives and point-to-point calls (torch.distributed's, re-exported by
distributed_c10d): ReduceOp, the argument checks shared by every call (torch's exception types and
words), and each function reduced to one request of its ProcessGroup, the small blocking ones
first offered to the C fast path of the default group.
"""
from __future__ import annotations

import enum

import numpy as np

from .. import _C, _interop
from .backends.interface import Request
from .process_group import Work
from .._interop import cpu_array as as_array
from ._groups import _default_pg, _resolve, _timeout_seconds, _world, get_global_rank

DistError = _C.DistError

# The C core's reduction operators (pd_redop), as pyddp._C exports them from its table.
_REDUCE_OPS = _C.REDUCE_OPS


class ReduceOp(enum.IntEnum):
    """Reduction operators (values match the C core's pd_redop)."""

    SUM = _REDUCE_OPS["SUM"]
    AVG = _REDUCE_OPS["AVG"]
    PRODUCT = _REDUCE_OPS["PRODUCT"]
    MIN = _REDUCE_OPS["MIN"]
    MAX = _REDUCE_OPS["MAX"]
    BAND = _REDUCE_OPS["BAND"]
    BOR = _REDUCE_OPS["BOR"]
    BXOR = _REDUCE_OPS["BXOR"]

    # torch's members are ReduceOp.RedOpType's and print as such: str(ReduceOp.SUM) == "RedOpType.SUM".
    # Python 3.11 made IntEnum's str() the bare number, so the text is spelled out here.
    def __str__(self):
        return f"RedOpType.{self.name}"

    def __repr__(self):
        return f"<RedOpType.{self.name}: {int(self)}>"

    def __format__(self, spec):
        return format(str(self), spec)

    # torch spells the type ReduceOp.RedOpType
    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        return None


ReduceOp.RedOpType = ReduceOp  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------- helpers

class _PremulSum:
    """A PREMUL_SUM reduction (``_make_nccl_premul_sum(factor)``, torch's): each rank's input is
    multiplied by ``factor`` before a SUM."""
    __slots__ = ("factor",)

    op = "PREMUL_SUM"

    def __init__(self, factor):
        self.factor = factor

    def __repr__(self):
        return f"<RedOpType.PREMUL_SUM factor={self.factor!r}>"


def _make_nccl_premul_sum(factor):
    """torch's ``dist._make_nccl_premul_sum(factor)``: an op that scales every rank's input by
    ``factor`` (a number, or a one-element array) and sums (all_reduce, reduce, reduce_scatter)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        try:
            arr = np.asarray(factor)
        except Exception:
            arr = None
        if arr is None or arr.size != 1 or arr.dtype.kind not in "iuf":
            raise TypeError(f"_make_nccl_premul_sum: factor must be a real number or a one-element "
                            f"array, got {type(factor).__name__}")
    return _PremulSum(factor)


def _op_of(op, premul=False):
    """The ReduceOp of ``op``, as torch accepts it: a ReduceOp member (``ReduceOp.SUM``, which is
    also ``ReduceOp.RedOpType.SUM``), torch's own ReduceOp / RedOpType objects, and with
    ``premul`` a premul-sum object; anything else (a bool, an int, a float, a string) is a
    TypeError, never a silent reinterpretation (``op=True`` is not AVG)."""
    if type(op) is ReduceOp:
        return op
    if type(op) is _PremulSum:
        if premul:
            return op
        raise ValueError("op: PREMUL_SUM is supported by all_reduce, reduce and reduce_scatter only")
    mod = type(op).__module__ or ""
    if mod.split(".")[0] == "torch":  # torch.distributed.ReduceOp(.RedOpType) objects
        inner = getattr(op, "op", op)  # a ReduceOp instance wraps a RedOpType
        name = getattr(inner, "name", None)
        if name == "PREMUL_SUM":
            if not premul:
                raise ValueError("op: PREMUL_SUM is supported by all_reduce, reduce and "
                                 "reduce_scatter only")
            return _PremulSum(getattr(op, "factor", None))
        if isinstance(name, str) and name in ReduceOp.__members__:
            return ReduceOp[name]
    raise TypeError(f"op must be a ReduceOp (ReduceOp.SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR) "
                    f"or a premul-sum op, got {op!r} of type {type(op).__name__}")


def _premul_input(pg, a, op, what):
    """For a PREMUL_SUM ``op``: ``a`` (a host array) scaled by the factor, and SUM; else (a, op)."""
    if type(op) is not _PremulSum:
        return a, op
    if type(a) is not np.ndarray:
        raise ValueError(f"{what}: PREMUL_SUM is supported on host (NumPy) arrays only")
    if a.dtype.kind not in "fc":
        raise ValueError(f"{what}: PREMUL_SUM needs a floating-point tensor, got {a.dtype}")
    factor = op.factor
    if factor is None:
        raise ValueError(f"{what}: PREMUL_SUM without a factor")
    return a * np.asarray(factor, dtype=a.dtype).reshape(()), ReduceOp.SUM


_TORCH_TYPE_NAMES = {"bool": "Bool", "int8": "Char", "uint8": "Byte", "int16": "Short",
                     "uint16": "UInt16", "int32": "Int", "uint32": "UInt32", "int64": "Long",
                     "uint64": "UInt64"}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def _check_reduce_op(a, code, op, name, value_error=False, call=None):
    """torch's (gloo's) refusals of a reduction op for the dtype of a host array, with its
    exception types: bitwise ops on floating types, AVG on integers and bool, and only SUM / AVG
    on complex.  Device arrays (the NCCL backend) keep NCCL's rules, checked by the backend.
    ``call`` names the function in the AVG message (default ``name``, the one torch's complex
    message names).  Raised before any communication, on every rank that passes the dtype."""
    if type(a) is not np.ndarray:
        return
    dname = _interop.DTYPE_NAMES[code]
    if dname.startswith("complex"):
        if op not in (ReduceOp.SUM, ReduceOp.AVG):
            msg = f"{name} does not support RedOpType.{op.name} on complex tensors"
            raise (ValueError if value_error else RuntimeError)(msg)
        return
    if dname in _TORCH_TYPE_NAMES:
        if op is ReduceOp.AVG:
            # torch's gloo fails dividing the sum in place; its words are kept at the end
            raise RuntimeError(f"{call or name}: Cannot use ReduceOp.AVG with non-floating point "
                               f"dtype {dname} (use a floating point array, or SUM and divide; "
                               f"torch: result type Float can't be cast to the desired output "
                               f"type {_TORCH_TYPE_NAMES[dname]})")
    elif op in _BITWISE:
        raise RuntimeError(f"Cannot use ReduceOp.{op.name} with non-integral dtype")


def supports_complex(reduceOp) -> bool:  # noqa: N803 (torch's name)
    """Whether ``reduceOp`` may reduce complex tensors (SUM and AVG), as torch answers."""
    try:
        op = _op_of(reduceOp)
    except (ValueError, TypeError):
        return True
    return op not in (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT) + _BITWISE


def _shape_str(shape) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"


def _check_gather_shape(output_tensor, input_tensor, n):
    """all_gather_into_tensor's output must be (n * d0, d1, ...) for an input (d0, d1, ...): torch
    (gloo) splits it with torch.chunk(output, n) and requires every chunk to have the input's shape.
    The error names output_tensor and both shapes, then torch's own words; it is a RuntimeError, as
    torch's is (a ported script's ``except RuntimeError`` keeps working; docs/api-coverage.md)."""
    oshape = getattr(output_tensor, "shape", None)
    ishape = getattr(input_tensor, "shape", None)
    if oshape is None or ishape is None:
        return
    oshape, ishape = tuple(oshape), tuple(ishape)
    if ishape and oshape == (n * ishape[0],) + ishape[1:]:
        return
    if ishape:
        head = (f"all_gather_into_tensor: output_tensor must have shape "
                f"{_shape_str((n * ishape[0],) + ishape[1:])} (world size {n} times input_tensor's "
                f"{_shape_str(ishape)} along dim 0), got {_shape_str(oshape)}")
    else:
        head = (f"all_gather_into_tensor: input_tensor is 0-dimensional, and no output_tensor splits "
                f"into {n} chunks of shape (): give input_tensor shape (1) and output_tensor shape "
                f"({n}) (output_tensor has shape {_shape_str(oshape)})")
    if not oshape:
        raise RuntimeError(f"{head}; torch: chunk expects at least a 1-dimensional tensor")
    d0 = oshape[0]
    chunk = -(-d0 // n) if d0 else 0
    count = -(-d0 // chunk) if chunk else n
    if count != n:
        raise RuntimeError(f"{head}; torch: ProcessGroupGloo::allgather: invalid output tensor list "
                         f"at index 0 (expected length {n}, got {count})")
    for i in range(n):
        got = (min(chunk, d0 - i * chunk),) + oshape[1:] if chunk else oshape
        if got != ishape:
            raise RuntimeError(f"{head}; torch: ProcessGroupGloo::allgather: invalid tensor size at "
                             f"index {i} (expected {_shape_str(ishape)}, got {_shape_str(got)})")


def _group_rank(pg, global_rank, what):
    if not isinstance(global_rank, (int, np.integer)) or isinstance(global_rank, bool):
        raise TypeError(f"{what} must be an int rank, got {type(global_rank).__name__}")
    r = pg._rank_of.get(int(global_rank))
    if r is None:
        if pg is _world.default_pg:
            raise ValueError(f"{what}={global_rank} is out of range: expected 0 <= {what} < {pg.size()}")
        raise ValueError(f"{what}={global_rank} is not a member of group {pg._name!r} "
                         f"(ranks {pg._ranks})")
    return r


def _check_same(a, code, ref, ref_code, what, ref_what):
    if code != ref_code:
        raise TypeError(f"{what} has dtype {_interop.DTYPE_NAMES[code]} but {ref_what} has dtype "
                        f"{_interop.DTYPE_NAMES[ref_code]}")


def _list_arg(lst, name):
    if not isinstance(lst, (list, tuple)):
        raise TypeError(f"{name} must be a list of arrays, got {type(lst).__name__}")
    return lst


def _rank_arrays(pg, lst, name, ref, ref_code, ref_name, writable):
    """Views of a list with one array per rank, each like `ref` (dtype, element count)."""
    _list_arg(lst, name)
    n = pg.size()
    if len(lst) != n:
        raise ValueError(f"{name} must have one array per rank ({n}), got {len(lst)}")
    out = []
    for i, t in enumerate(lst):
        a, code = as_array(t, f"{name}[{i}]", writable, pg._on_device)
        _check_same(a, code, ref, ref_code, f"{name}[{i}]", ref_name)
        if a.size != ref.size:
            raise ValueError(f"{name}[{i}] has {a.size} elements but {ref_name} has {ref.size}")
        out.append(a)
    return tuple(out)


def _root(pg, group_root, root, name):
    """The root's group rank: ``group_root`` (group_src / group_dst) when given, else the group
    rank of the global rank ``root`` (default 0)."""
    if group_root is not None:
        return group_root
    return _group_rank(pg, root if root is not None else 0, name)


def _root_list(pg, root, lst, name, ref, ref_code, writable, role):
    """gather's / scatter's list of one array per rank: its arrays on the root, () on the others
    (where it must be None or empty)."""
    if pg.rank() == root:
        if lst is None:
            raise ValueError(f"{name} must be given on the {role} rank")
        return _rank_arrays(pg, lst, name, ref, ref_code, "tensor", writable)
    if lst:
        raise ValueError(f"{name} must be None or empty on non-{role} ranks")
    return ()


# ------------------------------------------------------------------------------ collectives

def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Copy ``tensor`` of rank ``src`` (global rank; ``group_src``: rank in the group) into
    ``tensor`` on every rank of ``group``, in place. Returns a Work with ``async_op=True``,
    else None."""
    pg = _start(group, not async_op and group_src is None and src is not None,
                _K_BROADCAST, tensor, src)
    if pg is None:
        return None
    root = _root(pg, group_src, src, "src")
    a, code = as_array(tensor, "tensor", True, pg._on_device)
    return _ret(pg._submit(_C.K_BROADCAST, code, 0, root, 0, a.size, (), (a,),
                           name="broadcast", result=tensor, async_op=async_op), async_op)


_K_ALLREDUCE, _K_BROADCAST, _K_BARRIER = _C.K_ALLREDUCE, _C.K_BROADCAST, _C.K_BARRIER
_K_ALLGATHER, _K_REDUCE_SCATTER = _C.K_ALLGATHER, _C.K_REDUCE_SCATTER
_K_REDUCE, _K_GATHER, _K_SCATTER, _K_ALLTOALL = _C.K_REDUCE, _C.K_GATHER, _C.K_SCATTER, _C.K_ALLTOALL


def _start(group, fast, kind, x, arg, y=None, root=None):
    """What every collective does first: with ``fast`` (a blocking call the C fast path may take)
    on the default group, try the C fast path, ``fast(kind, x, arg[, y, root])`` (one C call;
    None: done); else the ProcessGroup to run on, or None on a rank outside ``group`` (nothing to
    do).  Fixed arguments, no ``*args``: a small blocking collective is about 1 us, and packing
    and unpacking a tuple was a tenth of it."""
    if fast and group is None:
        pg = _world.default_pg
        if pg is not None:
            f = pg._fast
            if f is not None and (f(kind, x, arg) if y is None and root is None
                                  else f(kind, x, arg, y, root or 0)):
                return None
    return _resolve(group)


def _ret(work, async_op):
    return work if async_op else None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` over every rank of ``group`` with ``op`` (a ReduceOp) and leave the result
    in ``tensor`` on every rank, in place. Returns a Work with ``async_op=True``, else None."""
    if group is None and not async_op:  # _start written out for the most frequent call (0.1 us)
        pg = _world.default_pg
        if pg is not None and pg._fast is not None and type(op) is ReduceOp and \
                pg._fast(_K_ALLREDUCE, tensor, op):
            return None
    pg = _resolve(group)
    if pg is None:
        return None
    op = _op_of(op, premul=True)
    a, code = as_array(tensor, "tensor", True, pg._on_device)
    if type(op) is _PremulSum:
        scaled, op = _premul_input(pg, a, op, "all_reduce")
        a[...] = scaled
    _check_reduce_op(a, code, op, "all_reduce", value_error=True)
    return _ret(pg._submit(_C.K_ALLREDUCE, code, op, 0, 0, a.size, (), (a,),
                           name="all_reduce", result=tensor, async_op=async_op), async_op)


def _all_reduce_as(array, code, op=ReduceOp.SUM, group=None, async_op=False):
    """all_reduce of a contiguous NumPy array whose bytes hold dtype ``code`` (internal: bfloat16
    carried in a uint16 view when ml_dtypes is absent)."""
    pg = _resolve(group)
    if pg is None:
        return None
    a, _ = as_array(array, "tensor", True, pg._on_device)
    return _ret(pg._submit(_C.K_ALLREDUCE, code, _op_of(op), 0, 0, a.size, (), (a,),
                           name="all_reduce", result=array, async_op=async_op), async_op)


def _all_reduce_into(src, dst, op=ReduceOp.SUM, group=None, async_op=False):
    """all_reduce of ``src`` with the result written to ``dst`` (internal; DistributedDataParallel
    reduces its buckets in place now, their slots being the .grads).

    ``src`` is left holding partial results.  When it is a ``_shared_array`` the reduction reads
    every rank's buffer in place and writes this rank's result straight into ``dst``, saving the
    copy back out of the buffer."""
    pg = _resolve(group)
    if pg is None:
        return None
    a, code = as_array(src, "src", True, pg._on_device)
    d, dcode = as_array(dst, "dst", True, pg._on_device)
    if dcode != code or d.size != a.size:
        raise ValueError(f"_all_reduce_into: dst must match src's dtype and size ({a.dtype}, {a.size}), "
                         f"got {d.dtype}, {d.size}")
    if np.shares_memory(a, d):  # False for device views (object arrays to NumPy)
        raise ValueError("_all_reduce_into: src and dst must not overlap")
    return _ret(pg._submit(_C.K_ALLREDUCE, code, _op_of(op), 0, 0, a.size, (a,), (d,),
                           name="all_reduce", result=dst, async_op=async_op), async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce ``tensor`` over the ranks of ``group`` with ``op``; the result lands in ``tensor`` on
    rank ``dst`` only (the other ranks' tensors are unchanged)."""
    if group is None and not async_op and group_dst is None and type(op) is ReduceOp and \
            (dst is None or type(dst) is int):  # _start written out (see all_reduce)
        pg = _world.default_pg
        if pg is not None and (f := pg._fast) is not None and \
                f(_K_REDUCE, tensor, op, None, dst or 0):
            return None
    pg = _resolve(group)
    if pg is None:
        return None
    op = _op_of(op, premul=True)
    root = _root(pg, group_dst, dst, "dst")
    a, code = as_array(tensor, "tensor", True, pg._on_device)
    src, op = _premul_input(pg, a, op, "reduce")
    _check_reduce_op(a, code, op, "reduce")
    return _ret(pg._submit(_C.K_REDUCE, code, op, root, 0, a.size, (src,), (a,),
                           name="reduce", result=tensor, async_op=async_op), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """Fill ``tensor_list`` (one array per rank of ``group``, shaped like ``tensor``) with every
    rank's ``tensor``, on every rank."""
    if group is None and not async_op:  # _start written out (see all_reduce)
        pg = _world.default_pg
        if pg is not None and (f := pg._fast) is not None and \
                f(_K_ALLGATHER, tensor_list, 0, tensor, 0):
            return None
    pg = _resolve(group)
    if pg is None:
        return None
    a, code = as_array(tensor, "tensor", False, pg._on_device)
    outs = _rank_arrays(pg, tensor_list, "tensor_list", a, code, "tensor", True)
    return _ret(pg._submit(_C.K_ALLGATHER, code, 0, 0, 0, a.size, (a,), outs,
                           name="all_gather", result=tensor_list, async_op=async_op), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Concatenate every rank's ``input_tensor``, in rank order, into ``output_tensor`` (world_size
    times as many elements), on every rank."""
    # the C fast path takes an output shaped (world_size * d0, d1, ...) for an input shaped
    # (d0, d1, ...) and leaves any other shape to the checks below
    pg = _start(group, not async_op, _K_ALLGATHER, output_tensor, 0, input_tensor)
    if pg is None:
        return None
    a, code = as_array(input_tensor, "input_tensor", False, pg._on_device)
    o, oc = as_array(output_tensor, "output_tensor", True, pg._on_device)
    if isinstance(o, np.ndarray):  # gloo's rule; torch's NCCL checks the element count alone
        _check_gather_shape(output_tensor, input_tensor, pg.size())
    _check_same(o, oc, a, code, "output_tensor", "input_tensor")
    if o.size != a.size * pg.size():
        raise ValueError(f"output_tensor must have world_size * input_tensor.numel() = "
                         f"{a.size * pg.size()} elements, got {o.size}")
    return _ret(pg._submit(_C.K_ALLGATHER, code, 0, 0, 0, a.size, (a,), (o,),
                           name="all_gather_into_tensor", result=output_tensor,
                           async_op=async_op), async_op)


def _all_gather_base(output_tensor, input_tensor, group=None, async_op=False):
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """Collect every rank's ``tensor`` into ``gather_list`` on rank ``dst`` (None on the other
    ranks)."""
    if group is None and not async_op and group_dst is None and \
            (dst is None or type(dst) is int):  # _start written out (see all_reduce)
        pg = _world.default_pg
        if pg is not None and (f := pg._fast) is not None and \
                f(_K_GATHER, gather_list, dst or 0, tensor, 0):
            return None
    pg = _resolve(group)
    if pg is None:
        return None
    root = _root(pg, group_dst, dst, "dst")
    a, code = as_array(tensor, "tensor", False, pg._on_device)
    outs = _root_list(pg, root, gather_list, "gather_list", a, code, True, "destination")
    return _ret(pg._submit(_C.K_GATHER, code, 0, root, 0, a.size, (a,), outs,
                           name="gather", result=gather_list, async_op=async_op), async_op)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """Rank ``src`` sends ``scatter_list[i]`` to rank i; every rank receives into ``tensor``."""
    if group is None and not async_op and group_src is None and \
            (src is None or type(src) is int):  # _start written out (see all_reduce)
        pg = _world.default_pg
        if pg is not None and (f := pg._fast) is not None and \
                f(_K_SCATTER, tensor, src or 0, scatter_list, 0):
            return None
    pg = _resolve(group)
    if pg is None:
        return None
    root = _root(pg, group_src, src, "src")
    o, code = as_array(tensor, "tensor", True, pg._on_device)
    ins = _root_list(pg, root, scatter_list, "scatter_list", o, code, False, "source")
    return _ret(pg._submit(_C.K_SCATTER, code, 0, root, 0, o.size, ins, (o,),
                           name="scatter", result=tensor, async_op=async_op), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input_list`` element-wise over the ranks with ``op``; rank i receives the i-th
    reduced array in ``output``."""
    pg = _start(group, not async_op and type(op) is ReduceOp, _K_REDUCE_SCATTER, output, op,
                input_list)
    if pg is None:
        return None
    op = _op_of(op, premul=True)
    o, code = as_array(output, "output", True, pg._on_device)
    ins = _rank_arrays(pg, input_list, "input_list", o, code, "output", False)
    if type(op) is _PremulSum:
        premul = op
        ins = tuple(_premul_input(pg, x, premul, "reduce_scatter")[0] for x in ins)
        op = ReduceOp.SUM
    _check_reduce_op(o, code, op, "reduce_scatter")
    return _ret(pg._submit(_C.K_REDUCE_SCATTER, code, op, 0, 0, o.size, ins, (o,),
                           name="reduce_scatter", result=output, async_op=async_op), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input`` (world_size times the size of ``output``) over the ranks with ``op``; rank i
    receives the i-th chunk in ``output``."""
    pg = _start(group, not async_op and type(op) is ReduceOp, _K_REDUCE_SCATTER, output, op, input)
    if pg is None:
        return None
    op = _op_of(op, premul=True)
    o, code = as_array(output, "output", True, pg._on_device)
    a, ac = as_array(input, "input", False, pg._on_device)
    _check_same(a, ac, o, code, "input", "output")
    a, op = _premul_input(pg, a, op, "reduce_scatter_tensor")
    # torch's complex message names all_reduce here too
    _check_reduce_op(a, code, op, "all_reduce", call="reduce_scatter_tensor")
    if a.size != o.size * pg.size():
        raise ValueError(f"input must have world_size * output.numel() = {o.size * pg.size()} "
                         f"elements, got {a.size}")
    return _ret(pg._submit(_C.K_REDUCE_SCATTER, code, op, 0, 0, o.size, (a,), (o,),
                           name="reduce_scatter_tensor", result=output, async_op=async_op),
                async_op)


def _reduce_scatter_base(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    return reduce_scatter_tensor(output, input, op, group, async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """Rank i sends ``input_tensor_list[j]`` to rank j, which receives it in
    ``output_tensor_list[i]``."""
    if group is None and not async_op:  # _start written out (see all_reduce)
        pg = _world.default_pg
        if pg is not None and (f := pg._fast) is not None and \
                f(_K_ALLTOALL, output_tensor_list, 0, input_tensor_list, 0):
            return None
    pg = _resolve(group)
    if pg is None:
        return None
    n = pg.size()
    _list_arg(output_tensor_list, "output_tensor_list")
    _list_arg(input_tensor_list, "input_tensor_list")
    if len(output_tensor_list) != n or len(input_tensor_list) != n:
        raise ValueError(f"output_tensor_list and input_tensor_list must have one array per rank "
                         f"({n}), got {len(output_tensor_list)} and {len(input_tensor_list)}")
    ins, outs = [], []
    code = None
    for i, t in enumerate(input_tensor_list):
        a, ac = as_array(t, f"input_tensor_list[{i}]", False, pg._on_device)
        if code is None:
            code = ac
        _check_same(a, ac, None, code, f"input_tensor_list[{i}]", "input_tensor_list[0]")
        ins.append(a)
    for i, t in enumerate(output_tensor_list):
        o, oc = as_array(t, f"output_tensor_list[{i}]", True, pg._on_device)
        _check_same(o, oc, None, code, f"output_tensor_list[{i}]", "input_tensor_list[0]")
        outs.append(o)
    if ins[pg.rank()].nbytes != outs[pg.rank()].nbytes:
        raise ValueError(f"output_tensor_list[{pg.rank()}] must match input_tensor_list[{pg.rank()}] "
                         "in size (the block a rank sends to itself)")
    ins = _unaliased(ins, outs)
    return _ret(pg._submit(_C.K_ALLTOALL, code, 0, 0, 0, 0, tuple(ins), tuple(outs),
                           name="all_to_all", result=output_tensor_list, async_op=async_op),
                async_op)


def _unaliased(ins, outs):
    """``ins``, copied when any of them shares memory with an output (all_to_all in place: the
    peers read a rank's input while it writes its output, so it must not change under them)."""
    host = all(type(a) is np.ndarray for a in ins) and all(type(o) is np.ndarray for o in outs)
    if host and any(np.may_share_memory(a, o) for a in ins for o in outs):
        return [a.copy() for a in ins]
    return ins


def _nbytes_per_row(a) -> int:
    if a.ndim == 0:
        return a.itemsize
    if a.shape[0] == 0:
        return 0
    return a.nbytes // a.shape[0]


def _splits(splits, arr, n, name, arrname):
    row = _nbytes_per_row(arr)
    rows = arr.shape[0] if arr.ndim else 1
    if splits is None or len(splits) == 0:
        if rows % n != 0:
            raise ValueError(f"{arrname} has {rows} rows, not divisible by world size {n}; "
                             f"give {name}")
        return tuple([(rows // n) * row] * n)
    splits = list(splits)
    if len(splits) != n:
        raise ValueError(f"{name} must have one entry per rank ({n}), got {len(splits)}")
    if any((not isinstance(s, (int, np.integer))) or s < 0 for s in splits):
        raise ValueError(f"{name} must be non-negative integers, got {splits}")
    if sum(splits) != rows:
        raise ValueError(f"{name} adds up to {sum(splits)} rows but {arrname} has {rows}")
    return tuple(int(s) * row for s in splits)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    """all_to_all on single arrays split along the first dimension: equal chunks, or
    ``input_split_sizes`` / ``output_split_sizes`` rows per rank."""
    pg = _start(group, not async_op and output_split_sizes is None and input_split_sizes is None,
                _K_ALLTOALL, output, 0, input)
    if pg is None:
        return None
    n = pg.size()
    o, code = as_array(output, "output", True, pg._on_device)
    a, ac = as_array(input, "input", False, pg._on_device)
    _check_same(a, ac, o, code, "input", "output")
    ins = _splits(input_split_sizes, a, n, "input_split_sizes", "input")
    outs = _splits(output_split_sizes, o, n, "output_split_sizes", "output")
    if ins[pg.rank()] != outs[pg.rank()]:
        raise ValueError(f"input_split_sizes[{pg.rank()}] and output_split_sizes[{pg.rank()}] must "
                         "match (the block a rank sends to itself)")
    a, = _unaliased([a], [o])
    return _ret(pg._submit(_C.K_ALLTOALL, code, 0, 0, 0, 0, (a,), (o,), in_splits=ins,
                           out_splits=outs, name="all_to_all_single", result=output,
                           async_op=async_op), async_op)


def _shared_array(shape, dtype=np.float32, group=None):
    """A NumPy array in the group's shared memory (internal; DistributedDataParallel keeps its
    gradient buckets there).

    A collective: every rank calls it with the same shape and dtype and gets its own array, which
    every other rank of the group has mapped, so ``all_reduce`` on it (or on a contiguous slice of
    it) reduces straight from the ranks' arrays without copying them in first. Needs a group
    whose ranks are all on this host (its 'cpu' backend's transport 'shm'); otherwise, or when /dev/shm
    is too small on any rank, it raises on every rank and the group goes on.
    """
    pg = _resolve(group)
    if pg is None:
        return None
    dt = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(n) for n in shape)
    count = 1
    for n in shape:
        if n < 0:
            raise ValueError(f"shape must not have negative entries, got {shape}")
        count *= n
    decl = pg._declared("cpu")
    if decl is None:
        raise DistError("_shared_array: the process group has been destroyed")
    alloc = decl.shared_alloc
    if alloc is None:
        raise DistError(f"_shared_array: the 'cpu' backend of group {pg._name!r} has no shared "
                        "memory")
    buf = alloc(count * dt.itemsize)
    return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)


def _check_device_ids(device_ids):
    """torch 2.13's checks of barrier's ``device_ids``: a list must hold device indices (its
    BarrierOptions refuses anything else with a TypeError) and at least one, the first not negative
    (it makes ``torch.device(type, device_ids[0])``: IndexError, RuntimeError).  Anything that is
    not a list torch 2.13 ignores, and so does pyddp (``device_ids=local_rank`` runs under torch
    2.13; torch 2.0-2.5 raised TypeError).  Checked on every rank before the barrier."""
    if not isinstance(device_ids, list):
        return
    for d in device_ids:
        # torch.device(type, index) takes a Python or NumPy integer, or a torch integer tensor
        if isinstance(d, (bool, np.bool_)) or not (
                isinstance(d, (int, np.integer)) or (type(d).__module__.split(".")[0] == "torch"
                                                     and hasattr(d, "__index__"))):
            raise TypeError(f"barrier: device_ids type should be List[int], got {device_ids!r} "
                            f"(an entry of type {type(d).__name__})")
    if not device_ids:
        raise IndexError("barrier: device_ids is an empty list (torch uses device_ids[0]): give "
                         "the device of this rank, e.g. [local_rank], or leave it None")
    if int(device_ids[0].__index__()) < 0:
        raise RuntimeError(f"barrier: device_ids[0] is {device_ids[0]}: Device index must not be "
                           f"negative")


def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    """Block until every rank of ``group`` has entered the barrier; ``timeout`` (a timedelta)
    replaces the group's timeout for this call.  ``device_ids`` is checked as torch 2.13 checks it
    (a list of device indices, at least one); on a CUDA backend the barrier runs on the first
    (else on the group's bound, last-used or current device) after the caller's current stream,
    and returns once its work there is done, as torch's NCCL barrier."""
    if device_ids is not None:
        _check_device_ids(device_ids)
    pg = _start(group, not async_op and timeout is None, _K_BARRIER, None, 0)
    if pg is None:
        return None
    if isinstance(device_ids, list):
        # a device backend's barrier runs on the first of them (torch's), else on the group's
        # bound or last-used device
        for decl in pg._decl.values():
            if decl.set_barrier_device is not None:
                decl.set_barrier_device(device_ids[0])
    t = 0.0 if timeout is None else _timeout_seconds(timeout)
    return _ret(pg._submit(_C.K_BARRIER, timeout=t, name="barrier", async_op=async_op), async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier that names the ranks that did not arrive within ``timeout`` (all of them with
    ``wait_all_ranks=True``), as torch's."""
    pg = _resolve(group)
    if pg is None:
        return None
    t = _timeout_seconds(timeout) if timeout is not None else pg._timeout
    pg._submit(_C.K_MONITORED_BARRIER, timeout=t, wait_all=wait_all_ranks,
               name="monitored_barrier")


# -------------------------------------------------------------------------- point to point

def _p2p(kind, tensor, peer, group, tag, name, writable):
    pg = _resolve(group)
    if pg is None:
        return None, None
    if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool):
        raise TypeError(f"tag must be an int, got {type(tag).__name__}")
    if not 0 <= int(tag) < 2 ** 31:
        raise ValueError(f"tag must be in [0, 2**31), got {tag}")
    a, code = as_array(tensor, "tensor", writable, pg._on_device)
    if peer is None:
        root = -1
    else:
        root = _group_rank(pg, peer, "dst" if kind == _C.K_SEND else "src")
        if root == pg.rank():
            raise ValueError(f"{name}: rank {peer} cannot {'send to' if kind == _C.K_SEND else 'receive from'} itself")
    ins, outs = ((a,), ()) if kind == _C.K_SEND else ((), (a,))
    return pg, (kind, code, 0, root, int(tag), a.size, ins, outs)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Start sending ``tensor`` to rank ``dst`` (``tag`` matches sends to receives); returns a Work."""
    if dst is None and group_dst is None:
        raise ValueError("isend: dst must be given")
    pg, args = _p2p(_C.K_SEND, tensor, dst if group_dst is None else _global(group, group_dst),
                    group, tag, "isend", False)
    if pg is None:
        return None
    return pg._submit(*args, name="send", result=tensor, async_op=True, source=True)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Start receiving into ``tensor`` from rank ``src`` (None: any rank); returns a Work whose
    source_rank() names the sender."""
    pg, args = _p2p(_C.K_RECV, tensor, src if group_src is None else _global(group, group_src),
                    group, tag, "irecv", True)
    if pg is None:
        return None
    return pg._submit(*args, name="recv", result=tensor, async_op=True, source=True)


def _global(group, group_rank):
    return get_global_rank(group if group is not None else _default_pg(), group_rank)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Send ``tensor`` to rank ``dst`` (isend, then wait for it to complete)."""
    w = isend(tensor, dst, group, tag, group_dst)
    if w is not None:
        w.wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into `tensor`; src=None receives from any rank.  Returns the sender's rank."""
    w = irecv(tensor, src, group, tag, group_src)
    if w is None:
        return -1
    w.wait()
    return w.source_rank()


class P2POp:
    """A point-to-point operation for batch_isend_irecv: P2POp(dist.isend, tensor, peer)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be pyddp.distributed.isend or pyddp.distributed.irecv")
        self.op = op
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer


def batch_isend_irecv(p2p_op_list):
    """Start every operation of the list; returns their Work handles."""
    if not isinstance(p2p_op_list, (list, tuple)) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise TypeError("batch_isend_irecv expects a list of P2POp")
    batched = _batch_on_device(p2p_op_list)
    if batched is not None:
        return batched
    works = []
    for p in p2p_op_list:
        if p.op is isend:
            works.append(isend(p.tensor, p.peer, p.group, p.tag, p.group_peer))
        else:
            works.append(irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer))
    return works


def _batch_on_device(p2p_op_list):
    """batch_isend_irecv as one operation of a device backend that batches (NCCL's group call):
    the Work of the whole batch for each op, as torch's; None when the ops are not all on one
    such backend."""
    if not p2p_op_list:
        return None
    pg = _resolve(p2p_op_list[0].group)
    if pg is None or pg._route is None or any(_resolve(p.group) is not pg for p in p2p_op_list):
        return None
    ops, be = [], None
    for i, p in enumerate(p2p_op_list):
        send = p.op is isend
        peer = p.peer if p.group_peer is None else _global(p.group, p.group_peer)
        if peer is None:
            return None
        v = describe_device(p.tensor)
        if v is None:
            return None
        a, code = as_array(p.tensor, f"p2p_op_list[{i}].tensor", not send, pg._on_device)
        device = getattr(a, "device", "cpu")
        b = pg._declared(device)
        if b is None or b.batch_p2p is None or (be is not None and b is not be):
            return None
        be = b
        r = _group_rank(pg, peer, "peer")
        if r == pg.rank():
            raise ValueError(f"batch_isend_irecv: p2p_op_list[{i}] has this rank as its peer")
        e = pg._refusal(Request(_C.K_SEND if send else _C.K_RECV, code, 0, r, p.tag, a.size,
                                (a,) if send else (), () if send else (a,), None, None, 0.0,
                                False, "batch_isend_irecv", False), device)
        if e is not None:
            raise e
        ops.append((send, a, r))
    work = Work(be.batch_p2p(ops), [p.tensor for p in p2p_op_list])
    with pg._lock:
        pg._pending.append(work._cw)
    return [work] * len(ops)


def describe_device(x):
    """An ArrayView of ``x`` when it lives on a device, else None (cheap for host arrays)."""
    if isinstance(x, np.ndarray) or isinstance(getattr(x, "_data", None), np.ndarray):
        return None
    try:
        v = _interop.describe(x)
    except TypeError:
        return None
    return None if v.device == "cpu" else v
