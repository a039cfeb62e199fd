"""pyddp as a torch.distributed backend: ``import pyddp.torch_backend`` registers "pyddp" (this
module, pyddp.distributed.torch_bridge, is also pyddp.torch_backend).

Then an unchanged torch script runs its collectives on pyddp's C core (shared memory on one
host, TCP across hosts)::

    import torch.distributed as dist
    import pyddp.torch_backend  # noqa: F401
    dist.init_process_group("pyddp")

torch 2.13 cannot subclass its C++ ``Backend`` from Python (no constructor is bound), so the
creator returns a ``torch.distributed.ProcessGroup`` subclass, which torch uses as the whole
group (as in torch's own test_c10d_pypg.py).  Its methods are the ones torch's Python API and its
C++ callers (DistributedDataParallel's reducer, ``_broadcast_coalesced``) call.  This module is a
caller of pyddp's ProcessGroup like distributed_c10d (not a backend): each method turns torch's
arguments into one checked request (the arrays through the group's own device rule, the same
as pyddp.distributed's functions) and hands it to a ``pyddp.distributed.ProcessGroup`` whose
backends are the C process group for 'cpu' and, for 'cuda', pyddp's NCCL backend, started over
the group's torch store at the first CUDA call (``_TorchNccl``).  CPU tensors are used in place
(bfloat16 as a uint16 view with the BFLOAT16 code).  Works are asynchronous; ``get_future()`` of
a CPU work completes from a watcher thread once the work finishes; that of a CUDA work completes
at launch with its consumers ordered on the GPU, as torch's ProcessGroupNCCL's
(``_cuda_future``).  pyddp's errors (mismatched collectives, dead peers, timeouts) surface as
``torch.distributed.DistBackendError``.

Registered for "cpu" and "cuda": with ``"pyddp"`` or ``"cpu:pyddp,cuda:nccl"`` this group is the
whole group, and CUDA tensors (any ``__cuda_array_interface__`` array) run on pyddp's own NCCL
backend.  ReduceOp.PREMUL_SUM is a sum of scaled inputs.  torch's ``dist.monitored_barrier``
accepts only gloo groups, so importing this module wraps it once: calls on a pyddp group run
pyddp's, all others torch's own function.

Importing this module imports torch; ``import pyddp`` alone never does.

The package: ``group`` (ProcessGroupPyddp, torch's arguments into requests), ``work`` (Work, its
futures, the handles of CUDA work), ``nccl`` (the 'cuda' backend it starts over the torch store);
this module registers the backend with torch and wraps torch's monitored_barrier.
"""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from ... import _C  # noqa: F401  (tests patch it here)
from .group import _K_ALLREDUCE, _SUM_CODE, BACKEND_NAME, ProcessGroupPyddp  # noqa: F401
from .work import Work, _CudaHandle  # noqa: F401  (tests and benchmarks reach them here)

__all__ = ["ProcessGroupPyddp", "Work", "BACKEND_NAME"]


def _create(store, rank, world_size, timeout):
    return ProcessGroupPyddp(store, rank, world_size, timeout)


if BACKEND_NAME.upper() not in dist.Backend._plugins:
    # "cuda" too: with "pyddp" or "cpu:pyddp,cuda:nccl" torch stops at this creator (a
    # ProcessGroup subclass is the whole group), and CUDA tensors run on pyddp's NCCL backend
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])


# ------------------------------------------------------------------ torch's monitored_barrier
# torch.distributed.monitored_barrier raises "only implemented for GLOO backend" for any group
# whose backend string is not "gloo" (``get_backend(group) != Backend.GLOO``: nothing a process
# group object exposes changes that).  pyddp's C core has its own monitored barrier (naming the
# ranks that did not arrive, all of them with wait_all_ranks=True), so this module wraps torch's
# function: a call on a ProcessGroupPyddp group runs it; every other call goes to torch's own
# function unchanged.  Installed once (importing this module again keeps the wrapper); code that
# bound ``monitored_barrier`` by name before importing pyddp.torch_backend keeps torch's.
_c10d_py = dist.distributed_c10d


def _pyddp_group_of(group):
    """The ProcessGroupPyddp a torch API call on ``group`` would use, or None."""
    if group is None or group is dist.GroupMember.WORLD:
        if not dist.is_initialized():
            return None
        group = _c10d_py._get_default_group()
    return group if isinstance(group, ProcessGroupPyddp) else None


def _wrap_monitored_barrier(torch_fn):
    import functools

    @functools.wraps(torch_fn)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        pg = _pyddp_group_of(group)
        if pg is None:
            return torch_fn(group, timeout, wait_all_ranks)
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            timeout = timedelta(seconds=timeout)
        if timeout is not None:
            _c10d_py._check_valid_timeout(timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._pyddp_torch_fn = torch_fn
    return monitored_barrier


if not hasattr(_c10d_py.monitored_barrier, "_pyddp_torch_fn"):
    _c10d_py.monitored_barrier = _wrap_monitored_barrier(_c10d_py.monitored_barrier)
if getattr(dist, "monitored_barrier", None) is not _c10d_py.monitored_barrier:
    dist.monitored_barrier = _c10d_py.monitored_barrier
