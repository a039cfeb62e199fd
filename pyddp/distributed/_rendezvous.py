"""init_method rendezvous (torch.distributed.rendezvous): env://, tcp://host:port and file://
turned into a store, a rank and a world size.  Backends connect through the store it returns;
one with a launcher of its own (mpi) has a hook in the registry instead (backends.interface)."""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from . import _cluster
from .store import DistNetworkError, DistStoreError, FileStore, TCPStore

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
        spawn_secret(rank, world_size)
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
        spawn_secret(rank, world_size)
        store = _store(url.hostname, url.port, world_size, rank, timeout, "the init_method's host")
        return store, rank, world_size
    if url.scheme == "file":
        _need_rank_and_size(rank, world_size, "file")
        check_rank(rank, world_size)
        path = url.path if not url.netloc else url.netloc + url.path
        store = FileStore(path, world_size)
        store.set_timeout(timedelta(seconds=timeout))
        spawn_secret(rank, world_size, store, path)
        return store, rank, world_size
    raise ValueError(f"init_method {init_method!r}: unsupported scheme {url.scheme!r} "
                     "(expected env://, tcp://host:port or file:///path)")


# The key under which file:// init shares a job secret (spawn_secret).
_SECRET_KEY = "pyddp/spawn_secret"


def spawn_secret(rank, world_size, file_store=None, path=None):
    """Set aside a PYDDP_SECRET that pyddp.multiprocessing.spawn invented when the job has more
    processes than that spawn started: the others (another shell's, node's or Slurm task's spawn)
    cannot know it, and every connection to them would be refused.

    With file:// init the job gets a secret through the file instead (rank 0 writes a fresh one):
    FileStore files are 0600, so whoever can read it could join through the file anyway.  A file
    that others can read shares no secret.  Otherwise the job runs without one, as torch's does
    (listeners stay on loopback where the job allows), and the spawn's first process says so once,
    naming PYDDP_SECRET.  Every rank decides alike: the world size is the job's, and file:// ranks
    take rank 0's word."""
    mod = sys.modules.get("pyddp.multiprocessing.spawn")
    invented = mod._invented_secret() if mod is not None else None
    if invented is None or world_size <= invented[0]:
        return
    nprocs, index = invented
    mod._drop_invented_secret()
    reach = "its ports (only local users while every rank is on this host with a loopback MASTER_ADDR)"
    if file_store is not None:
        if rank == 0:
            import secrets

            private = _private_file(path)
            file_store.set(_SECRET_KEY, secrets.token_hex(32) if private else "")
        try:
            shared = file_store.get(_SECRET_KEY).decode()
        except DistStoreError as e:
            raise DistStoreError(
                f"rank {rank}: rank 0 shared no secret through {path} ({e}): it was not started by "
                f"a pyddp.multiprocessing.spawn that invented one (its shell or task has "
                f"PYDDP_SECRET set, or it started otherwise), or it has not come; give every shell "
                f"or task that starts a part of the job the same PYDDP_SECRET, or none") from None
        if shared:
            os.environ["PYDDP_SECRET"] = shared
            return
        reach = f"its ports or read {path} (other users can read it, so it shares no secret)"
    if index == 0:
        import warnings

        warnings.warn(
            f"pyddp: this job has {world_size} processes and this pyddp.multiprocessing.spawn "
            f"started {nprocs} of them; the others (another shell's, node's or Slurm task's spawn) "
            f"cannot know the PYDDP_SECRET it invented, so the job runs without a secret, as "
            f"torch's does: anyone who can reach {reach} can join it. To keep strangers out, give "
            f"every shell or task the same PYDDP_SECRET before it starts, e.g. export "
            f"PYDDP_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))').",
            RuntimeWarning, stacklevel=4)


def _private_file(path):
    """Whether only this user can read the file at ``path`` (no group or other permissions)."""
    try:
        return (os.stat(path).st_mode & 0o077) == 0
    except OSError:
        return False


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
