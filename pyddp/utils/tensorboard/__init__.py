"""``pyddp.utils.tensorboard.SummaryWriter``: torch.utils.tensorboard's writer for pyddp scripts.

pyddp writes no event files itself: the writer is a well-kept one, imported when the first
SummaryWriter is made (never on import of pyddp): tensorboardX when installed, else torch's own
(``torch.utils.tensorboard``, which needs the ``tensorboard`` package).  Without either, a clear
ImportError names what to install.  pyddp Tensors given to its methods (scalars, histograms,
images, ...) reach the writer as NumPy arrays, so ``writer.add_scalar("loss", loss, step)``
works unchanged.

A writer the script never closes is closed (flushed, its writer thread stopped) when the process
ends, also in a rank started by ``pyddp.multiprocessing.spawn`` or multiprocessing, whose exit runs
no atexit hooks but multiprocessing's finalizers: those close the writer's event queue under its
thread (tensorboardX's) otherwise, which then raised ``OSError: handle is closed`` at exit and
could hang the rank.  A process forked from the one that made a writer leaves it to its maker.
``log_dir`` (torch's name) and ``logdir`` (tensorboardX's) both name the writer's directory.
"""
from __future__ import annotations

import atexit
import importlib
import os
import threading

__all__ = ["SummaryWriter"]

_INSTALL = ("pyddp.utils.tensorboard.SummaryWriter needs a TensorBoard writer: pip install "
            "tensorboardX (or torch and tensorboard, for torch.utils.tensorboard)")


def _backend():
    """The writer class: tensorboardX's, else torch's; ImportError naming what to install."""
    errors = []
    for mod in ("tensorboardX", "torch.utils.tensorboard"):
        try:
            return importlib.import_module(mod).SummaryWriter
        except ImportError as e:   # ModuleNotFoundError, or torch without tensorboard
            errors.append(f"{mod}: {e}")
    raise ImportError(_INSTALL + " (tried " + "; ".join(errors) + ")")


def _plain(x):
    """pyddp Tensors (also inside lists, tuples and dicts) as NumPy arrays; the rest as is."""
    from ..._tensor import Tensor
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


# The underlying writers this process made and has not closed, by id: (maker's pid, writer),
# closed at its exit (_close_open_writers).  Held strongly: a script's writer that went out of
# scope still has a thread and pending events (tensorboardX keeps it alive too).
_open = {}
_open_lock = threading.Lock()
_hooked_pid = None


def _close_open_writers():
    """Close the writers this process made and left open (its forked children leave them)."""
    with _open_lock:
        writers = [w for pid, w in _open.values() if pid == os.getpid()]
        _open.clear()
    for w in writers:
        try:
            w.close()
        except Exception:   # at exit: a writer that cannot close must not hide the others
            pass


def _hook_exit():
    """Once per process: close the open writers at exit, before anything closes their queues.
    atexit serves a program's main process; multiprocessing children (spawn ranks, Pool workers)
    end through multiprocessing's finalizers instead, so a finalizer of a priority above the
    queues' (10) serves them, and runs first in the main process's exit as well."""
    global _hooked_pid
    if _hooked_pid == os.getpid():
        return
    _hooked_pid = os.getpid()
    from multiprocessing import util
    util.Finalize(None, _close_open_writers, exitpriority=100)
    atexit.register(_close_open_writers)


class SummaryWriter:
    """torch.utils.tensorboard.SummaryWriter(log_dir=None, comment='', purge_step=None,
    max_queue=10, flush_secs=120, filename_suffix=''): every method of the underlying writer,
    with pyddp Tensors converted to NumPy; usable as a context manager; closed at exit when the
    script does not close it."""

    def __init__(self, *args, **kwargs):
        self._writer = _backend()(*args, **kwargs)
        with _open_lock:
            _hook_exit()
            _open[id(self._writer)] = (os.getpid(), self._writer)

    def get_logdir(self):
        """The directory the event files go to (both writers' method)."""
        w = self._writer
        get = getattr(w, "get_logdir", None)
        if get is not None:
            return get()
        return getattr(w, "log_dir", None) or getattr(w, "logdir", None)

    @property
    def log_dir(self):
        """The directory the event files go to (torch's name)."""
        return self.get_logdir()

    @property
    def logdir(self):
        """The directory the event files go to (tensorboardX's name)."""
        return self.get_logdir()

    def close(self):
        """Flush and close the writer (its thread stops); the writer can be reopened with
        ``reopen()`` where the underlying writer has one."""
        with _open_lock:
            _open.pop(id(self._writer), None)
        self._writer.close()

    def flush(self):
        """Write the pending events to disk."""
        self._writer.flush()

    def reopen(self):
        """Reopen a closed writer (tensorboardX's); it is closed at exit again if left open."""
        self._writer.reopen()
        with _open_lock:
            _hook_exit()
            _open[id(self._writer)] = (os.getpid(), self._writer)

    def __getattr__(self, name):
        attr = getattr(self._writer, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            return attr(*_plain(args), **_plain(kwargs))
        call.__name__ = name
        return call

    def add_graph(self, model, input_to_model=None, verbose=False, use_strict_trace=True):
        """Not available for pyddp models (the writers trace torch models)."""
        from ...nn.modules.module import Module
        if isinstance(model, Module):
            raise NotImplementedError("add_graph traces torch modules; a pyddp.nn model has no "
                                      "TorchScript graph to write")
        return self._writer.add_graph(model, input_to_model, verbose, use_strict_trace)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
