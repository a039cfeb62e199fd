"""torch.cuda's streams and events under the CPU stand-in (PYDDP_CUDA_ON_CPU=1): ordered no-ops,
since work runs in program order.  Above pyddp._device (a stream's ``device``) and the runtime."""
from __future__ import annotations

from .._device import device as _device
from ._emulation import enabled as _emulated
from ._runtime import _index_or_current, _require_emulated

__all__ = ["Stream", "Event", "stream", "StreamContext", "current_stream", "default_stream"]


class Stream:
    """torch.cuda.Stream under the CPU stand-in: an ordered no-op (work runs in program order)."""

    def __init__(self, device=None, priority=0, **kwargs):
        _require_emulated("Stream")
        self.device = _device("cuda", _index_or_current(device))
        self.priority = int(priority)
        self.cuda_stream = 0

    def query(self):
        """True: nothing is pending."""
        return True

    def synchronize(self):
        """Returns at once."""

    def wait_stream(self, stream):
        """Returns at once (every stream is in order with every other)."""

    def wait_event(self, event):
        """Returns at once."""

    def record_event(self, event=None):
        """Record ``event`` (a new Event when None) on this stream; returns it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, Stream) and other.device == self.device and \
            (other is self or (other._default and self._default))

    def __hash__(self):
        return hash((str(self.device), self._default or id(self)))

    _default = False

    def __repr__(self):
        return f"<pyddp.cuda.Stream device={self.device} (CPU stand-in)>"


class Event:
    """torch.cuda.Event under the CPU stand-in: records the time it was recorded at."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        _require_emulated("Event")
        self.enable_timing = bool(enable_timing)
        self._t = None

    def record(self, stream=None):
        """Mark this point of the (CPU-ordered) work."""
        import time
        self._t = time.perf_counter()

    def wait(self, stream=None):
        """Returns at once."""

    def query(self):
        """True: the work before the record is done."""
        return True

    def synchronize(self):
        """Returns at once."""

    def elapsed_time(self, end_event):
        """Milliseconds between this event's record and ``end_event``'s (both need
        enable_timing=True and a record, as torch's)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._t is None or end_event._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._t - self._t) * 1000.0


_streams = {}      # device index -> its default stream
_current_streams = {}


def default_stream(device=None) -> Stream:
    """The default stream of a device (the current one by default)."""
    idx = _index_or_current(device) if _emulated() else _require_emulated("default_stream")
    s = _streams.get(idx)
    if s is None:
        s = _streams[idx] = Stream(idx)
        s._default = True
    return s


def current_stream(device=None) -> Stream:
    """The stream selected by ``with pyddp.cuda.stream(s)`` (the default stream otherwise)."""
    idx = _index_or_current(device) if _emulated() else _require_emulated("current_stream")
    return _current_streams.get(idx) or default_stream(idx)


class StreamContext:
    """``with pyddp.cuda.stream(s):``: ``s`` is the current stream of its device inside."""

    def __init__(self, stream):
        self.stream = stream
        self._prev = None

    def __enter__(self):
        if self.stream is None:
            return None
        if not _emulated():
            _require_emulated("stream")
        idx = self.stream.device.index
        self._prev = (idx, _current_streams.get(idx))
        _current_streams[idx] = self.stream
        return self.stream

    def __exit__(self, *exc):
        if self._prev is not None:
            idx, prev = self._prev
            if prev is None:
                _current_streams.pop(idx, None)
            else:
                _current_streams[idx] = prev
        return False


def stream(stream) -> StreamContext:
    """Context manager selecting ``stream`` (None: no change)."""
    return StreamContext(stream)
