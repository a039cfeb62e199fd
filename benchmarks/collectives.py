#!/usr/bin/env python
"""Collective benchmark: pyddp against torch's gloo backend and Open MPI (mpi4py), in one run.

    python benchmarks/collectives.py                      # 2 ranks, 4 B .. 64 MiB, every peer found
    python benchmarks/collectives.py --nproc 4 --ops allreduce --peers pyddp,gloo
    python benchmarks/collectives.py --quick --peers pyddp --max-bytes 4096 --no-plot

Options: --nproc N, --ops LIST, --min-bytes/--max-bytes SIZE, --step K, --iters N, --budget-bytes SIZE,
--peers LIST (pyddp,pyddp-oob,pyddp-untuned,pyddp-tcp,gloo,mpi,mpi-again,pyddp-mpi,pyddp-mpi-nocheck,floor; default: all
found but floor and mpi-again), --json OUT, --plot FILE (default runs/bench/collectives.png under the working directory, when
matplotlib imports; runs/ is ignored by git), --no-plot, --timeout S, --quick, --split-ops, --rounds N,
--timing call|loop, --[no-]out-of-the-box.

For each collective (allreduce, broadcast, allgather = all_gather_into_tensor, reduce_scatter =
reduce_scatter_tensor, reduce, gather, scatter, alltoall = all_to_all_single; root 0) it prints an nccl-tests-style table of float32 arrays: size, the NumPy copy bandwidth
of that many bytes (memcpy GB/s), then per library the median time (us), algbw and busbw (GB/s), then time
ratios (gloo/pyddp, mpi/pyddp, gloo/pyddp-tcp: > 1, pyddp is faster) and, for allreduce, pyddp's algbw as a
fraction of memcpy (pyddp/memcpy, shm-buf/memcpy).

Libraries: "pyddp" (the transport pyddp picks itself: shared memory for ranks on one host, where the build
has it; the rules of algorithm choice in force, tuned by python -m pyddp.tools.tune where it ran), "pyddp
out-of-the-box" (pyddp-oob: the same with XDG_CACHE_HOME an empty directory and no PYDDP_TUNING_FILE,
what a new user runs with; by default, --out-of-the-box, beside "pyddp" where this host's rules file is in
force and PYDDP_TUNING_FILE names none, so that one run shows both; its summary comes first), "pyddp
untuned" (the same with PYDDP_TUNING=0: the built-in constants; named in --peers, or by default where a
rules file is in force with --no-out-of-the-box; the rules each pyddp column ran with, as its
workers reported them, head the tables, "# rules:" lines, and title the summaries), "pyddp-tcp" (the same workers with PYDDP_TRANSPORT=tcp), "pyddp shm-buffer" (allreduce only, run
by the pyddp workers: arrays from pyddp.distributed._shared_array, allocated once per size on every rank; a
note says so when the build has no _shared_array), "torch gloo" and "Open MPI"; "copy floor" (named in --peers only)
is no library: every rank copies, at the same time, its even share of the bytes the collective must write
into output memory, a peer's bytes the faster of two ways (plain copies out of the peer's shared-memory
segment, or one kernel copy out of its array: process_vm_readv), timed both and the faster kept per size
(bench_worker.FloorImpl), and a last table gives each library's time as a multiple of it.  "Open MPI again"
(mpi-again, named in --peers only) is Open MPI run a second time in every round, as a peer of its own: the
same code against itself, so its ratios to "Open MPI" are what the run's noise alone makes of a comparison
(the A/A control); a table gives them, and where pyddp is behind Open MPI, whether by more than that.

Method (as nccl-tests): each library runs in its own set of worker
processes (pyddp and torch: one process per rank started here with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT on
a free port; MPI: mpirun -np N); per size a correctness check, warm-up iterations, then timed iterations each
preceded by a barrier; each iteration's time is the slowest rank's; the table shows the median over iterations.
With --timing loop an iteration is a batch of calls back to back (as nccl-tests times them), a barrier before
the batch only, and its time per call is the slowest rank's batch time divided by the calls: where ranks share
cores, a call timed alone from each rank's barrier exit measures the order in which each library's barrier
lets its ranks go as much as the call.
size is the whole array: allgather's output, reduce_scatter's input. busbw = algbw * factor: allreduce
2(n-1)/n, allgather and reduce_scatter (n-1)/n, broadcast 1. memcpy: median time of np.copyto into a
preallocated array of the same number of bytes, warm, many repetitions, measured here before the libraries
run. A library that is missing or fails prints a note; the others still report. --plot draws algbw against
size, one panel per collective, memcpy dashed.
"""
import argparse
import atexit
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "bench_worker.py")
# Under the working directory, as the examples' runs/: never over the tracked docs/img/collectives.png (the
# docs' figure is redrawn only when asked: --plot docs/img/collectives.png).
DEFAULT_PLOT = os.path.join("runs", "bench", "collectives.png")

if HERE not in sys.path:  # bench_worker.counts_for: the sizes the workers will use (also when imported)
    sys.path.insert(0, HERE)
from bench_worker import OPS, counts_for, whole_bytes  # noqa: E402
import _report  # noqa: E402

PEERS = ("pyddp", "pyddp-oob", "pyddp-untuned", "pyddp-tcp", "gloo", "mpi", "mpi-again", "pyddp-mpi", "pyddp-mpi-nocheck",
         "floor")
# Run only when --peers names them.
OPT_IN = ("floor", "mpi-again")
# Table columns, in this order when present; "pyddp-shm" is not a peer of its own: the pyddp workers run it.
COLUMNS = ("pyddp", "pyddp-oob", "pyddp-untuned", "pyddp-shm", "pyddp-tcp", "gloo", "mpi", "mpi-again", "pyddp-mpi",
           "pyddp-mpi-nocheck", "floor")
LABEL = {"pyddp": "pyddp", "pyddp-oob": "pyddp out-of-the-box", "pyddp-untuned": "pyddp untuned", "pyddp-shm": "pyddp shm-buffer", "pyddp-tcp": "pyddp-tcp", "gloo": "torch gloo",
         "mpi": "Open MPI", "mpi-again": "Open MPI again", "pyddp-mpi": "pyddp mpi", "pyddp-mpi-nocheck": "pyddp mpi nocheck", "floor": "copy floor"}
IMPL = {"pyddp": "pyddp", "pyddp-oob": "pyddp", "pyddp-untuned": "pyddp", "pyddp-tcp": "pyddp", "gloo": "gloo", "mpi": "mpi", "mpi-again": "mpi", "pyddp-mpi": "pyddp-mpi",
        "pyddp-mpi-nocheck": "pyddp-mpi", "floor": "floor"}
# pyddp's backend "mpi" against the raw mpi4py calls of the "mpi" peer on the same arrays (the issue:
# at most 5% slower from 64 KiB, within 1.5 us at 4 B); "nocheck" runs it with PYDDP_MPI_CHECK=0.
MPI_PEERS = ("mpi", "mpi-again", "pyddp-mpi", "pyddp-mpi-nocheck")
# Ratio columns, numerator / denominator of times (> 1: the denominator is faster), where both ran.
RATIOS = (("gloo", "pyddp"), ("mpi", "pyddp-oob"), ("mpi-again", "mpi"), ("mpi", "pyddp"), ("mpi", "pyddp-untuned"), ("gloo", "pyddp-tcp"), ("pyddp-mpi", "mpi"),
          ("pyddp-mpi-nocheck", "mpi"))
# allreduce only: algbw / memcpy bandwidth, with the short names of the column heads.
FRACTIONS = (("pyddp", "pyddp/"), ("pyddp-shm", "shm-buf/"))
# The targets for allreduce at 64 MiB (at least), checked under the tables when that size ran.
TARGET_BYTES = 64 << 20
TARGETS = ((("mpi", "pyddp"), 1.5), (("gloo", "pyddp"), 4.0), ("pyddp", 0.4), ("pyddp-shm", 0.7))


def busbw_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter", "gather", "scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def parse_size(text):
    text = text.strip().upper()
    for suffix, mult in (("KIB", 1 << 10), ("MIB", 1 << 20), ("GIB", 1 << 30), ("K", 1 << 10),
                         ("M", 1 << 20), ("G", 1 << 30), ("B", 1)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    return int(text)


def fmt_size(n):
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n} B"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available(peer):
    """(True, '') when the peer can run here, else (False, why)."""
    if peer in ("pyddp", "pyddp-oob", "pyddp-untuned", "pyddp-tcp", "floor"):
        return True, ""
    if peer == "gloo":
        try:
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                return False, "torch is not installed"
        except Exception as e:  # a broken install is a note, not a crash
            return False, f"torch: {e}"
        return True, ""
    if peer in MPI_PEERS:
        import importlib.util

        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed"
        if shutil.which("mpirun") is None:
            return False, "mpirun not found"
        return True, ""
    return False, f"unknown peer {peer!r}"


def tuned_here():
    """Whether pyddp's groups read a rules file on this host (pyddp.tools.tune wrote one, or
    PYDDP_TUNING_FILE names one): then "pyddp-untuned" (PYDDP_TUNING=0, the built-in constants)
    differs from "pyddp"."""
    try:
        from pyddp.distributed.backends.cpu import tuning

        return tuning.path_in_force()[0] is not None
    except (ImportError, ValueError):
        return False


# One secret for every rank of this run (as a launcher sets it): the ranks prove they belong to the job.
JOB_SECRET = os.environ.get("PYDDP_SECRET") or secrets.token_hex(16)


def worker_env(extra=None):
    """This environment for a worker, with extra's entries (None: removed)."""
    env = dict(os.environ)
    # One thread per rank: the ranks already use every core of a small machine.
    env["OMP_NUM_THREADS"] = "1"
    env["PYDDP_SECRET"] = JOB_SECRET
    # "pyddp" measures the transport pyddp picks itself; only "pyddp-tcp" forces one (below).
    env.pop("PYDDP_TRANSPORT", None)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


_EMPTY_CACHE = []


def empty_cache_dir():
    """An empty directory for XDG_CACHE_HOME (the out-of-the-box peer: a new user's per-user cache,
    holding no rules file), made once per run and removed at exit."""
    if not _EMPTY_CACHE:
        d = tempfile.mkdtemp(prefix="pyddp-bench-empty-cache-")
        atexit.register(shutil.rmtree, d, True)
        _EMPTY_CACHE.append(d)
    return _EMPTY_CACHE[0]


def peer_env(peer):
    """Environment entries that make a peer what its name says."""
    if peer == "pyddp-mpi-nocheck":
        return {"PYDDP_MPI_CHECK": "0"}
    if peer == "pyddp-oob":
        # what a new user gets: an empty per-user cache (no rules file there), none named
        return {"XDG_CACHE_HOME": empty_cache_dir(), "PYDDP_TUNING_FILE": None, "PYDDP_TUNING": None}
    if peer == "pyddp-untuned":
        # the built-in constants of csrc/coll/rules.c, whatever rules file this host has
        return {"PYDDP_TUNING": "0"}
    return {"PYDDP_TRANSPORT": "tcp"} if peer == "pyddp-tcp" else {}


def launch(cmds, tmpdir, tag, timeout):
    """Run each (argv, env) of cmds as its own process (own session, output to a log in tmpdir) until all
    exit, one fails (the others are killed then: they would wait for it) or timeout seconds pass.

    Returns (return codes, timed_out, tail): tail holds the last 1500 characters of every distinct log."""
    logs = []
    procs = []
    timed_out = False
    try:
        for i, (argv, env) in enumerate(cmds):
            log = open(os.path.join(tmpdir, f"{tag}.{i}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break  # the other ranks would wait on the dead one: stop them (below)
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()
    tail, seen = "", set()
    for log in logs:
        log.seek(0)
        text = log.read().strip()[-1500:]
        if text and text not in seen:  # ranks often fail alike: show each distinct output once
            seen.add(text)
            tail += text + "\n"
        log.close()
    return [p.returncode for p in procs], timed_out, tail


def run_peer(peer, args, sizes, tmpdir):
    """Run one library's workers; returns (result dict or None, note or '')."""
    out = os.path.join(tmpdir, f"{peer}.json")
    wargs = [sys.executable, WORKER, "--impl", IMPL[peer], "--ops", ",".join(args.ops),
             "--sizes", ",".join(str(s) for s in sizes), "--iters", str(args.iters),
             "--budget-bytes", str(args.budget_bytes), "--out", out,
             "--timing", getattr(args, "timing", "call")]
    if peer == "pyddp" and "allreduce" in args.ops:
        wargs.append("--shm-buffer")
    if peer in MPI_PEERS:
        cmds = [(["mpirun", "-np", str(args.nproc), "--oversubscribe", "--allow-run-as-root",
                  "--bind-to", "none"] + wargs,
                 worker_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                             "OMPI_MCA_rmaps_base_oversubscribe": "1", **peer_env(peer)}))]
    else:
        port = free_port()
        cmds = [(wargs, worker_env({"RANK": str(rank), "LOCAL_RANK": str(rank),
                                    "WORLD_SIZE": str(args.nproc), "LOCAL_WORLD_SIZE": str(args.nproc),
                                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **peer_env(peer)}))
                for rank in range(args.nproc)]
    codes, timed_out, tail = launch(cmds, tmpdir, peer, args.timeout)
    result = None
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
    note = ""
    if timed_out:
        note = f"timed out after {args.timeout:.0f} s"
    elif any(codes) or result is None:
        note = f"exited with status {sorted(set(codes))}"
    if note and tail:
        note += "; last output:\n    " + tail.strip().replace("\n", "\n    ")
    if result and result.get("errors") and not note:
        note = "; ".join(f"{op}: {msg.strip().splitlines()[-1]}" for op, msg in result["errors"].items())
    return result, note


def merge_rows(row_lists, rounds=None):
    """One row per size from several rounds: the median of the rounds' medians, the least minimum.
    rounds: the round number of each list (default 0, 1, ...)."""
    by = {}
    rounds = list(range(len(row_lists))) if rounds is None else rounds
    for rnd, rows in zip(rounds, row_lists):
        for r in rows:
            by.setdefault(r["bytes"], []).append(dict(r, round=rnd))
    out = []
    for nbytes, rs in by.items():
        m = dict(rs[0])
        del m["round"]   # (a row of several rounds: round_medians below)
        m["median_us"] = float(np.median([r["median_us"] for r in rs]))
        m["min_us"] = min(r["min_us"] for r in rs)
        m["correct"] = all(r["correct"] for r in rs)
        m["iters"] = sum(r["iters"] for r in rs)
        m["rounds"] = len(rs)
        # each round's median, in round order (rounds run the libraries next to each other, so
        # round i of two libraries compares them at one moment: summary_block's rounds behind)
        m["round_medians"] = [[r["round"], r["median_us"]] for r in rs]
        out.append(m)
    return out


def merge_rounds(results):
    """A library's results over rounds (see merge_rows); a single round is returned as it is."""
    if len(results) == 1:
        return results[0]
    merged = dict(results[-1])
    ops = {}
    for i, r in enumerate(results):
        for op, rows in (r.get("ops") or {}).items():
            ops.setdefault(op, []).append((r.get("round", i), rows))
    merged["ops"] = {op: merge_rows([x[1] for x in lists], [x[0] for x in lists])
                     for op, lists in ops.items()}
    shm = [r.get("shm_buffer") for r in results if (r.get("shm_buffer") or {}).get("rows")]
    if shm:
        merged["shm_buffer"] = dict(shm[-1], rows=merge_rows([x["rows"] for x in shm]))
    merged["rounds"] = len(results)
    merged["inits"] = [(r.get("init_s"), r.get("first_job_s")) for r in results]
    return merged


def row_sizes(ops, sizes, world):
    """Every array size (bytes) a table row will have: the requested sizes as the workers round them."""
    out = set()
    for op in ops:
        for n in sizes:
            n_in, n_out = counts_for(op, n, world)
            out.add(whole_bytes(op, n_in, n_out))
    return sorted(out)


def memcpy_seconds(nbytes):
    """Median seconds of one np.copyto(dst, src) of nbytes into a preallocated array: warm, one thread.

    Small copies are timed in batches (the clock's own cost would dominate one copy of a few bytes).
    """
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    inner = max(1, min(256, (256 << 10) // nbytes))
    samples = max(25, min(400, (1 << 30) // (nbytes * inner)))
    for _ in range(3):  # warm: page faults, caches
        np.copyto(dst, src)
    clock = time.perf_counter
    times = np.empty(samples)
    for i in range(samples):
        t0 = clock()
        for _ in range(inner):
            np.copyto(dst, src)
        times[i] = (clock() - t0) / inner
    return float(np.median(times))


def measure_memcpy(nbytes_list):
    """{bytes: {"us": median time of one copy, "gbps": bytes / time}} for every size."""
    out = {}
    for n in nbytes_list:
        t = memcpy_seconds(n)
        out[n] = {"us": t * 1e6, "gbps": n / t / 1e9 if t > 0 else float("inf")}
    return out


def algbw(nbytes, us):
    return nbytes / (us * 1e-6) / 1e9 if us > 0 else float("inf")


def fmt_us(t):
    return f"{t:.2f}" if t < 10 else f"{t:.1f}" if t < 1e5 else f"{t:.0f}"


def fmt_bw(x):
    return f"{x:.1f}" if x >= 100 else f"{x:.2f}" if x >= 10 else f"{x:.3f}"


def table_columns(op, results):
    """The libraries with rows for op, in COLUMNS order."""
    return [c for c in COLUMNS if results.get(c) and results[c]["ops"].get(op)]


def ratio_value(a, b):
    """a / b of two rows' median times, or None."""
    if a and b and b["median_us"] > 0:
        return a["median_us"] / b["median_us"]
    return None


def table(op, results, world, memcpy):
    """The lines of one collective's table (results: column -> {"ops": {op: rows}})."""
    cols = table_columns(op, results)
    errors = [f"# {LABEL[c]}: {op} failed: {err.strip().splitlines()[-1]}" for c in COLUMNS
              for err in [(results.get(c) or {}).get("errors", {}).get(op)] if err]
    if not cols:
        return [f"# {op}: no results"] + errors
    factor = busbw_factor(op, world)
    by_col = {c: {r["bytes"]: r for r in results[c]["ops"][op]} for c in cols}
    ratios = [(a, b) for a, b in RATIOS if a in cols and b in cols]
    fracs = [(c, short) for c, short in FRACTIONS if op == "allreduce" and c in cols]
    # Extra columns: (head line 1, head line 2, value of a size, decimals); width from the heads.
    extra = [(f"{a}/", b, (lambda n, a=a, b=b: ratio_value(by_col[a].get(n), by_col[b].get(n))), 2)
             for a, b in ratios]
    for c, short in fracs:
        def frac(n, c=c):
            r, m = by_col[c].get(n), memcpy.get(n)
            return algbw(n, r["median_us"]) / m["gbps"] if r and m and m["gbps"] > 0 else None
        extra.append((short, "memcpy", frac, 3))

    lines = [f"# {op}  (float32, {world} ranks, median of timed iterations, busbw = algbw * {factor:.3g})"]
    group = 22  # time(us) algbw busbw
    head1 = f"# {'':>10}  {'memcpy':>6}"
    head2 = f"# {'size':>10}  {'GB/s':>6}"
    for c in cols:
        head1 += "  " + LABEL[c].center(group)
        head2 += f"  {'time(us)':>8} {'algbw':>6} {'busbw':>6}"
    widths = []
    for h1, h2, _, _ in extra:
        w = max(len(h1), len(h2), 6)
        widths.append(w)
        head1 += f"  {h1:>{w}}"
        head2 += f"  {h2:>{w}}"
    lines += [head1.rstrip(), head2]
    for n in sorted({b for c in cols for b in by_col[c]}):
        m = memcpy.get(n)
        line = f"  {n:>10}  {fmt_bw(m['gbps']) if m else '-':>6}"
        for c in cols:
            r = by_col[c].get(n)
            if r is None:
                line += f"  {'-':>8} {'-':>6} {'-':>6}"
                continue
            bw = algbw(n, r["median_us"])
            mark = "" if r.get("correct", True) else "!"
            line += f"  {fmt_us(r['median_us']):>8}{mark or ' '}{fmt_bw(bw):>6} {fmt_bw(bw * factor):>6}"
        for (_, _, value, digits), w in zip(extra, widths):
            v = value(n)
            digits = digits + 1 if v is not None and v < 0.1 else digits  # a small ratio keeps 2 figures
            line += f"  {'-' if v is None else f'{v:.{digits}f}':>{w}}"
        lines.append(line)
    legend = []
    if ratios:
        legend.append("x/y: time of x / time of y (> 1: y is faster)")
    if fracs:
        legend.append(", ".join(f"{short}memcpy" for _, short in fracs) + ": algbw of "
                      + ", ".join(LABEL[c] for c, _ in fracs) + " / memcpy GB/s")
    if legend:
        lines.append("# " + "; ".join(legend))
    wrong = sorted({LABEL[c] for c in cols for r in by_col[c].values() if not r.get("correct", True)})
    if wrong:
        lines.append(f"# '!': WRONG RESULT from {', '.join(wrong)} at that size")
    return lines + errors


def target_lines(results, memcpy, ops):
    """The issue's targets, checked where this run has the numbers: allreduce at 64 MiB, pyddp-tcp vs gloo."""
    lines = []
    ar = {c: {r["bytes"]: r for r in results[c]["ops"].get("allreduce", [])}
          for c in COLUMNS if results.get(c)}
    parts = []
    for what, want in TARGETS:
        if isinstance(what, tuple):
            a, b = what
            v = ratio_value(ar.get(a, {}).get(TARGET_BYTES), ar.get(b, {}).get(TARGET_BYTES))
            name = f"{a}/{b}"
        else:
            r, m = ar.get(what, {}).get(TARGET_BYTES), memcpy.get(TARGET_BYTES)
            v = algbw(TARGET_BYTES, r["median_us"]) / m["gbps"] if r and m else None
            name = f"{dict(FRACTIONS)[what]}memcpy"
        if v is not None:
            parts.append(f"{name} {v:.2f} (>= {want:g}: {'met' if v >= want else 'MISSED'})")
    if parts:
        lines.append(f"# targets, allreduce {fmt_size(TARGET_BYTES)}: " + ", ".join(parts))
    if results.get("gloo") and results.get("pyddp-tcp"):
        slower = []
        for op in ops:
            g = {r["bytes"]: r for r in results["gloo"]["ops"].get(op, [])}
            for r in results["pyddp-tcp"]["ops"].get(op, []):
                v = ratio_value(g.get(r["bytes"]), r)
                if v is not None and v < 1:
                    slower.append(f"{op} {fmt_size(r['bytes'])} ({v:.2f})")
        lines.append("# target, pyddp-tcp at least as fast as gloo at every size: "
                     + (f"MISSED at {', '.join(slower)}" if slower else "met"))
    return lines


def phase_results(phased, peers):
    """[(label, results)] for the phases of the machine seen in the run, when it changed phase.

    A run is in the near phase when the probes before and after it are both within 2x of the
    fastest probe of the whole run (data crossed between cores quickly all along), in the far phase
    when both are slower than that, mixed otherwise (left out).  A phase is reported when every
    library that ran has a run in it; its results are the median over those runs (merge_rounds).
    Empty when the probes never differed by 2x (the main summary says it all) or were not taken."""
    ns = [p[0] for _, _, b, a in phased for p in (b, a) if p]
    if len(ns) < 2 or max(ns) <= 2 * min(ns):
        return []
    limit = 2 * min(ns)
    by = {"near": {}, "far": {}}
    for peer, result, before, after in phased:
        if not (before and after):
            continue
        if before[0] <= limit and after[0] <= limit:
            by["near"].setdefault(peer, []).append(result)
        elif before[0] > limit and after[0] > limit:
            by["far"].setdefault(peer, []).append(result)
    ran = {peer for peer, *_ in phased}
    out = []
    for phase, runs in by.items():
        if not ran or set(runs) != ran:
            continue
        res = {peer: merge_rounds(rs) for peer, rs in runs.items()}
        counts = ", ".join(f"{LABEL[p]} {len(runs[p])}" for p in peers if p in runs)
        where = (f"at most {limit:.0f} ns" if phase == "near" else f"over {limit:.0f} ns")
        out.append((f"only the runs in the {phase} phase (a cache line crossed between cores in {where} "
                    f"before and after the run; runs: {counts})", res))
    return out


def _over(args, phase=None):
    """What a summary's times are: the phase's runs, or the median over the rounds; and the timing."""
    rounds = getattr(args, "rounds", 1)
    over = phase or f"median of {rounds} round{'s' if rounds > 1 else ''}' medians"
    if getattr(args, "timing", "call") == "loop":
        over += ", calls back to back (--timing loop)"
    return over


def rules_of(results, peer):
    """The rules of algorithm choice a pyddp peer's workers ran with, as they reported them
    (pyddp.distributed.backends.cpu.tuning.describe), with what made them so."""
    said = (results.get(peer) or {}).get("rules") or "not reported"
    if peer == "pyddp-oob":
        return f"{said}; out of the box: an empty per-user cache, no PYDDP_TUNING_FILE"
    if peer == "pyddp-untuned":
        return f"{said}; PYDDP_TUNING=0"
    return said


def rules_lines(results):
    """'# rules: ...' lines, one per pyddp peer that ran: which rules each table's column ran with;
    then what the first job on a new host paid to measure it (first_job_line)."""
    lines = [f"# rules: {LABEL[c]}: {rules_of(results, c)}"
             for c in ("pyddp", "pyddp-oob", "pyddp-untuned", "pyddp-tcp") if results.get(c)]
    first = first_job_line(results)
    return lines + ([first] if first else [])


def first_job_line(results):
    """'# first job on a new host: ...': the pyddp run that measured the host first (the
    out-of-the-box peer's first round, its per-user cache empty), its init_process_group time and
    the part of it the measurement took; what the next first jobs paid (they measure again, adding
    to it); against the median init_process_group of the pyddp runs that did not measure; '' where
    no run measured."""
    import statistics

    measured, others = [], []
    for c in ("pyddp-oob", "pyddp", "pyddp-untuned"):
        r = results.get(c) or {}
        for init_s, probe_s in r.get("inits") or [(r.get("init_s"), r.get("first_job_s"))]:
            if init_s is None:
                continue
            (measured if probe_s is not None else others).append((c, init_s, probe_s))
    if not measured:
        return ""
    c, init_s, probe_s = measured[0]
    line = (f"# first job on a new host ({LABEL[c]}): init_process_group {init_s:.2f} s, of which "
            f"{probe_s:.2f} s measuring the host (kept in the per-user cache for later jobs)")
    if len(measured) > 1:
        line += (f"; the next {len(measured) - 1} measured again (up to "
                 f"{max(m[2] for m in measured[1:]):.2f} s each)")
    if others:
        line += (f"; the {len(others)} pyddp runs that did not measure: init_process_group median "
                 f"{statistics.median(o[1] for o in others):.2f} s")
    return line


def summary_block(args, results, world, memcpy, phase=None):
    """The README's table of one run: for each peer pyddp is compared with (Open MPI, gloo), a
    collective x size table of peer time / pyddp time (> 1: pyddp ahead) and how many points pyddp
    leads, under the Command/Machine lines (benchmarks/_report.py).  None when fewer than two sizes
    or no peer ran.  phase: the title says which runs it compares (phase_results)."""
    blocks = []
    info = None
    # out of the box first: what a new user measures before tuning anything
    for peer, mine in (("mpi", "pyddp-oob"), ("mpi", "pyddp"), ("mpi", "pyddp-untuned"), ("gloo", "pyddp")):
        if not (results.get(peer) and results.get(mine)):
            continue
        ops = [op for op in args.ops if op in results[peer]["ops"] and op in results[mine]["ops"]]
        sizes = sorted({r["bytes"] for op in ops for r in results[mine]["ops"][op]})
        if len(sizes) < 2:
            continue
        rows, ahead, total, behind = [], 0, 0, []
        for op in ops:
            a = {r["bytes"]: r for r in results[peer]["ops"][op]}
            b = {r["bytes"]: r for r in results[mine]["ops"][op]}
            cells = [op]
            for n in sizes:
                v = ratio_value(a.get(n), b.get(n))
                if v is None:
                    cells.append("-")
                    continue
                total += 1
                ahead += v >= 1
                cells.append(f"{v:.2f}" if v >= 1 else f"**{v:.2f}**")
                if v < 1:
                    behind.append((op, n, v, rounds_behind(a[n], b[n])))
            rows.append(cells)
        if info is None:
            info = dict(getattr(args, "machine", None) or _report.machine(memcpy=False))
            big = memcpy.get(max(memcpy)) if memcpy else None
            if big:
                info["memcpy_gbs"] = big["gbps"]
        # the rules each pyddp column ran with: its Machine line's "pyddp rules:" (below)
        who = LABEL[mine] + {"pyddp-untuned": " (PYDDP_TUNING=0: the built-in constants)",
                             "pyddp-oob": " (an empty per-user cache, no PYDDP_TUNING_FILE)"}.get(mine, "")
        over = _over(args, phase)
        blocks.append(_report.block(
            f"{LABEL[peer]} time / {who} time, {world} ranks, float32, {over} (> 1: pyddp ahead; "
            f"**bold**: behind): {LABEL[mine]} ahead at {ahead} of {total} points on this machine",
            ["collective"] + [fmt_size_short(n) for n in sizes], rows,
            info=dict(info, rules=rules_of(results, mine)) if mine.startswith("pyddp") else info,
            align="l" + "r" * len(sizes)))
        counted = [x for x in behind if x[3] is not None]
        if counted:
            blocks[-1] += (
                f"\n\nRound by round (each round runs {LABEL[mine]} and {LABEL[peer]} one after the "
                "other), the points behind: "
                + "; ".join(f"{op} {fmt_size_short(n)} {v:.2f}, behind in {k} of {r} rounds"
                            for op, n, v, (k, r) in counted)
                + f"; behind in more than half of the rounds at {sum(2 * k > r for *_, (k, r) in counted)}"
                f" of {total} points")
    return "\n\n".join(blocks) if blocks else None


def noise_spread(args, results):
    """The A/A control: {(op, bytes): Open MPI time / Open MPI again time} where both ran (the same
    code in two launches of every round), and the spread it shows: the lowest of min(r, 1/r) over
    the points (identical code came out that far behind itself there).  ({}, None) without it."""
    a, b = results.get("mpi"), results.get("mpi-again")
    if not (a and b):
        return {}, None
    aa = {}
    for op in args.ops:
        x = {r["bytes"]: r for r in a["ops"].get(op, [])}
        y = {r["bytes"]: r for r in b["ops"].get(op, [])}
        for n in sorted(set(x) & set(y)):
            v = ratio_value(x[n], y[n])
            if v:
                aa[(op, n)] = v
    return aa, (min(min(v, 1 / v) for v in aa.values()) if aa else None)


def noise_block(args, results, world, phase=None):
    """With the "mpi-again" peer: the A/A table (Open MPI against itself, collective x size) and, for
    each pyddp column behind Open MPI somewhere, its points behind by more than the A/A spread (the
    lowest ratio identical code got in this run: a point above it is a tie as far as this run can
    tell), each with the A/A ratio at that point."""
    aa, spread = noise_spread(args, results)
    if spread is None:
        return None
    ops = [op for op in args.ops if any(k[0] == op for k in aa)]
    sizes = sorted({n for _, n in aa})
    rows = [[op] + [f"{aa[(op, n)]:.2f}" if (op, n) in aa else "-" for n in sizes] for op in ops]
    # Open MPI ran with no pyddp rules: the Machine line names none
    info = dict(getattr(args, "machine", None) or _report.machine(memcpy=False), rules=None)
    vals = sorted(aa.values())
    text = _report.block(
        f"Open MPI time / Open MPI again time, {world} ranks, float32, {_over(args, phase)} (the A/A "
        f"control: the same code in two launches of every round; 1.00 where the run's noise is nil): "
        f"{min(vals):.2f}-{max(vals):.2f}, median {float(np.median(vals)):.2f}; identical code came out "
        f"as far behind itself as {spread:.2f}",
        ["collective"] + [fmt_size_short(n) for n in sizes], rows, info=info, align="l" + "r" * len(sizes))
    for c in (x for x in ("pyddp-oob", "pyddp", "pyddp-untuned") if results.get(x)):
        behind, beyond = 0, []
        for op in ops:
            a = {r["bytes"]: r for r in results["mpi"]["ops"].get(op, [])}
            b = {r["bytes"]: r for r in results[c]["ops"].get(op, [])}
            for n in sizes:
                v = ratio_value(a.get(n), b.get(n))
                if v is None or v >= 1:
                    continue
                behind += 1
                if v < spread:
                    beyond.append(f"{op} {fmt_size_short(n)} {v:.2f} (A/A {aa.get((op, n), float('nan')):.2f})")
        text += (f"\n\n{LABEL[c]} behind Open MPI at {behind} point{'s' * (behind != 1)}; by more than the A/A spread (below "
                 f"{spread:.2f}) at " + (f"{len(beyond)}: " + "; ".join(beyond) if beyond else "none"))
    return text


def rounds_behind(a, b):
    """(rounds in which row b was slower than row a, rounds) from two rows' per-round medians
    (merge_rows), or None when they do not have the same rounds."""
    ra, rb = dict(a.get("round_medians") or ()), dict(b.get("round_medians") or ())
    both = sorted(set(ra) & set(rb))
    if len(both) < 2:
        return None
    return sum(rb[i] > ra[i] for i in both), len(both)


def floor_block(args, results, world, phase=None):
    """With the "floor" peer: each library's time as a multiple of the copy floor's (every rank
    copying its even share of the bytes the collective writes, bench_worker.FloorImpl), per
    collective and size, and the points where pyddp is behind Open MPI with both multiples."""
    floor = results.get("floor")
    libs = [c for c in ("pyddp-oob", "pyddp", "pyddp-untuned", "mpi") if results.get(c)]
    if not floor or not libs:
        return None
    ops = [op for op in args.ops if op in floor["ops"]]
    sizes = sorted({r["bytes"] for op in ops for r in floor["ops"][op]})
    rows = []
    for op in ops:
        f = {r["bytes"]: r for r in floor["ops"][op]}
        for c in libs:
            m = {r["bytes"]: r for r in results[c]["ops"].get(op, [])}
            cells = [op, LABEL[c]]
            for n in sizes:
                v = ratio_value(m.get(n), f.get(n))
                cells.append("-" if v is None else f"{v:.2f}")
            rows.append(cells)
    info = dict(getattr(args, "machine", None) or _report.machine(memcpy=False))
    # the rules each pyddp row ran with (not those of this process, which ran none of them)
    mine = [c for c in libs if c.startswith("pyddp")]
    info["rules"] = "; ".join(f"{LABEL[c]}: {rules_of(results, c)}" for c in mine) or None
    over = _over(args, phase)
    text = _report.block(
        f"time / copy floor time, {world} ranks, float32, {over} (1.00: the library writes its output "
        "as fast as copies of the same bytes, every rank copying its share at the same time, a "
        "peer's bytes the faster of plain copies and one kernel copy)",
        ["collective", "library"] + [fmt_size_short(n) for n in sizes], rows, info=info,
        align="ll" + "r" * len(sizes))
    ways = []
    for op in ops:
        by = {}
        for r in floor["ops"][op]:
            if r.get("way"):
                by.setdefault(r["way"], []).append(r["bytes"])
        if by:
            ways.append(f"{op} " + ", ".join(
                f"{w} at {' '.join(fmt_size_short(n) for n in sorted(v))}"
                for w, v in sorted(by.items())))
    if ways:
        text += ("\n\nThe floor copies a peer's bytes the faster way at each size, as the ranks timed "
                 "both first (shm: plain copies out of the peer's shared-memory segment; cma: one "
                 "copy by the kernel out of the peer's array, process_vm_readv): " + "; ".join(ways))
    for c in (x for x in ("pyddp-oob", "pyddp") if results.get(x) and results.get("mpi")):
        behind = []
        for op in ops:
            f = {r["bytes"]: r for r in floor["ops"][op]}
            a = {r["bytes"]: r for r in results["mpi"]["ops"].get(op, [])}
            b = {r["bytes"]: r for r in results[c]["ops"].get(op, [])}
            for n in sizes:
                v = ratio_value(a.get(n), b.get(n))
                if v is not None and v < 1 and f.get(n):
                    behind.append(f"{op} {fmt_size_short(n)} (Open MPI/{LABEL[c]} {v:.2f}; "
                                  f"{LABEL[c]} {ratio_value(b[n], f[n]):.2f}x the floor, Open MPI "
                                  f"{ratio_value(a[n], f[n]):.2f}x)")
        text += f"\n\n{LABEL[c]} behind Open MPI at: " + ("; ".join(behind) if behind else "no point")
    return text


def print_tables(args, results, notes, world, memcpy):
    if getattr(args, "rounds", 1) > 1:
        print()
        print(f"# {args.rounds} rounds, libraries in alternating order: time(us) is the median of the "
              "rounds' medians")
    lines = rules_lines(results)
    if lines:
        print()
        print("\n".join(lines))
    for op in args.ops:
        print()
        print("\n".join(table(op, results, world, memcpy)))
    targets = target_lines(results, memcpy, args.ops)
    if targets:
        print()
        print("\n".join(targets))
    for c in COLUMNS:
        if notes.get(c):
            print(f"# note: {LABEL[c]}: {notes[c]}")
    summary = summary_block(args, results, world, memcpy)
    if summary:
        print()
        print(summary)
    floors = floor_block(args, results, world)
    if floors:
        print()
        print(floors)
    noise = noise_block(args, results, world)
    if noise:
        print()
        print(noise)


def fmt_size_short(n):
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return f"{n}B"


def plot(path, ops, results, world, memcpy):
    """Write the algbw plot to path; returns a note ('' when written). matplotlib is imported here only."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullLocator
    except Exception as e:  # not installed, or broken: the tables are the result, the plot is extra
        return f"skipped: matplotlib does not import ({e}); pip install matplotlib"
    ops = [op for op in ops if table_columns(op, results)]
    if not ops:
        return "skipped: no results to plot"
    ncols = min(2, len(ops))
    nrows = math.ceil(len(ops) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.4 * nrows), squeeze=False)
    # One colour and marker per library in every panel.
    styles = {"pyddp": ("o-", "C0"), "pyddp-oob": ("o:", "C9"), "pyddp-untuned": ("o--", "C7"), "pyddp-shm": ("D-", "C1"), "pyddp-tcp": ("s-", "C2"), "gloo": ("^-", "C3"),
              "mpi": ("v-", "C4"), "pyddp-mpi": ("^-", "C5"), "pyddp-mpi-nocheck": ("^--", "C6")}
    for ax, op in zip(axes.flat, ops):
        xs_all = set()
        for c in table_columns(op, results):
            pts = [(r["bytes"], algbw(r["bytes"], r["median_us"])) for r in results[c]["ops"][op]]
            pts = [(x, y) for x, y in pts if 0 < y < float("inf")]
            if pts:
                xs_all.update(x for x, _ in pts)
                ax.plot(*zip(*pts), styles[c][0], color=styles[c][1], label=LABEL[c], markersize=4)
        pts = [(n, memcpy[n]["gbps"]) for n in sorted(xs_all) if n in memcpy and memcpy[n]["gbps"] > 0]
        if pts:
            ax.plot(*zip(*pts), "k--", label="memcpy (numpy copy)", linewidth=1.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        xs = sorted(xs_all)
        if xs:
            ticks = xs[:: max(1, math.ceil(len(xs) / 9))]
            ax.set_xticks(ticks)
            ax.set_xticklabels([fmt_size_short(t) for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title(f"{op} ({world} ranks, float32)")
        ax.set_xlabel("size (bytes, whole array)")
        ax.set_ylabel("algbw (GB/s)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    fig.suptitle("pyddp collective benchmark: median algbw (higher is better)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        return f"not written: {e}"
    finally:
        plt.close(fig)
    return ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="ranks (world size), default 2")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--min-bytes", default="4", help="smallest size (e.g. 4, 1K, 1MiB), default 4")
    ap.add_argument("--max-bytes", default="64M", help="largest size, default 64M")
    ap.add_argument("--step", type=int, default=4, help="size multiplier between rows (2 or 4), default 4")
    ap.add_argument("--iters", type=int, default=200,
                    help="timed iterations for small sizes (large sizes get fewer), default 200")
    ap.add_argument("--budget-bytes", default="2G",
                    help="cap on iterations*size per row, which keeps large sizes short; default 2G")
    ap.add_argument("--peers", default=None,
                    help=f"comma-separated subset of {','.join(PEERS)} (default: all found; pyddp-untuned "
                         "only where a rules file is in force); pyddp also runs the shm-buffer allreduce")
    ap.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")
    ap.add_argument("--plot", metavar="FILE", default=None,
                    help="PNG of algbw against size (default runs/bench/collectives.png; needs matplotlib, "
                         "a note when it does not import)")
    ap.add_argument("--no-plot", action="store_true", help="write no plot")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per library before giving up")
    ap.add_argument("--quick", action="store_true", help="few sizes, few iterations (smoke test)")
    ap.add_argument("--split-ops", action="store_true",
                    help="run every collective in processes of its own, the libraries alternating per "
                         "collective: the runs compared are seconds apart, so more of them fall in one phase "
                         "of a machine whose speed between cores changes (see the handoff probes)")
    ap.add_argument("--timing", choices=("call", "loop"), default="call",
                    help="call (default): a barrier before every call, each call timed alone, the slowest "
                         "rank's time; loop: batches of calls back to back (nccl-tests' method), a barrier "
                         "before each batch, time per call = the slowest rank's batch time / calls (see "
                         "docs/benchmarks.md: where ranks share cores, a call's own clock measures the "
                         "order in which each library's barrier lets the ranks go)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every library this many times, in alternating order, and report the median "
                         "of its per-round medians (default 1)")
    ap.add_argument("--out-of-the-box", dest="oob", action=argparse.BooleanOptionalAction, default=None,
                    help="beside pyddp with this host's rules file, run pyddp out of the box (peer "
                         "pyddp-oob: XDG_CACHE_HOME an empty directory, no PYDDP_TUNING_FILE), each "
                         "table labelled with the rules it ran with; default: on unless "
                         "PYDDP_TUNING_FILE names a rules file (without a rules file pyddp itself runs "
                         "out of the box)")
    args = ap.parse_args(argv)

    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if args.oob is None:
        args.oob = not (os.environ.get("PYDDP_TUNING_FILE") or "").strip()
    tuned = tuned_here()
    if args.peers is None:
        # with --out-of-the-box the empty-cache run stands where the built-in constants would
        args.peers = ",".join(p for p in PEERS if p not in OPT_IN and p != "pyddp-oob" and
                              (p != "pyddp-untuned" or (tuned and not args.oob)))
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if args.oob and tuned and "pyddp" in args.peers and "pyddp-oob" not in args.peers:
        args.peers.insert(args.peers.index("pyddp") + 1, "pyddp-oob")
    for o in args.ops:
        if o not in OPS:
            ap.error(f"--ops: unknown collective {o!r} (choose from {', '.join(OPS)})")
    for p in args.peers:
        if p not in PEERS:
            ap.error(f"--peers: unknown peer {p!r} (choose from {', '.join(PEERS)})")
    args.peers = list(dict.fromkeys(args.peers))
    if args.nproc < 1:
        ap.error("--nproc must be >= 1")
    if args.step < 2:
        ap.error("--step must be >= 2")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
    args.budget_bytes = parse_size(args.budget_bytes)
    if args.quick:
        args.step = max(args.step, 16)
        args.iters = min(args.iters, 10)
        args.budget_bytes = min(args.budget_bytes, 64 << 20)
    sizes = []
    s = max(lo, 1)
    while s <= hi:
        sizes.append(s)
        s *= args.step
    if not sizes:
        ap.error("--min-bytes is larger than --max-bytes")

    args.machine = _report.machine(memcpy=False)  # the summary's Machine line: load before the run
    print(f"# pyddp collective benchmark: {args.nproc} ranks on one host, {args.machine['cpu']}, "
          f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}, numpy {np.__version__}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5:
        print(f"# WARNING: load average {load:.2f} before the run: other processes compete for the CPUs, "
              "so times are noisy (busy-polling peers such as Open MPI suffer most)")
    if os.environ.get("PYDDP_TRANSPORT"):
        print(f"# PYDDP_TRANSPORT={os.environ['PYDDP_TRANSPORT']} in this environment is not passed on: "
              "pyddp runs with the transport it picks itself, pyddp-tcp with PYDDP_TRANSPORT=tcp")
    memcpy = measure_memcpy(row_sizes(args.ops, sizes, args.nproc))
    shown = [n for n in memcpy if n in (1 << 20, 16 << 20, 64 << 20)] or [max(memcpy)]
    if max(memcpy) not in shown:
        shown.append(max(memcpy))
    print("# numpy copy (memcpy) bandwidth, np.copyto per size (memcpy column): "
          + ", ".join(f"{fmt_size(n)} {memcpy[n]['gbps']:.1f} GB/s" for n in shown))
    sys.stdout.flush()

    results, notes, raw = {}, {}, {}
    runs = {}
    probes = []  # core-to-core handoff around every library's run: the machine's phase (_report.handoff)
    phased = []  # (peer, result, probe before, probe after) of every run
    with tempfile.TemporaryDirectory(prefix="pyddp-bench-") as tmpdir:
        # --split-ops: every collective in processes of its own, the libraries alternating per
        # collective, so that the runs compared are seconds apart (a machine's phase lasts 10-30 s)
        groups = [[op] for op in args.ops] if args.split_ops else [list(args.ops)]
        steps = [(rnd, ops, peer) for rnd in range(args.rounds) for gi, ops in enumerate(groups)
                 # alternate the order, so that no library always runs first (or after the same one)
                 for peer in (args.peers if (rnd + gi) % 2 == 0 else args.peers[::-1])]
        for rnd, ops, peer in steps:
            if peer in notes and peer not in runs:
                continue  # skipped or failed in an earlier round
            ok, why = available(peer)
            if not ok:
                notes[peer] = f"skipped: {why}"
                continue
            probe = _report.handoff()
            if probe:
                probes.append(probe)
            t0 = time.monotonic()
            result, note = run_peer(peer, argparse.Namespace(**dict(vars(args), ops=ops)), sizes,
                                    tmpdir)
            after = _report.handoff() if probe else None
            if after:
                probes.append(after)
            if result:
                result["round"] = rnd
                runs.setdefault(peer, []).append(result)
                phased.append((peer, result, probe, after))
            if note:
                notes[peer] = note
            print(f"# {LABEL[peer]}{' ' + ops[0] if args.split_ops else ''}: "
                  f"{time.monotonic() - t0:.1f} s"
                  + (f" (round {rnd + 1} of {args.rounds})" if args.rounds > 1 else "")
                  + (f", between cores before/after it: {probe[0]:.0f}/{after[0]:.0f} ns"
                     if probe and after else "")
                  + (" (see note)" if note else ""), flush=True)
        for peer in args.peers:
            if peer not in runs:
                continue
            result = merge_rounds(runs[peer])
            note = notes.get(peer, "")
            if result:
                raw[peer] = result
            if result and result.get("ops"):
                results[peer] = result
            notes[peer] = note
            shm = (result or {}).get("shm_buffer")
            if shm is not None:
                if shm.get("rows"):
                    results["pyddp-shm"] = {"ops": {"allreduce": shm["rows"]}, "errors": {}}
                if not shm.get("available"):
                    notes["pyddp-shm"] = f"not available: {shm.get('why', '')} (the rows appear once it exists)"
                elif shm.get("error"):
                    notes["pyddp-shm"] = "allreduce failed: " + shm["error"].strip().splitlines()[-1]

    if probes:
        args.machine = dict(args.machine, handoff=_report.fmt_handoff(probes))
        ns = [p[0] for p in probes]
        if max(ns) > 2 * min(ns):
            print(f"# WARNING: data crossed between cores {max(ns) / min(ns):.1f}x slower at one point of "
                  "the run than at another (the probes after each run time): the machine changed phase, "
                  "so the tables below mix phases; the summaries at the end compare runs of one phase")
    print_tables(args, results, notes, args.nproc, memcpy)
    for label, sub in phase_results(phased, args.peers):
        summary = summary_block(args, sub, args.nproc, memcpy, phase=label)
        if summary:
            print()
            print(summary)
        floors = floor_block(args, sub, args.nproc, phase=label)
        if floors:
            print()
            print(floors)
        noise = noise_block(args, sub, args.nproc, phase=label)
        if noise:
            print()
            print(noise)
    if not args.no_plot:
        path = args.plot or DEFAULT_PLOT
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        note = plot(path, args.ops, results, args.nproc, memcpy)
        shown = os.path.relpath(path)
        print(f"# note: plot {note}" if note else f"# plot: {path if shown.startswith(os.pardir) else shown}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nproc": args.nproc, "sizes": sizes, "handoff_probes": probes,
                       "memcpy": {str(n): m for n, m in memcpy.items()},
                       "memcpy_gbps": {str(n): m["gbps"] for n, m in memcpy.items()},
                       "results": raw, "notes": notes}, f, indent=1)
    # Success when at least one library produced numbers for every requested collective.
    return 0 if any(all(results[p]["ops"].get(op) for op in args.ops) for p in PEERS if p in results) else 1


if __name__ == "__main__":
    sys.exit(main())
