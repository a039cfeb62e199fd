"""A job whose halves are started apart, each with pyddp.multiprocessing.spawn (issue 50, item 4).

The README recipe of many DDP tutorials starts every "node" from its own shell, `python main.py
--nodes 2 --nr 0` and `--nr 1`, each calling `mp.spawn(train, nprocs=gpus)`; Slurm scripts call
`mp.spawn` in every task with file:// init.  Torch runs them unchanged.  Each spawn once invented a
secret of its own: node 1 was refused and node 0, the store host, waited without a word until its
timeout.  Here both halves run on this host, as real processes, with a deadline on every wait."""
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from _mp import _SCRUB, free_port

pytestmark = pytest.mark.timeout(240)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT = 120.0

# The tutorial's main.py, as written for torch (imports changed): rank = nr * gpus + gpu.
_MAIN = textwrap.dedent(r"""
    import argparse, json, os, sys
    from datetime import timedelta

    import numpy as np
    import pyddp.distributed as dist
    import pyddp.multiprocessing as mp


    def train(gpu, args):
        rank = args.nr * args.gpus + gpu
        dist.init_process_group("gloo", init_method=args.init, world_size=args.world_size, rank=rank,
                                timeout=timedelta(seconds=args.timeout))
        x = np.arange(5, dtype=np.float64) * (rank + 1)
        dist.all_reduce(x)
        objs = [{"from": rank, "n": 42}] if rank == 0 else [None]
        dist.broadcast_object_list(objs, src=0)
        with open(os.path.join(args.out, f"{rank}.json"), "w") as f:
            json.dump({"sum": x.tolist(), "object": objs[0],
                       "secret": bool(os.environ.get("PYDDP_SECRET"))}, f)
        dist.destroy_process_group()


    if __name__ == "__main__":
        p = argparse.ArgumentParser()
        p.add_argument("--nodes", type=int, default=int(os.environ.get("SLURM_NTASKS", 1)))
        p.add_argument("--gpus", type=int, default=2)
        p.add_argument("--nr", type=int, default=int(os.environ.get("SLURM_PROCID", 0)))
        p.add_argument("--init", default="env://")
        p.add_argument("--out", required=True)
        p.add_argument("--timeout", type=float, default=30.0)
        args = p.parse_args()
        args.world_size = args.gpus * args.nodes
        mp.spawn(train, nprocs=args.gpus, args=(args,))
""")


def _env(extra):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PYTHONPATH"] = os.pathsep.join([REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def _start(script, argv, env, log):
    return subprocess.Popen([sys.executable, script] + argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_all(procs, logs, timeout=WAIT):
    """Wait for every process (killing all at the deadline); their exit codes and outputs."""
    end = time.monotonic() + timeout
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(0.1, end - time.monotonic())))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    outs = []
    for log in logs:
        log.flush()
        with open(log.name, errors="replace") as fh:
            outs.append(fh.read())
    return [p.returncode for p in procs], outs


def _check_results(out_dir, world_size, outs):
    want = sum(np.arange(5, dtype=np.float64) * (r + 1) for r in range(world_size))
    for rank in range(world_size):
        path = os.path.join(out_dir, f"{rank}.json")
        assert os.path.exists(path), f"rank {rank} wrote no result:\n" + "\n----\n".join(o[-3000:] for o in outs)
        with open(path) as fh:
            got = json.load(fh)
        np.testing.assert_array_equal(np.array(got["sum"]), want)
        assert got["object"] == {"from": 0, "n": 42}
    return [json.load(open(os.path.join(out_dir, f"{r}.json"))) for r in range(world_size)]


def _two_halves(tmp_path, init, env_extra, argv_of):
    script = tmp_path / "main.py"
    script.write_text(_MAIN)
    out = tmp_path / "out"
    out.mkdir()
    procs, logs = [], []
    for nr in range(2):
        log = open(tmp_path / f"node{nr}.log", "w+")
        logs.append(log)
        argv = ["--gpus", "2", "--init", init, "--out", str(out), "--timeout", "30"] + argv_of(nr)
        procs.append(_start(str(script), argv, _env(env_extra(nr)), log))
    codes, outs = _wait_all(procs, logs)
    for log in logs:
        log.close()
    assert codes == [0, 0], "\n----\n".join(f"node {i} exit {c}:\n{o[-4000:]}" for i, (c, o) in
                                            enumerate(zip(codes, outs)))
    return _check_results(str(out), 4, outs), outs


def test_two_shells_each_spawning_half_of_an_env_job_run(tmp_path):
    # python main.py --nodes 2 --nr 0 & python main.py --nodes 2 --nr 1 (torch runs this unchanged)
    port = free_port()
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    results, outs = _two_halves(tmp_path, "env://", lambda nr: base,
                                lambda nr: ["--nodes", "2", "--nr", str(nr)])
    # the spawns' secrets, each known to half the job only, were not used ...
    assert not any(r["secret"] for r in results)
    # ... and each shell says once that its job runs without one, naming PYDDP_SECRET
    for nr, out in enumerate(outs):
        assert out.count("runs without a secret") == 1, f"node {nr}:\n{out[-3000:]}"
        assert "PYDDP_SECRET" in out


def test_slurm_tasks_each_spawning_with_file_init_run(tmp_path):
    # one mp.spawn per Slurm task (SLURM_PROCID / SLURM_NTASKS), file:// init on a shared file
    init = "file://" + str(tmp_path / "rdzv")
    results, outs = _two_halves(tmp_path, init,
                                lambda nr: {"SLURM_PROCID": str(nr), "SLURM_NTASKS": "2",
                                            "SLURM_LOCALID": "0", "SLURM_NODEID": str(nr)},
                                lambda nr: [])
    # the job shares a secret through the file (created 0600): connections still authenticate
    assert all(r["secret"] for r in results)
