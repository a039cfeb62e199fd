"""CUDA on the CPU: ``PYDDP_CUDA_ON_CPU=1`` runs a GPU script unchanged on a machine without a GPU.

Opt-in, off by default.  When on, and only where no real GPU is visible (a visible one is refused
with an error: the stand-in must never be mistaken for a GPU):

* ``pyddp.cuda`` reports one device per local rank: ``device_count()`` is ``LOCAL_WORLD_SIZE``
  under a launcher, else ``PYDDP_CUDA_ON_CPU_DEVICES`` (2 when unset), so scripts that spawn
  ``device_count()`` ranks start that many; ``is_available()`` is True, ``set_device`` /
  ``current_device`` keep an index per process;
* ``"cuda"``, ``"cuda:N"``, ``N`` as a device and ``.cuda()`` place pyddp tensors in host memory,
  tagged with that device (``t.device``, ``t.is_cuda``); streams and events are ordered no-ops;
* backend ``"nccl"`` (also inside ``"cpu:gloo,cuda:nccl"``) runs on pyddp's cpu backend;
  ``get_backend()`` still answers ``"nccl"``;
* ``pyddp.cuda.amp.GradScaler`` / ``autocast`` work as on a GPU.

One line on stderr says so when the first process of a job imports pyddp (children inherit a
marker and stay quiet).  This module is the only place that reads the two variables.
"""
from __future__ import annotations

import os
import sys

ENV = "PYDDP_CUDA_ON_CPU"
DEVICES_ENV = "PYDDP_CUDA_ON_CPU_DEVICES"
_SAID_ENV = "_PYDDP_CUDA_ON_CPU_SAID"
DEFAULT_DEVICES = 2
NAME = "pyddp CUDA-on-CPU stand-in (no GPU)"

_on = None        # None until read; then True / False
_count = None
current = 0       # the emulated current device of this process


def _parse_on(value: str) -> bool:
    v = value.strip().lower()
    if v in ("", "0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{ENV}={value!r}: expected 1 (on) or 0 (off)")


def _positive(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"{name}={value!r}: expected a positive integer (the number of emulated "
                         "CUDA devices)")
    return n


def _real_gpus() -> int:
    """How many GPUs the CUDA runtime sees (0 without libcudart, a driver or a GPU)."""
    from .. import _C
    from . import _lib
    try:
        _lib.load_cudart()
    except RuntimeError:
        return 0
    return _C.cuda_device_count()[0]


def enabled() -> bool:
    """Whether CUDA is emulated on the CPU in this process (read once)."""
    global _on
    if _on is None:
        on = _parse_on(os.environ.get(ENV, ""))
        if on:
            n = _real_gpus()
            if n > 0:
                raise RuntimeError(
                    f"{ENV}=1 is refused: the CUDA runtime sees {n} real GPU(s) here. The CPU "
                    f"stand-in is for machines without a GPU; unset {ENV} to use the GPU.")
        _on = on
    return _on


def device_count() -> int:
    """One emulated device per local rank (LOCAL_WORLD_SIZE, else PYDDP_CUDA_ON_CPU_DEVICES or 2)."""
    global _count
    if _count is None:
        lws = os.environ.get("LOCAL_WORLD_SIZE")
        if lws:
            _count = _positive("LOCAL_WORLD_SIZE", lws)
        elif os.environ.get(DEVICES_ENV):
            _count = _positive(DEVICES_ENV, os.environ[DEVICES_ENV])
        else:
            _count = DEFAULT_DEVICES
    return _count


def check_index(idx: int) -> int:
    """``idx`` when it names an emulated device, else torch's invalid-ordinal error."""
    n = device_count()
    if not 0 <= idx < n:
        raise RuntimeError(f"CUDA error: invalid device ordinal (device {idx}; {ENV}=1 emulates "
                           f"{n} device(s): one per local rank, set {DEVICES_ENV} to change)")
    return idx


def enable_for_children(env) -> None:
    """Turn the emulation on in ``env``, the environment of processes this one starts (notebook
    ranks), without turning it on here: refused as ``enabled`` refuses it where a real GPU is
    visible, said once in this process (the children stay quiet)."""
    n = _real_gpus()
    if n > 0:
        raise RuntimeError(
            f"{ENV}=1 is refused: the CUDA runtime sees {n} real GPU(s) here. The CPU "
            f"stand-in is for machines without a GPU; unset {ENV} to use the GPU.")
    if not os.environ.get(_SAID_ENV):
        os.environ[_SAID_ENV] = "1"
        print(f"pyddp: {ENV}=1 for the ranks: " + _ANNOUNCEMENT, file=sys.stderr, flush=True)
    env[ENV] = "1"
    env[_SAID_ENV] = "1"


_ANNOUNCEMENT = ("CUDA is emulated on the CPU, no GPU is used: pyddp.cuda reports one device per "
                 f"local rank (LOCAL_WORLD_SIZE, else {DEVICES_ENV}, default {DEFAULT_DEVICES}), "
                 "'cuda' tensors live in host memory, streams and events are no-ops, backend "
                 "'nccl' runs on the cpu backend")


def announce() -> None:
    """At import of pyddp: check the variable (a visible GPU raises) and say once that CUDA is
    emulated."""
    if not enabled() or os.environ.get(_SAID_ENV):
        return
    os.environ[_SAID_ENV] = "1"   # children (spawn, launchers) inherit it and stay quiet
    print(f"pyddp: {ENV}=1: " + _ANNOUNCEMENT, file=sys.stderr, flush=True)


def _reset_for_tests():
    global _on, _count, current
    _on, _count, current = None, None, 0
