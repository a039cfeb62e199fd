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

import _paths
from _mp import _SCRUB, free_port
from _tiers import FULL

pytestmark = pytest.mark.timeout(240)

REPO = _paths.ROOT
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
    results = []
    for rank in range(world_size):
        path = os.path.join(out_dir, f"{rank}.json")
        assert os.path.exists(path), \
            f"rank {rank} wrote no result:\n" + "\n----\n".join(o[-3000:] for o in outs)
        with open(path) as fh:
            got = json.load(fh)
        np.testing.assert_array_equal(np.array(got["sum"]), want)
        assert got["object"] == {"from": 0, "n": 42}
        results.append(got)
    return results


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


@pytest.mark.parametrize("scheme", ["env", "tcp"])
def test_two_shells_each_spawning_half_of_a_job_run(tmp_path, scheme):
    # python main.py --nodes 2 --nr 0 & python main.py --nodes 2 --nr 1 (torch runs this unchanged)
    port = free_port()
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    init = "env://" if scheme == "env" else f"tcp://127.0.0.1:{port}"
    results, outs = _two_halves(tmp_path, init, lambda nr: base,
                                lambda nr: ["--nodes", "2", "--nr", str(nr)])
    # the spawns' secrets, each known to half the job only, were not used ...
    assert not any(r["secret"] for r in results)
    # ... and each shell says once that its job runs without one, naming PYDDP_SECRET
    for nr, out in enumerate(outs):
        assert out.count("runs without a secret") == 1, f"node {nr}:\n{out[-3000:]}"
        assert "PYDDP_SECRET" in out


_TORCH_MAIN = textwrap.dedent(r"""
    import json, os, sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import pyddp.torch_backend  # noqa: F401
    import pyddp.multiprocessing as mp


    def train(gpu, nr, out):
        rank = nr * 2 + gpu
        dist.init_process_group("pyddp", init_method="env://", world_size=4, rank=rank,
                                timeout=timedelta(seconds=30))
        x = torch.arange(5, dtype=torch.float64) * (rank + 1)
        dist.all_reduce(x)
        with open(os.path.join(out, f"{rank}.json"), "w") as f:
            json.dump({"sum": x.tolist(), "object": {"from": 0, "n": 42},
                       "secret": bool(os.environ.get("PYDDP_SECRET"))}, f)
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(train, nprocs=2, args=(int(sys.argv[1]), sys.argv[2]))
""")


def test_two_shells_each_spawning_half_of_a_torch_job_on_the_pyddp_backend_run(tmp_path):
    # the same with torch.distributed on pyddp's backend: torch's store, pyddp's connections
    pytest.importorskip("torch")
    script = tmp_path / "main.py"
    script.write_text(_TORCH_MAIN)
    out = tmp_path / "out"
    out.mkdir()
    env = _env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    logs = [open(tmp_path / f"node{nr}.log", "w+") for nr in range(2)]
    procs = [_start(str(script), [str(nr), str(out)], env, logs[nr]) for nr in range(2)]
    codes, outs = _wait_all(procs, logs)
    for log in logs:
        log.close()
    assert codes == [0, 0], "\n----\n".join(o[-4000:] for o in outs)
    results = _check_results(str(out), 4, outs)
    assert not any(r["secret"] for r in results)
    for nr, text in enumerate(outs):
        assert text.count("runs without a secret") == 1, f"node {nr}:\n{text[-3000:]}"


def test_two_shells_with_the_same_exported_secret_keep_it(tmp_path):
    # the recipe the warning gives: export PYDDP_SECRET in every shell; nothing to say then
    port = free_port()
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYDDP_SECRET": "c" * 64}
    results, outs = _two_halves(tmp_path, "env://", lambda nr: base,
                                lambda nr: ["--nodes", "2", "--nr", str(nr)])
    assert all(r["secret"] for r in results)
    assert not any("runs without a secret" in out for out in outs), outs


def test_slurm_tasks_each_spawning_with_file_init_run(tmp_path):
    # one mp.spawn per Slurm task (SLURM_PROCID / SLURM_NTASKS), file:// init on a shared file
    init = "file://" + str(tmp_path / "rdzv")
    results, outs = _two_halves(tmp_path, init,
                                lambda nr: {"SLURM_PROCID": str(nr), "SLURM_NTASKS": "2",
                                            "SLURM_LOCALID": "0", "SLURM_NODEID": str(nr)},
                                lambda nr: [])
    # the job shares a secret through the file (created 0600): connections still authenticate
    assert all(r["secret"] for r in results)
    assert not any("runs without a secret" in out for out in outs), outs


@FULL
def test_a_slurm_task_whose_rank_0_shares_no_secret_says_so(tmp_path):
    # task 0 has PYDDP_SECRET exported, task 1 not: task 1's ranks wait for a secret from rank 0
    # through the file that never comes, and say why at their timeout instead of a bare key name
    script = tmp_path / "main.py"
    script.write_text(_MAIN)
    out = tmp_path / "out"
    out.mkdir()
    init = "file://" + str(tmp_path / "rdzv")
    logs = [open(tmp_path / f"task{nr}.log", "w+") for nr in range(2)]
    procs = []
    for nr in range(2):
        env = {"SLURM_PROCID": str(nr), "SLURM_NTASKS": "2"}
        if nr == 0:
            env["PYDDP_SECRET"] = "d" * 64
        procs.append(_start(str(script), ["--init", init, "--out", str(out), "--timeout", "8"], _env(env),
                            logs[nr]))
    codes, outs = _wait_all(procs, logs)
    for log in logs:
        log.close()
    assert codes[1] != 0, outs[1][-3000:]
    assert "rank 0 shared no secret through" in outs[1] and "PYDDP_SECRET" in outs[1], outs[1][-3000:]


def test_slurm_tasks_with_a_file_others_can_read_run_without_a_secret_and_say_so(tmp_path):
    # a rendezvous file made beforehand with the umask's 0644: a secret written there would be
    # anyone's, so the job shares none and each task's spawn says so once
    path = tmp_path / "rdzv"
    path.touch()
    os.chmod(path, 0o644)
    results, outs = _two_halves(tmp_path, "file://" + str(path),
                                lambda nr: {"SLURM_PROCID": str(nr), "SLURM_NTASKS": "2"},
                                lambda nr: [])
    assert not any(r["secret"] for r in results)
    for nr, out in enumerate(outs):
        assert out.count("runs without a secret") == 1, f"task {nr}:\n{out[-3000:]}"
        assert "other users can read it" in out and "PYDDP_SECRET" in out


# A rank of a two-rank job, started by hand: rank and secret from the command line.
_RANK = textwrap.dedent(r"""
    import json, os, sys
    from datetime import timedelta

    import numpy as np
    import pyddp.distributed as dist

    rank, init, out, timeout = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
    dist.init_process_group("gloo", init_method=init, world_size=2, rank=rank,
                            timeout=timedelta(seconds=timeout))
    x = np.arange(3, dtype=np.float64) + rank
    dist.all_reduce(x)
    with open(out, "w") as f:
        json.dump(x.tolist(), f)
    dist.destroy_process_group()
""")


def _wait_for_text(path, text, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(path, errors="replace") as fh:
            got = fh.read()
        if text in got:
            return got
        time.sleep(0.1)
    with open(path, errors="replace") as fh:
        return fh.read()


def test_the_store_host_says_at_once_that_it_refused_a_peer_and_the_job_still_runs(tmp_path):
    # rank 0's store server refuses rank 1's secret: rank 0 once waited without a word until its
    # timeout.  It says so at once, naming the peer's address and PYDDP_SECRET, and goes on
    # waiting: a stranger can claim to be anyone and must not be able to stop the job, so the
    # right rank 1 still joins it.
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    logs = [open(tmp_path / f"{name}.log", "w+") for name in ("rank0", "wrong", "rank1")]
    outs = [str(tmp_path / f"{name}.json") for name in ("rank0", "wrong", "rank1")]
    start = time.monotonic()
    procs = [_start(str(script), ["0", "env://", outs[0], "60"], _env(dict(base, PYDDP_SECRET="a" * 64)),
                    logs[0])]
    wrong = None
    try:
        wrong = _start(str(script), ["1", "env://", outs[1], "60"], _env(dict(base, PYDDP_SECRET="b" * 64)),
                       logs[1])
        assert wrong.wait(timeout=WAIT) != 0
        said = _wait_for_text(logs[0].name, "refused a connection", 20)
        assert "refused a connection" in said, said
        assert time.monotonic() - start < 40, "the host said it only at its timeout"
        assert "127.0.0.1:" in said and "PYDDP_SECRET" in said, said
        assert procs[0].poll() is None, "a refused peer stopped the host:\n" + said
        procs.append(_start(str(script), ["1", "env://", outs[2], "60"],
                            _env(dict(base, PYDDP_SECRET="a" * 64)), logs[2]))
    finally:
        if wrong is not None and wrong.poll() is None:
            wrong.kill()
            wrong.wait(timeout=30)
        codes, texts = _wait_all(procs, [logs[0], logs[2]][:len(procs)])
        for log in logs:
            log.close()
    assert codes == [0, 0], "\n----\n".join(t[-3000:] for t in texts)
    want = (np.arange(3) * 2 + 1).tolist()
    assert [json.load(open(outs[i])) for i in (0, 2)] == [want, want]


@FULL
def test_rank_0_says_at_once_that_it_refused_a_peer_and_names_it_at_its_timeout(tmp_path):
    # file:// has no store server: rank 0's transport listener refuses rank 1's secret.  Rank 0
    # once reported only "no connection arrived before the deadline".  (A FileStore job cannot
    # take a restarted rank: the refused one already counted itself in the file.)
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    url = f"file://{tmp_path / 'rdzv'}"
    logs = [open(tmp_path / f"{name}.log", "w+") for name in ("rank0", "wrong")]
    start = time.monotonic()
    procs = [_start(str(script), ["0", url, str(tmp_path / "0.json"), "20"],
                    _env({"PYDDP_SECRET": "a" * 64}), logs[0])]
    try:
        procs.append(_start(str(script), ["1", url, str(tmp_path / "1.json"), "20"],
                            _env({"PYDDP_SECRET": "b" * 64}), logs[1]))
        said = _wait_for_text(logs[0].name, "refused a connection", 15)
        assert "refused a connection" in said, said
        assert time.monotonic() - start < 18, "rank 0 said it only at its timeout"
        assert "rank 0 refused a connection" in said and "PYDDP_SECRET" in said, said
    finally:
        codes, texts = _wait_all(procs, logs)
        for log in logs:
            log.close()
    assert codes[0] != 0 and codes[1] != 0
    assert "no connection arrived before the deadline; meanwhile 1 connection was refused, the last: " \
        "authentication of client 127.0.0.1:" in texts[0], texts[0][-3000:]
