#!/usr/bin/env python
"""Collective benchmark: pyddp against torch's gloo backend and Open MPI (mpi4py), in one run.

    python benchmarks/collectives.py                      # 2 ranks, 4 B .. 64 MiB, every peer found
    python benchmarks/collectives.py --nproc 4 --ops allreduce --peers pyddp,gloo
    python benchmarks/collectives.py --quick --peers pyddp --max-bytes 4096

For each collective (allreduce, broadcast, allgather = all_gather_into_tensor, reduce_scatter =
reduce_scatter_tensor) it prints an nccl-tests-style table of float32 arrays: size, then per library the
median time (us), algbw and busbw (GB/s), and the time ratios gloo/pyddp and mpi/pyddp (> 1: pyddp is faster).

Method (as nccl-tests and ../shared/reference/performance.md): each library runs in its own set of worker
processes (pyddp and torch: one process per rank started here with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT on
a free port; MPI: mpirun -np N); per size a correctness check, warm-up iterations, then timed iterations each
preceded by a barrier; each iteration's time is the slowest rank's; the table shows the median over iterations.
size is the whole array: allgather's output, reduce_scatter's input. busbw = algbw * factor: allreduce
2(n-1)/n, allgather and reduce_scatter (n-1)/n, broadcast 1. NumPy copy bandwidth on this machine is printed
for reference. A library that is missing or fails prints a note; the others still report.
"""
import argparse
import json
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

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
PEERS = ("pyddp", "gloo", "mpi")
LABEL = {"pyddp": "pyddp", "gloo": "torch gloo", "mpi": "Open MPI"}


def busbw_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter"):
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
    if peer == "pyddp":
        return True, ""
    if peer == "gloo":
        try:
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                return False, "torch is not installed"
        except Exception as e:  # a broken install is a note, not a crash
            return False, f"torch: {e}"
        return True, ""
    if peer == "mpi":
        import importlib.util

        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed"
        if shutil.which("mpirun") is None:
            return False, "mpirun not found"
        return True, ""
    return False, f"unknown peer {peer!r}"


# One secret for every rank of this run (as a launcher sets it): the ranks prove they belong to the job.
JOB_SECRET = os.environ.get("PYDDP_SECRET") or secrets.token_hex(16)


def worker_env(extra=None):
    env = dict(os.environ)
    # One thread per rank: the ranks already use every core of a small machine.
    env["OMP_NUM_THREADS"] = "1"
    env["PYDDP_SECRET"] = JOB_SECRET
    env.update(extra or {})
    return env


def run_peer(peer, args, sizes, tmpdir):
    """Run one library's workers; returns (result dict or None, note or '')."""
    out = os.path.join(tmpdir, f"{peer}.json")
    wargs = [sys.executable, WORKER, "--impl", peer, "--ops", ",".join(args.ops),
             "--sizes", ",".join(str(s) for s in sizes), "--iters", str(args.iters),
             "--budget-bytes", str(args.budget_bytes), "--out", out]
    logs = []
    procs = []
    try:
        if peer == "mpi":
            cmd = ["mpirun", "-np", str(args.nproc), "--oversubscribe", "--allow-run-as-root",
                   "--bind-to", "none"] + wargs
            env = worker_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                              "OMPI_MCA_rmaps_base_oversubscribe": "1"})
            log = open(os.path.join(tmpdir, f"{peer}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        else:
            port = free_port()
            for rank in range(args.nproc):
                env = worker_env({"RANK": str(rank), "LOCAL_RANK": str(rank),
                                  "WORLD_SIZE": str(args.nproc), "LOCAL_WORLD_SIZE": str(args.nproc),
                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
                log = open(os.path.join(tmpdir, f"{peer}.{rank}.log"), "w+")
                logs.append(log)
                procs.append(subprocess.Popen(wargs, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        deadline = time.monotonic() + args.timeout
        timed_out = False
        failed = []
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                break  # the other ranks would wait on the dead one: stop them (below)
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
        failed = [p for p in procs if p.poll() not in (None, 0)]
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
    result = None
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
    note = ""
    if timed_out:
        note = f"timed out after {args.timeout:.0f} s"
    elif failed or result is None:
        codes = sorted({p.returncode for p in procs})
        note = f"exited with status {codes}"
    if note and tail:
        note += "; last output:\n    " + tail.strip().replace("\n", "\n    ")
    if result and result.get("errors") and not note:
        note = "; ".join(f"{op}: {msg.strip().splitlines()[-1]}" for op, msg in result["errors"].items())
    return result, note


def memcpy_bandwidth(sizes=(1 << 20, 16 << 20, 64 << 20)):
    """GB/s of np.copyto (bytes copied / time, median of repeats), one thread, this machine, now."""
    rows = []
    for n in sizes:
        src = np.ones(n // 4, dtype=np.float32)
        dst = np.empty_like(src)
        reps = max(5, min(200, (256 << 20) // n))
        times = []
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t0)
        rows.append((n, n / float(np.median(times[2:])) / 1e9))
    return rows


def print_tables(args, results, notes, world, copy=()):
    peers = [p for p in args.peers if results.get(p)]
    for op in args.ops:
        if not any(results[p]["ops"].get(op) for p in peers):
            print(f"\n# {op}: no results")
            continue
        factor = busbw_factor(op, world)
        print()
        print(f"# {op}  (float32, {world} ranks, median of timed iterations, busbw = algbw * {factor:.3g})")
        head1 = f"# {'':>10} {'':>10}"
        head2 = f"# {'size':>10} {'count':>10}"
        for p in peers:
            head1 += f"  {LABEL[p]:^27}"
            head2 += f"  {'time(us)':>10} {'algbw':>7} {'busbw':>7}"
        ratio_peers = [p for p in peers if p != "pyddp" and "pyddp" in peers]
        if ratio_peers:
            head1 += "  " + "ratio (peer time / pyddp)".center(10 * len(ratio_peers) + 2 * (len(ratio_peers) - 1))
            for p in ratio_peers:
                head2 += f"  {p + '/pyddp':>10}"
        print(head1.rstrip())
        print(head2)
        # rows keyed by size: every peer ran the same sizes
        by_peer = {p: {r["bytes"]: r for r in results[p]["ops"].get(op, [])} for p in peers}
        sizes = sorted({b for p in peers for b in by_peer[p]})
        for b in sizes:
            count = next(by_peer[p][b]["count"] for p in peers if b in by_peer[p])
            line = f"  {b:>10} {count:>10}"
            for p in peers:
                r = by_peer[p].get(b)
                if r is None:
                    line += f"  {'-':>10} {'-':>7} {'-':>7}"
                    continue
                t = r["median_us"]
                algbw = b / (t * 1e-6) / 1e9 if t > 0 else float("inf")
                mark = "" if r.get("correct", True) else "!"
                line += f"  {t:>9.1f}{mark or ' '} {algbw:>7.3f} {algbw * factor:>7.3f}"
            for p in ratio_peers:
                a, c = by_peer["pyddp"].get(b), by_peer[p].get(b)
                if a and c and a["median_us"] > 0:
                    line += f"  {c['median_us'] / a['median_us']:>10.2f}"
                else:
                    line += f"  {'-':>10}"
            print(line)
        wrong = [p for p in peers for r in by_peer[p].values() if not r.get("correct", True)]
        if wrong:
            print(f"# '!': WRONG RESULT from {', '.join(sorted(set(wrong)))} at that size")
        for p in args.peers:
            if p not in peers:
                continue
            err = results[p].get("errors", {}).get(op)
            if err:
                print(f"# {LABEL[p]}: {op} failed: {err.strip().splitlines()[-1]}")
    if "allreduce" in args.ops and copy:
        # performance.md: report allreduce algbw as a fraction of what one core can copy.
        parts = []
        for n, bw in copy:
            fr = []
            for p in peers:
                r = next((r for r in results[p]["ops"].get("allreduce", []) if r["bytes"] == n), None)
                if r and r["median_us"] > 0:
                    fr.append(f"{p} {100.0 * n / (r['median_us'] * 1e-6) / 1e9 / bw:.0f}%")
            if fr:
                parts.append(f"{fmt_size(n)}: " + ", ".join(fr))
        if parts:
            print("\n# allreduce algbw as a share of numpy copy bandwidth: " + "; ".join(parts))
    for p in args.peers:
        if notes.get(p):
            print(f"# note: {LABEL[p]}: {notes[p]}")


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
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of pyddp,gloo,mpi")
    ap.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per library before giving up")
    ap.add_argument("--quick", action="store_true", help="few sizes, few iterations (smoke test)")
    args = ap.parse_args(argv)

    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for o in args.ops:
        if o not in OPS:
            ap.error(f"--ops: unknown collective {o!r} (choose from {', '.join(OPS)})")
    for p in args.peers:
        if p not in PEERS:
            ap.error(f"--peers: unknown peer {p!r} (choose from {', '.join(PEERS)})")
    if args.nproc < 1:
        ap.error("--nproc must be >= 1")
    if args.step < 2:
        ap.error("--step must be >= 2")
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

    print(f"# pyddp collective benchmark: {args.nproc} ranks on one host, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, numpy {np.__version__}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5:
        print(f"# WARNING: load average {load:.2f} before the run: other processes compete for the CPUs, "
              "so times are noisy (busy-polling peers such as Open MPI suffer most)")
    copy = memcpy_bandwidth([n for n in (1 << 20, 16 << 20, 64 << 20) if n <= max(hi, 1 << 20)])
    print("# numpy copy (memcpy) bandwidth: " + ", ".join(f"{fmt_size(n)} {bw:.1f} GB/s" for n, bw in copy))
    sys.stdout.flush()

    results, notes = {}, {}
    with tempfile.TemporaryDirectory(prefix="pyddp-bench-") as tmpdir:
        for peer in args.peers:
            ok, why = available(peer)
            if not ok:
                notes[peer] = f"skipped: {why}"
                continue
            t0 = time.monotonic()
            result, note = run_peer(peer, args, sizes, tmpdir)
            if result and result.get("ops"):
                results[peer] = result
            notes[peer] = note
            print(f"# {LABEL[peer]}: {time.monotonic() - t0:.1f} s" + (" (see note)" if note else ""),
                  flush=True)

    print_tables(args, results, notes, args.nproc, copy)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nproc": args.nproc, "sizes": sizes, "memcpy_gbps": dict((str(n), bw) for n, bw in copy),
                       "results": results, "notes": notes}, f, indent=1)
    # Success when at least one library produced numbers for every requested collective.
    return 0 if any(all(r["ops"].get(op) for op in args.ops) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
