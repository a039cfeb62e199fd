"""The torch bridge's works: ``Work`` (a torch ``dist._Work`` over pyddp's handles), its futures
(a CPU work's completes from the group's watcher thread, a CUDA work's at launch with its consumers
ordered on the GPU, as torch's ProcessGroupNCCL's), the handles of CUDA work, and the sends and
receives held until they run as one NCCL group.
"""
from __future__ import annotations

import contextlib
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.futures import Future

from ... import _C


def _seconds(t):
    """A torch timeout (timedelta, or None) in seconds; None for none or torch's kNoTimeout (0)."""
    if t is None:
        return None
    s = t.total_seconds() if isinstance(t, timedelta) else float(t)
    return s if s > 0 else None


def _torch_error(e):
    err = dist.DistBackendError(str(e))
    err.__cause__ = e
    return err




class Work(dist._Work):
    """The works of one or more requests (the backends' handles: a C work, a _CudaHandle, a
    _DeferredP2P) as one torch Work."""

    def __init__(self, cworks, result, pg):
        super().__init__()
        self._cws = cworks  # handles still to wait for (empty: done on the caller's thread)
        self._result = result  # the list of output tensors the future yields
        self._pg = pg
        self._fut = None

    def _wait(self, timeout):
        try:
            for cw in self._cws:
                cw.wait(timeout)
        except _C.DistError as e:
            raise _torch_error(e) from None

    def wait(self, timeout=None):
        self._wait(_seconds(timeout))
        return True

    def is_completed(self):
        return all(cw.is_completed() for cw in self._cws)

    def is_success(self):
        return self.is_completed() and self.exception() is None

    def exception(self):
        if not self.is_completed():
            return None
        try:
            self._wait(0)
        except dist.DistBackendError as e:
            return e
        return None

    def result(self):
        self.wait()
        return list(self._result)

    def _source_rank(self):
        return self._cws[0].source_rank()

    source_rank = _source_rank

    def get_future(self):
        if self._fut is None:
            handles = self._cuda_handles()
            if handles is not None:
                self._fut = _cuda_future(handles, self._result)
                return self._fut
            self._fut = Future()
            if self.is_completed():
                self._complete()
            else:
                self._pg._watch(self)
        return self._fut

    def _cuda_handles(self):
        """The _CudaHandles of a work on CUDA arrays only (waiting sends and receives run now),
        else None."""
        cws = self._cws
        if not cws or any(type(cw) is not _CudaHandle and type(cw) is not _DeferredP2P
                          for cw in cws):
            return None
        return [cw if type(cw) is _CudaHandle else cw._handle() for cw in cws]

    def _cuda_device(self):
        """The device of the first NCCL work in it, or None."""
        return next((cw.nw.comm.device for cw in self._cws if type(cw) is _CudaHandle), None)

    def _complete(self):
        try:
            self._wait(None)
        except dist.DistBackendError as e:
            self._fut.set_exception(e)
        else:
            self._fut.set_result(list(self._result))


class _Done(Work):
    """The Work of a blocking call completed inline (one object per group, reused): torch's
    Python API calls its ``wait()`` after every blocking collective, so that is a bare return."""

    def wait(self, timeout=None):
        return True


def _cuda_tensors(value):
    """The torch CUDA tensors in a future's value (a list of tensors or of lists of them)."""
    for v in value:
        if isinstance(v, (list, tuple)):
            yield from _cuda_tensors(v)
        elif isinstance(v, torch.Tensor) and v.is_cuda:
            yield v


def _cuda_future(handles, result):
    """The future of a work on CUDA arrays, as torch's ProcessGroupNCCL makes it: completed at
    launch, no host wait and no thread, its consumers ordered on the GPU.

    torch CUDA tensors: a ``Future(devices=...)`` whose result is set while each communicator's
    stream is the current stream of its device, so torch records its events on those streams,
    after the collective, and makes every consumer's current stream wait on them (``wait()``,
    ``value()``, and ``then()``, whose callback runs at once on this thread, on a stream that
    waited).  Other CUDA arrays (``__cuda_array_interface__``, read on the stream they name):
    that stream waits for the collective now, as ``Work.wait()`` orders it, then the value is set.
    A failure after launch is not the future's: ``Work.wait()`` and the next call raise it."""
    value = list(result)
    devices = sorted({t.device.index for t in _cuda_tensors(value)})
    if not devices:
        fut = Future()
        try:
            for h in handles:
                h.nw.wait()
        except _C.DistError as e:
            fut.set_exception(_torch_error(e))
        else:
            fut.set_result(value)
        return fut
    fut = Future(devices=[torch.device("cuda", d) for d in devices])
    comms = {id(h.nw.comm): h.nw.comm for h in handles}
    with contextlib.ExitStack() as streams:
        for c in comms.values():
            streams.enter_context(torch.cuda.stream(
                torch.cuda.ExternalStream(c.stream, device=torch.device("cuda", c.device))))
        fut.set_result(value)
    return fut


class _CudaHandle:
    """An NCCL work (pyddp.distributed.backends.nccl.backend.NcclWork) as this group's works
    hold it.  ``wait()`` on the submitting thread orders that thread's current stream after the
    operation (torch's NCCL rule: no host block); on another thread (the future watcher, for a
    work mixing CPU and CUDA arrays; its current stream is unrelated to the caller's) it waits on
    the host, bounded by the group's timeout.  A work on CUDA arrays only never reaches the
    watcher: its future is complete at launch (``_cuda_future``)."""

    __slots__ = ("nw", "tid")

    def __init__(self, nw):
        self.nw = nw
        self.tid = threading.get_ident()

    def wait(self, timeout=None):
        if timeout is None and threading.get_ident() != self.tid:
            return self.nw.synchronize_host(self.nw.be.timeout)
        return self.nw.wait(timeout)

    def is_completed(self):
        return self.nw.is_completed()

    def source_rank(self):
        return self.nw.source_rank()


class _DeferredP2P:
    """A CUDA send or receive not given to NCCL yet (see _TorchNccl.run): asked anything, it
    runs the group's waiting sends and receives first."""

    __slots__ = ("nccl", "real", "peer")

    def __init__(self, nccl, peer):
        self.nccl = nccl  # the _TorchNccl holding it
        self.real = None  # the _CudaHandle of the NCCL group it ran in
        self.peer = peer

    def _handle(self):
        if self.real is None:
            self.nccl.flush()
        if self.real is None:
            raise dist.DistBackendError("send/recv: the pyddp process group was destroyed "
                                        "before this operation ran")
        return self.real

    def wait(self, timeout=None):
        return self._handle().wait(timeout)

    def is_completed(self):
        return self._handle().is_completed()

    def source_rank(self):
        return self.peer
