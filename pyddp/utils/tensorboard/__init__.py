"""``pyddp.utils.tensorboard.SummaryWriter``: torch.utils.tensorboard's writer for pyddp scripts.

pyddp writes no event files itself: the writer is a well-kept one, imported when the first
SummaryWriter is made (never on import of pyddp): tensorboardX when installed, else torch's own
(``torch.utils.tensorboard``, which needs the ``tensorboard`` package).  Without either, a clear
ImportError names what to install.  pyddp Tensors given to its methods (scalars, histograms,
images, ...) reach the writer as NumPy arrays, so ``writer.add_scalar("loss", loss, step)``
works unchanged.
"""
from __future__ import annotations

import importlib

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


class SummaryWriter:
    """torch.utils.tensorboard.SummaryWriter(log_dir=None, comment='', purge_step=None,
    max_queue=10, flush_secs=120, filename_suffix=''): every method of the underlying writer,
    with pyddp Tensors converted to NumPy; usable as a context manager."""

    def __init__(self, *args, **kwargs):
        self._writer = _backend()(*args, **kwargs)

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
        self._writer.close()
        return False
