"""Ctrl-C (SIGINT) interrupts a blocking collective that waits for a rank that never comes,
as it must in a terminal or a Jupyter notebook; the group and its arrays stay consistent."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import _paths

ROOT = _paths.ROOT
CHILD = r"""
import os, sys, time
sys.path.insert(0, os.environ["PYDDP_ROOT"])
import numpy as np
import pyddp.distributed as dist
dist.init_process_group("cpu")
if dist.get_rank() == 1:
    time.sleep(60)          # never joins the collective; killed by the test
    sys.exit(0)
print("ready", flush=True)
x = np.ones(10)
t = time.time()
try:
    dist.all_reduce(x)
    print("no interrupt", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.time() - t:.2f}", flush=True)
    os._exit(0)
"""


@pytest.mark.timeout(120)
def test_ctrl_c_interrupts_a_blocking_collective():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYDDP_ROOT=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    try:
        line = ""
        deadline = time.time() + 60
        while "ready" not in line and time.time() < deadline:
            line = procs[0].stdout.readline()
            if not line and procs[0].poll() is not None:
                break
        assert "ready" in line, f"rank 0 did not start: {line!r}"
        time.sleep(0.5)
        procs[0].send_signal(signal.SIGINT)
        out, _ = procs[0].communicate(timeout=20)
        assert "interrupted after" in out, out
        assert procs[0].returncode == 0, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=20)


CHILD_RESUME = r"""
import os, sys, time
sys.path.insert(0, os.environ["PYDDP_ROOT"])
import numpy as np
import pyddp.distributed as dist
dist.init_process_group("cpu")
r = dist.get_rank()
if r == 1:
    time.sleep(float(os.environ["LATE"]))   # joins late: rank 0 is interrupted meanwhile
x = np.full(1000, r + 1.0)
out = np.zeros(2000)
if r == 0:
    print("ready", flush=True)
    try:
        dist.all_gather_into_tensor(out, x)
        print("no interrupt", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
else:
    dist.all_gather_into_tensor(out, x)
# the interrupted collective still completes, in order, before the next one
y = np.full(10, r + 1.0)
dist.all_reduce(y)
assert np.array_equal(y, np.full(10, 3.0)), y
assert np.array_equal(out, np.concatenate([np.full(1000, 1.0), np.full(1000, 2.0)])), out
print("consistent", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_an_interrupted_collective_still_completes_in_order(transport):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYDDP_ROOT=ROOT, LATE="3", PYDDP_TRANSPORT=transport)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD_RESUME], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    try:
        line = procs[0].stdout.readline()
        assert "ready" in line, line
        time.sleep(1.0)
        procs[0].send_signal(signal.SIGINT)
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert "interrupted" in outs[0], outs
        for p, out in zip(procs, outs):
            assert "consistent" in out and p.returncode == 0, outs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
