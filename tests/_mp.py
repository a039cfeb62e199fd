"""Multi-process test harness: start real rank processes, collect what each one returns.

    from _mp import run, run_outcomes

    def _allreduce_ones(rank, world_size):          # module level: the child calls it
        a = np.ones(4)
        dist.all_reduce(a)
        return a

    def test_something():
        results = run(_allreduce_ones, 3)             # list indexed by rank

Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
MASTER_PORT picked by the parent, plus any extra environment (None removes a variable). With init=True
(default) the child calls dist.init_process_group(backend, **init_kwargs) before fn(rank, world_size,
*args) and dist.destroy_process_group() after; with init=False fn does it itself.

Every wait has a deadline: the queue is read with a timeout, children are joined with a timeout. When the
deadline passes every child is killed (SIGKILL) and the test fails naming the ranks that did not finish
(and showing what the others reported). Children die with the parent (PR_SET_PDEATHSIG), and an atexit
hook kills any child still tracked, so no run leaves orphans.

Children are forked ('fork' start method): fast, and target functions need not be importable by name.
The parent must never have initialised a process group (no pyddp threads in the parent at fork time).
"""
import atexit
import ctypes
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import signal
import socket
import sys
import time
import traceback

DEFAULT_TIMEOUT = 90.0
# A child that exited without reporting: how long to wait for its message to drain from the pipe.
_DEATH_GRACE = 1.0
# After every rank reported: how long each may take to exit (destroy_process_group already ran).
_EXIT_GRACE = 15.0

# Launcher variables the rendezvous would also read (torchrun first, then Slurm, Open MPI, PMI):
# a child must see only what the test gives it.
_SCRUB = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PYDDP_SECRET",
    "TORCHELASTIC_RUN_ID",
    # what env:// derives the master's address, port and secret from under Slurm and MPI launchers
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOBID", "PMI_LOCAL_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
    "OMPI_MCA_orte_precondition_transports", "OMPI_MCA_opal_precondition_transports",
)

_live = set()  # children of this process not yet reaped


def _kill_live():
    for p in list(_live):
        _kill(p)


atexit.register(_kill_live)


def _kill(p):
    try:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=5)
    except (OSError, ValueError, AssertionError):
        pass
    _live.discard(p)


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(n):
    """n distinct free ports (all sockets held open together, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class RankOutcome:
    """What one rank did: returned a value, raised, or died."""

    def __init__(self, rank, ok, value=None, exc_type=None, exc_mro=(), message=None, tb=None,
                 exitcode=None, elapsed=None):
        self.rank = rank
        self.ok = ok
        self.value = value
        self.exc_type = exc_type      # "module.QualName" of the exception raised
        self.exc_mro = exc_mro        # names of every class in type(exc).__mro__
        self.message = message        # str(exc)
        self.traceback = tb
        self.exitcode = exitcode      # set when the process died without reporting (e.g. -9)
        self.elapsed = elapsed

    @property
    def died(self):
        return not self.ok and self.exc_type is None

    def raised(self, name):
        """True if the rank raised an exception that is (a subclass of) the class called name."""
        return name in self.exc_mro

    def describe(self):
        if self.ok:
            return f"rank {self.rank}: ok"
        if self.died:
            return f"rank {self.rank}: died with exit code {self.exitcode} without reporting"
        return f"rank {self.rank}: raised {self.exc_type}: {self.message}\n{self.tb_indented()}"

    def tb_indented(self):
        return "".join("    " + line + "\n" for line in (self.traceback or "").splitlines())

    def __repr__(self):
        return f"<RankOutcome {self.describe().splitlines()[0]}>"


def _set_pdeathsig():
    # Linux: SIGKILL this child when the parent (thread) that forked it dies.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _child(fn, rank, world_size, args, env, init, backend, init_kwargs, q, parent_pid):
    _set_pdeathsig()
    if os.getppid() != parent_pid:
        os._exit(3)
    t0 = time.monotonic()
    for k in _SCRUB:
        os.environ.pop(k, None)
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    try:
        if init:
            import pyddp.distributed as dist

            dist.init_process_group(backend, **(init_kwargs or {}))
        try:
            value = fn(rank, world_size, *args)
        finally:
            if init and dist.is_initialized():
                dist.destroy_process_group()
        msg = ("ok", rank, value, time.monotonic() - t0)
        try:
            pickle.dumps(msg)
        except Exception as e:  # a test bug, but report it instead of hanging
            raise TypeError(f"rank {rank}: return value is not picklable: {e!r}") from None
    except BaseException as e:
        msg = ("err", rank, f"{type(e).__module__}.{type(e).__qualname__}",
               tuple(c.__name__ for c in type(e).__mro__), str(e), traceback.format_exc(),
               time.monotonic() - t0)
    q.put(msg)
    q.close()
    q.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the rank's result is out and the group is destroyed.
    os._exit(0)


def run_outcomes(fn, world_size, *args, timeout=DEFAULT_TIMEOUT, init=True, backend="cpu",
                 init_kwargs=None, env=None, rank_env=None, port=None, expect_death=(),
                 start_method="fork"):
    """Run fn(rank, world_size, *args) in world_size forked processes; return one RankOutcome per rank.

    Never raises for what a rank did (the caller inspects the outcomes); raises AssertionError (after
    killing every child) when a rank neither reports nor dies within timeout seconds, or when a rank
    reported but does not exit. Ranks in expect_death may die without reporting; a rank that dies
    unexpectedly is reported as died (exitcode set), not waited for.

    start_method="spawn" starts each child in a fresh interpreter (fn must then be importable by
    name): for what a forked child would inherit from this process, such as CUDA libraries that
    load once per process.
    """
    ctx = mp.get_context(start_method)
    q = ctx.Queue()
    port = free_port() if port is None else port
    procs = []
    outcomes = {}
    died_at = {}
    deadline = time.monotonic() + timeout
    try:
        for rank in range(world_size):
            cenv = {
                "RANK": rank, "WORLD_SIZE": world_size, "LOCAL_RANK": rank,
                "LOCAL_WORLD_SIZE": world_size, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
            }
            cenv.update(env or {})
            cenv.update((rank_env or {}).get(rank, {}))
            p = ctx.Process(
                target=_child,
                args=(fn, rank, world_size, args, cenv, init, backend, init_kwargs, q, os.getpid()),
                name=f"rank{rank}", daemon=True)
            p.start()
            _live.add(p)
            procs.append(p)

        while len(outcomes) < world_size:
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                msg = q.get(timeout=min(0.1, deadline - now))
            except queue_mod.Empty:
                now = time.monotonic()
                for rank, p in enumerate(procs):
                    if rank in outcomes or p.exitcode is None:
                        continue
                    died_at.setdefault(rank, now)
                    if now - died_at[rank] >= (0.2 if rank in expect_death else _DEATH_GRACE):
                        outcomes[rank] = RankOutcome(rank, False, exitcode=p.exitcode)
                continue
            if msg[0] == "ok":
                _, rank, value, elapsed = msg
                outcomes[rank] = RankOutcome(rank, True, value=value, elapsed=elapsed)
            else:
                _, rank, tname, mro, text, tb, elapsed = msg
                outcomes[rank] = RankOutcome(rank, False, exc_type=tname, exc_mro=mro, message=text,
                                             tb=tb, elapsed=elapsed)

        missing = [r for r in range(world_size) if r not in outcomes]
        if missing:
            for p in procs:
                _kill(p)
            lines = [f"ranks {missing} did not finish within {timeout:.0f} s (all children killed)"]
            lines += [outcomes[r].describe() for r in sorted(outcomes)]
            raise AssertionError("\n".join(lines))

        stuck = []
        exit_deadline = time.monotonic() + _EXIT_GRACE
        for rank, p in enumerate(procs):
            p.join(timeout=max(0.1, exit_deadline - time.monotonic()))
            if p.exitcode is None:
                stuck.append(rank)
        if stuck:
            for p in procs:
                _kill(p)
            raise AssertionError(f"ranks {stuck} reported a result but did not exit within "
                                 f"{_EXIT_GRACE:.0f} s (killed)")
        return [outcomes[r] for r in range(world_size)]
    finally:
        for p in procs:
            _kill(p)
        q.cancel_join_thread()
        q.close()


# a rank's failure that says the MASTER_PORT picked by free_port() was taken before rank 0 bound it
_PORT_TAKEN = ("EADDRINUSE", "Address already in use", "address already in use")


def _port_taken(outcome):
    return any(s in outcome.describe() for s in _PORT_TAKEN)


def run(fn, world_size, *args, port_retries=2, **kwargs):
    """Like run_outcomes, but every rank must succeed; returns the list of values, by rank.

    The port free_port() picks is closed again before rank 0 binds it; with many tests in parallel
    (spawned ranks take seconds to get there) another process can take it first.  When a rank says
    so, the whole run starts again on a new port, up to port_retries times (never when the caller
    chose the port: a test about a port in use sees its failure)."""
    for _ in range(port_retries + 1):
        outs = run_outcomes(fn, world_size, *args, **kwargs)
        bad = [o for o in outs if not o.ok]
        if not (bad and kwargs.get("port") is None and any(map(_port_taken, bad))):
            break
    if bad:
        raise AssertionError(f"{len(bad)} of {world_size} ranks failed:\n"
                             + "\n".join(o.describe() for o in bad))
    return [o.value for o in outs]


def in_forked_child(fn, timeout=60.0):
    """fn() in a child forked from this process (os.fork, nothing else started): its value (anything
    repr() and ast.literal_eval() round-trip), or "ExcType: message" when it raised.  For what a forked
    child may or may not do, e.g. use CUDA after its parent did.  The child is killed after timeout s."""
    import ast
    import select

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                out = repr(fn())
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                out = repr(f"{type(e).__name__}: {e}")
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    try:
        while select.select([r], [], [], timeout)[0]:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"the forked child did not finish within {timeout:g} s")
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return ast.literal_eval(b"".join(chunks).decode())
