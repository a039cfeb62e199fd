"""torchrun's elasticity for plain scripts: ``pyddp-run --nnodes 1:2 --rdzv-backend c10d
--rdzv-endpoint HOST:PORT --max-restarts N script.py``, with two launchers on this host.

* a node joining late: the first launcher's workers start with WORLD_SIZE 2 (one node, two
  processes); when the second launcher arrives every worker restarts with WORLD_SIZE 4, without
  counting a restart (torchrun: membership changes do not count as retries), and resumes from the
  script's own snapshot;
* a node lost (its launcher SIGKILLed): the survivors' workers fail (their peer is gone) and restart
  with WORLD_SIZE 2 and TORCHELASTIC_RESTART_COUNT 1;
* with --max-restarts 0 the same loss ends the job with an error;
* a range without c10d (or --elastic) is refused naming both.

The script is an ordinary DDP-style script: it reads WORLD_SIZE / RANK / TORCHELASTIC_RESTART_COUNT
and its snapshot, all-reduces until the test drops a stop file, and leaves a marker file per start.
Every wait has a timeout.
"""
import os
import signal

import pytest

from _launch import assert_all_gone, finish, kill_group, launcher_env, run, start, wait_for, \
    write_script

pytestmark = pytest.mark.timeout(300)

SCRIPT = r'''
import os, sys, time
import numpy as np
import pyddp.distributed as dist

ctl = sys.argv[1]
rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
snap = os.path.join(ctl, "snapshot")
step = int(open(snap).read()) if os.path.exists(snap) else 0
print(f"START WORLD_SIZE={ws} RANK={rank} RESTART={restart} STEP={step}", flush=True)
with open(os.path.join(ctl, f"ws{ws}.rank{rank}.restart{restart}.pid{os.getpid()}"), "w") as f:
    f.write(str(step))
dist.init_process_group("gloo")
deadline = time.time() + 150
while time.time() < deadline:
    flag = np.array([1.0 if os.path.exists(os.path.join(ctl, "stop")) else 0.0, 1.0])
    dist.all_reduce(flag)
    assert flag[1] == ws
    if flag[0] > 0:
        break
    step += 1
    if rank == 0:
        with open(snap + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(snap + ".tmp", snap)
    time.sleep(0.05)
dist.destroy_process_group()
print(f"END WORLD_SIZE={ws} RANK={rank} RESTART={restart}", flush=True)
'''


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _markers(ctl, prefix):
    return sorted(n for n in os.listdir(ctl) if n.startswith(prefix))


def _args(port, script, ctl, restarts=3):
    return ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", restarts,
            "--monitor-interval", "0.1", script, ctl]


@pytest.fixture
def job(tmp_path):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    script = write_script(tmp_path, "plain.py", SCRIPT)
    env = launcher_env(PYDDP_SECRET="rdzv-test-secret", OMP_NUM_THREADS=1)
    procs = []
    yield str(ctl), script, env, procs
    for p in procs:
        kill_group(p)


def test_node_joins_late_then_a_node_is_lost(job):
    ctl, script, env, procs = job
    port = _free_port()
    a = start(_args(port, script, ctl), env=env)
    procs.append(a)
    # one node: two workers, world size 2
    wait_for(lambda: len(_markers(ctl, "ws2.")) == 2, 60, "the first node's workers")
    b = start(_args(port, script, ctl), env=env)
    procs.append(b)
    # the second node joins: every worker restarts with world size 4, restart count unchanged
    wait_for(lambda: len(_markers(ctl, "ws4.")) == 4, 90, "four workers after the join")
    assert all(".restart0." in n for n in _markers(ctl, "ws4."))
    resumed = [int(open(os.path.join(ctl, n)).read()) for n in _markers(ctl, "ws4.")]
    assert min(resumed) > 0      # from the script's snapshot, not from step 0
    b_pids = [int(n.rpartition("pid")[2]) for n in _markers(ctl, "ws4.")]
    # the second node is lost: its launcher is killed
    os.kill(b.pid, signal.SIGKILL)
    wait_for(lambda: len(_markers(ctl, "ws2.rank0.restart1")) == 1 and
             len(_markers(ctl, "ws2.rank1.restart1")) == 1, 90,
             "the survivors' restart with world size 2")
    open(os.path.join(ctl, "stop"), "w").close()
    rc, out, err = finish(a, timeout=90)
    assert rc == 0, out + err
    assert "START WORLD_SIZE=2 RANK=0 RESTART=0" in out
    assert "START WORLD_SIZE=4" in out
    assert "END WORLD_SIZE=2 RANK=0 RESTART=1" in out and "END WORLD_SIZE=2 RANK=1 RESTART=1" in out
    assert "not counted as a restart" in err and "restart 1 of 3" in err
    finish(b, timeout=30)
    assert_all_gone(b_pids, timeout=30)


def test_lost_node_without_restarts_fails_the_job(job):
    ctl, script, env, procs = job
    port = _free_port()
    a = start(_args(port, script, ctl, restarts=0), env=env)
    procs.append(a)
    wait_for(lambda: len(_markers(ctl, "ws2.")) == 2, 60, "the first node's workers")
    b = start(_args(port, script, ctl, restarts=0), env=env)
    procs.append(b)
    wait_for(lambda: len(_markers(ctl, "ws4.")) == 4, 90, "four workers after the join")
    os.kill(b.pid, signal.SIGKILL)
    rc, out, err = finish(a, timeout=90)
    assert rc == 1, out + err
    assert "END WORLD_SIZE" not in out
    assert not _markers(ctl, "ws2.rank0.restart1")
    finish(b, timeout=30)


def test_a_range_needs_c10d_or_elastic(tmp_path):
    script = write_script(tmp_path, "plain.py", "print('never')\n")
    rc, out, err = run(["--nnodes", "1:2", "--nproc-per-node", "1", script], timeout=60)
    assert rc == 2 and "--rdzv-backend c10d" in err and "--elastic" in err and "never" not in out
