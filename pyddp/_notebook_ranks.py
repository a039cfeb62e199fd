"""Persistent ranks for a notebook: ``pyddp.notebook.Ranks`` (and the ``%ddp`` / ``%%ddp`` magics of
pyddp.notebook_magics, which drive it).

notebook_launcher runs one function and its ranks end with it; Ranks keeps N rank processes alive
across cells, each with an initialised default process group and a namespace of its own, and runs code
on them cell after cell.

    kernel (Ranks)                              rank r (a fresh interpreter: ``python -c``)
    ------------------------------------------  --------------------------------------------------
    listens on 127.0.0.1:<any port>             die_with_parent(SIGKILL); connects, answers the
    Popen x N, own session each, torchrun's     HMAC challenge with the job secret (and checks the
    environment + PYDDP_SECRET + the address    kernel's), says hello(r), init_process_group(),
    accepts authenticated connections only      says ready; then loops: run / push / pull / stop

Messages are pickled and length-prefixed (multiprocessing.connection.Connection) on a TCP socket bound
to 127.0.0.1; both ends prove they know the job's fresh secret (multiprocessing's HMAC challenge)
before anything is unpickled, so no other process can send code to the ranks.  A rank's stdout and
stderr are pipes the kernel reads while it waits, printing each line prefixed ``[rankN]: `` into the
running cell (pyddp._rank_io: progress bars as one updating line; display() and matplotlib figures
come as messages on the socket).  A request that leaves a rank's default process group failed (a
collective mismatch) is followed by a re-initialisation of the group on every rank.  Interrupting
the kernel while it waits sends SIGINT to the busy ranks (their cell raises KeyboardInterrupt, the
ranks stay usable); a rank that does not stop within ``interrupt_grace`` seconds is reported.  A rank
that dies is reported with its exit cause.  When the kernel dies, the kernel
(Linux parent-death signal) SIGKILLs its ranks.

Standard library only at import; the rank imports pyddp.distributed when it starts.
"""
import ast
import atexit
import inspect
import linecache
import multiprocessing.connection as _mpc
import os
import pickle
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import traceback
import weakref

from . import _rank_io
from ._lifecycle import describe_exit, die_with_parent, signal_group

__all__ = ["Ranks", "RanksError"]

_POLL = 0.1
# Seconds between the SIGINTs an interrupted cell's busy ranks are sent until they answer.
_RESIGNAL = 0.3
_STOP_GRACE = 3.0
# Seconds a connection to the kernel's port gets to prove it knows the secret and say hello.
_HANDSHAKE = 10.0


def _check_figures(figures, name="figures"):
    """A rank, a list of ranks, "all" or None (no rank sends its figures): the set, or "all"."""
    if figures is None:
        return frozenset()
    if figures == "all":
        return "all"
    if isinstance(figures, int) and not isinstance(figures, bool):
        figures = [figures]
    try:
        out = frozenset(figures)
    except TypeError:
        out = None
    if out is None or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in out):
        raise ValueError(f"{name} must be a rank, a list of ranks, 'all' or None, got {figures!r}")
    return out


def _sends_figures(figures, rank):
    return figures == "all" or rank in figures


class RanksError(RuntimeError):
    """Code run on the ranks failed on some of them: ``errors`` maps each failing rank to its
    traceback text (or to why it died).  The ranks that are still alive stay usable."""

    def __init__(self, message, errors=None):
        super().__init__(message)
        self.errors = dict(errors or {})

    def _render_traceback_(self):
        # IPython shows this instead of the kernel-side traceback (which is only Ranks' internals).
        return str(self).splitlines()


class CellResult:
    """What a cell run on the ranks evaluated to: ``values`` maps each rank to the repr of its last
    expression (None when the cell does not end with an expression or it is None); ``displays``:
    what the ranks displayed during the cell (display() and matplotlib figures), a list of
    (rank, {mime type: data}) in order, shown in the cell when it runs in a Jupyter kernel;
    ``figures``: the PNG bytes among them."""

    def __init__(self, values, displays=()):
        self.values = dict(values)
        self.displays = list(displays)

    @property
    def figures(self):
        """The PNG bytes of the images the ranks displayed (their matplotlib figures), in order."""
        return [d["image/png"] for _, d in self.displays if isinstance(d.get("image/png"), bytes)]

    def agreed(self):
        """The repr every rank produced, or None when they differ or there is none."""
        vals = set(self.values.values())
        return vals.pop() if len(vals) == 1 else None

    def __repr__(self):
        one = self.agreed()
        if one is not None:
            return one
        return "\n".join(f"[rank{r}]: {v}" for r, v in sorted(self.values.items()) if v is not None)

    def __bool__(self):
        return any(v is not None for v in self.values.values())


def _timeval(seconds):
    import struct

    return struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))


def _set_rcvtimeo(fd, seconds):
    s = socket.socket(fileno=fd)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))
    finally:
        s.detach()


def _free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


# ---------------------------------------------------------------------------------- backend 'mpi'

def _signal_proc(proc, sig):
    """Send sig to a rank's process group (each rank leads one: Popen's own session, or mpirun's
    setpgid), or to the process alone where it leads none; False when it is gone."""
    pid = proc.pid
    if pid is None:
        return False
    if signal_group(pid, sig):
        return True
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _exit_text(proc):
    """How a rank's process ended, in words."""
    describe = getattr(proc, "describe", None)
    return describe() if describe is not None else describe_exit(proc.returncode)


def find_mpirun():
    """The MPI launcher backend 'mpi' starts notebook ranks with: PYDDP_MPIRUN (a path), else
    mpirun or mpiexec on the PATH; RuntimeError naming what to install when there is none."""
    import shutil

    from . import _config

    named = _config.get("PYDDP_MPIRUN")
    if named:
        found = shutil.which(named)
        if found is None:
            raise RuntimeError(f"PYDDP_MPIRUN={named!r}: no such program (expected the path of "
                               "mpirun or mpiexec)")
        return found
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("backend 'mpi' starts its ranks with mpirun, which is not on the PATH: "
                       "install an MPI (Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin) "
                       "and mpi4py (pip install 'pyddp[mpi]'), or set PYDDP_MPIRUN")


# mpirun's words for how a rank ended: Open MPI's "process rank 1 with PID 0 on node vm exited on
# signal 9 (Killed)" and "Process name: [[28693,1],1] / Exit code: 3"; MPICH (Hydra) names the pid:
# "PID 1234 RUNNING AT host / EXIT CODE: 9" (a signal's number when a signal ended it)
_OMPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")
_OMPI_EXIT = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(\d+)")
_HYDRA = re.compile(r"PID (\d+) RUNNING AT \S+\s*=*\s*EXIT CODE: (\d+)")


class _MpiLauncher:
    """One ``mpirun -n N python -c BOOT`` for backend 'mpi': the ranks are MPI_COMM_WORLD's (their
    rank comes from mpirun's environment), each writes its stdout / stderr into a FIFO of its own
    (in a private directory), so that the kernel reads them apart, as the other backends' pipes;
    what mpirun itself prints is shown with ``[mpirun]: `` and kept to tell how a rank ended."""

    def __init__(self, nprocs, env, boot):
        import tempfile

        mpirun = find_mpirun()
        self.nprocs = nprocs
        self.dir = tempfile.mkdtemp(prefix="pyddp-ranks-")   # 0700: nobody else opens the FIFOs
        self.readers, self.holders = {}, {}
        self.tail = ""
        self._pending = {}
        self._fds = []   # the FIFOs' read ends
        env = dict(env)
        for k in ("RANK", "LOCAL_RANK", "PYDDP_RANKS_PARENT"):
            env.pop(k, None)
        env["PYDDP_RANKS_FIFOS"] = self.dir
        # Open MPI: more ranks than cores is what a notebook on a laptop asks for; ranks that wait
        # yield their core; a kernel running as root (containers) may start them
        env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        if os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        try:
            for r in range(nprocs):
                for what in ("out", "err"):
                    path = os.path.join(self.dir, f"{r}.{what}")
                    os.mkfifo(path, 0o600)
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                    self._fds.append(fd)
                    self.readers.setdefault(r, {})[fd] = [what == "err", b""]
                    # a writer of ours until the rank opens its own: no end of file before then
                    self.holders.setdefault(r, []).append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            parent = os.getpid()
            self.proc = subprocess.Popen(
                [mpirun, "-n", str(nprocs), sys.executable, "-c", boot], env=env, cwd=os.getcwd(),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
                # mpirun ends its ranks when it is told to end: when the kernel dies too
                preexec_fn=lambda: die_with_parent(signal.SIGTERM, parent) and os._exit(1))
        except BaseException:
            self.close()
            raise
        self._own = {}
        for f, is_err in ((self.proc.stdout, False), (self.proc.stderr, True)):
            os.set_blocking(f.fileno(), False)
            self._own[f.fileno()] = is_err

    def outputs(self, rank):
        return self.readers[rank]

    def connected(self, rank):
        """Rank ``rank`` said hello: it holds its FIFOs open (it opened them first), so ours go,
        and once every rank has, the FIFOs' names do too (nothing is left of them on disk when
        the kernel dies later)."""
        for fd in self.holders.pop(rank, ()):
            os.close(fd)
        if not self.holders:
            import shutil

            shutil.rmtree(self.dir, ignore_errors=True)

    def fds(self):
        return list(self._own)

    def pump(self, final=False):
        """Show what mpirun printed (its own messages: a rank that failed, the job aborted)."""
        for fd in list(self._own):
            chunks, closed = _rank_io.read_available(fd)
            if chunks:
                text = self._pending.get(fd, "") + b"".join(chunks).decode("utf-8", "replace")
                lines = text.split("\n")
                self._pending[fd] = lines.pop()
                self._show(lines)
            if closed:
                self._own.pop(fd)
        if final:
            self._show([t for t in self._pending.values() if t])
            self._pending.clear()

    def _show(self, lines):
        lines = [ln for ln in lines if ln.strip() and set(ln.strip()) != {"-"}]
        if lines:
            sys.stderr.write("".join(f"[mpirun]: {ln}\n" for ln in lines))
            sys.stderr.flush()
            self.tail = (self.tail + "\n" + "\n".join(lines))[-16384:]

    def settle(self, pump, seconds):
        """Wait (up to ``seconds``) for mpirun to end after a rank died, showing what it says."""
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None and time.monotonic() < deadline:
            pump()
            time.sleep(0.05)
        pump()

    def cause(self, rank, pid):
        """What mpirun said of how ``rank`` (process ``pid``) ended, or None."""
        text = " ".join(self.tail.split())
        for m in _OMPI_SIGNAL.finditer(text):
            if int(m.group(1)) == rank:
                return describe_exit(-int(m.group(2)))
        for m in _OMPI_EXIT.finditer(text):
            if int(m.group(1)) == rank:
                return describe_exit(int(m.group(2)))
        for m in _HYDRA.finditer(text):
            if pid is not None and int(m.group(1)) == pid:
                return (f"exit code {m.group(2)} (as mpiexec reports it: a signal's number when "
                        "a signal ended it)")
        return None

    def first_death(self):
        text = " ".join(self.tail.split())
        m = _OMPI_SIGNAL.search(text) or _OMPI_EXIT.search(text)
        return int(m.group(1)) if m else None

    def close(self):
        for fds in self.holders.values():
            for fd in fds:
                os.close(fd)
        self.holders.clear()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        proc = getattr(self, "proc", None)
        if proc is not None:
            for f in (proc.stdout, proc.stderr):
                try:
                    f.close()
                except OSError:
                    pass
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


class _MpiRankProc:
    """A rank started by mpirun, as the kernel sees it (the part of Popen's interface Ranks uses):
    its pid comes in its hello; until then it lives while mpirun does.  Not the kernel's child, so
    its end is watched through a pidfd (Linux 5.3+; elsewhere the pid is probed) and its exit
    status is what mpirun reports."""

    def __init__(self, rank, launcher):
        self.rank = rank
        self.launcher = launcher
        self.pid = None
        self._pidfd = None
        self.returncode = None
        self.stdout = self.stderr = None   # its output: the launcher's FIFOs

    def connected(self, pid):
        self.pid = pid
        self.launcher.connected(self.rank)
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def poll(self):
        if self.returncode is not None:
            return self.returncode
        if self.pid is None:
            gone = self.launcher.proc.poll() is not None
        elif self._pidfd is not None:
            import select

            gone = bool(select.select([self._pidfd], [], [], 0)[0])
        else:
            try:
                os.kill(self.pid, 0)
                gone = False
            except ProcessLookupError:
                gone = True
            except OSError:
                gone = False
        if gone:
            self.returncode = -1   # (not ours to reap: how it ended is describe()'s)
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("mpirun rank", timeout)
            time.sleep(0.02)
        return self.returncode

    def describe(self):
        said = self.launcher.cause(self.rank, self.pid)
        if said is not None:
            return said
        first = self.launcher.first_death()
        if first is not None and first != self.rank:
            return f"ended by mpirun after rank {first} died: an MPI job ends with any of its ranks"
        rc = self.launcher.proc.poll()
        if rc is not None:
            return f"ended with mpirun ({describe_exit(rc)})"
        return "ended (mpirun has not said how)"


# ---------------------------------------------------------------------------------- the kernel's end

class _Rank:
    def __init__(self, rank, proc):
        self.rank = rank
        self.proc = proc
        self.conn = None
        self.busy = None        # the id of the request it is working on, or None
        self.last_error = None
        self.exit_cause = None
        self.out = {}           # fd -> [is_stderr, pending bytes]

    def alive(self):
        return self.proc.poll() is None and self.exit_cause is None


class Ranks:
    """N persistent ranks that run code sent from a notebook (or any Python process).

    ``Ranks(nprocs=2, backend="cpu").start()`` starts ``nprocs`` fresh Python interpreters on this host
    with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
    a free MASTER_PORT) and a fresh PYDDP_SECRET; each calls
    ``pyddp.distributed.init_process_group(backend)`` and then waits for code.  ``run(code)`` executes
    code on every rank (or ``ranks=[...]``) in a namespace per rank that lives until ``stop()``;
    ``push`` and ``pull`` move objects between this process and the ranks.  Each rank prints into this
    process's stdout, every line prefixed ``[rankN]: ``.

    Every wait has a deadline (``start_timeout`` for starting; a cell runs as long as it runs, and
    interrupting it - KeyboardInterrupt here - sends SIGINT to the ranks and waits ``interrupt_grace``
    seconds for them to stop).  Ranks die with the thread that started them (Linux)."""

    def __init__(self, nprocs=2, backend="cpu", *, start_timeout=120.0, interrupt_grace=5.0,
                 quiet_others=False, figures=0, cuda_on_cpu=False):
        if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
            raise ValueError(f"nprocs must be a positive int, got {nprocs!r}")
        for name, v in (("start_timeout", start_timeout), ("interrupt_grace", interrupt_grace)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        self.nprocs = nprocs
        self.backend = backend
        self.start_timeout = float(start_timeout)
        self.interrupt_grace = float(interrupt_grace)
        self.quiet_others = quiet_others
        self.figures = figures
        _check_figures(figures)
        if not isinstance(cuda_on_cpu, bool):
            raise ValueError(f"cuda_on_cpu must be True or False, got {cuda_on_cpu!r}")
        self.cuda_on_cpu = cuda_on_cpu
        self._out = _rank_io.Presenter(elsewhere="kept in the CellResult's .displays; shown only "
                                                 "in a Jupyter kernel")
        self._ranks = []
        self._server = None
        self._secret = None
        self._port = None
        self._next_id = 0
        self._next_cell = 0
        self._atexit = None
        self._launcher = None   # backend 'mpi': the mpirun that started the ranks (_MpiLauncher)

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self):
        """Whether the ranks were started and not stopped (some may have died since)."""
        return bool(self._ranks)

    def start(self):
        """Start the ranks and wait until every one has initialised its process group.  Raises
        RuntimeError when they are running already, RanksError when a rank fails to start (the
        others are stopped then).  Returns self."""
        if self._ranks:
            raise RuntimeError(f"{len(self._ranks)} ranks are running already; stop() or restart() "
                               "them first")
        self._secret = secrets.token_hex(32)
        self._port = _free_port()
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(self.nprocs + 4)
        server.settimeout(_POLL)
        self._server = server
        addr = server.getsockname()
        path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        boot = ("import sys, os; sys.path[:] = os.environ.pop('PYDDP_RANKS_PATH').split(os.pathsep); "
                "from pyddp._notebook_ranks import _rank_main; _rank_main()")
        env = dict(os.environ)
        for k in ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "ROLE_RANK"):
            env.pop(k, None)
        env.update({
            "WORLD_SIZE": str(self.nprocs), "LOCAL_WORLD_SIZE": str(self.nprocs), "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self._port), "PYDDP_SECRET": self._secret,
            "PYTHONUNBUFFERED": "1", "PYDDP_RANKS_ADDR": f"{addr[0]}:{addr[1]}",
            "PYDDP_RANKS_PARENT": str(os.getpid()), "PYDDP_RANKS_BACKEND": str(self.backend or ""),
            "PYDDP_RANKS_PATH": os.pathsep.join(path),
            # Agg, whose show() sends the figures to the kernel (the kernel's inline backend
            # means nothing in a rank)
            "MPLBACKEND": _rank_io.MPL_BACKEND,
        })
        if self.nprocs > 1 and not os.environ.get("OMP_NUM_THREADS"):
            env["OMP_NUM_THREADS"] = "1"   # torchrun's policy for ranks sharing a host
        if self.cuda_on_cpu:
            # pyddp-run --cuda-on-cpu's: a GPU script's lines on this CPU, one emulated device
            # per rank, 'nccl' on the cpu backend; refused (here, once) where a GPU is visible
            from .cuda import _emulation

            _emulation.enable_for_children(env)
        try:
            if isinstance(self.backend, str) and "mpi" in self.backend:
                # MPI's ranks are MPI_COMM_WORLD's: one mpirun starts them all (its ranks' own
                # environment says who they are), and their output comes through FIFOs
                self._launcher = _MpiLauncher(self.nprocs, env, boot)
                self._ranks = [_Rank(r, _MpiRankProc(r, self._launcher)) for r in range(self.nprocs)]
                for rk in self._ranks:
                    rk.out.update(self._launcher.outputs(rk.rank))
            for r in range(0 if self._launcher else self.nprocs):
                env_r = dict(env, RANK=str(r), LOCAL_RANK=str(r))
                proc = subprocess.Popen([sys.executable, "-c", boot], env=env_r, cwd=os.getcwd(),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
                rk = _Rank(r, proc)
                for f, is_err in ((proc.stdout, False), (proc.stderr, True)):
                    fd = f.fileno()
                    os.set_blocking(fd, False)
                    rk.out[fd] = [is_err, b""]
                self._ranks.append(rk)
            deadline = time.monotonic() + self.start_timeout
            self._accept_all(deadline)
            self._wait_ready(deadline)
        except BaseException:
            self._stop_processes()
            raise
        if self._atexit is None:
            ref = weakref.ref(self)
            self._atexit = lambda: ref() is not None and ref().stop()
            atexit.register(self._atexit)
        return self

    def _accept_all(self, deadline):
        waiting = {rk.rank: rk for rk in self._ranks}
        while waiting:
            self._pump()
            for rk in waiting.values():
                if rk.proc.poll() is not None:
                    self._pump(final=True)
                    raise RanksError(f"rank {rk.rank} exited ({_exit_text(rk.proc)}) "
                                     "before it connected; its output is above")
            if time.monotonic() > deadline:
                raise RanksError(f"ranks {sorted(waiting)} did not connect within "
                                 f"{self.start_timeout:g} s (start_timeout; their output, if any, "
                                 "is above)")
            try:
                sock, _ = self._server.accept()
            except (socket.timeout, BlockingIOError):
                continue
            sock.setblocking(True)
            # Every read of the handshake is bounded: a connection that says nothing (not one of
            # ours) must not hold up the start (a blocking read there had no end).
            limit = max(0.5, min(_HANDSHAKE, deadline - time.monotonic()))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(limit))
            conn = _mpc.Connection(sock.detach())
            try:
                key = self._secret.encode()
                _mpc.deliver_challenge(conn, key)
                _mpc.answer_challenge(conn, key)
                if not conn.poll(limit):
                    raise EOFError("no hello")
                kind, rank, pid = conn.recv()
                if kind != "hello" or rank not in waiting or not isinstance(pid, int):
                    raise EOFError("unexpected hello")
            except (OSError, EOFError, _mpc.AuthenticationError, pickle.UnpicklingError, ValueError,
                    TypeError):
                conn.close()   # not one of ours: nothing it sent was unpickled unless it proved the secret
                continue
            _set_rcvtimeo(conn.fileno(), 0.0)
            rk = waiting.pop(rank)
            rk.conn = conn
            if isinstance(rk.proc, _MpiRankProc):
                rk.proc.connected(pid)

    def _wait_ready(self, deadline):
        pending = {rk.rank for rk in self._ranks}
        failures = {}
        while pending:
            for rank, msg in self._wait_messages(pending, deadline):
                pending.discard(rank)
                if msg[0] != "ready" or msg[1] is not None:
                    failures[rank] = msg[1] if msg[0] == "ready" else repr(msg)
            if time.monotonic() > deadline and pending:
                raise RanksError(f"ranks {sorted(pending)} did not initialise their process group "
                                 f"within {self.start_timeout:g} s (start_timeout)")
            dead = [rk for rk in self._ranks if rk.rank in pending and not rk.alive()]
            for rk in dead:
                failures[rk.rank] = f"exited ({_exit_text(rk.proc)}) while starting"
                pending.discard(rk.rank)
        if failures:
            self._pump(final=True)
            raise RanksError("ranks failed to start:\n" + "\n".join(
                f"[rank{r}]: {t}" for r, t in sorted(failures.items())), failures)

    def stop(self):
        """Stop every rank: ask each to leave (destroying its process group), then SIGTERM and SIGKILL
        what is left after a few seconds.  Nothing of the ranks is left running when it returns."""
        if not self._ranks:
            return
        for rk in self._ranks:
            if rk.conn is not None and rk.alive():
                try:
                    rk.conn.send(("stop",))
                except OSError:
                    pass
        self._stop_processes()

    def restart(self):
        """stop() then start(): fresh processes, namespaces and process group.  Returns self."""
        self.stop()
        return self.start()

    def _stop_processes(self):
        ranks, self._ranks = self._ranks, []
        try:
            deadline = time.monotonic() + _STOP_GRACE
            launcher = self._launcher
            procs = [rk.proc for rk in ranks] + ([launcher.proc] if launcher else [])
            for sig in (signal.SIGTERM, signal.SIGKILL):
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    self._pump(ranks=ranks)
                    time.sleep(0.05)
                for p in procs:
                    if p.poll() is None:
                        _signal_proc(p, sig)
                deadline = time.monotonic() + _STOP_GRACE
            for p in procs:
                try:
                    p.wait(timeout=_STOP_GRACE)
                except subprocess.TimeoutExpired:
                    pass
            self._pump(ranks=ranks, final=True)
        finally:
            if self._launcher is not None:
                self._launcher.close()
                self._launcher = None
            for rk in ranks:
                for f in (rk.proc.stdout, rk.proc.stderr):
                    try:
                        if f is not None:   # (mpirun's ranks: the launcher's FIFOs, closed there)
                            f.close()
                    except OSError:
                        pass
                if rk.conn is not None:
                    rk.conn.close()
            if self._server is not None:
                self._server.close()
                self._server = None
            if self._atexit is not None:
                atexit.unregister(self._atexit)
                self._atexit = None

    def status(self):
        """One dict per rank: rank, pid, alive, busy, last_error (the traceback of the last request
        that failed there, or None) and
        exit (how it ended, when it is not alive)."""
        self._poll_idle()
        out = []
        for rk in self._ranks:
            alive = rk.alive()
            out.append({"rank": rk.rank, "pid": rk.proc.pid, "alive": alive, "busy": rk.busy is not None,
                        "last_error": rk.last_error,
                        "exit": None if alive else (rk.exit_cause or _exit_text(rk.proc))})
        return out

    # ------------------------------------------------------------------ output and messages
    def _pump(self, ranks=None, final=False):
        """Show what the ranks wrote (pyddp._rank_io.Presenter): every complete line, lines redrawn
        with \\r as one updating line; all of it when final."""
        for rk in self._ranks if ranks is None else ranks:
            for fd, entry in list(rk.out.items()):
                chunks, closed = _rank_io.read_available(fd)
                for chunk in chunks:
                    self._out.feed(rk.rank, entry[0], chunk)
                if closed:
                    self._out.feed(rk.rank, entry[0], b"", final=True)
                    rk.out.pop(fd)
            if final:
                self._out.finish(rk.rank)
        if self._launcher is not None:
            self._out.flush()
            self._launcher.pump(final)
        self._out.tick()
        self._out.flush()

    def _mark_dead(self, rk):
        if rk.exit_cause is None:
            try:
                rk.proc.wait(timeout=2.0)
                if self._launcher is not None:   # what mpirun says of it comes as mpirun ends
                    self._launcher.settle(self._pump, 2.0)
                rk.exit_cause = _exit_text(rk.proc)
            except subprocess.TimeoutExpired:
                rk.exit_cause = "its connection closed"
                _signal_proc(rk.proc, signal.SIGKILL)
        rk.busy = None

    def _wait_messages(self, ranks, deadline=None):
        """Wait (up to deadline, at least one poll) for messages of the given ranks, printing output
        meanwhile; returns [(rank, message)].  A rank that died is marked so (and returned nothing)."""
        by_conn = {rk.conn: rk for rk in self._ranks if rk.rank in ranks and rk.conn is not None
                   and rk.alive()}
        fds = [fd for rk in self._ranks for fd in rk.out]
        if self._launcher is not None:
            fds += self._launcher.fds()
        left = _POLL if deadline is None else max(0.0, min(_POLL, deadline - time.monotonic()))
        ready = _mpc.wait(list(by_conn) + fds, timeout=left)
        self._pump()
        got = []
        for c in ready:
            rk = by_conn.get(c)
            if rk is None:
                continue
            try:
                got.append((rk.rank, c.recv()))
            except (EOFError, OSError):
                self._mark_dead(rk)
        for rk in by_conn.values():
            if rk.proc.poll() is not None and rk.exit_cause is None:
                try:   # its last message may still be there
                    while rk.conn.poll(0):
                        got.append((rk.rank, rk.conn.recv()))
                except (EOFError, OSError):
                    pass
                self._mark_dead(rk)
        out = []
        for rank, msg in got:
            if msg[0] == "show":   # display() or a figure, in the middle of a request
                self._pump()       # the text the rank printed before it
                self._out.show(rank, msg[2])
            else:
                out.append((rank, msg))
        return out

    def _poll_idle(self):
        """Collect late replies (of a cell a rank finished after it was reported) and deaths."""
        if not self._ranks:
            return
        for rank, msg in self._wait_messages({rk.rank for rk in self._ranks}, time.monotonic()):
            rk = self._ranks[rank]
            if msg[0] == "done" and msg[1] == rk.busy:
                rk.busy = None
                rk.last_error = msg[3] or rk.last_error

    def _select(self, ranks):
        if not self._ranks:
            raise RuntimeError("the ranks are not running: start() them first "
                               "(in a notebook: %ddp start -n 2)")
        if ranks is None:
            chosen = list(self._ranks)
        else:
            if isinstance(ranks, int):
                ranks = [ranks]
            chosen = []
            for r in ranks:
                if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < len(self._ranks):
                    raise ValueError(f"no rank {r!r}: the ranks are 0..{len(self._ranks) - 1}")
                chosen.append(self._ranks[r])
        self._poll_idle()
        dead = [rk for rk in chosen if not rk.alive()]
        for rk in dead:
            if rk.exit_cause is None:
                self._mark_dead(rk)
        if dead:
            raise RanksError("; ".join(f"rank {rk.rank} is dead ({rk.exit_cause})" for rk in dead)
                             + ": restart() the ranks (%ddp restart)")
        busy = [rk.rank for rk in chosen if rk.busy is not None]
        if busy:
            raise RanksError(f"ranks {busy} are still busy with an earlier cell that did not stop; "
                             "wait, interrupt again, or restart() them (%ddp restart)")
        return chosen

    def _request(self, chosen, make):
        """Send make(rank) to each chosen rank and wait for their 'done' replies; KeyboardInterrupt
        here sends SIGINT to those still busy.  Returns ({rank: payload}, {rank: error}, interrupted)."""
        self._next_id += 1
        rid = self._next_id
        results, errors, broken = {}, {}, {}
        interrupted_at = None
        signalled = 0.0   # when the busy ranks were last sent SIGINT
        to_send = list(chosen)
        while True:
            try:
                # (sent inside the try: an interrupt while sending, with some ranks already
                # running the cell, is an interrupt of the cell; the rest are not sent it)
                while to_send:
                    rk = to_send[0]
                    try:
                        rk.busy = rid   # (before the send: a rank sent the cell is one to interrupt)
                        rk.conn.send(make(rk.rank) + (rid,))
                    except OSError:
                        self._mark_dead(rk)
                    to_send.pop(0)
                pending = {rk.rank for rk in chosen if rk.busy == rid and rk.alive()}
                if not pending:
                    break
                if interrupted_at is not None and time.monotonic() - interrupted_at > self.interrupt_grace:
                    for r in sorted(pending):
                        errors[r] = (f"did not stop within {self.interrupt_grace:g} s of the interrupt; "
                                     "it is still running (interrupt again, or %ddp restart)")
                    break
                if interrupted_at is not None and time.monotonic() - signalled > _RESIGNAL:
                    # again, until they answer: a rank that was still receiving the cell when
                    # the first came had not started it, and ignored it
                    signalled = time.monotonic()
                    for rk in chosen:
                        if rk.busy == rid and rk.alive():
                            _signal_proc(rk.proc, signal.SIGINT)
                for rank, msg in self._wait_messages(pending):
                    rk = self._ranks[rank]
                    if msg[0] != "done" or msg[1] != rid:
                        continue
                    rk.busy = None
                    if len(msg) > 4 and msg[4]:
                        broken[rank] = msg[4]
                    if msg[3] is not None:
                        rk.last_error = msg[3]
                        errors[rank] = msg[3]
                    else:
                        results[rank] = msg[2]
            except KeyboardInterrupt:
                if interrupted_at is not None and time.monotonic() - interrupted_at > 0.5:
                    interrupted_at = -1e9   # a second interrupt: stop waiting now
                    continue
                interrupted_at = signalled = time.monotonic()
                to_send.clear()
                for rk in chosen:
                    if rk.busy == rid and rk.alive():
                        _signal_proc(rk.proc, signal.SIGINT)
        for rk in chosen:
            if rk.rank not in results and rk.rank not in errors and not rk.alive():
                if rk.exit_cause is None:   # its end seen before its connection's
                    self._mark_dead(rk)
                errors[rk.rank] = f"died ({rk.exit_cause}) while running the cell; %ddp restart"
                rk.last_error = errors[rk.rank]
        self._pump(final=True)
        for r in sorted(errors):   # what a quiet rank wrote to stderr, now that it failed
            self._out.reveal(r)
        if broken:
            note = self._reinit(broken)
            for r in errors:
                errors[r] = errors[r].rstrip() + "\n" + note
            if not errors:
                print(note, file=sys.stderr)
        return results, errors, interrupted_at is not None

    def _reinit(self, broken):
        """The default process group failed on some ranks (a collective mismatch, a peer's error):
        every rank destroys it and initialises a fresh one on a fresh port, so that the next cell
        has a working group.  Returns the note that says so (or why it could not be done)."""
        why = next(iter(broken.values())).strip().splitlines()[0]
        ready = [rk for rk in self._ranks if rk.alive() and rk.busy is None]
        if len(ready) < len(self._ranks):
            return (f"[pyddp] the process group failed ({why}); it could not be re-initialised "
                    "because some ranks are dead or busy: %ddp restart (Ranks.restart())")
        port = _free_port()
        self._next_id += 1
        rid = self._next_id
        for rk in ready:
            try:
                rk.conn.send(("reinit", port, rid))
                rk.busy = rid
            except OSError:
                self._mark_dead(rk)
        deadline = time.monotonic() + self.start_timeout
        failed = {}
        try:
            while True:
                pending = {rk.rank for rk in ready if rk.busy == rid and rk.alive()}
                if not pending or time.monotonic() > deadline:
                    break
                for rank, msg in self._wait_messages(pending, deadline):
                    if msg[0] == "done" and msg[1] == rid:
                        self._ranks[rank].busy = None
                        if msg[3] is not None:
                            failed[rank] = msg[3].strip().splitlines()[-1]
        except KeyboardInterrupt:
            failed[-1] = "interrupted"
        self._pump(final=True)
        left = [rk.rank for rk in ready if rk.busy == rid or not rk.alive()]
        if failed or left:
            return (f"[pyddp] the process group failed ({why}); re-initialising it failed "
                    f"({failed or f'ranks {left} did not finish in time'}): %ddp restart")
        return (f"[pyddp] the process group failed on rank{'s' if len(broken) > 1 else ''} "
                f"{', '.join(map(str, sorted(broken)))} ({why}); every rank has re-initialised "
                "its default process group, so the next cell can run collectives (groups made "
                "with new_group() must be made again)")

    @staticmethod
    def _raise(errors, interrupted, what):
        head = "interrupted: " if interrupted else ""
        msg = [f"{head}{what} failed on rank{'s' if len(errors) > 1 else ''} "
               f"{', '.join(map(str, sorted(errors)))}"]
        for r, text in sorted(errors.items()):
            msg.append(f"--- rank {r} ---")
            msg.append(text.rstrip())
        err = RanksError("\n".join(msg), errors)
        if interrupted:
            raise err from KeyboardInterrupt()
        raise err

    # ------------------------------------------------------------------ the API
    def run(self, code, ranks=None, *, filename=None):
        """Execute ``code`` (a str of Python statements) on every rank, or on ``ranks`` (a rank or a
        list of them), in each rank's persistent namespace; returns a CellResult with the repr of the
        last expression per rank.  A syntax error is raised here, before anything runs.  When the code
        raises on some ranks, raises RanksError with each failing rank's traceback; the ranks stay
        usable.  Interrupting the call (KeyboardInterrupt) interrupts the ranks' code."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        self._next_cell += 1
        filename = filename or f"<ddp-cell-{self._next_cell}>"
        compile(code, filename, "exec")   # SyntaxError once, here
        figures = _check_figures(self.figures)
        chosen = self._select(ranks)
        logging_now = _rank_io.logging_snapshot()
        self._out.quiet_others = self.quiet_others
        self._out.held.clear()
        first = len(self._out.displayed)
        results, errors, interrupted = self._request(
            chosen, lambda r: ("run", code, filename, _sends_figures(figures, r), logging_now))
        displays = [(r, d) for r, d, _ in self._out.displayed[first:]]
        del self._out.displayed[:]
        if errors:
            self._raise(errors, interrupted, "the cell")
        if interrupted:
            raise KeyboardInterrupt("interrupted; every rank stopped the cell and is ready")
        return CellResult(results, displays)

    def push(self, *objs, ranks=None, namespace=None, **named):
        """Send objects to the ranks' namespaces: each positional argument is a name (looked up in
        ``namespace``, by default the caller's globals) or an object with a ``__name__`` (a function,
        a class); keyword arguments give the names.  Functions and classes defined in a notebook go by
        value (cloudpickle when installed, else their source, re-run on each rank); other objects are
        pickled.  Raises TypeError naming what cannot be sent."""
        if namespace is None:
            namespace = sys._getframe(1).f_globals
        items = {}
        for o in objs:
            if isinstance(o, str):
                if o not in namespace:
                    raise NameError(f"push: no name {o!r} here")
                items[o] = namespace[o]
            elif getattr(o, "__name__", None):
                items[o.__name__] = o
            else:
                raise TypeError(f"push: a {type(o).__name__} has no name; pass it as name=value")
        items.update(named)
        payload = [(name,) + _serialise(name, obj) for name, obj in items.items()]
        chosen = self._select(ranks)
        results, errors, interrupted = self._request(chosen, lambda r: ("push", payload))
        if errors:
            self._raise(errors, interrupted, "push")
        return sorted(items)

    def pull(self, name, rank=None):
        """The value of ``name`` in the namespace of ``rank``, or, when rank is None, a list of its
        value on every rank (NumPy arrays come back by value).  Raises RanksError when a rank has no
        such name or the value cannot be pickled."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        chosen = self._select(None if rank is None else [rank])
        results, errors, interrupted = self._request(chosen, lambda r: ("pull", name))
        if errors:
            self._raise(errors, interrupted, f"pull {name!r}")
        values = {r: pickle.loads(b) for r, b in results.items()}
        return values[rank] if rank is not None else [values[r] for r in sorted(values)]

    def __enter__(self):
        return self if self._ranks else self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def __repr__(self):
        state = "running" if self._ranks else "stopped"
        return (f"Ranks(nprocs={self.nprocs}, backend={self.backend!r}"
                f"{', cuda_on_cpu=True' if self.cuda_on_cpu else ''}) [{state}]")


def _serialise(name, obj):
    """('pickle', bytes) or ('source', text, defined_name)."""
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        try:
            return ("pickle", cloudpickle.dumps(obj))
        except Exception as e:
            raise TypeError(f"push: {name!r} ({type(obj).__name__}) cannot be pickled: {e}") from e
    if inspect.isfunction(obj) or inspect.isclass(obj):
        mod = sys.modules.get(getattr(obj, "__module__", None) or "")
        by_ref = mod is not None and getattr(mod, "__file__", None) and \
            getattr(mod, obj.__qualname__, None) is obj and obj.__module__ != "__main__"
        if not by_ref:
            if obj.__name__ == "<lambda>" or "<locals>" in obj.__qualname__:
                raise TypeError(f"push: {name!r} is a lambda or a nested function, which cannot be "
                                "sent without cloudpickle (pip install cloudpickle), or define it "
                                "with def at the top level of a cell")
            try:
                src = _class_source(obj) if inspect.isclass(obj) else inspect.getsource(obj)
            except (OSError, TypeError) as e:
                raise TypeError(f"push: the source of {name!r} cannot be found ({e}); install "
                                "cloudpickle, or run its definition on the ranks with %%ddp") from e
            import textwrap
            return ("source", textwrap.dedent(src), obj.__name__)
    try:
        return ("pickle", pickle.dumps(obj))
    except Exception as e:
        raise TypeError(f"push: {name!r} ({type(obj).__name__}) cannot be pickled: {e}; install "
                        "cloudpickle or create it on the ranks with %%ddp") from e


def _class_source(cls):
    """The source of a class defined in a notebook cell.  inspect.getsource looks for classes in
    their module's file, which __main__ of a kernel does not have (before Python 3.13); the cell's
    text is in linecache under the file name of the class's methods."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        pass
    codes = [f.__code__ for f in vars(cls).values() if inspect.isfunction(f)]
    if not codes:
        raise OSError(f"class {cls.__name__} has no methods to find its cell by")
    filename, line = codes[0].co_filename, codes[0].co_firstlineno
    lines = linecache.getlines(filename)
    if not lines:
        raise OSError(f"the text of {filename} is not available")
    for node in ast.walk(ast.parse("".join(lines))):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__ and \
                node.lineno <= line <= node.end_lineno:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "".join(lines[first - 1:node.end_lineno])
    raise OSError(f"could not find class {cls.__name__} in {filename}")


# ------------------------------------------------------------------------------------ the rank's end

class _Interruptible:
    """SIGINT raises KeyboardInterrupt only while a request runs, once per request (the kernel
    repeats its SIGINT until the rank answers: one that came before the request started, while
    the rank was receiving it, was ignored); idle ranks ignore it."""

    running = False
    raised = False

    def start(self):
        self.raised = False
        self.running = True

    def __call__(self, signum, frame):
        if self.running and not self.raised:
            self.raised = True
            raise KeyboardInterrupt


def _format_exc(e):
    tb = e.__traceback__
    # drop this module's frames: the user's code starts at the first frame of another file
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def _run_code(code, filename, ns):
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), ns)
    if last is not None:
        value = eval(compile(last, filename, "eval"), ns)
        if value is not None:
            ns["_"] = value
            return repr(value)
    return None


def _group_error():
    """Why this rank's default process group cannot run collectives any more (its backend's error,
    or it was destroyed), or None when it is fine (or pyddp.distributed was never imported)."""
    c10d = sys.modules.get("pyddp.distributed.distributed_c10d")
    if c10d is None:
        return None
    pg = c10d._world.default_pg
    if pg is None:
        return "the default process group was destroyed"
    for b in list((getattr(pg, "_backends", None) or {}).values()):
        err = getattr(b, "error", None)
        if isinstance(err, str) and err:
            return err
    return None


def _rank_main():
    """A rank: connect to the kernel, initialise the process group, serve requests until stopped."""
    fifos = os.environ.pop("PYDDP_RANKS_FIFOS", None)
    if fifos is not None:
        # backend 'mpi': started by mpirun (the parent to die with), the rank is MPI_COMM_WORLD's
        # (mpirun's environment), the output goes into the FIFOs the kernel reads
        parent = os.getppid()
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["PMI_RANK"])
        for fd, what in ((1, "out"), (2, "err")):
            w = os.open(os.path.join(fifos, f"{rank}.{what}"), os.O_WRONLY)
            os.dup2(w, fd)
            os.close(w)
        try:
            os.setpgid(0, 0)   # a process group of its own, as the others' ranks (interrupts)
        except OSError:
            pass
    else:
        parent = int(os.environ.pop("PYDDP_RANKS_PARENT"))
        rank = int(os.environ["RANK"])
    if die_with_parent(signal.SIGKILL, parent):
        os._exit(1)
    handler = _Interruptible()
    signal.signal(signal.SIGINT, handler)
    host, _, port = os.environ.pop("PYDDP_RANKS_ADDR").rpartition(":")
    backend = os.environ.pop("PYDDP_RANKS_BACKEND") or None
    from . import _config

    conn = _mpc.Client((host, int(port)), authkey=_config.get("PYDDP_SECRET").encode())
    conn.send(("hello", rank, os.getpid()))
    # The cells' namespace is this process's __main__, so that what a cell defines pickles by name.
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    ns = main.__dict__
    # display() and matplotlib figures go to the kernel, tagged with the request they belong to
    current = [0]
    _rank_io.install(lambda m: conn.send(("show", current[0], m)), rank, figures=rank == 0)
    ns["display"] = _rank_io.display   # as in IPython, display() needs no import
    try:
        import pyddp.distributed as dist

        if backend and "nccl" in backend:
            # a device per rank before the group's communicators are made (what a torchrun
            # script does first: torch.cuda.set_device(local_rank))
            import pyddp.cuda as cuda

            if cuda.is_available():
                cuda.set_device(int(os.environ["LOCAL_RANK"]) % cuda.device_count())
        dist.init_process_group(backend)
    except BaseException as e:
        conn.send(("ready", _format_exc(e)))
        sys.exit(1)
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        kind, rid = msg[0], msg[-1]
        if kind == "stop":
            break
        current[0] = rid
        value = error = None
        handler.start()
        try:
            if kind == "run":
                _rank_io.set_figures(msg[3])
                _rank_io.apply_logging(msg[4])
                try:
                    value = _run_code(msg[1], msg[2], ns)
                finally:
                    # as IPython's inline backend: the figures still open are shown (and closed)
                    handler.running = False
                    try:
                        _rank_io.flush_figures()
                    except Exception as e:
                        print(f"[pyddp] could not send the cell's figures: {e!r}", file=sys.stderr)
            elif kind == "reinit":
                os.environ["MASTER_PORT"] = str(msg[1])
                try:
                    dist.destroy_process_group()
                except Exception:
                    pass
                dist.init_process_group(backend)
            elif kind == "push":
                for name, how, *rest in msg[1]:
                    if how == "pickle":
                        ns[name] = pickle.loads(rest[0])
                    else:
                        exec(compile(rest[0], f"<pushed {name}>", "exec"), ns)
                        ns[name] = ns[rest[1]]
            elif kind == "pull":
                if msg[1] not in ns:
                    raise NameError(f"name {msg[1]!r} is not defined on rank {rank}")
                value = pickle.dumps(ns[msg[1]])
        except BaseException as e:   # KeyboardInterrupt and SystemExit included: the rank goes on
            handler.running = False
            error = _format_exc(e)
        finally:
            handler.running = False
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        broken = _group_error() if kind != "reinit" else None
        try:
            conn.send(("done", rid, value, error, broken))
        except Exception as e:   # an unpicklable payload cannot be: values are bytes or str
            conn.send(("done", rid, None, _format_exc(e), broken))
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:   # backend 'mpi': mpirun counts a rank that leaves without it as failed
        try:
            if mpi.Is_initialized() and not mpi.Is_finalized():
                mpi.Finalize()
        except Exception:
            pass
    sys.stdout.flush()
    os._exit(0)
