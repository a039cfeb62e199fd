"""A group spanning two hosts: two network namespaces joined by a veth pair, two ranks in each.

Checks that ranks advertise an address their peers can reach (the interface that reaches
MASTER_ADDR), that the TCP mesh and the store work across hosts, with PYDDP_SECRET set.
Needs root and iproute2 (`ip netns`); skipped otherwise."""
import os
import subprocess
import sys

import pytest

import _paths
from _netns import two_hosts  # noqa: F401  (the fixture)

ROOT = _paths.ROOT

CHILD = r"""
import os, sys
import numpy as np
sys.path.insert(0, os.environ["PYDDP_ROOT"])
import pyddp.distributed as dist
dist.init_process_group("cpu")
r, n = dist.get_rank(), dist.get_world_size()
bad = []
for count in (1, 1000, 3 << 20):
    x = np.arange(count, dtype=np.float64) * (r + 1)
    dist.all_reduce(x)
    if not np.array_equal(x, np.arange(count, dtype=np.float64) * n * (n + 1) / 2):
        bad.append(f"all_reduce {count}")
    y = np.full(count, r, np.int32)
    dist.broadcast(y, src=n - 1)
    if not (y == n - 1).all():
        bad.append(f"broadcast {count}")
    out = np.zeros(count * n, np.int64)
    dist.all_gather_into_tensor(out, np.full(count, r, np.int64))
    if not np.array_equal(out, np.repeat(np.arange(n), count)):
        bad.append(f"all_gather {count}")
g = dist.new_group([1, 2])  # one rank on each host
if r in (1, 2):
    z = np.ones(5)
    dist.all_reduce(z, group=g)
    if not (z == 2).all():
        bad.append("subgroup")
dist.barrier()
print("RESULT", r, "ok" if not bad else ",".join(bad), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_group_across_two_hosts(two_hosts):
    h1, h2 = two_hosts
    env = dict(os.environ, MASTER_ADDR="10.77.0.1", MASTER_PORT="29611", WORLD_SIZE="4",
               PYDDP_SECRET="two-hosts", PYDDP_ROOT=ROOT, OMP_NUM_THREADS="1")
    env.pop("PYDDP_HOST", None)
    procs = []
    for rank, ns in enumerate((h1, h1, h2, h2)):
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", CHILD],
                                      env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE,
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
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{out}"
        assert f"RESULT {rank} ok" in out, f"rank {rank}:\n{out}"
