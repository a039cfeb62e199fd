"""Where pyddp finds libcudart and libnccl, and loading them (once per process).

Nothing in the build needs CUDA: the C core opens the libraries with dlopen on first use
(csrc/cuda/loader.c).  This module decides what it tries, in order:

1. ``PYDDP_CUDART_LIBRARY`` / ``PYDDP_NCCL_LIBRARY``: the path of the library to use.  When set,
   it is the only candidate: a library named explicitly that cannot be loaded is an error
   naming the variable, never silently replaced by another one found elsewhere.
2. The NVIDIA pip wheels on ``sys.path`` (in its order): nvidia-nccl-cu13 / -cu12
   (``nvidia/nccl/lib/libnccl.so.2``), nvidia-cuda-runtime for CUDA 13
   (``nvidia/cu13/lib/libcudart.so.13``) and nvidia-cuda-runtime-cu12
   (``nvidia/cuda_runtime/lib/libcudart.so.12``).
3. torch's lib directory, when torch is installed (found without importing torch).
4. The system loader (``LD_LIBRARY_PATH``, ldconfig's cache) by soname.

The first outcome, the library or the report of every step, is kept for the process: the C
loader keeps it, and so does this module.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
import threading

from .. import _C, _config

__all__ = ["cudart_candidates", "nccl_candidates", "load_cudart", "load_nccl", "cudart_loaded",
           "nccl_version_tuple", "cuda_version_str"]

_MIN_NCCL = "2.18"


class _Spec:
    """What to look for: one library's variable, wheel files, torch file patterns, sonames."""

    def __init__(self, name, env, wheels, torch_patterns, sonames, install, load):
        self.name = name
        self.env = env
        self.wheels = wheels                  # paths relative to a sys.path entry
        self.torch_patterns = torch_patterns  # glob patterns in torch's lib directory
        self.sonames = sonames
        self.install = install
        self.load = load                      # the C loader: list of paths -> outcome


_CUDART = _Spec(
    "libcudart", "PYDDP_CUDART_LIBRARY",
    ("nvidia/cu13/lib/libcudart.so.13", "nvidia/cuda_runtime/lib/libcudart.so.12"),
    ("libcudart.so*", "libcudart-*.so*"),
    ("libcudart.so.13", "libcudart.so.12", "libcudart.so"),
    "pip install nvidia-cuda-runtime (CUDA 13) or nvidia-cuda-runtime-cu12 (CUDA 12)",
    _C._cuda_load)
_NCCL = _Spec(
    "libnccl", "PYDDP_NCCL_LIBRARY",
    ("nvidia/nccl/lib/libnccl.so.2",),
    ("libnccl.so.2",),
    ("libnccl.so.2",),
    "pip install nvidia-nccl-cu13 (CUDA 13) or nvidia-nccl-cu12 (CUDA 12)",
    _C._nccl_load)


def _torch_lib_dir():
    """torch's lib directory, or None when torch is not installed (torch is not imported)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


def _steps(spec):
    """The search, in order: a list of ``(step description, [paths], note when none)``."""
    explicit = _config.get(spec.env) or ""
    if explicit:
        return [(f"${spec.env}", [explicit], "")]
    wheels = [os.path.join(entry or os.curdir, rel)
              for entry in sys.path if isinstance(entry, str) and os.path.isdir(entry or os.curdir)
              for rel in spec.wheels]
    steps = [(f"${spec.env}", [], "not set"),
             (f"NVIDIA pip wheels on sys.path ({', '.join(spec.wheels)})",
              [p for p in wheels if os.path.isfile(p)], "none found")]
    lib = _torch_lib_dir()
    if lib is None:
        steps.append(("torch's lib directory", [], "torch is not installed"))
    else:
        found = sorted({p for pat in spec.torch_patterns for p in glob.glob(os.path.join(lib, pat))})
        steps.append((f"torch's lib directory {lib}", found,
                      f"no {' or '.join(spec.torch_patterns)} there"))
    steps.append(("the system loader (LD_LIBRARY_PATH, ldconfig)", list(spec.sonames), ""))
    # a file found twice (a sys.path entry listed twice, a link to a wheel's library) is tried
    # once, at its first place
    seen, out = set(), []
    for step, paths, note in steps:
        kept = []
        for p in paths:
            key = os.path.realpath(p) if os.sep in p else p
            if key not in seen:
                seen.add(key)
                kept.append(p)
        out.append((step, kept, note if kept or not paths else "the same files as above"))
    return out


def _candidates(spec):
    return [(step, p) for step, paths, _ in _steps(spec) for p in paths]


def cudart_candidates() -> list:
    """libcudart's candidates in the order they are tried: ``[(step description, path)]``."""
    return _candidates(_CUDART)


def nccl_candidates() -> list:
    """libnccl's candidates in the order they are tried: ``[(step description, path)]``."""
    return _candidates(_NCCL)


def _reasons(paths, report):
    """The C report's reason for each path (its lines are ``<path>: <why>`` in order), or None
    when they do not pair up (a report from another caller's first load)."""
    lines = report.splitlines()
    if len(lines) != len(paths) or not all(ln.startswith(p + ": ") for p, ln in zip(paths, lines)):
        return None
    return [ln[len(p) + 2:] for p, ln in zip(paths, lines)]


def _failure(spec, steps, report):
    what = f"{spec.name}" + (f" (NCCL {_MIN_NCCL} or later)" if spec is _NCCL else "")
    paths = [p for _, ps, _ in steps for p in ps]
    reasons = _reasons(paths, report)
    if steps[0][0] == f"${spec.env}" and steps[0][1]:
        why = reasons[0] if reasons else report
        return (f"pyddp could not load {what} from {spec.env}={steps[0][1][0]!r}: {why}.\n"
                f"Point {spec.env} at a working {spec.sonames[0]}, or unset it to let pyddp "
                "search the NVIDIA pip wheels, torch's lib directory and the system loader.")
    lines = [f"pyddp could not load {what}. It looked, in this order:"]
    it = iter(reasons or [])
    for i, (step, ps, note) in enumerate(steps, 1):
        if not ps:
            lines.append(f"  {i}. {step}: {note}")
        elif len(ps) == 1 and reasons is not None:
            lines.append(f"  {i}. {step}: {ps[0]}: {next(it)}")
        else:
            lines.append(f"  {i}. {step}:")
            lines += [f"       {p}: {next(it)}" if reasons is not None else f"       {p}"
                      for p in ps]
    if reasons is None:
        lines.append("What the loader reported:")
        lines += [f"  {ln}" for ln in report.splitlines()]
    lines.append(f"To install it into this environment: {spec.install}; or set {spec.env} to "
                 f"the full path of a {spec.sonames[0]}.")
    return "\n".join(lines)


_lock = threading.Lock()
_outcomes: dict = {}   # spec name -> ("ok", result) or ("error", message)


def _load(spec):
    with _lock:
        outcome = _outcomes.get(spec.name)
        if outcome is None:
            steps = _steps(spec)
            try:
                outcome = ("ok", spec.load([p for _, ps, _ in steps for p in ps]))
            except RuntimeError as e:
                outcome = ("error", _failure(spec, steps, str(e)))
            _outcomes[spec.name] = outcome
    if outcome[0] == "error":
        raise RuntimeError(outcome[1])
    return outcome[1]


def load_cudart() -> dict:
    """Load libcudart (once): ``{'path', 'runtime_version', 'driver_version'}`` (versions as
    CUDA codes, 13000 for 13.0; driver 0 when there is no NVIDIA driver).  Raises RuntimeError
    listing every step of the search and what to pip install."""
    return _load(_CUDART)


def load_nccl() -> tuple:
    """Load libnccl (once): ``(path, version code)`` (2.19.3 is 21903).  Raises RuntimeError
    listing every step of the search and what to pip install; a library older than NCCL 2.18
    is refused with its version and path."""
    return _load(_NCCL)


def cudart_loaded() -> bool:
    """Whether libcudart has been loaded successfully in this process (never loads it)."""
    o = _outcomes.get(_CUDART.name)
    return o is not None and o[0] == "ok"


def nccl_version_tuple(code: int) -> tuple:
    """``(major, minor, patch)`` of an ncclGetVersion code (X*10000+Y*100+Z since NCCL 2.9,
    X*1000+Y*100+Z before)."""
    if code >= 10000:
        return (code // 10000, code % 10000 // 100, code % 100)
    return (code // 1000, code % 1000 // 100, code % 100)


def cuda_version_str(code: int) -> str:
    """'13.0' for a CUDA version code (13000)."""
    return f"{code // 1000}.{code % 1000 // 10}"
