"""``pyddp.accelerator``: torch.accelerator's device-agnostic questions.

pyddp's only accelerator is CUDA (through :mod:`pyddp.cuda`, which loads libcudart on first use).
On a machine where CUDA sees no GPU the answers are those of torch's CPU build:
``current_accelerator()`` is None, ``is_available()`` False, ``device_count()`` 0, and
``current_device_index()`` / ``set_device_index(i)`` (i >= 0) / ``synchronize()`` raise
``RuntimeError("Cannot access accelerator device when none is available.")``.  With a GPU they
answer as torch's CUDA build: ``current_accelerator()`` is ``device(type='cuda')``.
"""
from __future__ import annotations

__all__ = ["is_available", "current_accelerator", "device_count", "current_device_index",
           "current_device_idx", "set_device_index", "set_device_idx", "synchronize"]

_NONE = "Cannot access accelerator device when none is available."


def _cuda():
    from .cuda import _runtime
    return _runtime


def current_accelerator(check_available: bool = False):
    """``device(type='cuda')`` when CUDA sees a GPU, else None (torch's CPU build)."""
    from ._device import _accelerator, device
    kind = _accelerator()
    return None if kind is None else device(kind)


def is_available() -> bool:
    """Whether an accelerator (a CUDA GPU) can be used.  Never raises."""
    return current_accelerator() is not None


def device_count() -> int:
    """The number of accelerator devices (0 without a GPU).  Never raises."""
    return _cuda().device_count() if is_available() else 0


def _require():
    if not is_available():
        raise RuntimeError(_NONE)


def current_device_index() -> int:
    """The index of the current accelerator device."""
    _require()
    return _cuda().current_device()


def _device_index(dev, optional: bool) -> int:
    """torch.accelerator._utils._get_device_index."""
    if isinstance(dev, bool) or not (dev is None or isinstance(dev, (int, str))
                                     or hasattr(dev, "type")):
        raise TypeError("device must be an int, a str or a device, got "
                        f"{type(dev).__name__}")
    if isinstance(dev, int):
        return dev
    index = None
    if dev is not None:
        from ._device import device
        d = device(dev) if isinstance(dev, str) else dev
        acc = current_accelerator()
        if acc is None:
            raise RuntimeError("Accelerator expected")
        if acc.type != d.type:
            raise ValueError(f"{d.type} doesn't match the current accelerator {acc}.")
        index = d.index
    if index is None:
        if not optional:
            raise ValueError("Expected a torch.device with a specified index or an integer, "
                             f"but got:{dev}")
        return current_device_index()
    return int(index)


def set_device_index(device, /) -> None:
    """Make ``device`` (an int, 'cuda:N' or a device) the current accelerator device; a negative
    index does nothing."""
    idx = _device_index(device, optional=False)
    if idx < 0:
        return
    _require()
    _cuda().set_device(idx)


def synchronize(device=None, /) -> None:
    """Wait for the work on an accelerator device (the current one by default)."""
    idx = _device_index(device, optional=True)
    _require()
    _cuda().synchronize(idx)


current_device_idx = current_device_index   # torch's deprecated spellings
set_device_idx = set_device_index
