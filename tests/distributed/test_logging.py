"""PYDDP_DEBUG / PYDDP_DEBUG_SUBSYS: logging by subsystem to stderr, off by default."""
import os
import re
import socket
import subprocess
import sys

import pytest

import _paths

ROOT = _paths.ROOT
CHILD = (
    "import sys; sys.path.insert(0, %r)\n"
    "import numpy as np, pyddp.distributed as dist\n"
    "dist.init_process_group('cpu')\n"
    "x = np.ones(4); dist.all_reduce(x)\n"
    "dist.destroy_process_group()\n" % ROOT
)


def _run(**env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    e = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for k in ("PYDDP_DEBUG", "PYDDP_DEBUG_SUBSYS"):
        e.pop(k, None)
    e.update(env)
    res = subprocess.run([sys.executable, "-c", CHILD], env=e, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stderr


@pytest.mark.timeout(120)
def test_logging_is_off_by_default():
    # (warnings still print: under a parallel run a stranger's client, of a test that had this
    # port a moment before, can reach this job's store and be refused, which is worth a WARN line)
    out = _run()
    assert not re.search(r"^pyddp \d+ (INFO|DETAIL|TRACE) ", out, re.M), out


@pytest.mark.timeout(120)
def test_info_logs_the_group_and_trace_logs_each_collective():
    info = _run(PYDDP_DEBUG="INFO")
    assert "INFO group: rank 0 of 1 connected" in info
    assert "all_reduce #1" not in info
    trace = _run(PYDDP_DEBUG="TRACE")
    assert "TRACE group: rank 0: all_reduce #1 start" in trace
    assert "all_reduce #1 done" in trace


@pytest.mark.timeout(120)
def test_subsystem_filter():
    assert "group:" not in _run(PYDDP_DEBUG="TRACE", PYDDP_DEBUG_SUBSYS="tcp,store")
