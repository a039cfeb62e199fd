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


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # pragma: no cover - not Linux
        return os.cpu_count() or 1


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


def limit_for_group(local_ranks: int, rank: int) -> None:
    """A process group found ``local_ranks`` ranks on this host: give this process its share of
    the cores, once per process, unless the user set a thread variable."""
    global _limited
    if _limited or local_ranks <= 1 or user_set():
        return
    _limited = True
    n = max(1, cores() // local_ranks)
    from .distributed import _observe
    if _limit(n):
        _observe.info("%d ranks share this host's %d cores: limited this process's BLAS/OpenMP "
                      "thread pools to %d thread(s) (set OMP_NUM_THREADS to choose)",
                      local_ranks, cores(), n, rank=rank)
    else:
        warnings.warn(
            f"pyddp: {local_ranks} ranks share this host's {cores()} cores and NumPy's BLAS runs "
            "one thread per core in each, which can make training many times slower; install "
            "threadpoolctl (pyddp then limits each rank to its share) or set "
            f"OMP_NUM_THREADS={n} before starting the ranks", RuntimeWarning, stacklevel=2)
