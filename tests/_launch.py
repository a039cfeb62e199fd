"""Helpers for the launcher tests: start ``python -m pyddp.run`` / ``pyddp.launch`` as real processes.

Every wait has a deadline; a launcher still running at the end of a test is killed with its process
group.  Workers write what they saw into files under the test's tmp_path; processes are checked through
/proc (a zombie counts as gone: nothing here reaps orphans, and PID 1 of a container may not either).
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Variables a launcher or a rank would read from the test's own environment: scrubbed.
_SCRUB_PREFIXES = ("PET_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_")
_SCRUB = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
          "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYDDP_SECRET",
          "PYDDP_NODE_ID", "OMP_NUM_THREADS", "PYDDP_RUN_GRACE", "PYDDP_TRANSPORT",
          "THP_MEM_ALLOC_ENABLE"}


def launcher_env(**extra):
    """The test's environment without launcher variables, importing this checkout's pyddp."""
    env = {k: v for k, v in os.environ.items()
           if k not in _SCRUB and not k.startswith(_SCRUB_PREFIXES)}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def write_script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def start(args, module="pyddp.run", env=None, cwd=None):
    """Start a launcher (its own process group, so a test can clean up after it whatever happens)."""
    return subprocess.Popen([sys.executable, "-m", module] + [str(a) for a in args],
                            env=env or launcher_env(), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc, timeout=60):
    """Wait for a launcher; returns (returncode, stdout, stderr).  Kills it (and its group) on timeout."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"launcher did not finish within {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    return proc.returncode, out, err


def run(args, module="pyddp.run", env=None, cwd=None, timeout=60):
    return finish(start(args, module, env, cwd), timeout)


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] not in (b"Z", b"X")


def assert_all_gone(pids, timeout=10):
    """Every pid ends (SIGKILL and teardown take a moment); names the survivors otherwise."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if alive(p)]
    if left:
        cmds = {}
        for p in left:
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    cmds[p] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmds[p] = "?"
            try:
                os.kill(p, signal.SIGKILL)   # do not leave them to the next test
            except OSError:
                pass
        raise AssertionError(f"processes survived the launcher: {cmds}")


def read_json_files(directory, pattern="rank{}.json", n=None):
    """{rank: data} from files written by the workers."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                d = json.load(f)
            out[int(name[4:-5])] = d
    if n is not None:
        assert sorted(out) == list(range(n)), f"expected files of ranks 0..{n - 1}, got {sorted(out)}"
    return out


class Watched:
    """A stand-in for sys.stderr that records what is written and creates ``flag`` once ``needle``
    appears in a write that is not a finished line: the ranks wait for that file, which proves a
    progress bar's update reached this process while the bar was still running."""

    def __init__(self, real, needle, flag):
        self.real, self.needle, self.flag, self.parts = real, needle, flag, []

    def write(self, text):
        self.parts.append(text)
        if self.needle in text and not text.endswith("\n") and not os.path.exists(self.flag):
            open(self.flag, "w").close()
        return len(text)

    def flush(self):
        pass

    def text(self):
        return "".join(self.parts)


def terminal_lines(text):
    """What a terminal shows: each line is its last carriage-return redraw."""
    return [([p for p in line.split("\r") if p] or [""])[-1] for line in text.split("\n")]


@contextlib.contextmanager
def bounded(ranks, seconds):
    """A deadline on a blocking call of pyddp.notebook.Ranks (``ranks``): past ``seconds`` the
    ranks' processes are killed, so the call returns (a dead-rank error) instead of waiting on;
    the test then fails saying so."""
    pids = [s["pid"] for s in ranks.status()]
    fired = threading.Event()

    def kill():
        fired.set()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    timer = threading.Timer(seconds, kill)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        assert not fired.is_set(), f"the call did not return within {seconds} s: ranks killed"
