"""Captured worker output: whole lines to the launcher's console, raw bytes to log files.

With ``--tee`` every worker's stream comes through a pipe to the launcher, which alone writes the console:
it cuts what arrives into lines and writes only whole lines, each with its ``[rankN]: `` prefix, so two
ranks printing at once can never mix inside a line (whatever the line length; pipes only promise that
for writes up to PIPE_BUF).  A line still unfinished when its worker exits is completed with a newline.
One thread (the launcher's) reads every pipe through a selector, so nothing here needs a lock.
"""
import errno
import os
import select
import selectors
from typing import BinaryIO, Optional

_READ_SIZE = 1 << 16
# An unfinished line is written anyway (with a newline) once this long: memory stays bounded.
_MAX_PARTIAL = 1 << 20


class Console:
    """The launcher's stdout or stderr, written with raw os.write; stops quietly if the reader left."""

    def __init__(self, fd: int):
        self.fd = fd
        self.broken = False

    def write(self, data: bytes):
        view = memoryview(data)
        while view and not self.broken:
            try:
                n = os.write(self.fd, view)
            except InterruptedError:
                continue
            except BlockingIOError:   # a non-blocking console: wait until it drains
                select.select([], [self.fd], [], 1.0)
                continue
            except OSError as e:      # EPIPE (`| head`), EBADF: drop console output from now on
                if e.errno in (errno.EPIPE, errno.EBADF, errno.EINVAL):
                    self.broken = True
                    return
                raise
            view = view[n:]


class LineSink:
    """Where one captured stream goes: the console (whole, prefixed lines) and/or a log file (as is)."""

    def __init__(self, console: Optional[Console], prefix: bytes, logfile: Optional[BinaryIO]):
        self.console = console
        self.prefix = prefix
        self.logfile = logfile
        self._partial = b""

    def feed(self, data: bytes):
        if self.logfile is not None:
            self.logfile.write(data)
            self.logfile.flush()
        if self.console is None:
            return
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < _MAX_PARTIAL:
            self._partial = data
            return
        if cut == 0:
            whole, self._partial = data + b"\n", b""
        else:
            whole, self._partial = data[:cut], data[cut:]
        self.console.write(self._prefixed(whole))

    def _prefixed(self, whole: bytes) -> bytes:
        if not self.prefix:
            return whole
        lines = whole.split(b"\n")[:-1]
        return b"".join(self.prefix + line + b"\n" for line in lines)

    def close(self):
        if self.console is not None and self._partial:
            self.console.write(self._prefixed(self._partial + b"\n"))
        self._partial = b""
        if self.logfile is not None:
            self.logfile.close()
            self.logfile = None


class OutputPump:
    """Reads every captured pipe; also wakes up on the launcher's signal/child-exit wakeup fd."""

    def __init__(self):
        self._sel = selectors.DefaultSelector()
        self._sinks = {}

    def add(self, pipe: BinaryIO, sink: LineSink):
        os.set_blocking(pipe.fileno(), False)
        self._sel.register(pipe, selectors.EVENT_READ, sink)
        self._sinks[pipe] = sink

    def add_wakeup(self, fd: int):
        self._sel.register(fd, selectors.EVENT_READ, None)

    def pending(self) -> int:
        """How many captured pipes are still open (their writers may still print)."""
        return len(self._sinks)

    def pump(self, timeout: float):
        """Wait up to timeout for output or a wakeup; forward what arrived."""
        for key, _ in self._sel.select(timeout):
            if key.data is None:
                try:
                    while os.read(key.fd, 512):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
                continue
            self._read(key.fileobj, key.data)

    def _read(self, pipe, sink):
        try:
            data = os.read(pipe.fileno(), _READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            sink.feed(data)
        else:
            self._close(pipe)

    def _close(self, pipe):
        sink = self._sinks.pop(pipe)
        self._sel.unregister(pipe)
        pipe.close()
        sink.close()

    def close_all(self):
        """Forward what is already buffered in each pipe, then close them all."""
        for pipe in list(self._sinks):
            sink = self._sinks[pipe]
            while pipe in self._sinks:
                try:
                    data = os.read(pipe.fileno(), _READ_SIZE)
                except (BlockingIOError, InterruptedError, OSError):
                    data = b""
                if data:
                    sink.feed(data)
                else:
                    self._close(pipe)

    def close(self):
        self.close_all()
        self._sel.close()
