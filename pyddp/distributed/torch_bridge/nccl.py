"""The torch bridge's 'cuda' backend: pyddp's NCCL backend over the torch store, started at the
first CUDA request (``_TorchNccl``).
"""
from __future__ import annotations

import threading
import weakref
from datetime import timedelta

import torch.distributed as dist

from ... import _C
from ..backends import registry as _registry
from ..backends.interface import Backend, BackendOptions
from .work import _CudaHandle, _DeferredP2P, _torch_error


class _TorchNccl(Backend):
    """The 'cuda' backend of a torch group: pyddp's NCCL backend
    (pyddp.distributed.backends.nccl) over the torch store the group was created with, started
    at the first CUDA request (every rank makes that call together, as torch's ProcessGroupNCCL
    creates its communicators).

    NCCL must see the sends and receives of a batch as one group (ncclGroupStart/End) or a ring
    of them waits on itself; torch's batch_isend_irecv coalesces only on a plain ProcessGroup
    (``type(group) is ProcessGroup``), so on this group it issues them one by one.  They wait
    here and run as one NCCL group at the first wait() or is_completed() of any of them, the
    next CUDA collective, the end of a coalescing block, or destroy."""

    def __init__(self, owner, store):
        self._owner = weakref.ref(owner)  # the ProcessGroupPyddp (its rank, size, name, ranks)
        self._store = store
        self._lock = threading.Lock()
        self.nccl = None  # the NcclBackend, once started
        self._p2p = []  # (is_send, view, peer, _DeferredP2P) not given to NCCL yet

    def _backend(self, name):
        be = self.nccl
        if be is not None:
            return be
        with self._lock:
            if self.nccl is not None:
                return self.nccl
            pg = self._owner()
            if pg is None or self._store is None:
                raise dist.DistBackendError(
                    f"{name}: this pyddp group has no store to start its NCCL backend from "
                    "(create it through torch.distributed.init_process_group/new_group)")
            try:
                ranks = dist.get_process_group_ranks(pg)
            except (RuntimeError, ValueError, KeyError):  # not registered with torch
                ranks = range(pg.size())
            gname = pg.__dict__.get("_group_name") or "pyddp"
            opts = BackendOptions(dist.PrefixStore("pyddp_nccl", self._store), pg.rank(),
                                  pg.size(), timedelta(seconds=pg._timeout), gname, ranks)
            try:
                self.nccl = _registry.lookup("nccl").factory(opts)
            except (RuntimeError, OSError) as e:
                raise dist.DistBackendError(
                    f"{name}: CUDA tensors on a pyddp group run on pyddp's NCCL backend, which "
                    f"could not start: {e}") from e
            return self.nccl

    def run(self, request):
        be = self._backend(request.name)
        kind = request.kind
        if kind == _C.K_SEND or kind == _C.K_RECV:
            d = _DeferredP2P(self, request.root if kind == _C.K_RECV else -1)
            view = (request.inputs or request.outputs)[0]
            self._p2p.append((kind == _C.K_SEND, view, request.root, d))
            return d
        self.flush()
        nw = be.run(request)
        return None if nw is None else _CudaHandle(nw)

    def flush(self):
        """Run the CUDA sends and receives not yet given to NCCL as one NCCL group."""
        ops, self._p2p = self._p2p, []
        if not ops:
            return
        try:
            nw = self._backend("batch_isend_irecv").batch_p2p(
                [(is_send, view, peer) for is_send, view, peer, _ in ops])
        except _C.DistError as e:
            raise _torch_error(e) from None
        handle = _CudaHandle(nw)
        for _, _, _, d in ops:
            d.real = handle

    def destroy(self):
        nccl = self.nccl
        if nccl is None:
            return
        try:  # sends and receives never waited for still reach the peers
            self.flush()
        except (dist.DistBackendError, ValueError):
            pass
        self.nccl = None
        nccl.destroy()
