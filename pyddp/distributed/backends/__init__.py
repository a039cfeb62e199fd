"""pyddp.distributed's backends: one interface, a registry, one module per backend.

A ProcessGroup holds one backend object per device type and hands each collective, its
arguments checked by distributed_c10d, to the object serving its arrays' device as one
``Request`` record (``interface``: ``Backend.run(request) -> Work or None``, ``Work``,
``BackendOptions``).  ``registry`` maps names ("cpu", "gloo", "nccl", "mpi", users') to entries:
devices served, availability, a factory, an optional rendezvous hook; it registers nothing
itself.  Each backend module registers itself when this package imports it:

- ``cpu``: pyddp's C core (its object is the C process group); connecting a group through its
  store, the transport choice;
- ``nccl``: CUDA arrays on NCCL (``staging``: CUDA arrays on a host backend, through pinned
  memory, and the caller's-stream rules both share);
- ``mpi``: the site's MPI through mpi4py, with the rendezvous hook that takes MPI's ranks.

(pyddp as a torch.distributed backend, ``import pyddp.torch_backend``, is not one of these: it is
pyddp.distributed.torch_bridge, a caller of ProcessGroup like the public API.)

nccl and mpi are folders: their ``__init__`` registers them, their ``backend`` module is imported
at the first group that uses them (``import pyddp.distributed`` stays light).

Nothing here imports distributed_c10d (the API module sits above; tests/project/test_architecture.py
checks the import graph).  Adding a backend is one module like this one, registered under a name
and the devices it serves::

    import numpy as np
    from pyddp.distributed.backends import Backend, BackendEntry, Completed, register


    class Solo(Backend):
        \"\"\"Backend 'solo': one rank on the host, where every collective is a copy or nothing.\"\"\"

        def __init__(self, opts):
            if opts.group_size != 1:
                raise ValueError("backend 'solo' runs one rank")

        def run(self, request):
            for src, dst in zip(request.inputs, request.outputs):  # all_gather, scatter, ...
                np.copyto(dst.reshape(-1), src.reshape(-1))
            return None if request.blocking else Completed()  # None: done, no Work

        def destroy(self):
            pass


    register(BackendEntry("solo", ("cpu",), Solo))

after which ``dist.init_process_group("solo", store=dist.HashStore(), rank=0, world_size=1)`` runs
pyddp's collectives on it (tests/project/test_architecture.py registers and runs this example).
"""
from . import cpu, nccl, mpi  # noqa: F401,I001  (each registers itself, in this order: names())
from .interface import Backend, BackendOptions, Completed, Rendezvous, Request, Work, runner
from .registry import BackendEntry, Unavailable, create, lookup, names, parse, register

__all__ = ["Backend", "BackendOptions", "Completed", "Rendezvous", "Request", "Work", "runner",
           "BackendEntry", "Unavailable", "create", "lookup", "names", "parse", "register"]
