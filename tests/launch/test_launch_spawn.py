"""pyddp.multiprocessing.spawn / start_processes: torch.multiprocessing's behaviour, with real processes.

Every test checks that no process it started survives it; every wait has a deadline."""
import glob
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np
import pytest

import _paths
import _launch_targets as targets
from _launch import assert_all_gone
import pyddp.multiprocessing as mp
from _mp import free_port

pytestmark = pytest.mark.timeout(240)

REPO = _paths.ROOT
TESTS = _paths.TESTS
WAIT = 60.0




def _pids(piddir, n, timeout=WAIT):
    targets.wait_for_pids(piddir, n, timeout)
    return [int(open(os.path.join(piddir, f"{i}.pid")).read()) for i in range(n)]


def _error_files():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "pyddp-errorfile-*")))


def _subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, TESTS] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                        else []))
    return env


# ---------------------------------------------------------------------------------------- success

def test_spawn_calls_fn_with_index_and_args(tmp_path):
    assert mp.spawn(targets.record, args=(str(tmp_path), "a", 7), nprocs=3) is None
    got = [json.load(open(tmp_path / f"{i}.json")) for i in range(3)]
    assert [g["i"] for g in got] == [0, 1, 2]
    assert all(g["extra"] == ["a", 7] for g in got)
    assert all(g["ppid"] == os.getpid() for g in got)   # children of this process
    assert len({g["pid"] for g in got}) == 3
    assert_all_gone([g["pid"] for g in got], timeout=5)


def test_spawn_runs_a_pyddp_job(tmp_path):
    mp.spawn(targets.allreduce_job, args=(3, free_port(), str(tmp_path)), nprocs=3)
    want = np.arange(8, dtype=np.float64) * (1 + 2 + 3)
    for i in range(3):
        np.testing.assert_array_equal(np.load(tmp_path / f"{i}.npy"), want)


def test_start_processes_fork_runs_a_closure(tmp_path):
    seen = {"factor": 5}

    def closure(i, outdir):  # not picklable by name: only fork can start it
        with open(os.path.join(outdir, f"{i}"), "w") as f:
            f.write(str(i * seen["factor"]))

    assert mp.start_processes(closure, args=(str(tmp_path),), nprocs=2, start_method="fork") is None
    assert [open(tmp_path / f"{i}").read() for i in range(2)] == ["0", "5"]


def test_join_false_returns_a_context_to_join(tmp_path):
    ctx = mp.spawn(targets.sleeper, args=(str(tmp_path), 1.5), nprocs=2, join=False)
    try:
        assert isinstance(ctx, mp.ProcessContext)
        assert len(ctx.pids()) == 2 and all(isinstance(p, int) for p in ctx.pids())
        _pids(str(tmp_path), 2)
        assert ctx.join(timeout=0.05) is False   # still sleeping
        deadline = time.monotonic() + WAIT
        while not ctx.join(timeout=1.0):
            assert time.monotonic() < deadline, "processes did not finish"
        assert ctx.join() is True                # can be called again once done
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    assert_all_gone(ctx.pids(), timeout=5)


def test_join_false_reports_a_failure_from_join(tmp_path):
    before = _error_files()
    ctx = mp.start_processes(targets.fail_when_all_started, args=(2, 0, "raise", str(tmp_path)),
                             nprocs=2, join=False, start_method="fork")
    deadline = time.monotonic() + WAIT
    with pytest.raises(mp.ProcessRaisedException, match="ValueError: boom 0"):
        while not ctx.join(timeout=1.0):
            assert time.monotonic() < deadline
    assert_all_gone(ctx.pids())
    assert _error_files() <= before


# ---------------------------------------------------------------------------------------- failures

@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_raised_exception_carries_the_traceback_and_stops_the_others(tmp_path, start_method):
    before = _error_files()
    t0 = time.monotonic()
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.start_processes(targets.fail_when_all_started, args=(3, 1, "raise", str(tmp_path)),
                           nprocs=3, start_method=start_method)
    pids = _pids(str(tmp_path), 3, timeout=0)
    e = info.value
    assert e.error_index == 1 and e.error_pid == pids[1]
    msg = str(e)
    assert msg.startswith("\n\n-- Process 1 terminated with the following error:\n"
                          "Traceback (most recent call last):\n"), msg
    assert msg.rstrip().endswith("ValueError: boom 1"), msg
    assert "fail_when_all_started" in msg and "_launch_targets.py" in msg
    # the others were sleeping for 60 s: terminated, not waited for
    assert time.monotonic() - t0 < 30
    assert_all_gone(pids, timeout=5)
    assert _error_files() <= before, "error files left behind"


def test_exit_code_is_reported(tmp_path):
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.start_processes(targets.fail_when_all_started, args=(2, 1, "exit3", str(tmp_path)),
                           nprocs=2, start_method="fork")
    e = info.value
    assert str(e) == "process 1 terminated with exit code 3"
    assert (e.error_index, e.exit_code, e.signal_name) == (1, 3, None)
    assert_all_gone(_pids(str(tmp_path), 2, timeout=0), timeout=5)


def test_signal_is_reported_by_name(tmp_path):
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.spawn(targets.fail_when_all_started, args=(2, 0, "sigkill", str(tmp_path)), nprocs=2)
    e = info.value
    assert str(e) == "process 0 terminated with signal SIGKILL"
    assert (e.error_index, e.exit_code, e.signal_name) == (0, -signal.SIGKILL, "SIGKILL")
    assert_all_gone(_pids(str(tmp_path), 2, timeout=0), timeout=5)


@pytest.mark.parametrize("bad", [0, 1])
def test_the_first_failure_is_reported_not_its_consequence(bad):
    # Rank `bad` raises; the other rank's all_reduce then fails with DistNetworkError. join() is
    # called only after both have exited, so both failures are there to choose from.
    ctx = mp.start_processes(targets.root_cause_then_consequence, args=(free_port(), bad), nprocs=2,
                             join=False, start_method="fork")
    deadline = time.monotonic() + WAIT
    while any(p.is_alive() for p in ctx.processes):
        assert time.monotonic() < deadline, "ranks did not fail"
        time.sleep(0.05)
    assert all(p.exitcode == 1 for p in ctx.processes)
    with pytest.raises(mp.ProcessRaisedException) as info:
        ctx.join(timeout=WAIT)
    assert info.value.error_index == bad
    assert f"ValueError: root cause on process {bad}" in str(info.value)


@pytest.mark.parametrize("grace", [None, 20.0])
def test_grace_period_lets_the_others_finish_before_they_are_terminated(tmp_path, grace):
    finish_after = 1.0 if grace else 30.0   # without grace, process 0 must be terminated, not finish
    ctx = mp.start_processes(targets.fail_or_finish, args=(str(tmp_path), finish_after), nprocs=2,
                             join=False, start_method="fork")
    t0 = time.monotonic()
    with pytest.raises(mp.ProcessRaisedException, match="ValueError: boom 1"):
        while not ctx.join(timeout=WAIT, grace_period=grace):
            pass
    if grace is None:   # torch's default: terminate at once
        assert ctx.processes[0].exitcode == -signal.SIGTERM
    else:               # waited for process 0 to return by itself, not the whole grace period
        assert ctx.processes[0].exitcode == 0
        assert time.monotonic() - t0 < grace
    assert_all_gone(ctx.pids(), timeout=5)


def test_exceptions_pickle_round_trip():
    for e in (mp.ProcessRaisedException("m", 1, 123),
              mp.ProcessExitedException("n", 2, 456, -9, "SIGKILL")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)
        assert (back.error_index, back.error_pid) == (e.error_index, e.error_pid)
    back = pickle.loads(pickle.dumps(mp.ProcessExitedException("n", 2, 456, -9, "SIGKILL")))
    assert (back.exit_code, back.signal_name) == (-9, "SIGKILL")
    assert issubclass(mp.ProcessRaisedException, mp.ProcessException)
    assert issubclass(mp.ProcessExitedException, mp.ProcessException)


# ------------------------------------------------------------------------------- argument checks

@pytest.mark.parametrize("kwargs, exc, words", [
    ({"nprocs": 0}, ValueError, "nprocs"),
    ({"nprocs": -2}, ValueError, "nprocs"),
    ({"nprocs": "2"}, TypeError, "nprocs"),
    ({"nprocs": True}, TypeError, "nprocs"),
    ({"nprocs": 2.0}, TypeError, "nprocs"),
    ({"start_method": "bogus"}, ValueError, "start_method"),
    ({"args": 5}, TypeError, "args"),
    ({"args": "ab"}, TypeError, "args"),
])
@pytest.mark.parametrize("api", ["spawn", "start_processes"])
def test_bad_arguments_raise_naming_them(kwargs, exc, words, api):
    with pytest.raises(exc, match=words):
        getattr(mp, api)(targets.record, **kwargs)


@pytest.mark.parametrize("api", ["spawn", "start_processes"])
def test_fn_must_be_callable(api):
    with pytest.raises(TypeError, match="fn must be callable"):
        getattr(mp, api)(42, nprocs=1)


def test_spawn_with_another_start_method_warns_like_torch(tmp_path):
    with pytest.warns(FutureWarning, match=r"only supports start_method=spawn \(got: fork\)"):
        mp.spawn(targets.record, args=(str(tmp_path),), nprocs=1, start_method="fork")
    assert (tmp_path / "0.json").exists()


def test_function_of_an_interactive_session_is_reported_before_starting():
    # python -c: __main__ has no file, like a notebook; 'spawn' could not import f in the children.
    code = textwrap.dedent("""
        import pyddp.multiprocessing as mp
        def f(i):
            pass
        try:
            mp.spawn(f, nprocs=2)
        except ValueError as e:
            print("VALUEERROR", e)
        mp.start_processes(f, nprocs=2, start_method="fork")   # fork needs no import: works
        print("FORK OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=_subprocess_env(), capture_output=True,
                       text=True, timeout=WAIT)
    assert r.returncode == 0, r.stderr
    assert "VALUEERROR fn 'f' is defined in an interactive session" in r.stdout, r.stdout
    assert "notebook_launcher" in r.stdout and "Can't get attribute 'f'" in r.stdout
    assert "FORK OK" in r.stdout


def test_fork_with_an_initialized_group_is_refused():
    code = textwrap.dedent(f"""
        import pyddp.distributed as dist, pyddp.multiprocessing as mp
        dist.init_process_group("cpu", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        try:
            mp.start_processes(print, nprocs=1, start_method="fork")
        except RuntimeError as e:
            print("REFUSED", e)
        dist.destroy_process_group()
    """)
    r = subprocess.run([sys.executable, "-c", code], env=_subprocess_env(), capture_output=True,
                       text=True, timeout=WAIT)
    assert r.returncode == 0, r.stderr
    assert "REFUSED start_method='fork' with a pyddp process group initialized" in r.stdout, r.stdout


# --------------------------------------------------------------------------------------- orphans

_PARENT_SCRIPT = """
import sys
import _launch_targets as targets
import pyddp.multiprocessing as mp
if __name__ == "__main__":
    mp.spawn(targets.sleeper, args=(sys.argv[1], 120, sys.argv[2] == "ignore"), nprocs=2)
"""


def _start_parent(tmp_path, ignore_sigint):
    script = tmp_path / "parent.py"
    script.write_text(_PARENT_SCRIPT)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(piddir),
                             "ignore" if ignore_sigint else "-"],
                            env=_subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        pids = _pids(str(piddir), 2)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=WAIT)
        raise
    return proc, pids


def test_children_die_with_a_killed_parent(tmp_path):
    proc, pids = _start_parent(tmp_path, ignore_sigint=False)
    try:
        proc.kill()   # SIGKILL: the parent cleans nothing up; the parent-death signal does
        proc.communicate(timeout=WAIT)
        assert_all_gone(pids)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


def test_ctrl_c_in_the_parent_terminates_the_children(tmp_path):
    # The children ignore SIGINT (so the parent-death SIGINT cannot be what stops them): the parent,
    # interrupted while it joins, must terminate them itself before KeyboardInterrupt propagates.
    proc, pids = _start_parent(tmp_path, ignore_sigint=True)
    try:
        proc.send_signal(signal.SIGINT)   # the parent only, not its process group
        _, err = proc.communicate(timeout=WAIT)
        assert proc.returncode != 0
        assert "KeyboardInterrupt" in err, err
        # SIGTERM, sent by the parent before it exited
        assert_all_gone(pids, timeout=5)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


# ------------------------------------------------------------------------------- torch parity

def test_module_exports_what_torch_multiprocessing_does():
    import multiprocessing as std

    for name in std.__all__ + ["spawn", "start_processes", "ProcessContext", "ProcessException",
                               "ProcessRaisedException", "ProcessExitedException", "SpawnContext",
                               "set_sharing_strategy", "get_sharing_strategy",
                               "get_all_sharing_strategies"]:
        assert hasattr(mp, name), name
    assert mp.Process is std.Process and mp.Queue is std.Queue
    assert mp.get_sharing_strategy() in mp.get_all_sharing_strategies()
    with pytest.raises(ValueError, match="new_strategy"):
        mp.set_sharing_strategy("bogus")
    try:
        import torch.multiprocessing as tmp
    except ImportError:
        return
    missing = [n for n in tmp.__all__ if not hasattr(mp, n)]
    assert not missing, f"torch.multiprocessing has {missing}, pyddp.multiprocessing does not"
    assert sorted(tmp.__all__) == sorted(mp.__all__)


def _outcome(module, how, piddir):
    try:
        module.start_processes(targets.fail_when_all_started, args=(2, 1, how, piddir), nprocs=2,
                               start_method="fork")
    except Exception as e:
        d = {"type": type(e).__name__, "index": e.error_index,
             "exit_code": getattr(e, "exit_code", None), "signal_name": getattr(e, "signal_name", None)}
        msg = str(e)
        if how == "raise":   # tracebacks differ in the wrapper's frame: compare head and tail
            lines = msg.strip().splitlines()
            d["msg"] = (msg[:msg.index("Traceback")], lines[-1])
        else:
            d["msg"] = msg
        return d
    return None


@pytest.mark.parametrize("how", ["raise", "exit3", "sigkill"])
def test_failures_match_torch(tmp_path, how):
    tmp = pytest.importorskip("torch.multiprocessing")
    (tmp_path / "t").mkdir()
    (tmp_path / "p").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _outcome(tmp, how, str(tmp_path / "t"))
    got = _outcome(mp, how, str(tmp_path / "p"))
    assert want is not None
    assert got == want
    for d in ("t", "p"):
        assert_all_gone(_pids(str(tmp_path / d), 2, timeout=0), timeout=10)


def test_spawn_warning_matches_torch(tmp_path):
    tmp = pytest.importorskip("torch.multiprocessing")
    with pytest.warns(FutureWarning) as want:
        tmp.spawn(targets.record, args=(str(tmp_path),), nprocs=1, start_method="fork")
    with pytest.warns(FutureWarning) as got:
        mp.spawn(targets.record, args=(str(tmp_path),), nprocs=1, start_method="fork")
    w = [str(r.message) for r in want if r.category is FutureWarning][0]
    g = [str(r.message) for r in got if r.category is FutureWarning][0]
    assert g == w.replace("torch.multiprocessing", "pyddp.multiprocessing")
