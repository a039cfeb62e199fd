"""init_method rendezvous (torch.distributed.rendezvous): env://, tcp://host:port and file://
turned into a store, a rank and a world size.  Backends connect through the store it returns;
one with a launcher of its own (mpi) has a hook in the registry instead (backends.interface)."""
from __future__ import annotations

import os
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from . import _cluster
from .store import DistNetworkError, FileStore, TCPStore

__all__ = ["rendezvous", "check_rank"]


def rendezvous(init_method, rank, world_size, timeout):
    """Return (store, rank, world_size) like torch's rendezvous handlers."""
    url = urlparse(init_method)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if "rank" in query:
        rank = int(query["rank"])
    if "world_size" in query:
        world_size = int(query["world_size"])
    if url.scheme == "env":
        # torchrun's variables, else those of Open MPI, Hydra, Slurm or PMI (see _cluster.py)
        env = _cluster.resolve(os.environ, rank, world_size)
        rank, world_size = env.rank, env.world_size
        check_rank(rank, world_size)
        # What was derived from a cluster launcher's variables goes into the environment when absent
        # (as DeepSpeed's MPI discovery does), so code written for torchrun (os.environ["LOCAL_RANK"],
        # DataLoader workers, subprocesses) finds it; PYDDP_SECRET before the store reads it.
        for k, v in env.derived.items():
            os.environ.setdefault(k, v)
        # torchrun's flag: the launcher hosts the store (pyddp-run --elastic), every rank is a client
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("1", "true")
        store = _store(env.master_addr, env.master_port, world_size, rank, timeout, "MASTER_ADDR",
                       master=rank == 0 and not agent)
        return store, rank, world_size
    if url.scheme == "tcp":
        _need_rank_and_size(rank, world_size, "tcp", " (argument or query)")
        if not url.hostname or not url.port:
            raise ValueError(f"init_method {init_method!r} must look like tcp://host:port")
        check_rank(rank, world_size)
        store = _store(url.hostname, url.port, world_size, rank, timeout, "the init_method's host")
        return store, rank, world_size
    if url.scheme == "file":
        _need_rank_and_size(rank, world_size, "file")
        check_rank(rank, world_size)
        path = url.path if not url.netloc else url.netloc + url.path
        store = FileStore(path, world_size)
        store.set_timeout(timedelta(seconds=timeout))
        return store, rank, world_size
    raise ValueError(f"init_method {init_method!r}: unsupported scheme {url.scheme!r} "
                     "(expected env://, tcp://host:port or file:///path)")


def _store(host, port, world_size, rank, timeout, what, master=None):
    """The job's TCPStore (rank 0 runs the server unless ``master`` says otherwise); a host name
    that does not resolve is an error within seconds naming ``what`` (MASTER_ADDR), the name and
    the resolver's message."""
    try:
        return TCPStore(host, port, world_size, rank == 0 if master is None else master,
                        timeout=timedelta(seconds=timeout), wait_for_workers=False)
    except DistNetworkError as e:
        if "cannot resolve host" in str(e):
            raise DistNetworkError(f"{what} {host!r} does not resolve: {e}") from None
        raise


def check_rank(rank, world_size):
    """ValueError unless ``world_size`` >= 1 and 0 <= ``rank`` < ``world_size``."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]")


def _need_rank_and_size(rank, world_size, scheme, rank_hint=""):
    """tcp:// and file:// take rank and world size from the call (torch's messages)."""
    if rank is None or rank < 0:
        raise ValueError(f"rank parameter missing: {scheme}:// init needs rank={rank_hint}")
    if world_size is None or world_size < 0:
        raise ValueError(f"world_size parameter missing: {scheme}:// init needs world_size=")
