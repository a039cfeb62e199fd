"""Backend "mpi": the handle of a nonblocking MPI operation (``MpiWork``, what pyddp.distributed.Work
wraps) and the bounded polling every wait of the backend uses (MPI progresses only inside its
calls, so waits test, spin briefly, then yield the CPU).
"""
from __future__ import annotations

import threading
import time

from .... import _C
from . import library as _lib

def _poll(test, deadline):
    """Call ``test()`` until it returns True (-> True) or ``deadline`` passes (-> False): spin
    briefly, then yield the CPU between tests (MPI progresses only inside its calls)."""
    if test():
        return True
    spins = 0
    sleep = 0.0
    while True:
        spins += 1
        if test():
            return True
        if spins & 63 == 0:
            if _C.monotonic() > deadline:
                return test()
            if spins > 4096:
                sleep = min(1e-3, sleep + 2e-5)
                time.sleep(sleep)


# ----------------------------------------------------------------------------------- works

class MpiWork:
    """The handle pyddp.distributed.Work wraps for a nonblocking MPI operation."""

    __slots__ = ("be", "reqs", "after", "what", "keep", "done", "error", "status", "peer",
                 "lock", "t0", "fr")

    def __init__(self, be, reqs, after, what, keep, status=None, peer=-1):
        self.be = be
        self.reqs = reqs
        self.after = after  # run once when the requests completed (AVG, half types, staging)
        self.what = what
        self.keep = keep  # the arrays MPI reads and writes stay alive until completion
        self.done = False
        self.error = None
        self.status = status
        self.peer = peer
        self.lock = threading.Lock()
        self.t0 = _C.monotonic()
        self.fr = 0  # its flight record (the backend sets it)

    def _test(self) -> bool:
        if self.done:
            return True
        with self.lock:
            if self.done:
                return True
            try:
                if len(self.reqs) == 1:
                    ok = self.reqs[0].Test(self.status)
                else:
                    ok = _lib.MPI.Request.Testall(self.reqs)
            except _lib.MPI.Exception as e:
                self.error = self.be._mpi_message(e, self.what)
                ok = True
            if ok:
                if self.error is None and self.after is not None:
                    try:
                        self.after()
                    except Exception as e:  # noqa: BLE001 - reported by wait()
                        self.error = f"{self.what}: {e}"
                self.after = self.keep = None
                self.done = True
                fr, self.fr = self.fr, 0
                if fr:
                    if self.error is None:
                        self.be._fr_update(fr, _C.FR_COMPLETED)
                    else:
                        self.be._fr_update(fr, _C.FR_FAILED, _C.ST_BACKEND)
            return ok

    def wait(self, timeout=None) -> bool:
        """Poll until done; DistBackendError after ``timeout`` seconds (default: the group's) or
        on an MPI error."""
        t = self.be.timeout if timeout is None else float(timeout)
        if not _poll(self._test, _C.monotonic() + t):
            msg = (f"{self.what} on {self.be._where()}, rank {self.be.rank}, did not complete "
                   f"within {t:g} s (started {_C.monotonic() - self.t0:.3g} s ago); a rank did "
                   "not reach it, died or is stuck")
            if timeout is None:
                self.be._fail(msg, _C.ST_TIMEOUT)
            raise _C.DistBackendError(msg)
        if self.error is not None:
            raise _C.DistBackendError(self.error)
        return True

    def is_completed(self) -> bool:
        """Whether every request of the operation completed."""
        return self._test()

    def source_rank(self) -> int:
        """The sender of a completed receive (its status), else the peer given."""
        if self.status is not None and self.done:
            return self.status.Get_source()
        return self.peer

