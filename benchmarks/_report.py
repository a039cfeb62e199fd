"""What the benchmark scripts share to print the tables docs/ holds.

The benchmark tables in docs/ are pasted output of these scripts, never typed: every script prints its
table through ``table()`` under the lines of ``header()``, which say when, where and how the figures were
made, so that anyone can rerun the command and compare:

    Command: `python benchmarks/sampler.py --reps 15`
    Machine: 2026-11-25 22:10 UTC, AMD EPYC 7B13, 2 cores, load average 3.12 2.05 1.10, memcpy 7.1 GB/s
    (np.copyto, 64 MiB), Python 3.11.7, NumPy 2.2.6, torch 2.13.0

``machine()`` measures memcpy with ``np.copyto`` of 64 MiB (a few copies, the fastest taken): the memory
bandwidth a benchmark of big arrays can expect.  torch's version is read from its package metadata, so
the header never imports torch itself.
"""
import datetime
import os
import platform
import shlex
import sys
import time

__all__ = ["machine", "command", "header", "table", "block"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _version(dist):
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover (Python < 3.8)
        return None
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def memcpy_gbs(nbytes=64 << 20, reps=5):
    """GB/s of ``np.copyto`` between two warm arrays of nbytes (the fastest of reps copies)."""
    import numpy as np

    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(max(1, reps)):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return src.nbytes / best / 1e9


def _rules():
    """The rules of algorithm choice pyddp's groups apply on this host (pyddp.tools.tune), or None
    when pyddp does not import."""
    try:
        from pyddp.distributed.backends.cpu import tuning
    except ImportError:
        return None
    return tuning.describe()


def handoff(seconds=0.2):
    """pyddp.tools.tune.handoff (how fast data crosses between two cores right now), or None
    without pyddp."""
    try:
        from pyddp.tools.tune import handoff as probe
    except ImportError:
        return None
    return probe(seconds)


def fmt_handoff(probes):
    """'51 ns, 24.3 GB/s' for one probe, 'min-max' ranges for several (None entries skipped)."""
    probes = [p for p in probes if p]
    if not probes:
        return ""
    ns = [p[0] for p in probes]
    gb = [p[1] for p in probes]
    if len(probes) == 1:
        return f"{ns[0]:.0f} ns, {gb[0]:.1f} GB/s"
    return f"{min(ns):.0f}-{max(ns):.0f} ns, {min(gb):.1f}-{max(gb):.1f} GB/s over {len(probes)} probes"


def machine(memcpy=True):
    """The facts of the header as a dict: date (UTC), cpu, cores, loadavg, memcpy_gbs (None when not
    measured), python, numpy, torch (None when not installed)."""
    import numpy as np

    try:
        load = os.getloadavg()
    except (AttributeError, OSError):
        load = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 1,
        "loadavg": load,
        "memcpy_gbs": memcpy_gbs() if memcpy else None,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "rules": _rules(),
        "handoff": fmt_handoff([handoff()]),
    }


def command(argv=None, script=None):
    """The command line that reproduces this run: ``python benchmarks/NAME.py ARGS`` (the script's path
    relative to the repository, the arguments as given, shell-quoted).  argv defaults to sys.argv[1:] and
    script to sys.argv[0]."""
    if script is None:
        script = sys.argv[0] if sys.argv and sys.argv[0] else "benchmarks/?.py"
    if argv is None:
        argv = sys.argv[1:]
    path = os.path.abspath(script)
    if path.startswith(_ROOT + os.sep):
        script = os.path.relpath(path, _ROOT)
    return " ".join(["python", shlex.quote(script.replace(os.sep, "/"))] +
                    [shlex.quote(str(a)) for a in argv])


def header(argv=None, script=None, info=None):
    """The two lines above a generated table: the exact command, then the date and the machine (CPU
    model, cores, load average, memcpy GB/s, versions).  info: a dict from machine() (measured now when
    None)."""
    m = machine() if info is None else info
    parts = [m["date"], m["cpu"], f"{m['cores']} cores"]
    if m.get("loadavg") is not None:
        parts.append("load average " + " ".join(f"{x:.2f}" for x in m["loadavg"]))
    if m.get("memcpy_gbs") is not None:
        parts.append(f"memcpy {m['memcpy_gbs']:.1f} GB/s (np.copyto, 64 MiB)")
    parts.append(f"Python {m['python']}, NumPy {m['numpy']}")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}")
    if m.get("handoff"):
        parts.append(f"between cores {m['handoff']} (pyddp._C.probe_handoff)")
    if m.get("rules"):
        parts.append(f"pyddp rules: {m['rules']}")
    return [f"Command: `{command(argv, script)}`  ", "Machine: " + ", ".join(parts)]


def _is_number(text):
    t = str(text).strip().replace(",", "").rstrip("x%").split(" ")[0]
    try:
        float(t)
    except ValueError:
        return False
    return True


def table(headers, rows, align=None):
    """A markdown table as a list of lines.  align: a string of 'l'/'r' per column; by default a column
    is right-aligned when every non-empty cell of it starts with a number.  Cells are str()-ed; a '|'
    inside a cell is escaped."""
    headers = [str(h) for h in headers]
    cells = [[("" if c is None else str(c)).replace("|", "\\|") for c in r] for r in rows]
    for r in cells:
        if len(r) != len(headers):
            raise ValueError(f"table: a row has {len(r)} cells, the header {len(headers)}: {r!r}")
    if align is None:
        align = ""
        for j in range(len(headers)):
            col = [r[j] for r in cells if r[j].strip()]
            align += "r" if col and all(_is_number(c) for c in col) else "l"
    elif len(align) != len(headers) or set(align) - set("lr"):
        raise ValueError(f"table: align must be one of 'l'/'r' per column, got {align!r}")
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in cells]
    return out


def block(title, headers, rows, notes=(), argv=None, script=None, info=None, align=None):
    """A whole generated block as one string: the title line, the header lines, a blank line, the
    table and the notes (one line each) under it."""
    lines = []
    if title:
        lines += [title, ""]
    lines += header(argv, script, info) + [""] + table(headers, rows, align)
    notes = list(notes)
    if notes:
        lines += [""] + notes
    return "\n".join(lines)
