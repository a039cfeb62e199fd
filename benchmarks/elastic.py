"""Elastic recovery against restarting from a checkpoint, in the same run.

    python benchmarks/elastic.py                      # 2 and 4 ranks, prints the table
    python benchmarks/elastic.py --nproc 2 --params 1M --steps 60 --rounds 3

A training loop whose step is one all_reduce of ``--params`` float32 gradients plus a little
compute, launched with pyddp-run on this machine, in four ways:

- plain: no elastic, no checkpoints (the step time every other row is compared with);
- elastic: ``pyddp.elastic`` with ``state.commit()`` after every step (its cost: the step time's
  ratio to plain);
- elastic, one worker SIGKILLed at the middle step: recovery time = from the kill to the end of the
  survivors' first step after it (the group re-formed without it, the state rolled back, the step
  redone), and again when the replacement joins at a later commit;
- restart: ``--max-restarts 1`` without elastic, the state saved to disk (``np.save``) every step:
  from the kill to the end of the first step after every worker restarted and loaded it.

Each configuration runs ``--rounds`` times; the table gives medians.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _report  # noqa: E402

WORKER = textwrap.dedent('''
    import json, os, signal, sys, time
    import numpy as np
    import pyddp.distributed as dist

    P, STEPS, MODE, KILL, CKPT = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                  sys.argv[5])
    OUT = os.path.join(os.path.dirname(CKPT), "out")

    def emit(obj):  # one file per record: the workers share the launcher's stdout
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, f"{os.getpid()}-{time.time_ns()}.json"), "w") as f:
            json.dump(obj, f)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    me = os.environ.get("PYDDP_ELASTIC_ID", os.environ.get("RANK"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)

    class Model:
        def __init__(self):
            self.w = np.zeros(P, dtype=np.float32)
        def state_dict(self):
            return {"w": self.w}
        def load_state_dict(self, sd):
            self.w[...] = sd["w"]

    log = []

    def tag():  # 0 before any failure: the generation (elastic) or the restart count
        if MODE == "elastic":
            import pyddp.elastic as elastic
            g = elastic.current_generation()
            return g[0] if g else 0
        return restart

    def step(model, s):
        y = np.tanh(x @ x.T)  # a little compute
        g = np.full(P, float(y[0, 0]) * 1e-3, dtype=np.float32)
        dist.all_reduce(g)
        model.w -= g
        log.append((s, time.time(), tag()))

    def maybe_die(s):
        if s == KILL and me in ("1", "0.1.1") and restart == 0:  # local rank 1, first start
            emit({"killed": time.time()})
            os.kill(os.getpid(), signal.SIGKILL)

    if MODE in ("plain", "restart"):
        dist.init_process_group("cpu")
        model, s = Model(), 0
        if MODE == "restart" and os.path.exists(CKPT):
            sd = np.load(CKPT)
            model.w[...] = sd[:-1]
            s = int(sd[-1])
        while s < STEPS:
            step(model, s)
            s += 1
            if MODE == "restart":
                if dist.get_rank() == 0:
                    np.save(CKPT + ".tmp.npy", np.append(model.w, np.float32(s)))
                    os.replace(CKPT + ".tmp.npy", CKPT)
                dist.barrier()
                maybe_die(s)
        dist.destroy_process_group()
    else:
        import pyddp.elastic as elastic

        state = elastic.State(model=Model(), s=0)

        @elastic.run
        def train(state):
            while state.s < STEPS:
                step(state.model, state.s)
                state.s += 1
                maybe_die(state.s)
                state.commit()

        train(state)
    emit({"id": me, "log": log})
''')


def parse_count(text):
    t = text.strip().upper()
    mult = {"K": 1_000, "M": 1_000_000}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def run_job(nproc, mode, args, tmp):
    script = os.path.join(tmp, "worker.py")
    ckpt = os.path.join(tmp, "ckpt.npy")
    if os.path.exists(ckpt):
        os.remove(ckpt)
    outdir = os.path.join(tmp, "out")
    shutil.rmtree(outdir, ignore_errors=True)
    kill = args.steps // 2 if mode in ("kill", "restart") else -1
    launch = ["--elastic", "--max-restarts", "1"] if mode in ("elastic", "kill") else \
        ["--max-restarts", "1"] if mode == "restart" else []
    wmode = {"kill": "elastic"}.get(mode, mode)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pyddp.run", "--standalone", "--nproc-per-node", str(nproc),
           *launch, script, str(args.params), str(args.steps), wmode, str(kill), ckpt]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{mode} on {nproc} ranks failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    out = []
    for name in sorted(os.listdir(outdir)):
        with open(os.path.join(outdir, name)) as f:
            out.append(json.load(f))
    killed = [o["killed"] for o in out if "killed" in o]
    logs = [o["log"] for o in out if "log" in o]
    return killed, logs


def step_time(logs):
    """Median seconds between consecutive steps of rank logs (the first 3 steps left out)."""
    d = []
    for log in logs:
        ts = [t for _, t, _ in log]
        d += [b - a for a, b in zip(ts[3:], ts[4:])]
    return statistics.median(d) if d else float("nan")


def recovery(killed, logs):
    """Seconds from the kill to the end of the first step after the recovery (a step in a later
    generation, or of a restarted worker), the earliest over ranks; None without a kill."""
    if not killed:
        return None
    after = [t for log in logs for _, t, tag in log if tag > 0]
    return min(after) - killed[0] if after else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", default="2,4", help="comma-separated rank counts (default 2,4)")
    ap.add_argument("--params", type=parse_count, default=parse_count("1M"),
                    help="float32 gradients per step (default 1M)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pyddp-elastic-bench-") as tmp:
        with open(os.path.join(tmp, "worker.py"), "w") as f:
            f.write(WORKER)
        for n in [int(x) for x in args.nproc.split(",")]:
            res = {m: [] for m in ("plain", "elastic", "kill", "restart")}
            for _ in range(args.rounds):
                for mode in res:  # alternating: drift of the machine hits every mode alike
                    res[mode].append(run_job(n, mode, args, tmp))
            plain = statistics.median(step_time(logs) for _, logs in res["plain"])
            el = statistics.median(step_time(logs) for _, logs in res["elastic"])
            rec = [recovery(k, logs) for k, logs in res["kill"]]
            rst = [recovery(k, logs) for k, logs in res["restart"]]
            rec = [r for r in rec if r is not None]
            rst = [r for r in rst if r is not None]
            rows.append([n, f"{plain * 1e3:.2f}", f"{el * 1e3:.2f}", f"{el / plain:.3f}",
                         f"{statistics.median(rec) * 1e3:.0f}" if rec else "-",
                         f"{statistics.median(rst) * 1e3:.0f}" if rst else "-",
                         f"{statistics.median(rst) / statistics.median(rec):.1f}x"
                         if rec and rst else "-"])
    print(_report.block(
        f"Elastic recovery, {args.params:,} float32 gradients a step, {args.steps} steps, "
        f"median of {args.rounds} runs",
        ["ranks", "step ms (plain)", "step ms (elastic, commit each step)", "/ plain",
         "recovery ms (elastic)", "recovery ms (restart + checkpoint)", "restart / elastic"],
        rows, notes=["recovery: from the SIGKILL of one worker to the end of the first step after "
                     "it on a survivor (elastic: re-formed without it, rolled back to its commit; "
                     "restart: every worker restarted by --max-restarts, the checkpoint loaded)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
