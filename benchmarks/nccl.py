#!/usr/bin/env python
"""NCCL benchmark: pyddp's "nccl" backend against torch's ProcessGroupNCCL and CuPy's cupy.cuda.nccl, in one run.

    python benchmarks/nccl.py                           # 8 B .. 1 GiB (x4); 1 rank, 2 on one GPU, one per GPU
    python benchmarks/nccl.py --ops allreduce --max-bytes 64M --peers pyddp-torch,torch
    python benchmarks/nccl.py --worlds 2@1 --json out.json      # only the two ranks sharing one GPU
    python benchmarks/nccl.py --quick --max-bytes 4K            # a short run (the smoke test)

Options: --worlds LIST (N: N ranks, one GPU each while there are enough; N@G: N ranks on G GPUs, rank r on
GPU r % G; default "auto" = 1, 2@1 and, with several GPUs, one rank per GPU), --ops, --min-bytes/--max-bytes,
--step, --iters, --batches, --budget-bytes, --peers (pyddp-torch, pyddp-cupy, torch, cupy; default: all),
--pg-timeout, --timeout, --json OUT, --quick.

Peers (the table columns): "pyddp (torch tensors)" and "pyddp (CuPy arrays)": pyddp.distributed with backend
"nccl" on torch CUDA tensors and on CuPy arrays; "torch ProcessGroupNCCL": torch.distributed with backend
"nccl"; "cupy.cuda.nccl": CuPy's NcclCommunicator called directly on the current stream (no process group).
Each peer runs in its own processes, one after the other. Ranks sharing a GPU get NCCL_MULTI_RANK_GPU_ENABLE=1,
which NCCL allows from 2.30 on; a peer whose NCCL is older (or refuses) is skipped with a note.

Method (as nccl-tests): float32, in place for allreduce and broadcast (root 0); size is the whole array
(allgather's output, reduce_scatter's input). Per size: one check against NumPy with rank-dependent data (a wrong
result is marked "!"), warm-up calls, then --batches timed batches: the ranks line up (a one-element allreduce and
a device synchronize), then k back-to-back calls between two CUDA events recorded on the current stream (k =
--iters, fewer where k calls would move more than --budget-bytes). A batch's time per call is its elapsed time / k
on the slowest rank; the table shows the median over batches, algbw = size / time and busbw = algbw x factor
(allreduce 2(n-1)/n, allgather and reduce_scatter (n-1)/n, broadcast 1; one rank: busbw = algbw), and the ratios
pyddp/torch and pyddp/cupy of busbw (above 1: pyddp is faster) and of time (below 1: pyddp is faster). Under the
tables the targets are checked: busbw at least 0.97x torch's from 64 MiB on, and the smallest size's time at most
torch's.

Without a CUDA device it prints why and exits 0.
"""
import argparse
import datetime
import glob
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import _report  # noqa: E402
from bench_worker import counts_for, warmups  # noqa: E402
from collectives import (algbw, busbw_factor, fmt_bw, fmt_size, fmt_us, free_port, launch,  # noqa: E402
                         parse_size, worker_env)

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")
PEERS = ("pyddp-torch", "pyddp-cupy", "torch", "cupy")
LABEL = {"pyddp-torch": "pyddp (torch tensors)", "pyddp-cupy": "pyddp (CuPy arrays)",
         "torch": "torch ProcessGroupNCCL", "cupy": "cupy.cuda.nccl"}
# (peer, array library, NCCL caller): whose NCCL version gates a peer, which arrays it times
ARRAYS = {"pyddp-torch": "torch", "pyddp-cupy": "cupy", "torch": "torch", "cupy": "cupy"}
CALLER = {"pyddp-torch": "pyddp", "pyddp-cupy": "pyddp", "torch": "torch", "cupy": "cupy"}
# Ratio columns: pyddp on the same arrays as its peer.
RATIOS = (("pyddp-torch", "torch"), ("pyddp-cupy", "cupy"))
SHORT = {"pyddp-torch": "pyddp", "pyddp-cupy": "pyddp", "torch": "torch", "cupy": "cupy"}
TARGET_BYTES = 64 << 20
TARGET_BUSBW = 0.97
MULTI_RANK_GPU_NCCL = (2, 30, 0)
PATTERN = 13  # check data: (index % 13) plus a rank term, exact in float32


def prefer_checkout():
    """Import the in-place build of this checkout when there is one (as bench_worker does)."""
    if glob.glob(os.path.join(ROOT, "pyddp", "_C*.so")) and ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def version_tuple(text):
    return tuple(int(x) for x in text.split(".")[:3]) if text else ()


# ------------------------------------------------------------------------------------------- probe
# Run in a child process (`--probe`): a library that hangs or crashes on import cannot take the parent with it.

def nccl_code_text(code):
    """NCCL's version code as text: X*10000+Y*100+Z from 2.9 on, X*1000+Y*100+Z before."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def probe_torch():
    import torch

    info = {"version": torch.__version__}
    if not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build"
        return dict(info, why=f"torch {torch.__version__} ({build}): torch.cuda.is_available() is False")
    info.update(devices=torch.cuda.device_count(), name=torch.cuda.get_device_name(0))
    import torch.distributed as td

    if not (td.is_available() and td.is_nccl_available()):
        return dict(info, why=f"torch {torch.__version__} has no NCCL backend")
    return dict(info, nccl=".".join(str(x) for x in torch.cuda.nccl.version()[:3]))


def probe_cupy():
    import cupy

    info = {"version": cupy.__version__}
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver, no device
        return dict(info, why=f"cupy {cupy.__version__}: no CUDA device ({e})")
    if n == 0:
        return dict(info, why=f"cupy {cupy.__version__}: no CUDA device")
    info.update(devices=n, name=cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
    from cupy.cuda import nccl

    if not getattr(nccl, "available", True):  # CuPy imports its NCCL module either way, empty without libnccl
        return dict(info, why=f"cupy {cupy.__version__} finds no libnccl: pip install nvidia-nccl-cu13 (or -cu12)")
    return dict(info, nccl=nccl_code_text(nccl.get_version()))


def probe_pyddp():
    prefer_checkout()
    import pyddp.distributed as dist

    try:
        import pyddp.cuda as pcuda
    except ImportError as e:
        return {"why": f"this pyddp has no pyddp.cuda ({e})"}
    if not pcuda.is_available():
        return {"why": "pyddp.cuda.is_available() is False"}
    info = {"devices": pcuda.device_count()}
    if not dist.is_nccl_available():
        return dict(info, why="pyddp.distributed.is_nccl_available() is False")
    return dict(info, nccl=".".join(str(x) for x in pcuda.nccl.version()[:3]))


def probe():
    out = {}
    for name, fn in (("torch", probe_torch), ("cupy", probe_cupy), ("pyddp", probe_pyddp)):
        try:
            out[name] = fn()
        except ImportError as e:
            out[name] = {"why": f"{name} does not import ({e})"}
        except Exception as e:
            out[name] = {"why": f"{name}: {type(e).__name__}: {e}"}
    return out


def run_probe(timeout):
    """The probe's answer, or raises RuntimeError saying why there is none."""
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe"], capture_output=True,
                           text=True, timeout=timeout, env=worker_env())
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the probe of torch, CuPy and pyddp did not finish in {timeout:.0f} s") from None
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"the probe of torch, CuPy and pyddp failed (status {p.returncode}): "
                           f"{(p.stderr or p.stdout).strip()[-1500:]}")
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------------------ worker
# One rank of one peer (`--worker PEER`): RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment.

class TorchArrays:
    """float32 CUDA tensors and the events of torch's current stream."""

    def __init__(self, dev):
        import torch

        torch.cuda.set_device(dev)
        self.torch = torch
        self.dev = torch.device("cuda", dev)

    def upload(self, host):
        return self.torch.from_numpy(host).to(self.dev)

    def download(self, a):
        return a.cpu().numpy()

    def zero(self, a):
        a.zero_()

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def elapsed_ms(self, start, end):
        return start.elapsed_time(end)

    def sync(self):
        self.torch.cuda.synchronize()


class CupyArrays:
    """float32 CuPy arrays and the events of CuPy's current stream."""

    def __init__(self, dev):
        import cupy

        cupy.cuda.Device(dev).use()
        self.cupy = cupy

    def upload(self, host):
        return self.cupy.asarray(host)

    def download(self, a):
        return self.cupy.asnumpy(a)

    def zero(self, a):
        a.fill(0)

    def event(self):
        return self.cupy.cuda.Event()

    def elapsed_ms(self, start, end):
        return self.cupy.cuda.get_elapsed_time(start, end)

    def sync(self):
        self.cupy.cuda.Device().synchronize()


class DistColl:
    """pyddp.distributed and torch.distributed: the same calls."""

    def __init__(self, dist):
        self.dist = dist

    def allreduce(self, a, out):
        self.dist.all_reduce(a)

    def broadcast(self, a, out):
        self.dist.broadcast(a, 0)

    def allgather(self, a, out):
        self.dist.all_gather_into_tensor(out, a)

    def reduce_scatter(self, a, out):
        self.dist.reduce_scatter_tensor(out, a)

    def close(self):
        self.dist.destroy_process_group()


def pyddp_coll(rank, world, dev, args):
    prefer_checkout()
    import pyddp.cuda
    import pyddp.distributed as dist

    pyddp.cuda.set_device(dev)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.pg_timeout))
    return DistColl(dist)


def torch_coll(rank, world, dev, args):
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.pg_timeout),
                            device_id=torch.device("cuda", dev))
    return DistColl(dist)


class CupyColl:
    """cupy.cuda.nccl.NcclCommunicator on CuPy's current stream; the unique id goes through a file."""

    def __init__(self, rank, world, dev, args):
        import cupy
        from cupy.cuda import nccl

        self.cupy, self.nccl = cupy, nccl
        uid_path, timeout = args.out + ".uid", args.pg_timeout
        if rank == 0:
            uid = nccl.get_unique_id()
            with open(uid_path + ".tmp", "w") as f:
                json.dump(list(uid), f)
            os.replace(uid_path + ".tmp", uid_path)
        else:
            deadline = time.monotonic() + timeout
            while not os.path.exists(uid_path):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank 0 wrote no NCCL unique id to {uid_path} in {timeout:.0f} s")
                time.sleep(0.01)
            with open(uid_path) as f:
                uid = tuple(json.load(f))
        self.comm = nccl.NcclCommunicator(world, uid, rank)

    def stream(self):
        return self.cupy.cuda.get_current_stream().ptr

    def allreduce(self, a, out):
        p = a.data.ptr
        self.comm.allReduce(p, p, a.size, self.nccl.NCCL_FLOAT32, self.nccl.NCCL_SUM, self.stream())

    def broadcast(self, a, out):
        p = a.data.ptr
        self.comm.broadcast(p, p, a.size, self.nccl.NCCL_FLOAT32, 0, self.stream())

    def allgather(self, a, out):
        self.comm.allGather(a.data.ptr, out.data.ptr, a.size, self.nccl.NCCL_FLOAT32, self.stream())

    def reduce_scatter(self, a, out):
        self.comm.reduceScatter(a.data.ptr, out.data.ptr, out.size, self.nccl.NCCL_FLOAT32,
                                self.nccl.NCCL_SUM, self.stream())

    def close(self):
        self.comm.destroy()


ARRAY_TYPES = {"torch": TorchArrays, "cupy": CupyArrays}
COLLS = {"pyddp": pyddp_coll, "torch": torch_coll, "cupy": CupyColl}


def pattern(n, plus):
    return np.tile(np.arange(PATTERN, dtype=np.float32), n // PATTERN + 1)[:n] + np.float32(plus)


def check_data(op, n_in, n_out, rank, world):
    """(input, output's initial value, expected output array) of one check, all NumPy."""
    full = pattern(n_in, 0) * world + world * (world - 1) / 2
    if op == "allreduce":
        return pattern(n_in, rank), None, full
    if op == "broadcast":
        return (pattern(n_in, 1) if rank == 0 else np.full(n_in, -1, np.float32)), None, pattern(n_in, 1)
    if op == "allgather":
        want = np.concatenate([pattern(n_in, 100 * r) for r in range(world)])
        return pattern(n_in, 100 * rank), np.full(n_out, -1, np.float32), want
    return pattern(n_in, rank), np.full(n_out, -1, np.float32), full[rank * n_out:(rank + 1) * n_out]


def measure(arrays, coll, op, a, out, k, batches, tiny, warm):
    """Per-call microseconds of each batch of k back-to-back calls, timed with events on the current stream."""
    call = getattr(coll, op)
    for _ in range(warm):
        call(a, out)
    start, end = arrays.event(), arrays.event()
    times = []
    for _ in range(batches):
        coll.allreduce(tiny, None)  # line the ranks up
        arrays.sync()
        start.record()
        for _ in range(k):
            call(a, out)
        end.record()
        arrays.sync()
        times.append(arrays.elapsed_ms(start, end) * 1e3 / k)
    return times


def worker(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = rank % args.devices
    peer = args.worker
    arrays = ARRAY_TYPES[ARRAYS[peer]](dev)
    coll = COLLS[CALLER[peer]](rank, world, dev, args)
    result = {"peer": peer, "rank": rank, "device": dev, "ops": {}}
    tiny = arrays.upload(np.zeros(1, np.float32))
    for op in args.ops.split(","):
        rows = []
        for nbytes in (int(s) for s in args.sizes.split(",")):
            n_in, n_out = counts_for(op, nbytes, world)
            host_in, host_out, want = check_data(op, n_in, n_out, rank, world)
            a = arrays.upload(host_in)
            out = a if host_out is None else arrays.upload(host_out)
            getattr(coll, op)(a, out)
            arrays.sync()
            correct = bool(np.array_equal(arrays.download(out), want))
            del host_in, host_out, want
            arrays.zero(a)
            arrays.zero(out)
            whole = 4 * (n_out if op == "allgather" else n_in)
            k = max(1, min(args.iters, args.budget_bytes // whole))
            times = measure(arrays, coll, op, a, out, k, args.batches, tiny, warmups(whole))
            rows.append({"bytes": whole, "k": k, "us": times, "correct": correct})
            del a, out
        result["ops"][op] = rows
        with open(f"{args.out}.{rank}.tmp", "w") as f:  # after every collective: a later failure keeps these
            json.dump(result, f)
        os.replace(f"{args.out}.{rank}.tmp", f"{args.out}.{rank}.json")
    coll.close()
    return 0


# ------------------------------------------------------------------------------------------ parent

def sizes_for(lo, hi, step):
    """max, max/step, max/step^2, ... down to lo, and lo itself: 8 B .. 1 GiB by 4 holds 64 MiB and 1 GiB."""
    out = {lo}
    s = hi
    while s >= lo:
        out.add(s)
        s //= step
    return sorted(out)


def parse_worlds(text, ngpu):
    """[(ranks, gpus)] from "auto" or "N,N@G,...": N alone is N ranks on min(N, ngpu) GPUs."""
    if text == "auto":
        worlds = [(1, 1), (2, 1)]
        if ngpu >= 2:
            worlds.append((ngpu, ngpu))
        return worlds
    out = []
    for item in text.split(","):
        n, _, g = item.strip().partition("@")
        try:
            n, g = int(n), int(g) if g else min(int(n), ngpu)
        except ValueError:
            raise ValueError(f"--worlds: {item!r} is not N or N@G") from None
        if n < 1 or not 1 <= g <= min(n, ngpu):
            raise ValueError(f"--worlds: {item!r}: need N >= 1 ranks on 1 <= G <= min(N, {ngpu} GPUs here)")
        out.append((n, g))
    return out


def world_label(n, g):
    return f"{n} rank{'s' if n > 1 else ''} on {g} GPU{'s' if g > 1 else ''}"


def merge_ranks(per_rank):
    """One row per size from every rank's batches: a batch takes its slowest rank; the row its median batch."""
    ops = {}
    for op, rows in per_rank[0]["ops"].items():
        if not all(op in r["ops"] for r in per_rank):
            continue
        merged = []
        for i, row in enumerate(rows):
            batches = np.max([r["ops"][op][i]["us"] for r in per_rank], axis=0)
            merged.append({"bytes": row["bytes"], "median_us": float(np.median(batches)),
                           "min_us": float(batches.min()), "iters": row["k"] * len(batches),
                           "correct": all(r["ops"][op][i]["correct"] for r in per_rank)})
        ops[op] = merged
    return ops


def skip_reason(peer, probe, shared):
    """Why peer cannot run here ('' when it can)."""
    for lib in dict.fromkeys((ARRAYS[peer], CALLER[peer])):
        why = probe.get(lib, {}).get("why")
        if why:
            return why
    have = version_tuple(probe[CALLER[peer]].get("nccl", ""))
    if shared and have < MULTI_RANK_GPU_NCCL:
        return (f"ranks sharing a GPU need NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE=1); "
                f"{CALLER[peer]} uses NCCL {probe[CALLER[peer]]['nccl']}")
    return ""


REFUSALS = ("duplicate gpu", "multi_rank_gpu", "multiple ranks")


def run_peer(peer, n, g, args, sizes, tmpdir):
    """Run one peer on n ranks over g GPUs: (ops or None, note, failed)."""
    tag = f"{peer}-{n}at{g}"
    out = os.path.join(tmpdir, tag)
    port = free_port()
    wargs = [sys.executable, os.path.abspath(__file__), "--worker", peer, "--out", out, "--devices", str(g),
             "--ops", ",".join(args.ops), "--sizes", ",".join(map(str, sizes)), "--iters", str(args.iters),
             "--batches", str(args.batches), "--budget-bytes", str(args.budget_bytes),
             "--pg-timeout", str(args.pg_timeout)]
    extra = {"NCCL_MULTI_RANK_GPU_ENABLE": os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE", "1")} if n > g else {}
    cmds = [(wargs, worker_env({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n),
                                "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                **extra}))
            for r in range(n)]
    codes, timed_out, tail = launch(cmds, tmpdir, tag, args.timeout)
    per_rank = []
    for r in range(n):
        path = f"{out}.{r}.json"
        if os.path.exists(path):
            with open(path) as f:
                per_rank.append(json.load(f))
    ops = merge_ranks(per_rank) if len(per_rank) == n else None
    if not timed_out and not any(codes):
        return ops, "", False
    note = f"timed out after {args.timeout:.0f} s" if timed_out else f"exited with status {sorted(set(codes))}"
    if n > g and any(w in tail.lower() for w in REFUSALS):
        note = f"NCCL refused {world_label(n, g)}: " + note
    note += "; last output:\n    " + tail.strip().replace("\n", "\n    ") if tail else ""
    return ops, note, True


def table(op, config, peers, world):
    """The lines of one collective's table for one world: peers is {peer: ops}."""
    cols = [p for p in PEERS if peers.get(p, {}).get(op)]
    if not cols:
        return [f"# {op}: no results"]
    factor = 1.0 if world == 1 else busbw_factor(op, world)
    by = {c: {r["bytes"]: r for r in peers[c][op]} for c in cols}
    ratios = [(a, b) for a, b in RATIOS if a in cols and b in cols]
    what = "busbw = algbw (one rank)" if world == 1 else f"busbw = algbw * {factor:.3g}"
    lines = [f"# {op}  (float32, {config}, median of batches, {what})"]
    head1, head2 = f"# {'':>10}", f"# {'size':>10}"
    for c in cols:
        head1 += "  " + LABEL[c].center(22)
        head2 += f"  {'time(us)':>8} {'algbw':>6} {'busbw':>6}"
    for a, b in ratios:
        head1 += "  " + f"{SHORT[a]}/{SHORT[b]}".center(13)
        head2 += f"  {'busbw':>6} {'time':>6}"
    lines += [head1.rstrip(), head2]
    for size in sorted({s for c in cols for s in by[c]}):
        line = f"  {size:>10}"
        for c in cols:
            r = by[c].get(size)
            if r is None:
                line += f"  {'-':>8} {'-':>6} {'-':>6}"
                continue
            bw = algbw(size, r["median_us"])
            mark = " " if r["correct"] else "!"
            line += f"  {fmt_us(r['median_us']):>8}{mark}{fmt_bw(bw):>6} {fmt_bw(bw * factor):>6}"
        for a, b in ratios:
            ra, rb = by[a].get(size), by[b].get(size)
            if ra and rb and ra["median_us"] > 0:
                line += f"  {rb['median_us'] / ra['median_us']:>6.3f} {ra['median_us'] / rb['median_us']:>6.3f}"
            else:
                line += f"  {'-':>6} {'-':>6}"
        lines.append(line)
    if ratios:
        lines.append("# x/y busbw: busbw of x / busbw of y (> 1: x is faster); x/y time: time of x / time of y")
    wrong = sorted({LABEL[c] for c in cols for r in by[c].values() if not r["correct"]})
    if wrong:
        lines.append(f"# '!': WRONG RESULT from {', '.join(wrong)} at that size")
    return lines


def target_lines(config, peers, ops):
    """busbw >= 0.97x torch's from 64 MiB on, and time at the smallest size <= torch's, where measured."""
    lines = []
    for a, b in RATIOS[:1]:  # the targets are against torch
        for op in ops:
            ra = {r["bytes"]: r for r in peers.get(a, {}).get(op, [])}
            rb = {r["bytes"]: r for r in peers.get(b, {}).get(op, [])}
            both = sorted(set(ra) & set(rb))
            if not both:
                continue
            parts = []
            big = [(rb[s]["median_us"] / ra[s]["median_us"], s) for s in both if s >= TARGET_BYTES]
            if big:
                worst, at = min(big)
                verdict = "met" if worst >= TARGET_BUSBW else "MISSED"
                parts.append(f"busbw from {fmt_size(TARGET_BYTES)} >= {TARGET_BUSBW}x: {verdict} "
                             f"(lowest {worst:.3f} at {fmt_size(at)})")
            small = both[0]
            t = ra[small]["median_us"] / rb[small]["median_us"]
            parts.append(f"time at {fmt_size(small)} <= 1x: {'met' if t <= 1 else 'MISSED'} ({t:.3f})")
            lines.append(f"# target, {config}, {op}, {LABEL[a]} vs {LABEL[b]}: " + "; ".join(parts))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="auto",
                    help="comma-separated N (N ranks, one GPU each while there are enough) or N@G (N ranks "
                         "on G GPUs); default auto: 1, 2@1 and, with several GPUs, one rank per GPU")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--min-bytes", default="8", help="smallest size, default 8")
    ap.add_argument("--max-bytes", default="1G", help="largest size, default 1G")
    ap.add_argument("--step", type=int, default=4, help="size divisor between rows, down from the largest (4)")
    ap.add_argument("--iters", type=int, default=20, help="back-to-back calls per timed batch (small sizes), 20")
    ap.add_argument("--batches", type=int, default=20, help="timed batches per size, default 20")
    ap.add_argument("--budget-bytes", default="256M",
                    help="cap on calls x size per batch (large sizes get fewer calls, at least 1), default 256M")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated subset of {','.join(PEERS)} (default: all; missing ones print a note)")
    ap.add_argument("--pg-timeout", type=float, default=120, help="the libraries' own timeout, seconds (120)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per peer and world before giving up")
    ap.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")
    ap.add_argument("--quick", action="store_true", help="few sizes, few iterations (smoke test)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(probe()))
        return 0
    if args.worker:
        args.budget_bytes = int(args.budget_bytes)
        return worker(args)

    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.peers = list(dict.fromkeys(p.strip() for p in args.peers.split(",") if p.strip()))
    for o in args.ops:
        if o not in OPS:
            ap.error(f"--ops: unknown collective {o!r} (choose from {', '.join(OPS)})")
    for p in args.peers:
        if p not in PEERS:
            ap.error(f"--peers: unknown peer {p!r} (choose from {', '.join(PEERS)})")
    if args.step < 2 or args.iters < 1 or args.batches < 1:
        ap.error("--step must be >= 2, --iters and --batches >= 1")
    if args.quick:
        args.step, args.iters, args.batches = max(args.step, 16), min(args.iters, 5), min(args.batches, 5)
    lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
    if not 1 <= lo <= hi:
        ap.error("need 1 <= --min-bytes <= --max-bytes")
    args.budget_bytes = parse_size(args.budget_bytes)
    sizes = sizes_for(lo, hi, args.step)

    print(f"# pyddp NCCL benchmark, {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"# command: {shlex.join([os.path.basename(sys.executable)] + sys.argv)}")
    env = sorted(f"{k}={v}" for k, v in os.environ.items()
                 if k.startswith(("NCCL_", "TORCH_NCCL_", "PYDDP_")) and k != "PYDDP_SECRET")
    if env:
        print(f"# environment: {' '.join(env)}")
    try:
        found = run_probe(timeout=180)
    except RuntimeError as e:
        print(f"# cannot run: {e}")
        return 1
    ngpu = max(found[lib].get("devices", 0) for lib in ("torch", "cupy", "pyddp"))
    if ngpu == 0 or not any(found[lib].get("devices") for lib in ("torch", "cupy")):
        print("# cannot run here: no usable CUDA device, nothing measured")
        for lib in ("torch", "cupy", "pyddp"):
            print(f"#   {lib}: {found[lib].get('why') or 'ok'}")
        return 0
    try:
        worlds = parse_worlds(args.worlds, ngpu)
    except ValueError as e:
        ap.error(str(e))
    name = found["torch"].get("name") or found["cupy"].get("name")
    print(f"# device: {ngpu} x {name}; NCCL: "
          + ", ".join(f"{lib} {v['nccl']}" for lib, v in found.items() if v.get("nccl")))
    print(f"# sizes {fmt_size(sizes[0])} .. {fmt_size(sizes[-1])}, {args.batches} batches of up to {args.iters} "
          f"calls, ops {','.join(args.ops)}")
    for line in _report.header(argv):  # the command and the host, as every generated README table
        print("# " + line.rstrip())
    sys.stdout.flush()

    results, notes, failed = {}, {}, False
    with tempfile.TemporaryDirectory(prefix="pyddp-nccl-bench-") as tmpdir:
        for n, g in worlds:
            config = world_label(n, g)
            results[config], notes[config] = {}, {}
            for peer in args.peers:
                why = skip_reason(peer, found, shared=n > g)
                if why:
                    notes[config][peer] = f"skipped: {why}"
                    continue
                t0 = time.monotonic()
                ops, note, bad = run_peer(peer, n, g, args, sizes, tmpdir)
                failed |= bad and not note.startswith("NCCL refused")
                if ops:
                    results[config][peer] = ops
                if note:
                    notes[config][peer] = note
                print(f"# {config}, {LABEL[peer]}: {time.monotonic() - t0:.1f} s"
                      + (" (see note)" if note else ""), flush=True)

    for (n, g) in worlds:
        config = world_label(n, g)
        for op in args.ops:
            print()
            print("\n".join(table(op, config, results[config], n)))
        targets = target_lines(config, results[config], args.ops)
        if targets:
            print()
            print("\n".join(targets))
        for peer, note in notes[config].items():
            print(f"# note: {config}, {LABEL[peer]}: {note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": sys.argv, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                       "probe": found, "sizes": sizes, "results": results, "notes": notes}, f, indent=1)
    wrong = any(not r["correct"] for per in results.values() for ops in per.values() for rows in ops.values()
                for r in rows)
    return 1 if failed or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
