"""One node's share of a job: start its workers, watch them, stop them, restart them, report.

The agent is a single thread around one selector: worker output (when captured), SIGCHLD and the
launcher's own signals all wake the same select(), so a worker's exit is seen within milliseconds (which
is how the first failure is told from the failures it caused) and ``--monitor-interval`` is only the
longest sleep.  Being single-threaded also makes forking the workers safe.

Rendezvous is static, as with torchrun's ``--rdzv-backend static``: every worker gets MASTER_ADDR and
MASTER_PORT, and rank 0 (on node 0) hosts pyddp's TCPStore there; the agent itself holds no store.
"""
import contextlib
import errno
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import List, Optional

from .. import _config
from .._lifecycle import describe_exit, signal_group, signal_name, terminate_with_grace, wait_until_gone
from .errors import (  # noqa: F401  (LaunchError, LauncherInterrupted: the launcher's API here)
    Failure, LaunchError, LauncherInterrupted, first_failure_order, format_summary, read_failure)
from .guardian import Guardian
from .options import STD_ERR, STD_OUT, LaunchConfig
from .output import Console, LineSink, OutputPump
from .workers import Worker, live_groups, worker_argv, worker_env

# Seconds a worker gets between SIGTERM (or the forwarded SIGINT) and SIGKILL; torchrun waits 30.
GRACE_ENV = "PYDDP_RUN_GRACE"
_DEFAULT_GRACE = 30.0
# After SIGKILL: how long to wait for the kernel to take the processes away.
_KILL_WAIT = 10.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# After the first failure: how long a worker that has recorded its exception (it is on its way out)
# may take to exit by itself before it is stopped, so that the report shows its own exit code and
# not the SIGTERM it would get mid-exit.
_EXITING_WAIT = 5.0


def _remove_if_empty(path):
    try:
        if os.path.getsize(path) == 0:
            os.unlink(path)
    except OSError:
        pass


def _grace() -> float:
    try:
        return _config.get(GRACE_ENV)
    except ValueError as e:
        raise LaunchError(str(e)) from None


def free_port() -> int:
    """A port nothing listens on right now, on every interface (where rank 0's store will bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _first_time(what: str) -> bool:
    """True the first time this user asks on this machine: creates a stamp file under
    $XDG_CACHE_HOME/pyddp (default ~/.cache/pyddp).  Where that cannot be written, always True."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    stamp = os.path.join(cache, "pyddp", what)
    try:
        os.makedirs(os.path.dirname(stamp), exist_ok=True)
        os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


class _Logs:
    """Where log and error files go: ``<log-dir>/<run_id>_<x>/attempt_<n>/<local_rank>/`` as torchrun.

    Without --log-dir the error files live in a private temporary directory removed at the end, unless
    output has to be kept (--redirects, or ranks hidden by --local-ranks-filter): then a temporary log
    directory is kept and announced."""

    def __init__(self, cfg: LaunchConfig, need_files: bool):
        self.keep = True
        if cfg.log_dir:
            os.makedirs(cfg.log_dir, exist_ok=True)
            self.root = tempfile.mkdtemp(prefix=f"{cfg.run_id}_", dir=cfg.log_dir)
        elif need_files:
            self.root = tempfile.mkdtemp(prefix="pyddp_run_")
            print(f"{cfg.prog}: worker logs are written to {self.root} (no --log-dir given)",
                  file=sys.stderr, flush=True)
        else:
            self.root = tempfile.mkdtemp(prefix="pyddp_run_errors_")
            self.keep = False

    def rank_dir(self, restart, local_rank):
        d = os.path.join(self.root, f"attempt_{restart}", str(local_rank))
        os.makedirs(d, exist_ok=True)
        return d

    def close(self):
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


class Agent:
    def __init__(self, cfg: LaunchConfig):
        self.cfg = cfg
        self.host = socket.gethostname()
        self.grace = _grace()
        self._signum: Optional[int] = None
        self._signal_count = 0
        self._wakeup: Optional[int] = None
        self._stdout = Console(1)
        self._stderr = Console(2)

    # ------------------------------------------------------------ messages

    def note(self, text):
        sys.stdout.flush()
        print(f"{self.cfg.prog}: {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ job

    def run(self) -> int:
        """Run the job on this node; returns the launcher's exit code (0: every worker succeeded)."""
        cfg = self.cfg
        secret = self._secret()
        omp = self._omp_threads()
        port = cfg.master_port or free_port()
        logs = _Logs(cfg, need_files=self._need_files())
        self._guardian = Guardian()
        if cfg.timeline:
            os.makedirs(cfg.timeline, exist_ok=True)
        if not logs.keep:
            self._guardian.remove_on_exit(logs.root)
        try:
            with self._signal_handling():
                if cfg.elastic:
                    from .elastic_agent import ElasticNode

                    return ElasticNode(self, port, secret, omp, logs).run()
                if cfg.dynamic:
                    from .rdzv_agent import RendezvousNode

                    return RendezvousNode(self, secret, omp, logs).run()
                restart = 0
                while True:
                    failures = self._attempt(restart, port, secret, omp, logs)
                    if self._signum is not None:
                        self.note(f"received {signal_name(self._signum)}: stopped all workers")
                        raise LauncherInterrupted(self._signum)
                    if not failures:
                        return 0
                    root = failures[0]
                    if restart < cfg.max_restarts:
                        restart += 1
                        self.note(f"rank {root.rank} failed ({describe_exit(root.returncode)}); restarting all "
                                  f"{cfg.nproc_per_node} workers of this node (restart {restart} of "
                                  f"{cfg.max_restarts})")
                        continue
                    sys.stdout.flush()
                    print(format_summary(cfg.target, failures, self.host, restart, cfg.max_restarts),
                          file=sys.stderr, flush=True)
                    return 1
        finally:
            self._guardian.close()
            logs.close()
            if cfg.timeline:
                self._merge_timeline()

    def _merge_timeline(self):
        from ..tools import timeline

        try:
            done = timeline.merge_dir(self.cfg.timeline)
        except (OSError, ValueError) as e:
            self.note(f"--timeline: could not merge the ranks' timelines: {e}")
            return
        if done is None:
            self.note(f"--timeline: no rank wrote a timeline into {self.cfg.timeline}")
        else:
            path, ranks, n = done
            self.note(f"timeline of ranks {', '.join(map(str, ranks))} ({n} events): {path} "
                      "(open it in https://ui.perfetto.dev)")

    def _secret(self) -> str:
        """One secret per job; several nodes must share it, so it must come from outside then."""
        s = _config.get("PYDDP_SECRET")
        if s:
            return s
        if max(self.cfg.nnodes, self.cfg.max_nodes) > 1:
            nodes = str(self.cfg.nnodes) if self.cfg.max_nodes <= self.cfg.nnodes else \
                f"{self.cfg.nnodes}:{self.cfg.max_nodes}"
            raise LaunchError(
                f"--nnodes {nodes}: every node of the job must use the same PYDDP_SECRET (pyddp's "
                "ranks and rendezvous store authenticate with it), and none is set. Create one once, e.g.\n"
                "    export PYDDP_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')\n"
                "and start the launcher of every node with that same value in its environment.", exit_code=2)
        return secrets.token_hex(32)

    def _omp_threads(self) -> Optional[int]:
        if "OMP_NUM_THREADS" in os.environ or self.cfg.nproc_per_node <= 1:
            return None
        # Said once: by node 0 of a job, the first time on this machine (a stamp in the user's cache
        # directory); every later launch does the same silently.  torchrun repeats it on every launch.
        if self.cfg.node_rank == 0 and _first_time("omp_num_threads_note"):
            self.note(f"note: setting OMP_NUM_THREADS=1 for each of the {self.cfg.nproc_per_node} workers "
                      "(it was unset) so they do not overload this node; set it to tune (said once per "
                      "machine)")
        return 1

    def _need_files(self) -> bool:
        cfg = self.cfg
        if any(cfg.redirects.values()):
            return True
        return cfg.local_ranks_filter is not None and len(cfg.local_ranks_filter) < cfg.nproc_per_node

    def _check_port(self, port):
        """Node 0 hosts rank 0's store: fail before starting anything if its port is taken."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the store does
            try:
                s.bind(("", port))
            except OSError as e:
                where = f"{self.cfg.master_addr}:{port}"
                if e.errno == errno.EADDRINUSE:
                    why = (f"port {port} is already in use on this node (another job or program is "
                           "listening on it)")
                else:
                    why = f"cannot bind port {port}: {e.strerror}"
                raise LaunchError(
                    f"rank 0's rendezvous store cannot listen on {where} (MASTER_ADDR:MASTER_PORT): {why}. "
                    "Start with --standalone to use a free port, or choose another --master-port.") from None

    # ------------------------------------------------------------ one attempt

    def _stream(self, local_rank, bit, rank_dir, name):
        """How one stream of one worker is routed: ('inherit'|'file'|'tee', log path or None)."""
        cfg = self.cfg
        shown = cfg.local_ranks_filter is None or local_rank in cfg.local_ranks_filter
        path = os.path.join(rank_dir, f"{name}.log")
        if cfg.tee.get(local_rank, 0) & bit and shown:
            return "tee", path if cfg.log_dir else None
        if cfg.redirects.get(local_rank, 0) & bit or not shown:
            return "file", path
        return "inherit", None

    def _start(self, worker, rank_dir, pump):
        plans = [self._stream(worker.local_rank, STD_OUT, rank_dir, "stdout"),
                 self._stream(worker.local_rank, STD_ERR, rank_dir, "stderr")]
        popen_args = []
        opened = []
        try:
            for mode, path in plans:
                if mode == "inherit":
                    popen_args.append(None)
                elif mode == "file":
                    f = open(path, "wb")
                    opened.append(f)
                    popen_args.append(f)
                else:
                    popen_args.append(-1)   # subprocess.PIPE
            worker.start(stdout=popen_args[0], stderr=popen_args[1])
        finally:
            for f in opened:   # the child has its own copy
                f.close()
        prefix = f"[rank{worker.rank}]: ".encode()
        for (mode, path), pipe, console in ((plans[0], worker.proc.stdout, self._stdout),
                                            (plans[1], worker.proc.stderr, self._stderr)):
            if mode == "tee":
                pump.add(pipe, LineSink(console, prefix, open(path, "wb") if path else None))

    def _attempt(self, restart, port, secret, omp, logs) -> List[Failure]:
        """Start every worker of this node, wait until all succeed, one fails, or a signal arrives.

        Returns the failures (root cause first), or [] on success or signal."""
        cfg = self.cfg
        if self._signum is not None:
            return []
        if cfg.node_rank == 0:
            self._check_port(port)
        pump = OutputPump()
        if self._wakeup is not None:
            pump.add_wakeup(self._wakeup)
        workers: List[Worker] = []
        try:
            for lr in range(cfg.nproc_per_node):
                d = logs.rank_dir(restart, lr)
                err = os.path.join(d, "error.json")
                w = Worker(lr, cfg.node_rank * cfg.nproc_per_node + lr, worker_argv(cfg, lr),
                           worker_env(cfg, lr, restart, port, secret, err, omp), err)
                workers.append(w)   # before starting: a half-started worker is still stopped below
                try:
                    self._start(w, d, pump)
                except OSError as e:
                    raise LaunchError(f"cannot start worker {lr} ({' '.join(w.argv[:3])} ...): {e}") from None
                self._guardian.watch(w.pid)
            failed = self._monitor(workers, pump)
            if failed:
                seen = time.time()
                self._let_exiting_exit(workers, pump)
                self._stop(workers, pump, signal.SIGTERM)
                # A worker that had recorded an exception but was still exiting when we stopped it
                # failed too, and maybe first (the others' errors are its consequences).
                for w in workers:
                    if w not in failed and os.path.exists(w.error_file):
                        f = read_failure(w, logs.keep)
                        if f.error_time is not None and f.error_time <= seen:
                            failed.append(w)
            return first_failure_order([read_failure(w, logs.keep) for w in failed])
        finally:
            # Also on exceptions (a worker that would not start, Ctrl-C in the launcher's own code).
            self._stop(workers, pump, signal.SIGTERM)
            workers = [w for w in workers if w.proc is not None]
            self._clean_groups(workers)
            for w in workers:
                self._guardian.forget(w.pid)
                _remove_if_empty(os.path.join(os.path.dirname(w.error_file), "fault.txt"))
            pump.close()

    def _let_exiting_exit(self, workers, pump):
        """Wait up to _EXITING_WAIT for the workers that recorded an exception (their error file
        exists: they raised too, often the same error as the first failure) to exit by themselves."""
        deadline = time.monotonic() + _EXITING_WAIT
        while time.monotonic() < deadline and self._signum is None:
            now = time.time()
            if not [w for w in workers if w.proc is not None and w.poll(now) is None
                    and os.path.exists(w.error_file)]:
                return
            pump.pump(0.02)

    def _monitor(self, workers, pump) -> List[Worker]:
        """Wait for the end: every worker exited 0 ([]), or some failed (them), or a signal ([])."""
        live = list(workers)
        while live:
            pump.pump(self.cfg.monitor_interval)
            if self._signum is not None:
                self._stop(workers, pump, self._signum)
                return []
            now = time.time()
            gone = [w for w in live if w.poll(now) is not None]
            failed = [w for w in gone if w.returncode != 0]
            if failed:
                return failed
            live = [w for w in live if w.returncode is None]
        # Let the pipes drain: output printed just before exiting must not be lost.
        deadline = time.monotonic() + 1.0
        while pump.pending() and time.monotonic() < deadline:
            pump.pump(0.05)
        return []

    def _stop(self, workers, pump, sig):
        """Signal every running worker's group, give them the grace period, then SIGKILL.

        A second launcher signal during the wait kills at once."""
        def running(ws):
            return [w for w in ws if w.poll() is None]

        def slow(live):
            self.note(f"waiting up to {self.grace:.0f} s for {len(live)} worker(s) to stop after "
                      f"{signal_name(sig)} (send SIGINT/Ctrl-C again to kill them now)")

        def wait_grace(live):
            # Any further launcher signal (a second Ctrl-C) cuts the wait short.
            signals_seen = self._signal_count
            return wait_until_gone(live, running, self.grace, pause=pump.pump,
                                   cut_short=lambda: self._signal_count != signals_seen, on_slow=slow)

        def wait_kill(live):
            return wait_until_gone(live, running, _KILL_WAIT, pause=pump.pump)

        terminate_with_grace([w for w in workers if w.proc is not None], lambda w, s: w.signal_group(s),
                             running, wait_grace, wait_kill, sig=sig)

    def _clean_groups(self, workers):
        """Whatever a worker started in its process group must not outlive the job (TERM, then KILL)."""
        terminate_with_grace(
            [w.pid for w in workers], signal_group, live_groups,
            wait_grace=lambda groups: wait_until_gone(groups, live_groups, min(self.grace, 5.0)))

    # ------------------------------------------------------------ signals

    def _on_signal(self, signum, frame):
        if self._signum is None:
            self._signum = signum
        self._signal_count += 1

    @contextlib.contextmanager
    def _signal_handling(self):
        """Catch SIGINT/SIGTERM/SIGHUP (forwarded to the workers) and wake the selector on SIGCHLD.

        Only the main thread may install handlers; elsewhere the agent polls every --monitor-interval
        and signals are left to the caller."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        old = {}
        try:
            for s in _FORWARDED:
                old[s] = signal.signal(s, self._on_signal)
            old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda signum, frame: None)
            self._wakeup = r
            yield
        finally:
            self._wakeup = None
            for s, h in old.items():
                signal.signal(s, h)
            signal.set_wakeup_fd(old_fd)
            os.close(r)
            os.close(w)


def launch(cfg: LaunchConfig) -> int:
    """Run cfg's job on this node.  Returns the exit code; raises LaunchError when it cannot start and
    LauncherInterrupted after a signal stopped it."""
    return Agent(cfg).run()
