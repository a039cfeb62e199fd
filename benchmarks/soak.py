#!/usr/bin/env python
"""Soak test: many mixed collectives on 3 ranks, every result checked, resources watched.

    nice python benchmarks/soak.py                 # 100,000 operations, 3 ranks (about 18 minutes)
    python benchmarks/soak.py --ops 2000           # the short version CI runs (tests/distributed/test_soak.py)

Every rank draws the same sequence of operations from one seed: the kind (all_reduce, reduce,
broadcast, all_gather, all_gather_into_tensor, gather, scatter, reduce_scatter,
reduce_scatter_tensor, all_to_all, all_to_all_single, barrier, send/recv, broadcast_object_list,
all_gather_object), the group (the world or a subgroup), sync or async (up to 4 outstanding),
the dtype and the size (log-uniform from 1 B to 4 MiB).  A rank's input for operation i is a
function of (seed, i, rank), so every rank computes every expected result with NumPy; values are
small integers, so sums and products are exact in every dtype.

Before the sequence, every kind runs once at 4 MiB in every group and every rank sends 4 MiB to
every other (checked like the rest), and NumPy's cache of small buffers is filled (see
fill_numpy_cache).  Every --sample operations each rank, with no array of the operations alive,
frees what glibc holds (malloc_trim) and samples its resident memory as the kernel splits it
(/proc/self/status: RssAnon, the heap and stacks, where a leak shows; RssShmem, the pages of the
groups' shared-memory segments it touched; RssFile, mapped files), glibc's heap (mallinfo2), its
open file descriptors, threads and the job's /dev/shm entries.  After the warm-up (the first
--warmup fraction) the counts must not grow at all, and resident memory and its anonymous part by
less than --max-growth (1%) each, from the median of the first fifth of the samples after warm-up
to the median of the last; the script prints the table (--json: every sample) and exits 1 when a
result was wrong or a resource grew.

What grows without the warm-up, none of it a leak (measured, see the README): NumPy's small-buffer
cache fills as random sizes meet each of its byte sizes (up to 3.7 MiB, the 1.9-2.2% a 40,000
operation run once showed); each rank touches the 256 KiB byte rings to its peers only as
point-to-point traffic first wraps them (RssShmem +0.8 MiB over the first ~550 operations); and
glibc's per-thread caches of freed small chunks (tcache: at most 7 chunks of each size up to
1,032 B, counted as in use) fill ever more slowly, the +0.3% of RssAnon left over 24,000 operations
after warm-up (with GLIBC_TUNABLES=glibc.malloc.tcache_count=0 the heap is flat to 1 KiB).
"""
import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

KINDS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather",
         "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
         "all_to_all_single", "barrier", "send_recv", "broadcast_object_list",
         "all_gather_object")
DTYPES = ("float32", "float64", "float16", "int32", "int64", "int8", "uint8")
REDUCE_OPS = ("SUM", "MAX", "MIN", "PRODUCT")
MAX_BYTES = 4 << 20


def _parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--nproc", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--sample", type=int, default=0, help="operations between samples "
                                                           "(default: ops / 50)")
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of the run before "
                                                              "resources must be flat")
    ap.add_argument("--max-growth", type=float, default=0.01)
    ap.add_argument("--timeout", type=float, default=6 * 3600.0)
    ap.add_argument("--json", metavar="PATH", help="also write every rank's samples there")
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ------------------------------------------------------------------------------- sampling

def _status():
    """Resident memory split as the kernel counts it (/proc/self/status, bytes): RssAnon (heap,
    stacks, anonymous mmaps: where a leak shows), RssFile (mapped files: the interpreter, libraries)
    and RssShmem (the pages of shared-memory segments this process touched), and the threads."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(val.split()[0]) * 1024
            elif key == "Threads":
                out[key] = int(val.split()[0])
    return out


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks",
                                                "keepcost")]


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        return libc
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None


_LIBC = _libc()


def _mallinfo():
    """glibc's heap statistics (bytes): in use, free in the arenas, and in mmapped chunks."""
    if _LIBC is None:
        return {}
    m = _LIBC.mallinfo2()
    return {"heap_used": m.uordblks, "heap_free": m.fordblks, "heap_mmapped": m.hblkhd,
            "heap_arena": m.arena}


def _shm_entries():
    """/dev/shm entries of this job's groups (other jobs on the machine do not count)."""
    from pyddp.distributed import _observe

    prefixes = tuple(_observe.shm_prefixes())
    try:
        return sum(1 for e in os.scandir("/dev/shm") if e.name.startswith(prefixes))
    except OSError:
        return -1


def _trim():
    """Return freed heap memory to the system first (glibc keeps it otherwise, and with arrays of
    up to 4 MiB coming and going resident memory would measure the allocator, not leaks)."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def fill_numpy_cache(np):
    """Fill NumPy's cache of small data buffers to its bound before measuring.

    NumPy keeps freed array buffers of fewer than 1,024 bytes for reuse instead of returning them
    to malloc: up to 7 per exact byte size (numpy/_core/src/multiarray/alloc.c, the data cache),
    at most 7 * (1 + 2 + ... + 1023) bytes plus malloc's headers, about 3.7 MiB.  With sizes
    drawn log-uniform from 1 B, a byte size near 1,000 comes up rarely, so the cache fills over
    tens of thousands of operations: resident memory creeps up, ever more slowly, by up to 8% of a
    rank's 47 MiB, for no leak at all.  Seven live buffers of every size, freed together, fill it
    now; malloc then sees no more of this cache's growth and the samples measure the rest.
    """
    keep = [np.empty(n, np.uint8) for n in range(1, 1024) for _ in range(7)]
    del keep


def sample():
    _trim()
    st = _status()
    s = {"rss": st.get("VmRSS", 0), "anon": st.get("RssAnon", 0), "file": st.get("RssFile", 0),
         "shmem": st.get("RssShmem", 0), "fds": len(os.listdir("/proc/self/fd")),
         "threads": st.get("Threads", -1), "shm": _shm_entries(),
         "pyblocks": sys.getallocatedblocks(), "pyobjects": len(gc.get_objects())}
    s.update(_mallinfo())
    return s


# ------------------------------------------------------------------------------ operations

class Plan:
    """The operation sequence (same on every rank) and the inputs (a function of rank)."""

    def __init__(self, np, seed, world, subgroups):
        self.np = np
        self.seed = seed
        self.world = world
        self.groups = [list(range(world))] + subgroups
        self.largest = {}  # i -> (kind, group) of the warm-up's largest operations

    def warm_up(self, first):
        """Indices from `first` on of one operation of every kind in every group at the largest
        size, which the run does first: they touch all the shared memory each group's transport
        and collectives will ever use, so those pages are resident before the samples start."""
        todo = [(kind, gi, None) for gi in range(len(self.groups)) for kind in KINDS
                if kind != "send_recv"]
        todo += [("send_recv", 0, [a, b]) for a in range(self.world) for b in range(self.world)
                 if a != b]
        for j, t in enumerate(todo):
            self.largest[first + j] = t
        return sorted(self.largest)

    def op(self, i):
        rng = self.np.random.default_rng([self.seed, i])
        kind = KINDS[rng.integers(len(KINDS))]
        gi = int(rng.integers(len(self.groups))) if kind != "send_recv" else 0
        dtype = DTYPES[rng.integers(len(DTYPES))]
        red = REDUCE_OPS[rng.integers(len(REDUCE_OPS))]
        itemsize = self.np.dtype(dtype).itemsize
        nbytes = int(2 ** rng.uniform(0, 22))  # 1 B .. 4 MiB, log-uniform
        pair = None
        if i in self.largest:
            (kind, gi, pair), nbytes = self.largest[i], MAX_BYTES
            red = "SUM" if red == "PRODUCT" else red
        ranks = self.groups[gi]
        count = max(1, nbytes // itemsize)
        if red == "PRODUCT":
            count = min(count, 1 << 16)
        o = {"kind": kind, "group": gi, "ranks": ranks, "dtype": dtype, "red": red,
             "count": count, "root": ranks[int(rng.integers(len(ranks)))],
             "async": bool(rng.random() < 0.3),
             "pair": [int(x) for x in rng.permutation(self.world)[:2]],
             "splits": [int(x) for x in rng.integers(0, 3, size=len(ranks) ** 2)]}
        if pair is not None:
            o["pair"] = pair
        return o

    def data(self, i, rank, count, dtype, red="SUM", salt=0):
        """Rank's input for operation i: small integers, exact under every reduction."""
        rng = self.np.random.default_rng([self.seed, i, rank, salt])
        hi = 2 if red == "PRODUCT" else 5
        return rng.integers(1, hi + 1, size=count).astype(dtype)


def _reduce(np, arrays, red):
    acc = arrays[0].astype(np.float64)
    for a in arrays[1:]:
        b = a.astype(np.float64)
        acc = {"SUM": acc + b, "MAX": np.maximum(acc, b), "MIN": np.minimum(acc, b),
               "PRODUCT": acc * b}[red]
    return acc


class Checker:
    def __init__(self):
        self.failures = []
        self.checked = 0

    def eq(self, np, got, want, what):
        self.checked += 1
        got = np.asarray(got)
        want = np.asarray(want)
        if got.shape != want.shape or not np.array_equal(got.astype(np.float64),
                                                         want.astype(np.float64)):
            if len(self.failures) < 20:
                self.failures.append(f"{what}: got {got.ravel()[:6]}... shape {got.shape}, "
                                     f"want {want.ravel()[:6]}... shape {want.shape}")


def _run_one(dist, np, plan, i, rank, groups, chk, pending):
    o = plan.op(i)
    kind, ranks, dt, red, n = o["kind"], o["ranks"], o["dtype"], o["red"], o["count"]
    if rank not in ranks and kind != "send_recv":
        return
    g = groups[o["group"]]
    me = ranks.index(rank) if rank in ranks else -1
    k = len(ranks)
    op = getattr(dist.ReduceOp, red)
    asyn = o["async"]
    what = f"op {i} {kind} {dt} n={n} group={ranks}"
    if red == "MAX" or red == "MIN":
        pass
    inputs = {r: plan.data(i, r, n, dt, red) for r in ranks}
    checks = []  # (array, expected) checked after completion
    work = None
    if kind == "all_reduce":
        x = inputs[rank].copy()
        work = dist.all_reduce(x, op=op, group=g, async_op=asyn)
        checks.append((x, _reduce(np, [inputs[r] for r in ranks], red)))
    elif kind == "reduce":
        x = inputs[rank].copy()
        work = dist.reduce(x, o["root"], op=op, group=g, async_op=asyn)
        if rank == o["root"]:
            checks.append((x, _reduce(np, [inputs[r] for r in ranks], red)))
    elif kind == "broadcast":
        x = inputs[rank].copy()
        work = dist.broadcast(x, o["root"], group=g, async_op=asyn)
        checks.append((x, inputs[o["root"]]))
    elif kind == "all_gather":
        outs = [np.empty(n, dt) for _ in ranks]
        work = dist.all_gather(outs, inputs[rank], group=g, async_op=asyn)
        checks += [(outs[j], inputs[r]) for j, r in enumerate(ranks)]
    elif kind == "all_gather_into_tensor":
        out = np.empty(n * k, dt)
        work = dist.all_gather_into_tensor(out, inputs[rank], group=g, async_op=asyn)
        checks.append((out, np.concatenate([inputs[r] for r in ranks])))
    elif kind == "gather":
        outs = [np.empty(n, dt) for _ in ranks] if rank == o["root"] else None
        work = dist.gather(inputs[rank], outs, dst=o["root"], group=g, async_op=asyn)
        if outs is not None:
            checks += [(outs[j], inputs[r]) for j, r in enumerate(ranks)]
    elif kind == "scatter":
        parts = [plan.data(i, o["root"], n, dt, salt=j + 1) for j in range(k)]
        out = np.empty(n, dt)
        work = dist.scatter(out, parts if rank == o["root"] else None, src=o["root"], group=g,
                            async_op=asyn)
        checks.append((out, parts[me]))
    elif kind == "reduce_scatter":
        lists = {r: [plan.data(i, r, n, dt, red, salt=j + 1) for j in range(k)] for r in ranks}
        out = np.empty(n, dt)
        work = dist.reduce_scatter(out, lists[rank], op=op, group=g, async_op=asyn)
        checks.append((out, _reduce(np, [lists[r][me] for r in ranks], red)))
    elif kind == "reduce_scatter_tensor":
        big = {r: plan.data(i, r, n * k, dt, red) for r in ranks}
        out = np.empty(n, dt)
        work = dist.reduce_scatter_tensor(out, big[rank], op=op, group=g, async_op=asyn)
        checks.append((out, _reduce(np, [big[r][me * n:(me + 1) * n] for r in ranks], red)))
    elif kind == "all_to_all":
        m = max(1, n // k)
        ins = {r: [plan.data(i, r, m, dt, salt=j + 1) for j in range(k)] for r in ranks}
        outs = [np.empty(m, dt) for _ in ranks]
        work = dist.all_to_all(outs, ins[rank], group=g, async_op=asyn)
        checks += [(outs[j], ins[r][me]) for j, r in enumerate(ranks)]
    elif kind == "all_to_all_single":
        # splits[s * k + d]: rows rank s sends to rank d (0 allowed); rows of 1 element
        sp = o["splits"]
        send = [sp[me * k + d] for d in range(k)]
        recv = [sp[s * k + me] for s in range(k)]
        ins = {r: plan.data(i, r, sum(sp[ranks.index(r) * k + d] for d in range(k)), dt)
               for r in ranks}
        out = np.empty(sum(recv), dt)
        work = dist.all_to_all_single(out, ins[rank], recv, send, group=g, async_op=asyn)
        want = []
        for s, r in enumerate(ranks):
            off = sum(sp[s * k + d] for d in range(me))
            want.append(ins[r][off:off + sp[s * k + me]])
        checks.append((out, np.concatenate(want) if want else np.empty(0, dt)))
    elif kind == "barrier":
        work = dist.barrier(group=g, async_op=asyn)
    elif kind == "send_recv":
        a, b = o["pair"]
        x = plan.data(i, a, n, dt)
        if rank == a:
            work = dist.isend(x, b, tag=i % 1000) if asyn else dist.send(x, b, tag=i % 1000)
        elif rank == b:
            y = np.empty(n, dt)
            work = dist.irecv(y, a, tag=i % 1000) if asyn else dist.recv(y, a, tag=i % 1000)
            checks.append((y, x))
    elif kind == "broadcast_object_list":
        objs = [{"i": i, "from": rank, "v": inputs[rank][:4].tolist()}, "x" * (n % 100)]
        dist.broadcast_object_list(objs, src=o["root"], group=g)
        want = [{"i": i, "from": o["root"], "v": inputs[o["root"]][:4].tolist()},
                "x" * (n % 100)]
        chk.checked += 1
        if objs != want and len(chk.failures) < 20:
            chk.failures.append(f"{what}: got {objs!r:.80}, want {want!r:.80}")
    elif kind == "all_gather_object":
        out = [None] * k
        dist.all_gather_object(out, (rank, i, n % 7), group=g)
        chk.checked += 1
        if out != [(r, i, n % 7) for r in ranks] and len(chk.failures) < 20:
            chk.failures.append(f"{what}: got {out!r:.80}")
    if work is not None and asyn:
        pending.append((work, checks, what))
    else:
        for got, want in checks:
            chk.eq(np, got, want, what)
    while len(pending) > (4 if asyn else 0):
        w, cs, wh = pending.pop(0)
        w.wait()
        for got, want in cs:
            chk.eq(np, got, want, wh)


def _drain(np, chk, pending):
    while pending:
        w, cs, wh = pending.pop(0)
        w.wait()
        for got, want in cs:
            chk.eq(np, got, want, wh)


def _worker(args):
    import numpy as np

    import pyddp.distributed as dist

    dist.init_process_group("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    subgroups = [[0, 1], [1, 2], [0, 2]] if world == 3 else [[0, 1]] if world >= 2 else []
    groups = [None] + [dist.new_group(r) for r in subgroups]
    plan = Plan(np, args.seed, world, subgroups)
    chk = Checker()
    pending = []
    every = args.sample or max(1, args.ops // 50)
    samples = []
    t0 = time.perf_counter()
    fill_numpy_cache(np)
    for i in plan.warm_up(args.ops):
        _run_one(dist, np, plan, i, rank, groups, chk, pending)
    _drain(np, chk, pending)
    for i in range(args.ops):
        _run_one(dist, np, plan, i, rank, groups, chk, pending)
        if (i + 1) % every == 0:
            _drain(np, chk, pending)  # no array of the last operations stays alive in a sample
            s = sample()
            s["op"] = i + 1
            s["t"] = time.perf_counter() - t0
            samples.append(s)
    _drain(np, chk, pending)
    dist.barrier()
    out = [None] * world
    dist.all_gather_object(out, {"rank": rank, "checked": chk.checked, "failures": chk.failures,
                                 "samples": samples, "seconds": time.perf_counter() - t0})
    if rank == 0:
        with open(args.worker, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


MEMORY = ("rss", "anon", "shmem", "file")
COUNTS = ("fds", "threads", "shm")


def growth(samples, warmup):
    """{resource: (value after warm-up, value at the end, relative growth)}.

    Memory: the medians of the first and of the last fifth of the samples after warm-up (one
    sample taken while the kernel was slow to account a page does not decide).  Counts: the first
    sample after warm-up against the largest after it (any growth at all counts)."""
    if len(samples) < 2:
        return {}
    after = [s for s in samples if s["op"] > warmup] or samples[len(samples) // 5:]
    w = max(1, len(after) // 5)

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    out = {}
    for key in MEMORY + COUNTS:
        if key not in after[0]:
            continue
        if key in MEMORY:
            base, end = median(s[key] for s in after[:w]), median(s[key] for s in after[-w:])
        else:
            base, end = after[0][key], max(s[key] for s in after)
        out[key] = (base, end, (end - base) / base if base > 0 else 0.0)
    return out


def report(res, args):
    """The table, one row a rank, and whether the run passed: every result right, the counts
    flat, and both the resident set and its anonymous part (heap, stacks: where a leak would
    show) grown by less than --max-growth after warm-up."""
    lines = ["| rank | results checked | wrong | ops/s | RSS after warm-up MiB | RSS end MiB | "
             "RSS growth | RssAnon MiB | RssShmem MiB | RssFile MiB | fds | threads | "
             "/dev/shm entries |", "|---" * 13 + "|"]
    ok = True
    warm = int(args.ops * args.warmup)
    for r in res:
        g = growth(r["samples"], warm)
        wrong = len(r["failures"])
        ok = ok and wrong == 0
        cells = [str(r["rank"]), str(r["checked"]), str(wrong), f"{args.ops / r['seconds']:.0f}"]
        if g:
            rss0, rss1, rg = g["rss"]
            cells += [f"{rss0 / 2**20:.2f}", f"{rss1 / 2**20:.2f}", f"{rg * 100:+.2f}%"]
            for key in ("anon", "shmem", "file"):
                a, b, x = g.get(key, (0, 0, 0.0))
                cells.append(f"{a / 2**20:.2f} -> {b / 2**20:.2f} ({x * 100:+.2f}%)")
            for key in COUNTS:
                a, b, _ = g[key]
                cells.append(f"{a} -> {b}")
                ok = ok and b <= a
            ok = ok and rg < args.max_growth and g.get("anon", (0, 0, 0.0))[2] < args.max_growth
        else:
            ok = False
            cells += ["-"] * 9
        lines.append("| " + " | ".join(cells) + " |")
    return lines, ok


def main(argv=None):
    args = _parse(argv)
    if args.worker:
        _worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "soak.json")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        cmd = [sys.executable, "-m", "pyddp.run", "--standalone", "--nproc-per-node", str(args.nproc),
               __file__,
               "--worker", out, "--ops", str(args.ops), "--seed", str(args.seed),
               "--sample", str(args.sample or max(1, args.ops // 50))]
        t0 = time.time()
        subprocess.run(cmd, env=env, check=True, timeout=args.timeout)
        with open(out) as f:
            res = json.load(f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    lines, ok = report(res, args)
    print(f"# soak: {args.ops} mixed operations on {args.nproc} ranks, seed {args.seed}, "
          f"{time.time() - t0:.0f} s, {time.strftime('%Y-%m-%d')}; resources after the first "
          f"{args.warmup:.0%} must be flat (RSS growth < {args.max_growth:.0%})")
    print("\n".join(lines))
    for r in res:
        for f in r["failures"]:
            print(f"rank {r['rank']}: WRONG {f}")
    print("soak: " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
