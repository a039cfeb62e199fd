"""A rank whose DataLoader worker raised exits with its error (issue 50, item 5), under every launcher.

The failing script (tests/_launch_targets.py ``loader_fails``): 2 ranks, DataLoader(num_workers=2)
whose collate_fn raises TypeError in worker 0, an uncaught exception in the training loop, the
iterator still referenced (by the traceback) when Python exits.  The iterator was then freed while
the interpreter finalised, and its shutdown put None on the index queue of a worker that had been
sent nothing yet: the queue started its feeder thread, a thread started while Python finalises
never runs, and Thread.start waited for it forever.  Each test checks that the launcher reports the
rank's own exception and exit code promptly (not a SIGTERM of its own) and that no rank or worker
process is left.  Every wait has a deadline."""
import os
import signal
import subprocess
import sys
import time

import pytest

import _paths
import _launch_targets as targets
import pyddp
import pyddp.multiprocessing as mp
from _launch import alive, assert_all_gone, launcher_env, run, write_script
from _mp import free_port

pytestmark = pytest.mark.timeout(240)

TESTS = _paths.TESTS
WORKER_ERROR = "TypeError: Caught TypeError in DataLoader worker process 0."
# Long enough for 2 ranks and 4 workers to start on a busy machine, far below "never".
PROMPT = 45

SCRIPT = f"""
import os, sys
sys.path.insert(0, {TESTS!r})
import _launch_targets as targets
targets.loader_fails_env(2, os.environ["OUT"])
"""


def _pids(piddir):
    """The ranks' (<rank>.pid) and their DataLoader workers' (.wpid) pids."""
    out = []
    for name in os.listdir(piddir):
        if name.endswith((".pid", ".wpid")):
            out.append(int(open(os.path.join(piddir, name)).read()))
    return out


def _worker_files(piddir):
    """The names of the files the DataLoader workers wrote their pids to."""
    return {p for p in os.listdir(piddir) if p.endswith(".wpid")}


def _in_sessions(sids):
    """Live processes (zombies excluded) of the sessions sids: a rank started in a session of its
    own (pyddp.run's ranks, the single process here) and every DataLoader worker forked from it."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[3]) in sids:
            out.append(int(d))
    return out


def _assert_sessions_end(sids, timeout=10):
    deadline = time.monotonic() + timeout
    while _in_sessions(sids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _in_sessions(sids)
    for p in left:
        try:
            os.kill(p, 9)
        except OSError:
            pass
    assert not left, f"processes left behind: {left}"


def test_a_single_process_exits_with_the_worker_error(tmp_path):
    """Without a launcher: `python script.py` exits 1 with the worker's error, promptly."""
    code = f"""
import sys
sys.path.insert(0, {TESTS!r})
import numpy as np, functools
import _launch_targets as targets
from pyddp.utils.data import DataLoader
ds = [np.full(3, k, np.float32) for k in range(4)]
loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=targets.collate_fails_in_worker0,
                    worker_init_fn=functools.partial(targets.record_worker_pid, {str(tmp_path)!r}, 0))
batches = iter(loader)    # a global: freed only while the interpreter finalises
next(batches)
"""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", code], env=launcher_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=PROMPT)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate(timeout=10)
        raise AssertionError(f"the process did not exit within {PROMPT} s:\n{err}")
    finally:
        assert_all_gone(_pids(str(tmp_path)))
        _assert_sessions_end({p.pid})
    assert p.returncode == 1, err
    assert WORKER_ERROR in err and "TypeError: collate cannot batch these" in err, err
    assert time.monotonic() - t0 < PROMPT
    assert "worker-0-0.wpid" in _worker_files(str(tmp_path))


@pytest.mark.parametrize("module", ["pyddp.run", "pyddp.launch"])
def test_a_rank_whose_dataloader_worker_raised_exits_with_its_error(tmp_path, module):
    script = write_script(tmp_path, "train.py", SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    try:
        rc, _, err = run(["--standalone", "--nproc_per_node=2", script], module=module,
                         env=launcher_env(OUT=out), timeout=PROMPT)
    finally:
        ranks = [int(open(out / f"{r}.pid").read()) for r in range(2) if (out / f"{r}.pid").exists()]
        assert_all_gone(_pids(str(out)))
        _assert_sessions_end(set(ranks))   # the ranks' sessions: their DataLoader workers too
    assert time.monotonic() - t0 < PROMPT
    assert rc == 1, err
    summary = err[err.index("=" * 20):]
    root = summary[summary.index("Root Cause"):summary.index("Other Failures")]
    assert "exitcode  : 1 (pid:" in root, summary
    assert WORKER_ERROR in root and "TypeError: collate cannot batch these" in root, summary
    # Both ranks raise: a rank that had raised and was still exiting when the launcher saw the
    # other fail is reported with its own exit code and error, not as stopped by SIGTERM.
    assert "SIGTERM" not in summary, summary
    assert "worker-0-0.wpid" in _worker_files(str(out)) or "worker-1-0.wpid" in _worker_files(str(out))


def test_spawn_reports_the_dataloader_worker_error(tmp_path):
    t0 = time.monotonic()
    ctx = mp.spawn(targets.loader_fails, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False)
    try:
        with pytest.raises(mp.ProcessRaisedException) as info:
            while not ctx.join(timeout=1.0):
                assert time.monotonic() - t0 < PROMPT, f"the ranks did not exit within {PROMPT} s"
    finally:
        for pid in ctx.pids():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        assert_all_gone(_pids(str(tmp_path)))
    assert time.monotonic() - t0 < PROMPT
    assert WORKER_ERROR in str(info.value) and "collate cannot batch these" in str(info.value)
    # the other rank may have been stopped before its workers started
    assert f"worker-{info.value.error_index}-0.wpid" in _worker_files(str(tmp_path))


def test_notebook_launcher_reports_the_dataloader_worker_error(tmp_path):
    t0 = time.monotonic()
    try:
        with pytest.raises(mp.ProcessRaisedException) as info:
            pyddp.notebook_launcher(targets.loader_fails_env, args=(2, str(tmp_path)), nprocs=2)
    finally:
        assert_all_gone(_pids(str(tmp_path)))
    assert time.monotonic() - t0 < PROMPT
    assert WORKER_ERROR in str(info.value) and "collate cannot batch these" in str(info.value)
    # the other rank may have been stopped before its workers started
    assert f"worker-{info.value.error_index}-0.wpid" in _worker_files(str(tmp_path))
