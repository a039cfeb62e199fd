"""How many cores a host's ranks can keep busy: their CPU sets together (taskset, cpusets),
within the cgroup's CPU limit (docker --cpus, Kubernetes limits).  The C core spins its waiters
only with a core per rank; each rank's BLAS pools get their share.  quota() against fake cgroup
trees (v1 and v2); the spin decision with real ranks bound to one CPU and to two."""
import os
import subprocess
import sys

import pytest

import pyddp
from pyddp import _threads

import _paths

pytestmark = pytest.mark.timeout(120)
SCRIPT = os.path.join(_paths.TESTS, "_cores_script.py")


def _tree(tmp_path, cgroup, files):
    proc = tmp_path / "cgroup"
    proc.write_text(cgroup)
    mount = tmp_path / "fs"
    for rel, text in files.items():
        f = mount / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return _threads.quota(str(proc), str(mount))


def test_quota_v2_smallest_over_the_levels(tmp_path):
    files = {"cgroup.controllers": "cpu\n", "a/b/cpu.max": "max 100000\n",
             "a/cpu.max": "250000 100000\n", "cpu.max": "max 100000\n"}
    assert _tree(tmp_path, "0::/a/b\n", files) == 2
    files["a/b/cpu.max"] = "150000 100000\n"   # 1.5 CPUs: one whole core
    assert _tree(tmp_path, "0::/a/b\n", files) == 1
    files["a/b/cpu.max"] = "50000 100000\n"    # half a CPU: still one
    assert _tree(tmp_path, "0::/a/b\n", files) == 1


def test_quota_v2_none_without_a_limit(tmp_path):
    files = {"cgroup.controllers": "cpu\n", "a/cpu.max": "max 100000\n"}
    assert _tree(tmp_path, "0::/a\n", files) is None
    assert _tree(tmp_path, "0::/\n", {"cgroup.controllers": ""}) is None
    assert _threads.quota(str(tmp_path / "missing"), str(tmp_path)) is None


def test_quota_v1(tmp_path):
    cg = "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "400000\n",
             "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
             "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
    assert _tree(tmp_path, cg, files) == 4
    # a container's own hierarchy mounted at the root (no cgroup namespace): the root's file
    files = {"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    assert _tree(tmp_path, "3:cpu,cpuacct:/docker/abc\n", files) == 3
    files = {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    assert _tree(tmp_path, "3:cpu,cpuacct:/\n", files) is None


def test_cpu_sets_round_trip():
    for cpus in ({0}, {0, 1, 2, 3}, {0, 2, 3, 4, 9}, set(range(64)) - {7}):
        text = _threads.encode_cpus(cpus)
        assert _threads.decode_cpus(text) == cpus
    assert _threads.encode_cpus({5, 0, 1, 2, 8}) == "0-2,5,8"


def test_cores_is_within_the_affinity():
    assert 1 <= _threads.cores() <= len(os.sched_getaffinity(0))
    assert _threads.cores({0}) == 1


def _run(binding):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "PYDDP_TEST_SPIN", "PYDDP_PROGRESS_SPIN")}
    here = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYDDP_DEBUG"] = "INFO"
    p = subprocess.run([sys.executable, "-m", "pyddp.run", "--standalone", "--nproc-per-node", "2",
                        SCRIPT, binding], env=env, capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stdout + p.stderr   # each rank checked its result
    return [ln for ln in p.stderr.splitlines() if "connected (2 ranks on this host" in ln]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_ranks_bound_to_one_cpu_do_not_spin():
    c = min(os.sched_getaffinity(0))
    lines = _run(f"{c};{c}")
    assert len(lines) == 2 and all("waiters yield" in ln for ln in lines), lines


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or (_threads.quota() or 2) < 2,
                    reason="needs 2 CPUs")
def test_ranks_bound_to_a_cpu_each_spin():
    # each rank's own set has one CPU; together they have two, one per rank
    cpus = sorted(os.sched_getaffinity(0))[:2]
    lines = _run(f"{cpus[0]};{cpus[1]}")
    assert len(lines) == 2 and all("waiters spin" in ln for ln in lines), lines
