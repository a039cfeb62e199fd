"""pyddp against Open MPI in the same processes, call by call.

    python benchmarks/interleaved.py                       # 2 ranks, every collective, 4 KiB-64 MiB
    python benchmarks/interleaved.py --nproc 4 --ops allreduce,alltoall --max-bytes 4M

benchmarks/collectives.py runs each library in processes of its own, one after the other.  On a
machine whose speed between cores changes for minutes at a time (see the machine's phases in
docs/benchmarks.md) two runs seconds apart can fall in different phases, and a ratio then says more
about the phase than about the libraries.  Here mpirun starts the ranks once; every rank joins
pyddp's default group (backend "cpu", the rules in force on this host) beside MPI.COMM_WORLD, and
for every collective and size the two libraries take turns call by call (pyddp first on even
calls, Open MPI first on odd ones), each call after an MPI barrier, so both see the same phase.  A
call's time is the slowest rank's; a cell is the median over calls.  Both libraries' results are
checked against NumPy first (bench_worker.check).

mpirun binds each rank to a core of its own (its default for up to 2 ranks); with more ranks than
cores it runs them unbound (--oversubscribe).  Needs mpirun and mpi4py; says so and exits 0 without
them.
"""
import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _report  # noqa: E402
import bench_worker as bw  # noqa: E402
from pyddp.tools.tune import _free_port as free_port  # noqa: E402
from pyddp.tools.tune import _parse_bytes as parse_bytes  # noqa: E402  (4K, 64M, ...)


def fmt_size(n):
    for unit, s in (("M", 20), ("K", 10)):
        if n >= 1 << s and n % (1 << s) == 0:
            return f"{n >> s}{unit}"
    return str(n)


# ------------------------------------------------------------------------------------------ worker

def probe_quiet(mimpl):
    """Rank 0's cache-line handoff (ns) while the other ranks sleep (None where unavailable)."""
    mimpl.barrier()
    ns = None
    if mimpl.rank == 0:
        # the probe's two threads need two cores: mpirun bound this rank to one
        bound = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
            from pyddp import _C

            ns = float(_C.probe_handoff(0.01)[0]) if (os.cpu_count() or 1) > 1 else None
        except (ImportError, RuntimeError, OSError):
            ns = None
        finally:
            os.sched_setaffinity(0, bound)
    else:
        time.sleep(0.015)
    mimpl.barrier()
    return ns


def run_cell(pimpl, mimpl, op, nbytes, args):
    """One collective at one size, both libraries alternating: a row of the result."""
    n_in, n_out = bw.counts_for(op, nbytes, mimpl.world)
    # One pair of arrays for both libraries: arrays made one after the other land on memory of
    # different histories (the allocator's heap after the larger sizes before), and a 1 MiB
    # all_to_all or reduce ran 1.4-1.8x faster for whichever library's arrays were made second,
    # Open MPI's or pyddp's alike.  Shared, they have the same pages and the same caches.
    a = pimpl.make(n_in)
    out = pimpl.make(n_out) if op in bw.BLOCKED else np.zeros(1, dtype=np.float32)
    arrays = {}
    ok = {}
    for impl in (pimpl, mimpl):
        ok[impl.name] = bw.check(impl, op, a, out)  # leaves both zeroed
        arrays[impl.name] = (impl.wrap(a), impl.wrap(out))
    iters = bw.iterations(nbytes, args.iters, args.budget_bytes)
    fns = {impl.name: getattr(impl, op) for impl in (pimpl, mimpl)}
    for _ in range(bw.warmups(nbytes)):
        for name in ("pyddp", "mpi"):
            mimpl.barrier()
            fns[name](*arrays[name])
    probe = probe_quiet(mimpl)
    times = np.zeros((2, iters), dtype=np.float64)
    clock = time.perf_counter
    for i in range(iters):
        order = ((0, "pyddp"), (1, "mpi")) if i % 2 == 0 else ((1, "mpi"), (0, "pyddp"))
        for row, name in order:
            a, out = arrays[name]
            mimpl.barrier()
            t0 = clock()
            fns[name](a, out)
            times[row, i] = clock() - t0
    mimpl.max_over_ranks(times)
    pimpl._last_blocks = mimpl._last_blocks = None
    return {"bytes": bw.whole_bytes(op, n_in, n_out), "iters": iters, "probe_ns": probe,
            "pyddp_us": float(np.median(times[0]) * 1e6), "mpi_us": float(np.median(times[1]) * 1e6),
            "pyddp_correct": ok["pyddp"], "mpi_correct": ok["mpi"]}


def worker(args):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local.Get_rank()),
                      LOCAL_WORLD_SIZE=str(local.Get_size()))
    mimpl = bw.MpiImpl()
    pimpl = bw.PyddpImpl()
    rows = {}
    for op in args.ops:
        rows[op] = [run_cell(pimpl, mimpl, op, n, args) for n in args.sizes]
        if rank == 0:
            print(f"# {op}: done", file=sys.stderr, flush=True)
    if rank == 0:
        with open(args.worker_out, "w", encoding="utf-8") as f:
            json.dump({"world": world, "ops": rows}, f)
    pimpl.close()


# ------------------------------------------------------------------------------------------ parent

def missing():
    """Why this benchmark cannot run here, or None."""
    if shutil.which("mpirun") is None:
        return "mpirun not found (Open MPI: apt install openmpi-bin libopenmpi-dev)"
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py not installed (pip install mpi4py)"
    return None


def report(result, args, info):
    world = result["world"]
    ops = [op for op in args.ops if op in result["ops"]]
    sizes = sorted({r["bytes"] for op in ops for r in result["ops"][op]})
    cells = {(op, r["bytes"]): r for op in ops for r in result["ops"][op]}
    probes = [r["probe_ns"] for r in cells.values() if r["probe_ns"] is not None]
    if probes:
        info = dict(info, handoff=f"{min(probes):.0f}-{max(probes):.0f} ns over {len(probes)} "
                                  "probes, one before each row")
    out = []
    head = ["collective"] + [fmt_size(n) for n in sizes]
    ratio_rows, time_rows = [], []
    ahead = total = 0
    behind = []
    wrong = []
    for op in ops:
        rr = [op]
        for n in sizes:
            c = cells.get((op, n))
            if c is None:
                rr.append("-")
                continue
            for lib in ("pyddp", "mpi"):
                if not c[f"{lib}_correct"]:
                    wrong.append(f"{'pyddp' if lib == 'pyddp' else 'Open MPI'} {op} {fmt_size(n)}")
            ratio = c["mpi_us"] / c["pyddp_us"] if c["pyddp_us"] > 0 else float("inf")
            total += 1
            if ratio >= 1.0:
                ahead += 1
                rr.append(f"{ratio:.2f}")
            else:
                behind.append(f"{op} {fmt_size(n)} ({ratio:.2f})")
                rr.append(f"**{ratio:.2f}**")
            time_rows.append([op, fmt_size(n), f"{c['pyddp_us']:.2f}", f"{c['mpi_us']:.2f}",
                              f"{ratio:.2f}", c["iters"],
                              "-" if c["probe_ns"] is None else f"{c['probe_ns']:.0f}"])
        ratio_rows.append(rr)
    title = (f"Open MPI time / pyddp time, {world} ranks, float32, the two in the same processes "
             f"call by call (> 1: pyddp ahead; **bold**: behind): pyddp ahead at {ahead} of {total} "
             "points on this machine")
    out.append(title)
    out.append("")
    out += _report.header(info=info)
    out.append("")
    out += _report.table(head, ratio_rows, align="l" + "r" * len(sizes))
    out.append("")
    out.append("pyddp behind Open MPI at: " + ("; ".join(behind) if behind else "no point"))
    if wrong:
        out.append("WRONG RESULT: " + "; ".join(wrong))
    if args.times:
        out.append("")
        out += _report.table(["collective", "size", "pyddp us", "Open MPI us", "mpi/pyddp",
                              "calls", "probe ns"], time_rows, align="llrrrrr")
    return "\n".join(out), ahead, total, bool(wrong)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--ops", default=",".join(bw.OPS),
                    help=f"comma-separated subset of {','.join(bw.OPS)}")
    ap.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("4K"))
    ap.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("64M"))
    ap.add_argument("--step", type=int, choices=(2, 4), default=4,
                    help="size multiplier between rows (default 4)")
    ap.add_argument("--iters", type=int, default=200,
                    help="timed calls per library for small sizes (large sizes get fewer)")
    ap.add_argument("--budget-bytes", type=parse_bytes, default=parse_bytes("2G"),
                    help="cap on calls x size per row, which keeps large sizes short")
    ap.add_argument("--times", action="store_true", help="also print every cell's times")
    ap.add_argument("--json", help="also write every number to this JSON file")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run")
    ap.add_argument("--quick", action="store_true",
                    help="4K to 256K, 20 calls: a check that it works, not a measurement")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in args.ops if o not in bw.OPS]
    if bad:
        ap.error(f"--ops: unknown collective(s) {', '.join(bad)} (expected {', '.join(bw.OPS)})")
    if args.worker:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        worker(args)
        return 0
    if args.nproc < 2:
        ap.error("--nproc must be at least 2")
    if args.quick:
        args.max_bytes, args.iters = min(args.max_bytes, 256 << 10), 20
    if args.min_bytes > args.max_bytes:
        ap.error("--min-bytes is larger than --max-bytes")
    why = missing()
    if why:
        print(f"interleaved.py: skipped: {why}")
        return 0
    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.step
    info = _report.machine()
    with tempfile.TemporaryDirectory(prefix="pyddp-interleaved-") as tmp:
        out = os.path.join(tmp, "result.json")
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   PYDDP_SECRET=os.environ.get("PYDDP_SECRET") or secrets.token_hex(16),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = ["mpirun", "-np", str(args.nproc), "--allow-run-as-root"]
        if args.nproc > (os.cpu_count() or 1):
            cmd += ["--oversubscribe", "--bind-to", "none"]
        for var in ("MASTER_ADDR", "MASTER_PORT", "PYDDP_SECRET", "OMP_NUM_THREADS", "PYTHONPATH"):
            cmd += ["-x", var]
        cmd += [sys.executable, os.path.abspath(__file__), "--worker", "--worker-out", out,
                "--ops", ",".join(args.ops), "--sizes", ",".join(map(str, sizes)),
                "--iters", str(args.iters), "--budget-bytes", str(args.budget_bytes)]
        try:
            p = subprocess.run(cmd, env=env, timeout=args.timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            print(f"interleaved.py: the run did not finish in {args.timeout:.0f} s", file=sys.stderr)
            return 1
        if p.returncode != 0 or not os.path.exists(out):
            print(f"interleaved.py: mpirun failed (exit {p.returncode}):\n{p.stdout[-3000:]}"
                  f"\n{p.stderr[-3000:]}", file=sys.stderr)
            return 1
        with open(out, encoding="utf-8") as f:
            result = json.load(f)
    text, ahead, total, wrong = report(result, args, info)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "result": result, "ahead": ahead, "points": total}, f,
                      indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
