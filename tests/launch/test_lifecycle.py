"""pyddp._lifecycle: the process lifecycle shared by the launchers, spawn and notebook_launcher.

The behaviour each of them builds on it is tested with them (test_launch_run, test_launch_spawn,
test_launch_notebook); these are the building blocks on their own.
"""
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pyddp import _lifecycle

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def test_signal_and_exit_names():
    assert _lifecycle.signal_name(signal.SIGKILL) == "SIGKILL"
    assert _lifecycle.signal_name(1000) == "signal 1000"
    assert _lifecycle.signal_name(1000, unknown="<Unknown signal {}>") == "<Unknown signal 1000>"
    assert _lifecycle.describe_exit(3) == "exit code 3"
    assert _lifecycle.describe_exit(-signal.SIGTERM) == "signal SIGTERM"


def _sleeper(ignore_term=False):
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout.readline() == b"ready\n"
    return p


def _running(procs):
    return [p for p in procs if p.poll() is None]


def test_terminate_with_grace_kills_what_ignores_sigterm():
    polite, stubborn = _sleeper(), _sleeper(ignore_term=True)
    sent = []
    slow = []

    def send(p, sig):
        sent.append((p.pid, sig))
        p.send_signal(sig)

    try:
        t0 = time.monotonic()
        left = _lifecycle.terminate_with_grace(
            [polite, stubborn], send, _running,
            wait_grace=lambda live: _lifecycle.wait_until_gone(live, _running, 1.0, on_slow=slow.append,
                                                               slow_after=0.2),
            wait_kill=lambda live: _lifecycle.wait_until_gone(live, _running, 10.0))
        elapsed = time.monotonic() - t0
    finally:
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert left == []
    assert sent == [(polite.pid, signal.SIGTERM), (stubborn.pid, signal.SIGTERM),
                    (stubborn.pid, signal.SIGKILL)]
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
    assert slow == [[stubborn]]   # told once, about the one left
    assert 1.0 <= elapsed < 10


def test_terminate_with_grace_with_nothing_running_sends_nothing():
    def send(p, sig):
        raise AssertionError("signalled a process that is gone")

    assert _lifecycle.terminate_with_grace([1, 2], send, lambda procs: [], wait_grace=None) == []


def test_wait_until_gone_cut_short():
    t0 = time.monotonic()
    left = _lifecycle.wait_until_gone(["p"], lambda live: live, 30.0,
                                      cut_short=lambda: time.monotonic() - t0 > 0.2)
    assert left == ["p"] and time.monotonic() - t0 < 5


def test_signal_group_of_a_gone_group():
    p = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    p.wait(timeout=30)
    assert _lifecycle.signal_group(p.pid, signal.SIGTERM) is False
    q = _sleeper()
    try:
        assert _lifecycle.signal_group(q.pid, signal.SIGKILL) is True
        assert q.wait(timeout=10) == -signal.SIGKILL
    finally:
        if q.poll() is None:
            q.kill()
            q.wait(timeout=10)


@linux_only
def test_die_with_parent():
    # A parent that starts a child asking for SIGKILL on its death, then dies: the child goes too.
    child = textwrap.dedent("""
        import os, signal, sys, time
        from pyddp import _lifecycle
        assert _lifecycle.die_with_parent(signal.SIGKILL, os.getppid()) is False
        assert _lifecycle.die_with_parent(signal.SIGKILL, os.getppid() + 1) is True   # "orphaned"
        print(os.getpid(), flush=True)
        time.sleep(60)
    """)
    parent = textwrap.dedent(f"""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", {child!r}], stdout=subprocess.PIPE)
        print(p.stdout.readline().decode().strip(), flush=True)
        sys.stdin.read()   # until the test closes stdin; then exit without reaping the child
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        assert line.strip(), "the child did not start"
        pid = int(line)
        proc.stdin.close()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), "the child outlived its parent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _alive(pid):
    """Running, not a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] not in (b"Z", b"X")
