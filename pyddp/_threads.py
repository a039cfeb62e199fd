"""One share of the host's cores per rank: no BLAS/OpenMP oversubscription, however ranks start.

NumPy's BLAS (and OpenMP) start one thread per core in every process, so N ranks on one host run
N threads per core and crawl.  pyddp-run, pyddp.launch and notebook_launcher give each rank one
thread (OMP_NUM_THREADS=1, torchrun's policy).  Here the two other ways:

* ``pyddp.multiprocessing.spawn`` / ``start_processes`` with ``nprocs > 1`` start their children
  with ``OMP_NUM_THREADS=1`` (the parent's environment is left as it was), and a forked child
  also limits the pools it inherited (threadpoolctl);
* a process group created in a process that no launcher prepared (plain ``multiprocessing``, a
  foreign launcher) limits that process's loaded BLAS/OpenMP pools to its share of the cores,
  ``cores // ranks on this host`` (at least 1), once it knows how many ranks share the host;
  with threadpoolctl (the well-kept way; without it a warning says what to do), and
  ``torch.set_num_threads`` when torch is loaded.  Said once at INFO (PYDDP_DEBUG=INFO).

Nothing is changed when the user set any of the thread variables below.

The same launchers also set ``THP_MEM_ALLOC_ENABLE=1`` for ranks that share a host (unless it is
set): torch's CPU allocator then backs every tensor of 2 MiB or more with transparent huge pages.
A gradient autograd allocates is private memory that DDP reduces in place, where the peer ranks
read it with single copies (process_vm_readv); the kernel pins and copies such memory page by
page, and with 2 MiB pages a 16 MiB all-reduce of it takes 2.6 ms instead of 3.2-3.6 ms on the
2-core machine pyddp is developed on (level with NumPy's arrays, which NumPy already puts on huge
pages).  torch reads the variable once, at its first large allocation, so it must be in the
environment the rank starts with; a forked rank (notebook_launcher) keeps its parent's choice.
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
HUGE_PAGES_VAR = "THP_MEM_ALLOC_ENABLE"   # torch's: huge pages for tensors of >= 2 MiB
_CHILD_MARK = "_PYDDP_SPAWN_THREADS"   # set for spawn's children: their pools are limited too
_limited = False


def user_set() -> bool:
    """Whether the user chose a thread count through the environment."""
    return any(os.environ.get(v) for v in THREAD_VARS)


def affinity() -> set:
    """The CPUs this process may run on (taskset, cpusets), unlike os.cpu_count()."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


def _cgroup_dirs(root: str, path: str):
    """``root``/``path`` and each of its parents up to ``root``: every level's limit applies."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts), -1, -1):
        yield os.path.join(root, *parts[:i])


def _read(path: str):
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().split()
    except OSError:
        return None


def quota(cgroup_file: str = "/proc/self/cgroup", mount: str = "/sys/fs/cgroup"):
    """Whole CPUs that this process's cgroup CPU bandwidth limit allows (``docker --cpus``,
    Kubernetes CPU limits): the quota over the period, rounded down (at least 1), the smallest
    over the cgroup and its parents; None without a limit.  cgroup v2 (``cpu.max``) and v1
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``)."""
    limits = []
    try:
        with open(cgroup_file, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "":   # v2: one hierarchy
            roots = [mount] if os.path.exists(os.path.join(mount, "cgroup.controllers")) else []
            roots.append(os.path.join(mount, "unified"))
            for root in roots:
                for d in _cgroup_dirs(root, path):
                    v = _read(os.path.join(d, "cpu.max"))
                    if v and len(v) == 2 and v[0] != "max":
                        limits.append((int(v[0]), int(v[1])))
        elif "cpu" in controllers.split(","):
            for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                for d in _cgroup_dirs(os.path.join(mount, name), path):
                    q = _read(os.path.join(d, "cpu.cfs_quota_us"))
                    p = _read(os.path.join(d, "cpu.cfs_period_us"))
                    if q and p and int(q[0]) > 0 and int(p[0]) > 0:
                        limits.append((int(q[0]), int(p[0])))
    return min((max(1, q // p) for q, p in limits), default=None)


def cores(cpus=None) -> int:
    """CPUs this process can keep busy at once: those it may run on (``cpus``, default its
    affinity), no more than its cgroup's CPU limit allows."""
    n = len(affinity() if cpus is None else cpus) or 1
    q = quota()
    return n if q is None else min(n, q)


def encode_cpus(cpus) -> str:
    """A CPU set as ranges (``0-3,8``), for the other ranks of the host."""
    import itertools

    out = []
    for _, run in itertools.groupby(enumerate(sorted(cpus)), lambda ic: ic[1] - ic[0]):
        run = [c for _, c in run]
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def decode_cpus(text: str) -> set:
    out = set()
    for part in text.split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def huge_pages(env: dict, local_ranks: int) -> None:
    """``THP_MEM_ALLOC_ENABLE=1`` in ``env`` (a rank's environment) when ``local_ranks`` ranks
    share the host and the user did not set it (see the module's docstring)."""
    if local_ranks > 1 and HUGE_PAGES_VAR not in os.environ:
        env[HUGE_PAGES_VAR] = "1"


@contextlib.contextmanager
def for_children(nprocs: int):
    """While starting ``nprocs`` rank processes: OMP_NUM_THREADS=1 in the environment they
    inherit (unless the user set a thread variable, or there is one rank), and
    THP_MEM_ALLOC_ENABLE=1 (unless set); restored after."""
    added = {}
    huge_pages(added, nprocs)
    if nprocs > 1 and not user_set():
        added.update({"OMP_NUM_THREADS": "1", _CHILD_MARK: "1"})
    os.environ.update(added)
    try:
        yield "OMP_NUM_THREADS" in added
    finally:
        for k in added:
            os.environ.pop(k, None)


def in_child() -> None:
    """In a child that spawn started: limit the pools it may have inherited (fork) to one thread."""
    if os.environ.pop(_CHILD_MARK, None):
        _limit(1)


def _limit(n: int) -> bool:
    """Limit this process's loaded BLAS/OpenMP pools (and torch's) to n threads; False when
    threadpoolctl is missing."""
    ok = True
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        ok = False
    else:
        try:
            threadpool_limits(n)
        except Exception:   # an unusual BLAS build: run with its threads rather than fail
            pass
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        try:
            if torch.get_num_threads() > n:
                torch.set_num_threads(n)
        except Exception:
            pass
    return ok


def limit_for_group(local_ranks: int, rank: int, host_cores: int = 0) -> None:
    """A process group found ``local_ranks`` ranks on this host, which share ``host_cores``
    cores (default: this process's): give this process its share of them, once per process,
    unless the user set a thread variable."""
    global _limited
    if _limited or local_ranks <= 1 or user_set():
        return
    _limited = True
    host_cores = host_cores or cores()
    n = max(1, host_cores // local_ranks)
    from .distributed import _observe
    if _limit(n):
        _observe.info("%d ranks share this host's %d cores: limited this process's BLAS/OpenMP "
                      "thread pools to %d thread(s) (set OMP_NUM_THREADS to choose)",
                      local_ranks, host_cores, n, rank=rank)
    else:
        warnings.warn(
            f"pyddp: {local_ranks} ranks share this host's {host_cores} cores and NumPy's BLAS runs "
            "one thread per core in each, which can make training many times slower; install "
            "threadpoolctl (pyddp then limits each rank to its share) or set "
            f"OMP_NUM_THREADS={n} before starting the ranks", RuntimeWarning, stacklevel=2)


def spare_core(local_ranks=None) -> bool:
    """Whether work handed to a progress thread gets a core of its own here (DDP reduces buckets
    there while backward goes on; the torch bridge runs blocking calls inline otherwise).
    ``local_ranks``: the ranks of the group on this host when known (its ranks share this host's
    memory), else the launcher's LOCAL_WORLD_SIZE (1 without one).

    Overlap needs a spare core: with at least as many ranks on this host as cores, the progress
    thread would only take turns with backward on the same cores (and add hand-offs), so buckets
    are reduced right where they become ready. PYDDP_DDP_OVERLAP=0/1 overrides.
    """
    from . import _config

    v = _config.get("PYDDP_DDP_OVERLAP")
    if v is not None:
        return v
    local = local_ranks if local_ranks is not None else \
        int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return cores() > local
