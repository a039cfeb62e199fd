"""Every environment variable pyddp reads (``PYDDP_*`` and the ``TORCH_*`` ones it honours), parsed in
one place: a name, what it expects, and a parser that turns the text into a value or raises
ValueError naming the variable and what it expects.

``get(name)`` is how the Python package reads one (its default when unset or empty); ``check()``
parses every one that is set, and runs at ``init_process_group`` and whenever a group connects, so a
garbage value (``PYDDP_SHM_CHUNK=abc``) is an error before the job starts rather than a silent
default.  The C core reads its own tuning variables (it has no Python); it parses them with the
same rules, and ``check()`` has refused a bad one before the core ever reads it.  An unknown
``PYDDP_*`` variable (a typo) is warned about once.
"""
from __future__ import annotations

import math
import os
import re
import warnings
from typing import Any, Callable, Dict, Mapping, Optional

__all__ = ["VARIABLES", "check", "get"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_BYTES = re.compile(r"^\s*(\d+)\s*([kKmMgG]?)\s*$")
_FR_MAX = 1 << 22  # csrc/group/flight.c FR_MAX


class Var:
    """One variable: its name, what the error message says it expects, a parser (text -> value;
    ValueError, any message, on a bad value) and its default.  (A plain class: typing.NamedTuple
    costs a millisecond of every ``import pyddp``.)"""

    __slots__ = ("name", "expects", "parse", "default")

    def __init__(self, name: str, expects: str, parse: Callable[[str], Any], default: Any = None):
        self.name, self.expects, self.parse, self.default = name, expects, parse, default


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError


def _bit(text: str) -> bool:
    if text.strip() not in ("0", "1"):
        raise ValueError
    return text.strip() == "1"


def _bytes(lo: int, hi: Optional[int] = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        m = _BYTES.match(text)
        if m is None:
            raise ValueError
        n = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]
        if n < lo or (hi is not None and n > hi):
            raise ValueError
        return n
    return parse


def _int(lo: int, hi: Optional[int] = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        t = text.strip()
        if not re.fullmatch(r"[+-]?\d+", t):
            raise ValueError
        n = int(t)
        if n < lo or (hi is not None and n > hi):
            raise ValueError
        return n
    return parse


def _seconds(positive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        s = float(text)
        if not math.isfinite(s) or s < 0 or (positive and s == 0):
            raise ValueError
        return s
    return parse


def _choice(*names: str, upper: bool = False) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = text.strip().upper() if upper else text.strip().lower()
        if t not in names:
            raise ValueError
        return t
    return parse


def _text(text: str) -> str:
    return text


_V = [
    # security and addresses
    Var("PYDDP_SECRET", "a shared secret string (every rank and the store must agree)", _text),
    Var("PYDDP_HOST", "the host name or address this rank's peers reach it at", _text),
    Var("PYDDP_NODE_ID", "a string naming this host (ranks with equal ids share memory)", _text),
    Var("PYDDP_TRANSPORT", "'tcp', 'shm' or 'auto' (or unset)",
        _choice("", "auto", "tcp", "shm"), ""),
    # logging and diagnostics
    Var("PYDDP_DEBUG", "OFF, WARN, INFO, DETAIL or TRACE",
        _choice("OFF", "WARN", "INFO", "DETAIL", "TRACE", upper=True)),
    Var("TORCH_DISTRIBUTED_DEBUG", "OFF, INFO or DETAIL",
        _choice("OFF", "WARN", "INFO", "DETAIL", "TRACE", upper=True)),
    Var("PYDDP_DEBUG_SUBSYS", "a comma-separated list of subsystems (e.g. 'tcp,store')", _text),
    Var("PYDDP_FLIGHT_RECORDER_SIZE", f"a whole number of entries from 0 to {_FR_MAX}",
        _int(0, _FR_MAX), 2000),
    Var("TORCH_FR_BUFFER_SIZE", f"a whole number of entries from 0 to {_FR_MAX}", _int(0, _FR_MAX)),
    Var("PYDDP_FLIGHT_RECORDER_DIR", "a directory to write flight-recorder dumps to", _text),
    Var("PYDDP_TIMELINE", "a file or directory (ending in '/') to write the timeline to", _text),
    # tuning of the C core (csrc/transport/shm, csrc/group)
    Var("PYDDP_SHM_CHUNK", "a byte count from 4K to 64M (e.g. 262144, 256K, 1M)",
        _bytes(4096, 64 << 20)),  # unset: 1M where each local rank has a core, else 256K (segment.c)
    Var("PYDDP_SHM_STREAM", "a byte count of at least 1 (e.g. 8M)",
        _bytes(1)),  # unset: a quarter of the shared last-level cache, 8M when unknown (segment.c)
    Var("PYDDP_CMA", "0 (off) or 1 (on)", _bit, True),
    Var("PYDDP_CMA_THRESHOLD", "a byte count of at least 0 (e.g. 65536, 256K, 1M, 1G)", _bytes(0)),
    Var("PYDDP_PROGRESS_SPIN", "0 (sleep) or 1 (spin)", _bit),
    Var("PYDDP_DDP_OVERLAP", "0 or 1 (also false/true, no/yes, off/on)", _bool),
    Var("PYDDP_DDP_IN_PLACE", "a byte count of at least 0 (e.g. 1M; 0 turns it off)", _bytes(0), 1 << 20),
    Var("PYDDP_TUNING_FILE", "the path of a rules file (python -m pyddp.tools.tune writes one)",
        _text),
    Var("PYDDP_TUNING", "0 (the built-in constants) or 1 (the rules file, the default)", _bit, True),
    Var("PYDDP_TUNING_AUTO", "0 or 1 (also false/true, no/yes, off/on)", _bool, True),
    Var("PYDDP_TUNING_ONLINE", "0 or 1 (also false/true, no/yes, off/on)", _bool, False),
    # CPU stand-in for CUDA (pyddp.cuda._emulation)
    Var("PYDDP_CUDA_ON_CPU", "0 or 1 (also false/true, no/yes, off/on)", _bool, False),
    Var("PYDDP_CUDA_ON_CPU_DEVICES", "a whole number of devices of at least 1", _int(1), 2),
    # lifecycle and launcher
    Var("PYDDP_ELASTIC_ID", "a worker id set by pyddp-run --elastic", _text),
    Var("PYDDP_ELASTIC_STORE_FILE", "a file holding the store's address (set by pyddp-run --elastic)",
        _text),
    Var("PYDDP_ELASTIC_LAST_CALL", "a number of seconds >= 0", _seconds(False), 2.0),
    Var("PYDDP_EXIT_TIMEOUT", "a number of seconds >= 0", _seconds(False)),
    Var("PYDDP_RUN_GRACE", "a number of seconds >= 0", _seconds(False), 30.0),
    # torch.hub's cache (pyddp.hub): torch's variables, read as torch reads them
    Var("TORCH_HOME", "a directory (torch's cache: hub/ and hub/checkpoints/ under it)", _text),
    Var("TORCH_HUB", "deprecated by torch (a warning names TORCH_HOME)", _text),
    Var("TORCH_MODEL_ZOO", "deprecated by torch (a warning names TORCH_HOME)", _text),
    # device backends
    Var("PYDDP_NCCL_CHECK", "0 or 1 (also false/true, no/yes, off/on)", _bool, True),
    Var("PYDDP_NCCL_BLOCKING_WAIT", "0 or 1 (also false/true, no/yes, off/on)", _bool, False),
    Var("TORCH_NCCL_BLOCKING_WAIT", "0 or 1 (also false/true, no/yes, off/on)", _bool, False),
    Var("PYDDP_NCCL_WATCHDOG_INTERVAL", "a number of seconds > 0", _seconds(True), 0.05),
    Var("PYDDP_NCCL_LIBRARY", "the path of libnccl", _text),
    Var("PYDDP_CUDART_LIBRARY", "the path of libcudart", _text),
    Var("PYDDP_MPI_CHECK", "0 or 1 (also false/true, no/yes, off/on)", _bool, True),
    Var("PYDDP_MPI_FROM_C", "0 or 1 (also false/true, no/yes, off/on)", _bool, True),
    Var("PYDDP_MPI_CUDA_AWARE", "0 or 1 (also false/true, no/yes, off/on)", _bool),
    # fault injection for pyddp's own tests
    Var("PYDDP_TEST_SHM_FAIL", "ENOSPC or EACCES (tests only)",
        lambda t: {"ENOSPC": "ENOSPC", "EACCES": "EACCES"}[t]),
    Var("PYDDP_TEST_CMA_FAIL", "EPERM (tests only)", lambda t: {"EPERM": "EPERM"}[t]),
    Var("PYDDP_TEST_SPIN", "1 (tests only)", lambda t: {"1": "1"}[t]),
    Var("PYDDP_TEST_PHASE", "fast or slow (tests only)",
        lambda t: {"fast": "fast", "slow": "slow"}[t]),
    Var("PYDDP_TEST_PHASE_NS", "a number of ns > 0 (tests only)", _seconds(True)),
    # what pyddp.notebook.Ranks hands each rank it starts (read and removed at the rank's start)
    Var("PYDDP_RANKS_ADDR", "host:port of the kernel (set by pyddp.notebook.Ranks)", _text),
    Var("PYDDP_RANKS_PARENT", "the kernel's pid (set by pyddp.notebook.Ranks)", _text),
    Var("PYDDP_RANKS_BACKEND", "the ranks' backend (set by pyddp.notebook.Ranks)", _text),
    Var("PYDDP_RANKS_PATH", "the kernel's sys.path (set by pyddp.notebook.Ranks)", _text),
    Var("PYDDP_RANKS_FIFOS", "the directory of the ranks' output FIFOs (set by pyddp.notebook.Ranks "
        "for backend 'mpi')", _text),
    Var("PYDDP_MPIRUN", "the MPI launcher notebook ranks of backend 'mpi' are started with (a "
        "program name or path; default mpirun, else mpiexec)", _text),
]
# Read by the build (setup.py) and pyddp's own test harness, never at run time.
_BUILD_AND_TESTS = {"PYDDP_SANITIZE", "PYDDP_WERROR", "PYDDP_ROOT", "PYDDP_SKIPPED_FILE",
                    "PYDDP_SLOW_TESTS", "PYDDP_TEST_TIER", "PYDDP_BUILD_JOBS"}
VARIABLES: Dict[str, Var] = {v.name: v for v in _V}

_warned_unknown: set = set()


def _parse(var: Var, raw: str) -> Any:
    try:
        return var.parse(raw)
    except (ValueError, TypeError, OverflowError, KeyError):
        raise ValueError(f"{var.name} must be {var.expects}, got {raw!r}") from None


def get(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The parsed value of variable ``name`` (its default when unset or empty); ValueError naming
    it and what it expects when its value is bad."""
    var = VARIABLES[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw.strip() == "" and var.parse is not _text:
        return var.default
    return _parse(var, raw)


def check(environ: Optional[Mapping[str, str]] = None) -> None:
    """Parse every variable pyddp reads that is set; the first bad one raises ValueError naming it
    and what it expects.  Unknown ``PYDDP_*`` names (typos) are warned about once each."""
    env = os.environ if environ is None else environ
    for name, var in VARIABLES.items():
        raw = env.get(name)
        if raw is not None and (raw.strip() != "" or var.parse is _text):
            _parse(var, raw)
    for name in env:
        if name.startswith("PYDDP_") and name not in VARIABLES and name not in _BUILD_AND_TESTS \
                and name not in _warned_unknown:
            _warned_unknown.add(name)
            close = [k for k in VARIABLES if _similar(k, name)]
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.warn(f"{name} is not a variable pyddp reads; it is ignored{hint}",
                          RuntimeWarning, stacklevel=2)


def _similar(a: str, b: str) -> bool:
    import difflib

    return difflib.SequenceMatcher(None, a, b).ratio() > 0.85
