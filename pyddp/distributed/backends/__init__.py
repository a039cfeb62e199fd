"""pyddp.distributed's backends: one interface, a registry, one folder per backend.

A ProcessGroup holds one backend object per device type and hands each collective, its
arguments checked by distributed_c10d, to the object serving its arrays' device as one
``Request`` record (``interface``: ``Backend.run(request) -> Work or None``, ``Work``,
``BackendOptions``).  A backend declares what it serves: its registry entry names the devices and
a ``Supports`` (kinds, dtypes, the dtypes and ops it reduces), and ProcessGroup refuses the rest
above the seam, in one wording for all; its object has the optional members ``Backend`` declares
(``fast``, ``split``, ``host``, ``shared_alloc``, ``batch_p2p``, ``explain``, ...), read once per
object (``declared``).  ``registry`` maps names ("cpu", "gloo", "nccl", "mpi", users') to entries:
devices served, what they support, availability, a factory, an optional rendezvous hook, and for
'cpu' the hook that makes the host groups device backends keep (``host_group``); it registers
nothing itself.  Each backend folder registers itself when this package imports it:

- ``cpu``: pyddp's C core (its object is the C process group); connecting a group through its
  store, the transport choice; ``cpu.tuning`` (the rules file of algorithm choice) and
  ``cpu.crossovers`` (measuring the rules on running ranks);
- ``nccl``: CUDA arrays on NCCL (``staging``: CUDA arrays on a host backend, through pinned
  memory, and the caller's-stream rules both share);
- ``mpi``: the site's MPI through mpi4py, with the rendezvous hook that takes MPI's ranks.

(pyddp as a torch.distributed backend, ``import pyddp.torch_backend``, is not one of these: it is
pyddp.distributed.torch_bridge, a caller of ProcessGroup like the public API.)

nccl and mpi register in their ``__init__`` and import their implementation at the first group
that uses them (``import pyddp.distributed`` stays light).  tests/distributed/test_backend_conformance.py runs
the same checks on every backend (the example below included).

Nothing here imports distributed_c10d (the API module sits above; tests/project/test_architecture.py
checks the import graph).  Adding a backend is one module like this one (its entry given
``supports=Supports(...)`` when it serves less than everything), registered under a name and
the devices it serves::

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
from .interface import (Backend, BackendOptions, Completed, Declared, Rendezvous, Request, Supports,
                        Work, declared, runner)
from .registry import BackendEntry, Unavailable, create, host_group, lookup, names, parse, register

__all__ = ["Backend", "BackendOptions", "Completed", "Declared", "Rendezvous", "Request",
           "Supports", "Work", "declared", "runner", "BackendEntry", "Unavailable", "create",
           "host_group", "lookup", "names", "parse", "register"]
