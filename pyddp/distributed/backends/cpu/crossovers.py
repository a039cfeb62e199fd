"""The crossovers of algorithm choice, measured on a running group (backend "cpu").

Both candidates of a collective kind (on one host: the shared banks or single copies; over TCP: the
direct algorithms or the rings) are timed size by size on the group's own ranks, a barrier before
every call and each call's time the slowest rank's (an all_reduce MAX), so every rank holds the same
numbers; ``crossover`` turns a kind's rows into its rule.  ``python -m pyddp.tools.tune`` runs this in
fresh groups and writes the rules file every later group reads; ``online()`` runs it on the job's
default group and applies the result to it (``PYDDP_TUNING_ONLINE=1``: as backend 'cpu' creates
the default group).  The collectives measured run on the C process group itself (``Calls``), the
backend's own object, not through pyddp.distributed's API above the seam.
"""
from __future__ import annotations

import os
import time

_SHM_KINDS = ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter",
              "reduce_scatter", "all_to_all")
_TCP_KINDS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")
_NEVER_SMALL = 1 << 62  # small_bytes past every message: direct algorithms always


# On shared memory a tie goes to single copies: where the banks and single copies are within this
# fraction of each other, single copies are taken.  The banks hand every byte over through a small
# shared window that one core writes and the other reads at once, so their speed follows how fast
# data crosses between the cores, which on some virtual machines changes for minutes at a time (on
# the 2-core VM of the docs, a 1 MiB all_reduce through the banks took 98 us in one phase and 510 us
# in the other, single copies 102 and 106); single copies read the peer's buffer once and keep
# their speed.  A tie measured in one phase is a clear win in the other.
SHM_TIE = 0.20


def _phase_loss(times, best):
    """log(time / best time) in the phase where it is largest (``times`` and ``best``: one number
    per phase)."""
    import math

    return max(math.log(t / b) if b > 0 else 0.0 for t, b in zip(times, best))


def _losses(rows, tie):
    """Each size's loss (``crossover``) with the first candidate and with the second."""
    loss_a, loss_b = [], []
    for _, a, b in rows:
        a = tuple(a) if isinstance(a, (tuple, list)) else (a,)
        b = tuple(x / (1.0 + tie) for x in (b if isinstance(b, (tuple, list)) else (b,)))
        best = tuple(min(x, y) for x, y in zip(a, b))
        loss_a.append(_phase_loss(a, best))
        loss_b.append(_phase_loss(b, best))
    return loss_a, loss_b


def crossover(rows, tie=0.0):
    """``rows``: (size, time of the first candidate, time of the second) ascending in size; a time
    is a number, or a tuple of one time per phase of the machine (``phase_times``).  The size from
    which the second candidate is taken, or None (never; also for no rows): the threshold that
    loses the least over all the measured sizes, each size's loss being log(time taken / time of
    the faster one there) in the phase where that is largest, the second candidate's times counted
    ``tie`` (a fraction) faster.

    Where the second candidate wins at every size from some point on and loses below it, that point
    has no loss and is the answer; a single noisy size (one that loses among larger sizes that win,
    or wins among smaller ones that lose) moves the threshold only when it outweighs the sizes on
    the other side of it.  Among thresholds that lose the same, the largest.  With one time per
    phase, a candidate that is a little slower in one phase and much faster in the other loses the
    little (the worse phase decides each size, whichever phase the machine happens to be in)."""
    if not rows:
        return None
    loss_a, loss_b = _losses(rows, tie)
    # threshold at rows[i] (second candidate from there); i == len(rows): never
    best_i, best_cost = len(rows), sum(loss_a)
    cost = best_cost
    for i in range(len(rows) - 1, -1, -1):
        cost += loss_b[i] - loss_a[i]
        if cost < best_cost - 1e-12:
            best_i, best_cost = i, cost
    return None if best_i == len(rows) else rows[best_i][0]


# A gap (the first candidate again in a band above the threshold) is kept only where it spans at
# least GAP_SIZES measured sizes and saves at least GAP_GAIN over them together (a sum of log time
# ratios: 0.25, 13% at each of two sizes): a machine with two crossings, not one noisy size.
GAP_GAIN = 0.25
GAP_SIZES = 2
# ... and only from measurements of at least this many rounds per size (``--quick``, one round,
# finds bands in noise).
GAP_ROUNDS = 3


def gap(rows, start, tie=0.0):
    """[lo, hi): the band of sizes above the threshold ``start`` (``crossover``'s) where taking the
    first candidate again saves the most, or None where no band of ``GAP_SIZES`` sizes or more
    saves ``GAP_GAIN``.  The band starts above ``start`` and ends before the largest size (a band
    to the end would be a larger threshold, which ``crossover`` weighed); hi is the first size
    after it, where the second candidate is taken again.  Measured so on the 2-core VM of the docs: 2-rank all_gather by
    single copies from 16 KiB, the banks 12-18% faster at 512 KiB-1 MiB, single copies again from
    2 MiB."""
    if start is None or not rows:
        return None
    loss_a, loss_b = _losses(rows, tie)
    above = [i for i, r in enumerate(rows) if r[0] > start]
    best, best_gain = None, GAP_GAIN
    for a in range(len(above)):
        saved = 0.0
        for b in range(a, len(above)):
            i = above[b]
            if i == len(rows) - 1:
                break
            saved += loss_b[i] - loss_a[i]
            if b - a + 1 >= GAP_SIZES and saved > best_gain + 1e-12:
                best, best_gain = (above[a], i + 1), saved
    return None if best is None else [rows[best[0]][0], rows[best[1]][0]]


# A round is slow when rank 0's probe before it took over this many times the measurement's
# fastest probes (their 10th percentile).
SLOW_FACTOR = 2.0
# Where a group switches to the slow phase's rules at run time: once rank 0's probe passes the
# fastest rounds' highest probe by this factor (and by SWITCH_MIN_NS), not only where the rounds
# were classified slow (SLOW_FACTOR).  The banks' speed follows the probe all the way, not in two
# steps: 2 ranks, 64 KiB all_reduce through the banks took 6.3 us at probes of 40-45 ns, 13 us at
# 60-75 ns (single copies 12-13.5 us at both) and 43 us at 245 ns; so rules measured at 40-45 ns
# hold only near there, and from about 60 ns the slow phase's rules (single copies, whose speed
# does not follow the probe) were the better ones.  The slow rules' cost in a state between the
# two is at most what single copies cost there, the fast rules' grows with the probe.
SWITCH_FACTOR = 1.25
SWITCH_MIN_NS = 10.0


def switch_ns(fast_probes, limit):
    """The run-time threshold of the slow phase's rules (see SWITCH_FACTOR) from the probes of
    the rounds classified fast (at most ``limit``, the classification's threshold): the highest
    of them times SWITCH_FACTOR, at least SWITCH_MIN_NS above it, never above ``limit``."""
    top = max(fast_probes) if fast_probes else limit
    return round(min(limit, max(top * SWITCH_FACTOR, top + SWITCH_MIN_NS)), 1)


# Per-phase times decide a measurement's rules only where each phase holds at least this share of
# its rounds (fewer rounds make a phase's medians one or two samples).
PHASE_SHARE = 0.1
# A measurement gives each phase rules of its own (``phased``) from this many slow rounds on: a
# size seen in one phase only takes the kind's slow/fast ratio (``phase_times``).
PHASED_ROUNDS = 6


def phase_times(res, slow_factor=SLOW_FACTOR):
    """Each candidate's time in the fast and in the slow phase of the machine, from one
    measurement's per-round data (``res["rounds"]``: kind -> [(size, [(probe ns, a, b) per
    round])], as ``_measure`` returns it).

    A round is slow when rank 0's probe before it exceeds ``slow_factor`` times the 10th
    percentile of all the measurement's probes.  A candidate's time in a phase is its median over
    that phase's rounds; a size measured in one phase only gets the other phase's time from the
    kind's median slow/fast ratio of that candidate (over the sizes seen in both).  Returns
    (rows by kind: [(size, (a fast, a slow), (b fast, b slow))] ascending, info); rows is None when
    the measurement stayed in one phase (or has no probes).  info: {"phases": 1 or 2,
    "slow_fraction", "fast_probe_ns", "slow_above_ns", "switch_ns" (``switch_ns``)}."""
    from statistics import median as med

    rounds = res.get("rounds") or {}
    probes = sorted(r[0] for v in rounds.values() for _, rs in v for r in rs if r[0] is not None)
    if len(probes) < 4:
        return None, {"phases": 1}
    ref = probes[len(probes) // 10]
    limit = ref * slow_factor
    nslow = sum(1 for x in probes if x > limit)
    p = nslow / len(probes)
    info = {"phases": 2 if 0 < nslow < len(probes) else 1, "slow_fraction": p,
            "fast_probe_ns": round(ref, 1), "slow_above_ns": round(limit, 1),
            "switch_ns": switch_ns([x for x in probes if x <= limit], limit)}
    if info["phases"] == 1:
        return None, info
    out = {}
    for kind, v in rounds.items():
        split = {}
        for size, rs in v:
            rs = [r for r in rs if r[0] is not None]
            f = [r for r in rs if r[0] <= limit]
            sl = [r for r in rs if r[0] > limit]
            split[size] = [(med([r[1 + c] for r in f]) if f else None,
                            med([r[1 + c] for r in sl]) if sl else None) for c in (0, 1)]
        ratio = []
        for c in (0, 1):
            rr = [s / f for f, s in (split[z][c] for z in split) if f and s]
            ratio.append(med(rr) if rr else None)
        rows = []
        for size in sorted(split):
            both = []
            for c in (0, 1):
                f, sl = split[size][c]
                if f is None and sl is not None and ratio[c]:
                    f = sl / ratio[c]
                if sl is None and f is not None and ratio[c]:
                    sl = f * ratio[c]
                both.append((f, sl))
            if all(x is not None for t in both for x in t):
                rows.append((size, both[0], both[1]))
        out[kind] = rows
    return out, info


def smooth_phases(rows):
    """Per-phase rows (``phase_times``) as each size's time ratio first / second candidate in each
    phase, taken as the median of that size's and its two neighbours' ratios (the end sizes keep
    their own): (size, (fast ratio, slow ratio), (1.0, 1.0)), which ``crossover`` reads as it reads
    times.  Split by phase, a size has a few rounds per phase (on the docs' VM a quarter to a half of
    them slow), and one size's slow rounds could land 3x off its neighbours' (a 4-rank reduce of
    1 MiB through the banks: 264 us against 393 at 512 KiB and 1635 at 2 MiB) and outweigh the sizes
    around it."""
    from statistics import median as med

    ratios = [tuple(a[k] / b[k] if b[k] > 0 else 1.0 for k in range(len(a))) for _, a, b in rows]
    out = []
    for i, (size, a, _) in enumerate(rows):
        if 0 < i < len(rows) - 1:
            r = tuple(med(x[k] for x in ratios[i - 1:i + 2]) for k in range(len(a)))
        else:
            r = ratios[i]
        out.append((size, r, (1.0,) * len(a)))
    return out


def _both_phases(res):
    """A shared-memory measurement that saw both phases, each in at least PHASE_SHARE of its
    rounds: its rules take each phase's times (``_table``).  Not over TCP: loopback sockets keep
    their speed across the phases (within the rounds' noise, 10-20%), and the worse of two noisy
    medians would only add the noise up."""
    ph = res.get("phases") or {}
    p = ph.get("slow_fraction", 0.0)
    return (res.get("path") == "shm" and ph.get("phases") == 2
            and PHASE_SHARE <= p <= 1.0 - PHASE_SHARE)


class Calls:
    """The blocking collectives a measurement runs, on the 'cpu' backend's object (the C process
    group ``cpg``) itself: its ``fast`` path when it takes the call, else ``submit`` with the
    request pyddp.distributed would build (backends.interface.Request's fields).  Float32 data,
    a float64 all_reduce MAX for the timings, an int64 broadcast for the agreed rules."""

    def __init__(self, cpg):
        from .... import _C

        self.cpg, self._C = cpg, _C
        self.rank, self.size = cpg.rank, cpg.size
        self._codes = {np_name: _C.DTYPE_CODES[np_name] for np_name in
                       ("float32", "float64", "int64")}

    def get_rank(self):
        """This rank in the group (torch's get_rank)."""
        return self.rank

    def get_world_size(self):
        """The group's size."""
        return self.size

    def _run(self, kind, a, op=0, root=0, inputs=(), outputs=(), count=None, splits=None,
             name=""):
        code = self._codes[a.dtype.name]
        self.cpg.submit(kind, code, op, root, 0, a.size if count is None else count, inputs,
                        outputs, splits, splits, 0.0, False, name, True)

    def barrier(self):
        """A barrier."""
        if not self.cpg.fast(self._C.K_BARRIER, None, 0):
            self.cpg.submit(self._C.K_BARRIER, 0, 0, 0, 0, 0, (), (), None, None, 0.0, False,
                            "barrier", True)

    def all_reduce(self, a, op=0):
        """all_reduce of ``a`` in place (``op``: a REDUCE_OPS code)."""
        op = int(op)
        if not self.cpg.fast(self._C.K_ALLREDUCE, a, op):
            self._run(self._C.K_ALLREDUCE, a, op, outputs=(a,), name="all_reduce")

    def all_reduce_max(self, a):
        """all_reduce MAX of ``a`` in place (the timings' agreement)."""
        self.all_reduce(a, self._C.REDUCE_OPS["MAX"])

    def broadcast(self, a, src=0):
        """broadcast of ``a`` from ``src``."""
        if not self.cpg.fast(self._C.K_BROADCAST, a, src):
            self._run(self._C.K_BROADCAST, a, root=src, outputs=(a,), name="broadcast")

    def reduce(self, a, dst=0):
        """reduce into ``dst``'s ``a``."""
        if not self.cpg.fast(self._C.K_REDUCE, a, 0, None, dst):
            self._run(self._C.K_REDUCE, a, root=dst, inputs=(a,), outputs=(a,), name="reduce")

    def all_gather_into_tensor(self, out, a):
        """all_gather of ``a`` into ``out``."""
        if not self.cpg.fast(self._C.K_ALLGATHER, out, 0, a):
            self._run(self._C.K_ALLGATHER, a, inputs=(a,), outputs=(out,), name="all_gather")

    def gather(self, a, lst, dst=0):
        """gather of ``a`` into ``lst`` on ``dst``."""
        if not self.cpg.fast(self._C.K_GATHER, lst, dst, a):
            self._run(self._C.K_GATHER, a, root=dst, inputs=(a,), outputs=tuple(lst or ()),
                      name="gather")

    def scatter(self, a, lst, src=0):
        """scatter of ``lst`` from ``src`` into ``a``."""
        if not self.cpg.fast(self._C.K_SCATTER, a, src, lst):
            self._run(self._C.K_SCATTER, a, root=src, inputs=tuple(lst or ()), outputs=(a,),
                      name="scatter")

    def reduce_scatter_tensor(self, out, big):
        """reduce_scatter of ``big`` into ``out``."""
        if not self.cpg.fast(self._C.K_REDUCE_SCATTER, out, 0, big):
            self._run(self._C.K_REDUCE_SCATTER, out, inputs=(big,), outputs=(out,),
                      name="reduce_scatter")

    def all_to_all_single(self, out, src):
        """all_to_all of ``src`` into ``out``, equal splits."""
        if not self.cpg.fast(self._C.K_ALLTOALL, out, 0, src):
            splits = (src.nbytes // self.size,) * self.size
            self._run(self._C.K_ALLTOALL, src, inputs=(src,), outputs=(out,), count=0,
                      splits=splits, name="all_to_all_single")


PHASE_PROBE_S = 0.01  # rank 0's probe before each round (the other ranks sleep meanwhile)


def _round_probe(coll, rank, _C, cpg=None):
    """Rank 0's cache-line handoff (ns) right before a round; None where it cannot be measured.
    With ``cpg`` (a group that has it): ``probe_phase``, ranks 0 and 1 handing a line back and
    forth, the probe that switches a group between the phases' rules at run time, so that the
    rounds are classified in its units.  Else ``probe_handoff``'s two threads in rank 0, measured
    while the other ranks sleep (a rank spinning in a barrier would take a core from them)."""
    coll.barrier()
    ns = None
    if cpg is not None:
        ns = cpg.probe_phase()
        coll.barrier()
        return ns
    if rank == 0:
        try:
            ns = float(_C.probe_handoff(PHASE_PROBE_S)[0]) if (os.cpu_count() or 1) > 1 else None
        except RuntimeError:
            ns = None
    else:
        time.sleep(PHASE_PROBE_S * 1.5)
    coll.barrier()
    return ns


def _sizes(lo, hi, step=4):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    return out


HUGE_PAGE = 2 << 20


def user_array(count, value=0.0):
    """``count`` float32 of ``value`` on memory like a training job's arrays: a fresh anonymous
    mapping (so the pages do not depend on what the process allocated before), from 2 MiB on
    2 MiB-aligned with transparent huge pages asked for, as torch's allocator does under
    THP_MEM_ALLOC_ENABLE=1 (which pyddp's launchers set) and NumPy does from 4 MiB.  Single copies
    pin the pages they read one page at a time, so whether the pages are huge moves the crossover:
    a 4 MiB all_gather on 2 ranks through the banks ran at 0.64x Open MPI on huge pages and ahead
    of it on small ones.  The tuner measures on these; ``benchmarks/`` allocates them for every
    library."""
    import mmap

    import numpy as np

    nbytes = max(count, 1) * 4
    huge = nbytes >= HUGE_PAGE
    m = mmap.mmap(-1, nbytes + (HUGE_PAGE if huge else 0),
                  flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)  # before the first touch
    raw = np.frombuffer(m, dtype=np.uint8)  # the array keeps the mapping alive
    off = (-raw.ctypes.data) % HUGE_PAGE if huge else 0
    a = raw[off:off + count * 4].view(np.float32)
    a[...] = value
    return a


def _op(coll, kind, rank, n, count):
    """(callable running one ``kind`` of ``count`` float32 per rank's block, its check)."""
    a = user_array(count, rank + 1)
    if kind == "all_reduce":
        return lambda: coll.all_reduce(a)
    if kind == "reduce":
        return lambda: coll.reduce(a, dst=0)
    if kind == "broadcast":
        return lambda: coll.broadcast(a, src=0)
    if kind == "all_gather":
        out = user_array(count * n)
        return lambda: coll.all_gather_into_tensor(out, a)
    if kind == "gather":
        lst = [user_array(count) for _ in range(n)] if rank == 0 else None
        return lambda: coll.gather(a, lst, dst=0)
    if kind == "scatter":
        lst = [user_array(count, r) for r in range(n)] if rank == 0 else None
        return lambda: coll.scatter(a, lst, src=0)
    if kind == "reduce_scatter":
        big = user_array(count * n, 1)
        return lambda: coll.reduce_scatter_tensor(a, big)
    if kind == "all_to_all":
        src = user_array(count * n, 1)
        out = user_array(count * n)
        return lambda: coll.all_to_all_single(out, src)
    raise ValueError(kind)


def _rule_bytes(kind, path, count, n):
    """The message size in the unit the C core's rule reads (coll/select.c, cma_common.c)."""
    b = count * 4
    if path == "tcp" and kind == "all_gather":
        return b * n  # all_gather's transport crossover is on the whole output
    return b


def _measure(cpg, path, kinds, min_bytes, max_bytes, rounds, iters, budget, probe=True,
             step=4):
    """Both candidates of every kind of ``kinds`` on the default group, size by size (``step``
    apart): {"path", "ranks", "single_copy", "kinds": kind -> [(size, first us, second us)],
    "rounds": kind -> [(size, [(probe ns, first us, second us) per round])]}.  Every rank gets the
    same numbers (a call's time is the slowest rank's, through an all_reduce MAX).  Leaves the rules
    as it found them.

    The rounds are passes over every kind and size in turn, not back to back at one size: a pass
    takes a few seconds on shared memory, so the rounds of one size are spread over the whole
    measurement, and a machine that changes phase while it runs (see SHM_TIE) has every size
    measured in both phases, which ``weigh_phases`` needs."""
    import numpy as np

    from .... import _C

    coll = Calls(cpg)
    rank, n = coll.get_rank(), coll.get_world_size()
    base_cma, base_small = (list(v) for v in cpg.rules)  # (None: never)
    codes = {k: _C.KINDS[k]["code"] for k in _SHM_KINDS}
    pingpong = path == "shm" and hasattr(cpg, "probe_phase")
    result = {"path": path, "ranks": n, "single_copy": bool(cpg.single_copy), "kinds": {},
              "rounds": {}, "probe": "pingpong" if pingpong else "handoff"}
    kinds = [k for k in kinds if k in (_TCP_KINDS if path == "tcp" else _SHM_KINDS)]
    if path == "shm" and not cpg.single_copy:
        kinds = []  # no second candidate: single copies are not possible here
    times = np.zeros(1, dtype=np.float64)
    lo = max(min_bytes, 4 * n) if path == "tcp" else min_bytes
    sizes = _sizes(lo, max_bytes, step)
    # (kind, size) -> both candidates' samples and the rounds' rows, filled pass by pass
    state = {(kind, size): {"samples": {0: [], 1: []}, "rounds": []}
             for kind in kinds for size in sizes}
    # a group with the phases' rules (a rules file's) would run the slow phase's instead of the
    # candidate set below whenever rank 0's probe saw that phase: off while measuring
    phases = getattr(cpg, "phase", {}).get("phase_ns") or 0.0
    slow_cma = list(cpg.slow_rules[0]) if phases else None
    if phases:
        cpg.set_slow_rules(slow_cma, base_small, 0.0)
    try:
        for _ in range(rounds):
            for kind in kinds:
                for size in sizes:
                    st = state[(kind, size)]
                    count = max(1, size // 4)
                    if path == "tcp" and kind == "all_gather":
                        count = max(1, size // (4 * n))
                    run = _op(coll, kind, rank, n, count)
                    calls = max(3, min(iters, budget // max(1, count * 4 * n)))
                    samples = st["samples"]
                    ns = (_round_probe(coll, rank, _C, cpg if pingpong else None)
                          if probe else None)
                    mark = {c: len(samples[c]) for c in (0, 1)}
                    for cand in (0, 1):
                        cma, small = list(base_cma), list(base_small)
                        if path == "shm":
                            cma[codes[kind]] = None if cand == 0 else 1
                        else:
                            small[codes[kind]] = _NEVER_SMALL if cand == 0 else 1
                        coll.barrier()
                        cpg.set_rules(cma, small)
                        run()  # warm-up
                        for _ in range(calls):
                            coll.barrier()
                            t0 = time.perf_counter()
                            run()
                            times[0] = time.perf_counter() - t0
                            coll.all_reduce_max(times)
                            samples[cand].append(float(times[0]))
                    st["rounds"].append([ns] + [float(np.median(samples[c][mark[c]:])) * 1e6
                                                for c in (0, 1)])
                    st["bytes"] = _rule_bytes(kind, path, count, n)
                    del run
        for kind in kinds:
            rows, rounds_out = [], []
            for size in sizes:
                st = state[(kind, size)]
                a, b = (float(np.median(st["samples"][c])) * 1e6 for c in (0, 1))
                rows.append((st["bytes"], a, b))
                rounds_out.append([st["bytes"], st["rounds"]])
            result["kinds"][kind] = rows
            result["rounds"][kind] = rounds_out
    finally:
        coll.barrier()
        cpg.set_rules(base_cma, base_small)
        if phases:
            cpg.set_slow_rules(slow_cma, base_small, phases)
    return result


def online(cpg, kinds=None, min_bytes=16 << 10, max_bytes=16 << 20, rounds=2, iters=10,
           budget_bytes=256 << 20):
    """Tune the algorithm choice of the job's default group, whose 'cpu' backend object (the C
    process group) is ``cpg``, in the job itself, on its own ranks.

    Collective: every rank of the group calls it (``pyddp.tools.tune.online()``; under
    ``PYDDP_TUNING_ONLINE=1`` backend 'cpu' does as it creates the default group).  For each
    collective of ``kinds`` (default: all) it times both candidates (shared memory: the banks and
    single copies; TCP: direct and ring) at sizes from ``min_bytes`` to ``max_bytes`` (x4 apart),
    ``rounds`` alternations of at most ``iters`` calls, each call's time the slowest rank's; the
    crossovers are then worked out as the offline tuner does, rank 0's are broadcast, and every
    rank applies the same rules to the group (they last as long as the group; ``python -m
    pyddp.tools.tune`` writes a file that every later group reads).  Returns {"cma_from": {kind:
    bytes or None}, "small_bytes": {kind: bytes}} (None: never); {} for a group of one rank or one
    without these choices.
    """
    kinds = list(_SHM_KINDS) if kinds is None else [str(k) for k in kinds]
    bad = [k for k in kinds if k not in _SHM_KINDS]
    if bad:
        raise ValueError(f"kinds: unknown collective(s) {', '.join(bad)} (expected "
                         f"{', '.join(_SHM_KINDS)})")
    for name, v in (("min_bytes", min_bytes), ("max_bytes", max_bytes), ("rounds", rounds),
                    ("iters", iters), ("budget_bytes", budget_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if min_bytes > max_bytes:
        raise ValueError(f"min_bytes ({min_bytes}) is larger than max_bytes ({max_bytes})")
    path = cpg.transport
    if cpg.size < 2 or path not in ("shm", "tcp"):
        return {}
    res = _measure(cpg, path, kinds, min_bytes, max_bytes, rounds, iters, budget_bytes,
                   probe=False)
    table = _table([res], gaps=False)
    out = _apply(cpg, table)
    from ... import _observe

    _observe.info("tuned online (%s, %d ranks): single copies from %s; direct up to %s", path,
                  cpg.size, out["cma_from"], out["small_bytes"], rank=cpg.rank)
    return out


def _cma_with(base, codes, t):
    """``base`` (a group's single-copy rules, as ``cpg.rules[0]``) with ``t``'s "cma_from" and
    "cma_gap" in place of the kinds ``t`` names."""
    cma = list(base)  # (None: never; (from, lo, hi): with a gap)
    gaps = t.get("cma_gap") or {}
    for kind, v in t["cma_from"].items():
        # (online tuning finds no gaps; a rules file's gaps (tuples) for other kinds stay)
        cma[codes[kind]] = (v, *gaps[kind]) if v is not None and kind in gaps else v
    return cma


def _apply(cpg, table, phased=None):
    """Apply ``table``'s crossovers (``_table``'s, with its "cma_gap" where it has one) to the
    group, rank 0's on every rank (a collective).  ``phased`` (a first job's ``table["phased"]``,
    where each rank has a core to run the phase probe on; None on every rank otherwise): the
    group switches between each phase's rules at run time, as later jobs reading the file do (the
    fast phase's rules in place of the table's, the slow phase's and the probe's threshold by
    ``set_slow_rules``).  Returns the table's crossovers as applied."""
    import numpy as np

    from .... import _C

    coll = Calls(cpg)
    codes = {k: _C.KINDS[k]["code"] for k in _SHM_KINDS}
    base_cma, small = (list(v) for v in cpg.rules)
    cma = _cma_with(base_cma, codes, phased["fast"] if phased else table)
    slow = _cma_with(base_cma, codes, phased["slow"]) if phased else list(cma)
    for kind, v in table["small_bytes"].items():
        small[codes[kind]] = v
    never = -1
    # every rank computed the same rules from the same numbers; rank 0's are the ones applied
    # everywhere all the same, so no rank ever acts on a choice of its own (its phase threshold
    # too, in hundredths of a ns; 0: no phases)
    flat = [(never, 0, 0) if v is None else tuple(v) if isinstance(v, tuple) else (v, 0, 0)
            for v in cma + slow]
    phase_ns = int(round(float(phased["phase_ns"]) * 100)) if phased else 0
    agreed = np.array([x for f in flat for x in f] + small + [phase_ns], dtype=np.int64)
    coll.broadcast(agreed, src=0)
    k = len(cma)
    trip = agreed[:6 * k].reshape(2 * k, 3).tolist()
    both = [None if f == never else (f, lo, hi) if lo < hi else f for f, lo, hi in trip]
    cma, slow = both[:k], both[k:]
    small = [int(v) for v in agreed[6 * k:-1].tolist()]
    phase_ns = int(agreed[-1]) / 100.0
    coll.barrier()
    cpg.set_rules(cma, small)  # without phases, a rules file's slow-phase rules stay
    if phase_ns > 0:
        cpg.set_slow_rules(slow, small, phase_ns)
    coll.barrier()
    return {"cma_from": {kd: (None if cma[codes[kd]] is None else cma[codes[kd]])
                         for kd in table["cma_from"]},
            "small_bytes": {kd: small[codes[kd]] for kd in table["small_bytes"]}}


# What the first job on a host measures (tuning.auto_claim): every kind's two candidates at
# per-rank blocks from FIRST_JOB_MIN to FIRST_JOB_MAX (x4 apart, and HUGE_PAGE: first_job_sizes),
# in pairs of calls (one of each, their order alternating), FIRST_JOB_PAIRS pairs at most, fewer
# where pairs x bytes x ranks would pass FIRST_JOB_BUDGET (never fewer than 3).
FIRST_JOB_MIN = 4 << 10
FIRST_JOB_MAX = 4 << 20
FIRST_JOB_PAIRS = 12
FIRST_JOB_BUDGET = 16 << 20


def first_job_sizes():
    """The per-rank blocks a first job measures: x4 apart from FIRST_JOB_MIN to FIRST_JOB_MAX, and
    HUGE_PAGE, where arrays start to sit on huge pages (``user_array``) and single copies, which
    pin the peer's pages one at a time, get faster.  Without it the crossover of a kind whose
    single copies lose at 1 MiB (small pages) and win at 4 MiB fell at 4 MiB, and 2 MiB blocks
    kept the banks: on 2 ranks of the 2-core VM of the docs, all_gather of 2 MiB blocks through
    the banks ran at 0.82x Open MPI in the same processes, single copies at 1.00-1.04x."""
    return sorted(set(_sizes(FIRST_JOB_MIN, FIRST_JOB_MAX))
                  | ({HUGE_PAGE} if FIRST_JOB_MIN <= HUGE_PAGE <= FIRST_JOB_MAX else set()))


# Where each rank has a core of its own and no launcher bound it to one, which core a rank runs on
# is the scheduler's choice, job by job, and on a virtual machine the cores need not be alike: on
# the 2-core VM of the docs, one job pinned each way in turn, six times, took 12.2-12.7 us for a
# scatter of 64 KiB blocks through the banks with rank 0 on the first core and 9.5-10.4 with it on
# the second, a gather 10.6-11.1 and 13.4-14.2, single copies 7-10 either way; jobs pinned each way
# throughout measured single copies of gather 64 KiB at 0.55x the banks' time and at 1.5x.  So the
# first jobs measure half of each size's pairs with the ranks placed each way (every thread
# of rank r on core r, then on core r + 1, wrapping; the affinity restored after), and each size's
# ratio weighs both placements (``_placed_log``).
def _placements(coll, rank, n):
    """[[core of each placement]] for this rank: two placements (rank r on the r-th allowed core,
    then the (r + 1)-th mod n) where every rank may run on the same n or more cores (none bound by
    a launcher), every rank agreeing; [] otherwise (a single placement: measured as it is)."""
    import numpy as np

    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = []
    ok = len(allowed) >= n >= 2
    key = hash(tuple(allowed[:n])) & 0x7FFFFFFF if ok else -1
    v = np.array([key, -key], dtype=np.float64)
    coll.all_reduce_max(v)   # every rank's key alike: max(key) == -max(-key)
    if not ok or v[0] != -v[1]:
        return []
    return [allowed[rank], allowed[(rank + 1) % n]]


def _threads_affinity():
    """{thread id: its CPU set} of this process's threads (pinning the calling thread alone would
    leave the progress thread where it was)."""
    out = {}
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    out[0] = os.sched_getaffinity(0)   # (the calling thread)
    for t in tids:
        try:
            out[t] = os.sched_getaffinity(t)
        except OSError:
            pass   # (a thread that ended)
    return out


def _pin(tids, cpus):
    for t in tids:
        try:
            os.sched_setaffinity(t, cpus[t] if isinstance(cpus, dict) else cpus)
        except OSError:
            pass


def _unpin(saved):
    """Every thread back on the CPUs it had (``saved``: ``_threads_affinity``'s); a thread started
    while the ranks were pinned gets the calling thread's."""
    _pin(saved, saved)
    mine = saved.get(0) or next(iter(saved.values()), None)
    if mine is not None:
        _pin([t for t in _threads_affinity() if t not in saved], mine)


def _aligned(v, n):
    """The last ``n`` of ``v``, None in front where it holds fewer (per-pair facts that files of
    older versions, or earlier jobs, did not keep)."""
    v = list(v or [])
    return ([None] * (n - len(v)) + v)[-n:] if n else []


def _placed_log(lr, places):
    """One log ratio (second candidate's time over the first's) for pairs measured in one or
    more placements (``places``: each pair's, None where not known): each placement's median,
    combined so that ``crossover`` weighs a size by the placement where each candidate loses most
    (as the phases: log(time / best) of the first candidate in the placement where the second
    does best, of the second where it does worst; the first candidate's loss there counts
    against it).  One placement: the plain median."""
    import statistics

    groups = {}
    for x, p in zip(lr, _aligned(places, len(lr))):
        groups.setdefault(p, []).append(x)
    meds = [statistics.median(v) for v in groups.values()]
    if len(meds) == 1:
        return meds[0]
    hi, lo = max(meds), min(meds)
    return max(0.0, hi) - max(0.0, -lo)


def _paired(cpg, kinds, sizes, max_pairs, budget, phases=True):
    """Both shared-memory candidates of each kind, size by size, in pairs of calls back to back
    (the order alternating from pair to pair), each call's time the slowest rank's: a machine
    whose speed changes from one moment to the next (see SHM_TIE) changes it for both calls of a
    pair alike, and the median of the pairs' ratios is what one candidate costs against the other
    there, where separate runs of each would compare two moments.  Returns ``_measure``'s result
    (its rows: each candidate's median time, the second's as the first's times the median
    ratio), with "pairs": kind -> [(size, pairs)].  Where each rank has a core (``phases``) and
    none is bound to one, half of each size's pairs run with the ranks placed each way on the cores
    (``_placements``; "pair_places": kind -> [(size, each pair's placement)]), and the rows' ratio
    weighs both (``_placed_log``)."""
    import math

    import numpy as np

    from .... import _C

    coll = Calls(cpg)
    rank, n = coll.get_rank(), coll.get_world_size()
    base_cma, base_small = (list(v) for v in cpg.rules)
    # the run-time probe of the machine's phase before each size (``phases``: where every rank
    # has a core; ranks sharing cores would probe the scheduler): the pairs of the first jobs,
    # which may run in different phases, are split by it (first_job_phases)
    pingpong = phases and hasattr(cpg, "probe_phase")
    from .... import _config

    forced = _config.get("PYDDP_TEST_PHASE_NS") if pingpong else None  # (tests: the phase they say)
    result = {"path": "shm", "ranks": n, "single_copy": bool(cpg.single_copy), "kinds": {},
              "rounds": {}, "probe": "pingpong" if pingpong else None, "how": "pairs",
              "pairs": {}, "ratios": {}, "pair_probes": {}, "pair_places": {}, "jobs": 1}
    # both placements of the ranks on the cores where each has one (``phases``) and none is bound
    cores = _placements(coll, rank, n) if phases else []
    saved = _threads_affinity() if cores else {}
    try:
        for kind in kinds:
            code = _C.KINDS[kind]["code"]
            cand = []
            for c in (0, 1):
                cma = list(base_cma)
                cma[code] = None if c == 0 else 1
                cand.append(cma)
            rows, rounds, used, logs, probes, places = [], [], [], [], [], []
            for size in sizes:
                count = max(1, size // 4)
                run = _op(coll, kind, rank, n, count)
                pairs = max(3, min(max_pairs, budget // max(1, size * n)))
                # each placement's share of the pairs, after a pair that warms both up (on the
                # placement's cores) and is not counted
                blocks = ([(j, max(2, (pairs + 1) // 2)) for j in range(len(cores))]
                          if cores else [(None, pairs)])
                lr, ns_of, place_of, a_all, b_all = [], [], [], [], []
                for j, k in blocks:
                    if j is not None:
                        _pin(saved, {cores[j]})
                    ns = _round_probe(coll, rank, _C, cpg) if pingpong else None
                    if forced is not None:
                        ns = float(forced)
                    times = np.zeros(2 * k + 2, dtype=np.float64)
                    for i in range(k + 1):
                        for c in ((0, 1) if i % 2 == 0 else (1, 0)):
                            coll.barrier()
                            cpg.set_rules(cand[c], base_small)
                            t0 = time.perf_counter()
                            run()
                            times[2 * i + c] = time.perf_counter() - t0
                    coll.all_reduce_max(times)
                    a_j, b_j = times[2::2] * 1e6, times[3::2] * 1e6
                    a_all += list(a_j)
                    b_all += list(b_j)
                    lr += [float(x) for x in np.log(b_j / a_j)]
                    ns_of += [None if ns is None else round(float(ns), 1)] * k
                    place_of += [j] * k
                logs.append([size, [round(x, 4) for x in lr]])
                probes.append([size, ns_of])
                places.append([size, place_of])
                ratio = math.exp(_placed_log(lr, place_of))
                med = float(np.median(a_all))
                rows.append((size, med, med * ratio))
                rounds.append([size, [[ns, med, float(np.median(b_all))]]])
                used.append([size, len(lr)])
                del run
            result["kinds"][kind] = rows
            result["rounds"][kind] = rounds
            result["pairs"][kind] = used
            result["ratios"][kind] = logs
            result["pair_probes"][kind] = probes
            result["pair_places"][kind] = places
    finally:
        if cores:
            _unpin(saved)   # every thread where it was
        coll.barrier()
        cpg.set_rules(base_cma, base_small)
    return result


MERGED_PAIRS = 48   # the pairs a size keeps over the first jobs (the latest)


def merge_paired(res, old):
    """``res`` (this job's ``_paired`` result) with the earlier jobs' pairs (``old``, the same
    kind of result, or None) added: each size's ratio is then the median over all of them.
    Returns a new result; sizes or kinds only one of them has keep their own; with each pair's
    placement ("pair_places"), the ratio weighs the placements (``_placed_log``)."""
    import math

    if not isinstance(old, dict) or not isinstance(old.get("ratios"), dict):
        return res
    out = dict(res, kinds={}, ratios={}, pair_probes={}, pair_places={},
               jobs=int(old.get("jobs", 1)) + 1)

    def per_pair(doc, field, kind):
        return {int(s): list(v) for s, v in ((doc.get(field) or {}).get(kind) or [])}

    for kind, rows in res["kinds"].items():
        before = {int(s): list(v) for s, v in (old["ratios"].get(kind) or [])}
        # each earlier pair's probe and placement (None: not known, as in files of older versions)
        probed, placed = per_pair(old, "pair_probes", kind), per_pair(old, "pair_places", kind)
        mine, mine_at = per_pair(res, "pair_probes", kind), per_pair(res, "pair_places", kind)
        logs, merged, probes, places = [], [], [], []
        for (size, a, _), (_, lr) in zip(rows, res["ratios"][kind]):
            earlier = before.get(size, [])
            allr = (earlier + list(lr))[-MERGED_PAIRS:]
            alln = (_aligned(probed.get(size), len(earlier)) +
                    _aligned(mine.get(size), len(lr)))[-MERGED_PAIRS:]
            allp = (_aligned(placed.get(size), len(earlier)) +
                    _aligned(mine_at.get(size), len(lr)))[-MERGED_PAIRS:]
            logs.append([size, allr])
            probes.append([size, alln])
            places.append([size, allp])
            merged.append((size, a, a * math.exp(_placed_log(allr, allp))))
        out["kinds"][kind] = merged
        out["ratios"][kind] = logs
        out["pair_probes"][kind] = probes
        out["pair_places"][kind] = places
    return out


# The first jobs give each phase of the machine rules of its own where their pairs hold at least
# this many of every size in each phase (a job's pairs are all in one phase, mostly: a phase lasts
# seconds, a first job's measurement a fraction of one).
FIRST_JOB_PHASE_PAIRS = 3


def _pair_probes(res):
    """The probes before the first jobs' pairs (``merge_paired``'s), ascending, and the slow
    phase's classification threshold over them (SLOW_FACTOR times their 10th percentile), as the
    tuner's rounds are classified; None with fewer than 4 probes (or a 10th percentile of 0)."""
    probes = sorted(ns for v in (res.get("pair_probes") or {}).values() for _, p in v for ns in p
                    if ns is not None)
    if len(probes) < 4 or probes[len(probes) // 10] <= 0:
        return None
    return probes, probes[len(probes) // 10] * SLOW_FACTOR


def first_job_phases(res):
    """The first jobs' pairs (``merge_paired``'s) split by the machine's phase, classified as the
    tuner's rounds are (a pair is slow when the probe before its size exceeds SLOW_FACTOR times the
    10th percentile of all the pairs' probes): ({kind: [(size, fast ratio, slow ratio)]}, the
    run-time threshold of the slow rules in ns, ``switch_ns``), each ratio the median of that
    phase's pairs (second candidate's time over the first's), or None where the pairs do not hold
    FIRST_JOB_PHASE_PAIRS of every size in each phase (one phase seen, or pairs without probes)."""
    import math

    seen = _pair_probes(res)
    if seen is None:
        return None
    probes, limit = seen
    switch = switch_ns([x for x in probes if x <= limit], limit)
    out = {}
    for kind, logs in (res.get("ratios") or {}).items():
        pp = {int(s): v for s, v in (res.get("pair_probes") or {}).get(kind) or []}
        at = {int(s): v for s, v in (res.get("pair_places") or {}).get(kind) or []}
        rows = []
        for size, lr in logs:
            ns = pp.get(int(size)) or []
            if len(ns) != len(lr):
                return None
            where = _places_of(at, size, lr)
            fast = [(x, w) for x, p, w in zip(lr, ns, where) if p is not None and p <= limit]
            slow = [(x, w) for x, p, w in zip(lr, ns, where) if p is not None and p > limit]
            if min(len(fast), len(slow)) < FIRST_JOB_PHASE_PAIRS:
                return None
            rows.append((int(size), math.exp(_placed_log(*zip(*fast))),
                         math.exp(_placed_log(*zip(*slow)))))
        out[kind] = rows
    return (out, switch) if out else None


def _places_of(at, size, lr):
    """Each pair's placement at ``size`` (``at``: size -> the placements), None where not known."""
    return _aligned(at.get(int(size)), len(lr))


# Where the first jobs' pairs saw one phase of the machine only, the slow phase's rules are
# modelled: the banks' time taken to grow with rank 0's probe from the pairs' (their median) to the
# classification's limit (SLOW_FACTOR times their 10th percentile) and on, single copies' to stay;
# a group switches to them earlier, at ``switch_ns`` (below).  Measured so on the 2-core VM of the docs (the tuner's rounds of 2 ranks, fast
# phase at 40 ns, slow at 60-75 ns): the banks of all_to_all 16-64 KiB took 1.6-1.7x longer in the
# slow phase (3 -> 5 us, 10 -> 17), all_gather and reduce_scatter the same or more (all_reduce 64
# KiB 6 -> 14), broadcast at 145-160 ns 5-9x (3 -> 28 us at 64 KiB), while single copies held
# (5 -> 6, 13 -> 13, 6 -> 7): the modelled slowdown is the least the banks showed.  Without it, a
# first job measured in the fast state kept the banks in the slow one (all_to_all of 64 KiB: 24 us
# in 3 of 7 rounds of a benchmark against 7-10 in the others; single copies 7-9).
def modelled_phases(res):
    """The first jobs' pairs (``merge_paired``'s) where they saw one phase (``first_job_phases``
    None): ({kind: [(size, ratio, modelled slow-phase ratio)]}, the run-time threshold in ns,
    ``switch_ns`` of the pairs' probes),
    each ratio the second candidate's (single copies') time over the first's (the banks'), the
    median of the pairs at or under the classification's limit, the slow phase's that divided by
    the modelled slowdown of the banks (the limit / the median probe of those pairs; a pair whose probe went
    unanswered counts with them); a kind with a size measured in slower states only is left out;
    None without probes."""
    import math
    import statistics

    seen = _pair_probes(res)
    if seen is None:
        return None
    probes, limit = seen
    slowdown = limit / statistics.median([x for x in probes if x <= limit])
    out = {}
    for kind, logs in (res.get("ratios") or {}).items():
        pp = {int(s): v for s, v in (res.get("pair_probes") or {}).get(kind) or []}
        at = {int(s): v for s, v in (res.get("pair_places") or {}).get(kind) or []}
        rows = []
        for size, lr in logs:
            ns = pp.get(int(size)) or []
            # (a pair whose probe went unanswered counts with the phase seen)
            fast = [(x, w) for x, p, w in zip(lr, ns, _places_of(at, size, lr))
                    if p is None or p <= limit]
            if len(ns) != len(lr) or not fast:
                break   # a size measured only in the slow state: no model for the kind
            r = math.exp(_placed_log(*zip(*fast)))
            rows.append((int(size), r, r / slowdown))
        else:
            out[kind] = rows
    # the rules switch where a measured slow phase's would (``switch_ns``: 1.25x the highest probe
    # of the pairs, not at the classification's limit of twice their 10th percentile): measured at
    # 40-50 ns, a limit of 80-100 ns kept the banks at 60-75 ns, where they run 2x slower
    return (out, switch_ns([x for x in probes if x <= limit], limit)) if out else None


# A first job keeps a gap (``gap``: the banks again in a band above the threshold) only where each
# size of the band holds at least this many pairs (over the first jobs so far).
FIRST_JOB_GAP_PAIRS = 6


def _first_job_gaps(res, rows_by_kind, starts, tie):
    """{kind: [lo, hi)} of the first jobs' pairs: ``gap`` on each kind's rows (``rows_by_kind``,
    as ``crossover`` takes them; ``starts``: each kind's threshold), kept where every size of the
    band holds FIRST_JOB_GAP_PAIRS pairs.  Measured so on the 2-core VM of the docs (2 ranks):
    single copies won at 64 KiB and from 2 MiB blocks, the banks at 256 KiB-1 MiB, whose arrays sit
    on 4 KiB pages that single copies pin one at a time (all_gather of 1 MiB blocks 95 us through
    the banks, 139 by single copies)."""
    pairs = {k: {int(s): len(lr) for s, lr in v} for k, v in (res.get("ratios") or {}).items()}
    out = {}
    for kind, rows in rows_by_kind.items():
        band = gap(rows, starts.get(kind), tie)
        if band is None:
            continue
        lo, hi = band
        held = [pairs.get(kind, {}).get(int(s), 0) for s, *_ in rows if lo <= s < hi]
        if held and min(held) >= FIRST_JOB_GAP_PAIRS:
            out[kind] = band
    return out


def first_job_table(res, defaults):
    """The crossovers of a first job's measurement (``_paired``'s): ``_table``'s, except where a
    kind's second candidate never won up to the largest size measured and the built-in threshold
    lies above it, which the measurement says nothing against (the kind is left out: the
    constant stays; ``defaults``: the group's single-copy rules before, as ``cpg.rules[0]``, None
    for never), with the gaps the pairs hold (``_first_job_gaps``).  Where the pairs saw both of
    the machine's phases, each phase gets rules of its own (``first_job_phases``); where they saw
    one, the slow phase's are modelled (``modelled_phases``, without gaps: the banks modelled
    slower; the table's "phased" then says "slow_modelled")."""
    from .... import _C

    table = _table([res], gaps=False)
    table["cma_gap"] = _first_job_gaps(res, res["kinds"], table["cma_from"], _tie(res))
    split = first_job_phases(res)
    phases, model = [], None
    if split is not None:
        # pairs in both phases: the worse phase decides each size (as the tuner's measurements
        # that saw both: a tie in one phase is a clear win in the other), and each phase gets
        # rules of its own, which later jobs switch between at run time (tuning.phased_for)
        by_kind, limit = split
        both = {k: [(s, (1.0, 1.0), (f, sl)) for s, f, sl in rows] for k, rows in by_kind.items()}
        table["cma_from"] = {k: crossover(rows) for k, rows in both.items()}
        table["cma_gap"] = _first_job_gaps(res, both, table["cma_from"], 0.0)
        for ph in (0, 1):
            rows = {k: [(s, 1.0, r[ph]) for s, *r in v] for k, v in by_kind.items()}
            starts = {k: crossover(v) for k, v in rows.items()}
            phases.append({"cma_from": starts,
                           "cma_gap": _first_job_gaps(res, rows, starts, 0.0)})
    else:
        model = modelled_phases(res)
        if model is not None:
            # one phase seen: its rules as measured (with the tie), the slow phase's modelled
            by_kind, limit = model
            split = (by_kind, limit)
            slow = dict(table["cma_from"])   # (a kind the model leaves out: as measured)
            slow.update({k: crossover([(s, 1.0, sl) for s, _, sl in rows], SHM_TIE)
                         for k, rows in by_kind.items()})
            phases = [{"cma_from": dict(table["cma_from"]), "cma_gap": dict(table["cma_gap"])},
                      {"cma_from": slow, "cma_gap": {k: v for k, v in table["cma_gap"].items()
                                                     if k not in by_kind}}]
    top = max((r[-1][0] for r in res["kinds"].values() if r), default=0)
    for kind, v in list(table["cma_from"].items()):
        was = defaults[_C.KINDS[kind]["code"]]
        was = was[0] if isinstance(was, (tuple, list)) else was
        if v is None and was is not None and was > top:
            del table["cma_from"][kind]
            for t in phases:
                if t["cma_from"].get(kind, 0) is None:
                    del t["cma_from"][kind]
    if phases:
        table["phased"] = {"fast": phases[0], "slow": phases[1], "phase_ns": split[1]}
        if model is not None:
            table["phased"]["slow_modelled"] = True
    return table


# what this process's last first_job measurement took: {"seconds", "path"} (benchmarks print it)
last_first_job = None


def first_job(cpg, phases=True):
    """The first jobs on a host without rules measure the host as their default group starts
    (every rank calls it when rank 0's rules said ``tuning.PROBE``): both candidates of every
    kind at a few sizes on shared memory (``_paired``), added to what the earlier first jobs
    measured (``merge_paired``; tuning.FIRST_JOBS jobs in all), the crossovers worked out as the
    tuner does (``first_job_table``; rank 0's applied on every rank), and rank 0 writes them to
    the host's rules file for later jobs; ``phases``: each rank has a core, so the phase probe
    before each size measures the machine (``_paired``).  Returns (the crossovers applied,
    seconds it took, the file written or None)."""
    from . import tuning

    t0 = time.perf_counter()
    try:
        defaults = list(cpg.rules[0])
        res = _paired(cpg, list(_SHM_KINDS), first_job_sizes(), FIRST_JOB_PAIRS,
                      FIRST_JOB_BUDGET, phases)
        if cpg.rank == 0:   # (rank 0's crossovers are the ones every rank applies)
            res = merge_paired(res, tuning.claimed_measurement())
        table = first_job_table(res, defaults)
        # the phases' rules as a later job applies them (tuning.phased_for: where each rank has a
        # core to spin the probe on), so the first jobs switch phases too
        out = _apply(cpg, table, table.get("phased") if phases else None)
    except BaseException:
        if cpg.rank == 0:
            tuning.auto_release()
        raise
    seconds = time.perf_counter() - t0
    path = tuning.auto_save(cpg.size, res, table, seconds) if cpg.rank == 0 else None
    global last_first_job
    last_first_job = {"seconds": seconds, "path": path}
    if cpg.rank == 0:   # (the others applied the same)
        from ... import _observe

        _observe.info("measured this host's crossovers in %.2f s (one of its first jobs; %s): "
                      "single copies from %s", seconds, path or "not kept: the cache directory "
                      "cannot be written", out["cma_from"], rank=cpg.rank)
    return out, seconds, path


def _tie(res):
    """The tie of one measurement's crossovers: SHM_TIE on shared memory, unless the measurement
    saw both of the machine's phases (``_both_phases``): then each phase's times decide (see
    ``_table``), and they already hold what the tie stands in for."""
    if res["path"] != "shm" or _both_phases(res):
        return 0.0
    return SHM_TIE


def phased(res):
    """Whether a shared-memory measurement can give each of the machine's phases rules of its
    own (``_table(..., phase=)``), which a group switches between at run time: both phases seen,
    the slow one in at least PHASED_ROUNDS rounds, classified by the run-time probe
    (``probe_phase``; older measurements' probe measured something else)."""
    ph = res.get("phases") or {}
    if res.get("path") != "shm" or res.get("probe") != "pingpong" or ph.get("phases") != 2:
        return False
    limit = ph.get("slow_above_ns") or 0
    slow = sum(1 for v in (res.get("rounds") or {}).values() for _, rs in v for r in rs
               if r[0] is not None and r[0] > limit)
    return slow >= PHASED_ROUNDS


def _table(results, gaps=True, phase=None):
    """{"cma_from": {kind: bytes or None}, "cma_gap": {kind: [lo, hi]}, "small_bytes": {kind:
    bytes}} from one rank count's measurements (``gaps``: look for them; online tuning measures
    too few rounds, 4x apart, to tell a second crossing from noise).  ``phase`` 0 or 1: the rules
    of the fast or the slow phase alone, from the rounds in that phase (``phased``)."""
    t = {"cma_from": {}, "cma_gap": {}, "small_bytes": {}}
    for res in results:
        # both phases seen (shared memory): each size's loss is the worse phase's (crossover), on
        # the ratios smoothed over neighbouring sizes; or one phase's, for that phase's rules
        both = phased(res) if phase is not None else _both_phases(res)
        by_phase = phase_times(res)[0] if both else None
        for kind, rows in res["kinds"].items():
            if by_phase and len(by_phase.get(kind) or ()) == len(rows):
                rows = smooth_phases(by_phase[kind])
                if phase is not None:
                    rows = [(size, (a[phase],), (b[phase],)) for size, a, b in rows]
            start = crossover(rows, _tie(res))
            if res["path"] == "shm":
                t["cma_from"][kind] = start
                rounds = [len(r[1]) for r in (res.get("rounds") or {}).get(kind) or []]
                enough = bool(rounds) and min(rounds) >= GAP_ROUNDS
                band = gap(rows, start, _tie(res)) if gaps and enough else None
                if band is not None:
                    t["cma_gap"][kind] = band
            else:
                if start is None:
                    t["small_bytes"][kind] = _NEVER_SMALL
                else:  # direct through the last size where it won
                    below = [s for s, _, _ in rows if s < start]
                    t["small_bytes"][kind] = below[-1] if below else max(1, start - 1)
        if res["path"] == "shm" and not res["single_copy"]:
            t["note"] = "single copies (cross-memory attach) are not possible on this host"
    return t
