"""A helper process that kills the workers' process groups if the launcher dies without stopping them.

PR_SET_PDEATHSIG kills each worker when the launcher dies, even by SIGKILL, but not what the worker
started (data-loader processes, shells, ...): those would live on as orphans.  So the launcher starts this
small process (its own session, so a Ctrl-C or a kill of the launcher's process group does not reach it)
and tells it, through a pipe, which process groups to guard: ``+<pgid>`` when a worker starts, ``-<pgid>``
once its group is gone, ``d<path>`` for a private directory to remove.  When the pipe reaches
end-of-file (the launcher exited, however it exited) the guardian SIGKILLs the groups still listed,
removes the directories and exits.  It is started with ``python -I`` and needs only
the standard library.
"""
import os
import shutil
import signal
import subprocess
import sys


class Guardian:
    """The launcher's end: start the helper, tell it about process groups."""

    def __init__(self):
        r, w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), str(r)], pass_fds=(r,),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        except OSError:
            os.close(w)
            self._proc, w = None, -1
        finally:
            os.close(r)
        self._w = w

    def _send(self, line):
        if self._w < 0:
            return
        try:
            os.write(self._w, line.encode())
        except OSError:   # the guardian is gone: PR_SET_PDEATHSIG still covers the workers
            os.close(self._w)
            self._w = -1

    def watch(self, pgid):
        self._send(f"+{pgid}\n")

    def forget(self, pgid):
        self._send(f"-{pgid}\n")

    def remove_on_exit(self, path):
        """A directory only the launcher uses (error files): removed even if the launcher is killed."""
        if "\n" not in path:
            self._send(f"d{path}\n")

    def close(self):
        """Normal end: every group was already cleaned (and forgotten); the guardian exits on EOF."""
        if self._w >= 0:
            os.close(self._w)
            self._w = -1
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _guard(fd):
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    groups = set()
    dirs = []
    buf = b""
    while True:
        try:
            data = os.read(fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.startswith(b"d"):
                dirs.append(os.fsdecode(line[1:]))
                continue
            try:
                pgid = int(line[1:])
            except ValueError:
                continue
            if line.startswith(b"+"):
                groups.add(pgid)
            elif line.startswith(b"-"):
                groups.discard(pgid)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    _guard(int(sys.argv[1]))
