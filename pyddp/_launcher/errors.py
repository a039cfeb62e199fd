"""Per-rank error files and the failure summary the launcher prints when a job fails.

A worker's error file is what its bootstrap wrote (torchelastic's JSON layout, so a script decorated with
torch's ``@record`` fills it the same way); a worker killed by a signal has none, but may have a
faulthandler dump beside it.  The summary follows torchrun's layout: the root cause (the first failure
the launcher observed) with host, rank, exit code or signal and Python traceback, then the others.
"""
import datetime
import json
import os
from dataclasses import dataclass
from typing import List, Optional

from .._lifecycle import describe_exit, signal_name


class LaunchError(Exception):
    """The job cannot start (port in use, no shared secret, ...): message for the user, exit code."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class LauncherInterrupted(Exception):
    """The launcher got SIGINT/SIGTERM/SIGHUP; every worker has been stopped."""

    def __init__(self, signum):
        super().__init__(f"received {signal_name(signum)}")
        self.signum = signum


_RULE = "=" * 72
_THIN = "-" * 72
_INDENT = " " * 14


@dataclass
class Failure:
    rank: int
    local_rank: int
    pid: int
    returncode: int
    exit_time: float                 # when the launcher saw the worker gone
    error_file: Optional[str]        # None when the file was not kept (no --log-dir)
    message: Optional[str] = None    # "ValueError: boom"
    traceback: Optional[str] = None
    error_time: Optional[float] = None
    fault: Optional[str] = None      # faulthandler's dump after a fatal signal


def _read_text(path, limit=1 << 16) -> Optional[str]:
    try:
        with open(path, "r", errors="replace") as f:
            text = f.read(limit)
    except OSError:
        return None
    return text.strip() or None


def read_failure(worker, keep_files: bool) -> Failure:
    """What is known about a failed worker: exit status, and its error file if it wrote one."""
    f = Failure(rank=worker.rank, local_rank=worker.local_rank, pid=worker.pid,
                returncode=worker.returncode, exit_time=worker.exit_time or 0.0,
                error_file=worker.error_file if keep_files else None)
    try:
        with open(worker.error_file) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict):
        msg = data.get("message")
        if isinstance(msg, dict):
            f.message = msg.get("message")
            extra = msg.get("extraInfo") or {}
            f.traceback = extra.get("py_callstack")
            try:
                f.error_time = float(extra.get("timestamp"))
            except (TypeError, ValueError):
                pass
        elif isinstance(msg, str):
            f.message = msg
        exact = (data.get("pyddp") or {}).get("time")
        if isinstance(exact, (int, float)):
            f.error_time = float(exact)
    elif not os.path.exists(worker.error_file):
        f.error_file = None
    if worker.returncode < 0:
        f.fault = _launcher_frames_dropped(
            _read_text(os.path.join(os.path.dirname(worker.error_file), "fault.txt")))
    return f


def _launcher_frames_dropped(dump: Optional[str]) -> Optional[str]:
    """faulthandler's stacks without the bootstrap's and runpy's frames (they sit below the script)."""
    if not dump:
        return dump
    keep = [line for line in dump.splitlines()
            if '"<frozen runpy>"' not in line and "runpy.py\"" not in line
            and os.path.join("_launcher", "bootstrap.py") + '"' not in line]
    return "\n".join(keep)


def first_failure_order(failures: List[Failure]) -> List[Failure]:
    """Root cause first: the earliest failure, by the time its error was recorded (the exception, as
    torchrun orders error files) or, without an error file, by its exit; then the lowest rank.

    Exit order alone misleads: a rank that raises is still tearing its group down (and so telling its
    peers) when a peer it broke raises in turn and may exit first."""
    return sorted(failures, key=lambda f: (f.error_time if f.error_time is not None else f.exit_time,
                                           f.rank))


def _field(name, value):
    lines = str(value).rstrip("\n").splitlines() or [""]
    out = [f"  {name:<10}: {lines[0]}"]
    out += [_INDENT + line for line in lines[1:]]
    return out


def _hint(f: Failure) -> Optional[str]:
    text = (f.traceback or "") + (f.message or "")
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return ("rank 0 could not listen on MASTER_PORT: another job or program uses it; start with "
                "--standalone for a free port, or choose another --master-port")
    return None


def _describe(f: Failure, host) -> List[str]:
    when = datetime.datetime.fromtimestamp(f.exit_time).strftime("%Y-%m-%d_%H:%M:%S")
    lines = _field("time", when)
    lines += _field("host", host)
    lines += _field("rank", f"{f.rank} (local_rank: {f.local_rank})")
    lines += _field("exitcode", f"{f.returncode} (pid: {f.pid})")
    if f.returncode < 0:
        lines += _field("signal", signal_name(-f.returncode))
    lines += _field("error_file", f.error_file or "<N/A>")
    if f.traceback:
        tb = f.traceback
    elif f.returncode < 0:
        tb = f"Signal {-f.returncode} ({signal_name(-f.returncode)}) received by PID {f.pid}"
        if f.fault:
            tb += "\n" + f.fault
    elif f.message:
        tb = f.message
    else:
        tb = ("<not recorded: the worker exited without raising a Python exception "
              "(os._exit, or a program that is not Python)>")
    lines += _field("traceback", tb)
    hint = _hint(f)
    if hint:
        lines += _field("hint", hint)
    return lines


def _how(f: Failure) -> str:
    """How a worker failed, for the headline: the exception it raised when it recorded one (a worker
    that raised and was then stopped by the launcher while it was still exiting failed by raising, not
    by the launcher's signal), else its exit code or signal."""
    if f.message and f.error_time is not None:
        first = f.message.strip().splitlines()[0] if f.message.strip() else f.message
        how = f"raising {first}"
        if f.returncode < 0:
            how += (f" (then stopped by the launcher with {signal_name(-f.returncode)} while it was "
                    "still exiting)")
        return how
    return f"with {describe_exit(f.returncode)}"


def format_summary(target, failures: List[Failure], host, restarts, max_restarts) -> str:
    """torchrun's failure report; failures[0] is the root cause."""
    root, others = failures[0], failures[1:]
    lines = [_RULE, f"{target} FAILED: rank {root.rank} first, {_how(root)}"
             + (f" (after {restarts} restart{'s' if restarts != 1 else ''}, "
                                           f"--max-restarts {max_restarts})" if max_restarts else ""),
             _THIN, "Root Cause (first observed failure):", f"[0]:"]
    lines += _describe(root, host)
    lines += [_THIN, "Other Failures:"]
    if not others:
        lines.append("  <NO_OTHER_FAILURES>")
    for i, f in enumerate(others, 1):
        what = f" ({f.message})" if f.message else ""
        stopped = (f", stopped by the launcher with {signal_name(-f.returncode)} while exiting"
                   if f.message and f.error_time is not None and f.returncode < 0 else "")
        lines.append(f"  [{i}]: rank {f.rank} (local_rank: {f.local_rank}): {describe_exit(f.returncode)}"
                     f"{what}{stopped}")
    lines.append(_RULE)
    return "\n".join(lines)
