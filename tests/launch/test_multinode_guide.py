"""The README's multi-node guide, run on two "hosts": two network namespaces joined by a veth pair
(10.77.0.1 and 10.77.0.2), with the training example for one epoch.

- Slurm: examples/cluster/slurm_pyddp_run.sbatch runs unchanged under stand-ins for ``scontrol``
  (host-list expansion) and ``srun`` (one task per node, in that node's namespace, with the
  SLURM_NODEID / SLURM_PROCID / SLURM_NNODES a real srun gives its tasks).
- Kubeflow PyTorchJob: each "pod" gets the environment the training operator sets (MASTER_ADDR,
  MASTER_PORT, WORLD_SIZE, RANK, and PET_* for pyddp-run) and runs the command of
  examples/cluster/kubeflow_pytorchjob.yaml; then pods running pyddp-run with two ranks each.
- pyddp-run --nnodes=2 --rdzv_backend=c10d started by hand on each host.
- mpirun -H host0:2,host1:2 from the first host, Open MPI reaching the second through its rsh agent
  (a stand-in for ssh that enters the other namespace).

Needs root and iproute2 (``ip netns``); skipped otherwise (the fixture is tests/_netns.py's).
"""
import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from _netns import two_hosts  # noqa: F401  (the fixture)

import _paths
from _tiers import FULL

ROOT = _paths.ROOT
CLUSTER = os.path.join(ROOT, "examples", "cluster")
HOSTS = ("10.77.0.1", "10.77.0.2")

FAKE_SCONTROL = r"""#!/usr/bin/env python3
# scontrol show hostnames LIST: one host per line (pyddp's expansion agrees with Slurm's own:
# tests/launch/test_launch_cluster.py)
import os, sys
sys.path.insert(0, os.environ["PYDDP_ROOT"])
from pyddp.distributed._cluster import expand_hostlist
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
print("\n".join(expand_hostlist(sys.argv[3] if len(sys.argv) > 3 else os.environ["SLURM_JOB_NODELIST"])))
"""

# srun [options] cmd...: one task per node of the allocation, each in the namespace of its host,
# with the variables srun sets for a task; exits with the first failing task's status.
FAKE_SRUN = r"""#!/usr/bin/env python3
import os, subprocess, sys
sys.path.insert(0, os.environ["PYDDP_ROOT"])
from pyddp.distributed._cluster import expand_hostlist
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args.pop(0)
netns = dict(kv.split("=") for kv in os.environ["FAKE_SLURM_NETNS"].split(","))
hosts = list(expand_hostlist(os.environ["SLURM_JOB_NODELIST"]))
procs = []
for k, h in enumerate(hosts):
    env = dict(os.environ, SLURM_NODEID=str(k), SLURM_PROCID=str(k), SLURM_LOCALID="0",
               SLURM_NTASKS=str(len(hosts)), SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
               SLURMD_NODENAME=h)
    procs.append(subprocess.Popen(["ip", "netns", "exec", netns[h], *args], env=env))
try:
    codes = [p.wait(timeout=200) for p in procs]  # under the test's own 240 s deadline
except subprocess.TimeoutExpired:
    for p in procs:
        p.kill()
    sys.exit(124)
sys.exit(next((c for c in codes if c), 0))
"""


# ssh HOST COMMAND as Open MPI's rsh launcher calls it: COMMAND in the namespace of HOST
FAKE_SSH = r"""#!/bin/bash
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
for kv in ${FAKE_SSH_NETNS//,/ }; do
    if [[ "${kv%%=*}" == "$host" ]]; then exec ip netns exec "${kv#*=}" /bin/sh -c "$*"; fi
done
echo "fake ssh: unknown host $host" >&2
exit 255
"""


def _base_env(tmp_path):
    env = dict(os.environ, PYDDP_ROOT=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               MPLBACKEND="Agg")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for k in list(env):  # nothing of this session's own job
        if k.startswith(("SLURM_", "PET_", "OMPI_", "PMI_")) or k in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYDDP_HOST",
                "PYDDP_SECRET", "TORCHELASTIC_RUN_ID"):
            del env[k]
    return env


def _train_args(tmp_path, tag):
    return ["--epochs", "1", "--no-progress", "--plot", "",
            "--checkpoint", str(tmp_path / f"{tag}.pt")]


def _run_all(cmds, timeout=240):
    """Start every (argv, env) at once; (returncode, output) of each, killing all on a timeout."""
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True, cwd=ROOT) for argv, env in cmds]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait(timeout=10)
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def _accuracy(out):
    m = re.search(r"final test accuracy (\d\.\d+)", out)
    assert m, out
    return float(m.group(1))


def _port():
    return 20000 + uuid.uuid4().int % 9000


@FULL
@pytest.mark.timeout(300)
def test_slurm_sbatch_with_pyddp_run(two_hosts, tmp_path):  # noqa: F811
    h1, h2 = two_hosts
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = _base_env(tmp_path)
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}"
               f"{env['PATH']}",
               SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="10.77.0.[1-2]", SLURM_NNODES="2",
               FAKE_SLURM_NETNS=f"{HOSTS[0]}={h1},{HOSTS[1]}={h2}", NPROC_PER_NODE="2",
               PORT=str(_port()))
    (rc, out), = _run_all([(["bash", os.path.join(CLUSTER, "slurm_pyddp_run.sbatch"),
                             *_train_args(tmp_path, "slurm")], env)])
    assert rc == 0, out
    assert " 4 ranks" in out, out
    assert _accuracy(out) > 0.5


def _kubeflow_command():
    text = open(os.path.join(CLUSTER, "kubeflow_pytorchjob.yaml")).read()
    cmds = re.findall(r"^\s*command:\s*(\[.*\])\s*$", text, re.M)
    assert len(cmds) == 2 and cmds[0] == cmds[1], cmds
    return json.loads(cmds[0])


@FULL
@pytest.mark.timeout(300)
def test_kubeflow_pytorchjob_environment(two_hosts, tmp_path):  # noqa: F811
    """One rank per pod: the operator's MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK."""
    cmd = _kubeflow_command()
    assert cmd[0] == "python"
    port = str(_port())
    cmds = []
    for rank, ns in enumerate(two_hosts):
        env = _base_env(tmp_path)
        env.update(MASTER_ADDR=HOSTS[0], MASTER_PORT=port, WORLD_SIZE="2", RANK=str(rank),
                   PET_NNODES="2", PET_NODE_RANK=str(rank), PET_MASTER_ADDR=HOSTS[0],
                   PET_MASTER_PORT=port, PYDDP_SECRET="from-a-kubernetes-secret")
        argv = [sys.executable, *cmd[1:], *_train_args(tmp_path, f"kf{rank}")]
        cmds.append((["ip", "netns", "exec", ns, *argv], env))
    results = _run_all(cmds)
    for rank, (rc, out) in enumerate(results):
        assert rc == 0, f"pod {rank}:\n{out}"
    assert " 2 ranks" in results[0][1], results[0][1]
    assert _accuracy(results[0][1]) > 0.5


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", [pytest.param("pet", marks=FULL), "c10d"])
def test_pyddp_run_on_two_hosts(two_hosts, tmp_path, how):  # noqa: F811
    """Two ranks per host: pods running pyddp-run (PET_* from the operator), or pyddp-run
    --nnodes=2 --rdzv_backend=c10d started by hand on each host."""
    port = str(_port())
    cmds = []
    for node, ns in enumerate(two_hosts):
        env = _base_env(tmp_path)
        env["PYDDP_SECRET"] = "two-hosts"
        run = [sys.executable, "-m", "pyddp.run", "--nproc-per-node", "2"]
        if how == "pet":
            env.update(MASTER_ADDR=HOSTS[0], MASTER_PORT=port, WORLD_SIZE="2", RANK=str(node),
                       PET_NNODES="2", PET_NODE_RANK=str(node), PET_MASTER_ADDR=HOSTS[0],
                       PET_MASTER_PORT=port)
        else:
            run += ["--nnodes=2", f"--node-rank={node}", "--rdzv_backend=c10d",
                    f"--rdzv_endpoint={HOSTS[0]}:{port}"]
        argv = [*run, os.path.join(ROOT, "examples", "train_digits.py"),
                *_train_args(tmp_path, f"{how}{node}")]
        cmds.append((["ip", "netns", "exec", ns, *argv], env))
    results = _run_all(cmds)
    for node, (rc, out) in enumerate(results):
        assert rc == 0, f"node {node}:\n{out}"
    assert " 4 ranks" in results[0][1], results[0][1]
    assert _accuracy(results[0][1]) > 0.5


@FULL
@pytest.mark.timeout(300)
def test_mpirun_across_two_hosts(two_hosts, tmp_path):  # noqa: F811
    """mpirun -H host0:2,host1:2 -x MASTER_ADDR -x PYDDP_SECRET python train.py, Open MPI's own
    launcher reaching the second host through its rsh agent (a stand-in for ssh)."""
    import shutil

    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed")
    h1, h2 = two_hosts
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    env = _base_env(tmp_path)
    env.update(PYDDP_SECRET="mpirun-two-hosts", MASTER_ADDR=HOSTS[0],
               FAKE_SSH_NETNS=f"{HOSTS[0]}={h1},{HOSTS[1]}={h2}")
    argv = ["ip", "netns", "exec", h1, "mpirun", "--allow-run-as-root", "--oversubscribe",
            "--mca", "plm_rsh_agent", str(ssh), "-H", f"{HOSTS[0]}:2,{HOSTS[1]}:2", "-n", "4",
            "-x", "MASTER_ADDR", "-x", "PYDDP_SECRET", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
            sys.executable, os.path.join(ROOT, "examples", "train_digits.py"),
            *_train_args(tmp_path, "mpirun")]
    (rc, out), = _run_all([(argv, env)])
    assert rc == 0, out
    assert " 4 ranks" in out, out
    assert _accuracy(out) > 0.5


# srun --mpi=PLUGIN cmd...: every task of the allocation started by Open MPI across the hosts (what
# Slurm's PMI does for a real srun), from the first host, reaching the second through FAKE_SSH.
# MPI's data moves over TCP only ("btl tcp,self"): the two "hosts" share one kernel and hostname, so
# Open MPI would take ranks in different namespaces for one node and join them through its
# shared-memory transport, which crashes across the namespaces' separate session directories.
FAKE_SRUN_MPI = r"""#!/usr/bin/env python3
import os, sys
sys.path.insert(0, os.environ["PYDDP_ROOT"])
from pyddp.distributed._cluster import expand_hostlist
args = sys.argv[1:]
assert args[0].startswith("--mpi="), args
args.pop(0)
netns = dict(kv.split("=") for kv in os.environ["FAKE_SSH_NETNS"].split(","))
hosts = list(expand_hostlist(os.environ["SLURM_JOB_NODELIST"]))
per = int(os.environ["SLURM_NTASKS_PER_NODE"])
os.execvp("ip", ["ip", "netns", "exec", netns[hosts[0]], "mpirun", "--allow-run-as-root",
                 "--oversubscribe", "--mca", "plm_rsh_agent", os.environ["FAKE_SSH"],
                 "--mca", "btl", "tcp,self", "-H", ",".join(f"{h}:{per}" for h in hosts), "-n", str(per * len(hosts)),
                 "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", *args])
"""


@FULL
@pytest.mark.timeout(300)
def test_slurm_sbatch_srun_backend_mpi(two_hosts, tmp_path):  # noqa: F811
    """examples/cluster/slurm_mpi.sbatch unchanged: srun starts every rank, backend "mpi" takes
    rank and size from MPI (no MASTER_ADDR, no secret), 2 hosts x 2 ranks."""
    import shutil

    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed")
    pytest.importorskip("mpi4py")
    h1, h2 = two_hosts
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN_MPI), ("ssh", FAKE_SSH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = _base_env(tmp_path)
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}"
               f"{env['PATH']}",
               SLURM_JOB_ID="4343", SLURM_JOB_NODELIST="10.77.0.[1-2]", SLURM_NNODES="2",
               SLURM_NTASKS_PER_NODE="2", SLURM_CPUS_PER_TASK="1", FAKE_SSH=str(bin_dir / "ssh"),
               FAKE_SSH_NETNS=f"{HOSTS[0]}={h1},{HOSTS[1]}={h2}")
    (rc, out), = _run_all([(["bash", os.path.join(CLUSTER, "slurm_mpi.sbatch"),
                             *_train_args(tmp_path, "slurm_mpi")], env)])
    assert rc == 0, out
    assert " 4 ranks" in out, out
    assert _accuracy(out) > 0.5
