"""The README's multi-node guide, Kubernetes part: a Kubeflow PyTorchJob starts one pod per rank with
MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK set (and nothing else: no LOCAL_RANK, no launcher).
Two processes with exactly that environment, as two pods (distinct PYDDP_NODE_ID: TCP, as between
hosts), run init_process_group() with no arguments, an all_reduce and a DistributedSampler epoch."""
import json
import subprocess
import sys

import pytest

from _launch import launcher_env
from _mp import free_port

pytestmark = pytest.mark.timeout(120)

POD = r"""
import json, os, sys
import numpy as np
import pyddp.distributed as dist
from pyddp.utils.data.distributed import DistributedSampler

dist.init_process_group()            # env://, the variables the PyTorchJob operator sets
r, n = dist.get_rank(), dist.get_world_size()
x = np.full(3, r + 1.0)
dist.all_reduce(x)
s = DistributedSampler(range(10), shuffle=True, seed=3)
s.set_epoch(1)
out = {"rank": r, "world": n, "sum": x.tolist(), "indices": list(s),
       "transport": dist.distributed_c10d._default_pg()._transport}
dist.destroy_process_group()
print("POD " + json.dumps(out), flush=True)
"""


def test_kubeflow_pytorchjob_environment():
    port = free_port()
    procs = []
    for rank in range(2):
        env = launcher_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=2, RANK=rank,
                           PYDDP_NODE_ID=f"pod-{rank}")
        procs.append(subprocess.Popen([sys.executable, "-c", POD], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=90)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    res = {}
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        d = json.loads(out.split("POD ", 1)[1])
        res[d["rank"]] = d
    assert sorted(res) == [0, 1]
    for d in res.values():
        assert d["world"] == 2 and d["sum"] == [3.0, 3.0, 3.0] and d["transport"] == "tcp"
    a, b = res[0]["indices"], res[1]["indices"]
    assert len(a) == len(b) == 5 and sorted(a + b) == list(range(10))
