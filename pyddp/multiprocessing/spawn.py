"""spawn / start_processes: torch.multiprocessing's way of starting one process per rank.

Mirrors torch.multiprocessing.spawn (torch 2.13): fn(i, *args) runs in nprocs new processes; the first
process to fail makes the others terminate (SIGTERM, SIGKILL after a grace period) and the parent
raises ProcessRaisedException with the child's traceback, or ProcessExitedException with its exit code
or signal name; the messages are torch's.  Differences, all on the side of never hanging and never
leaving processes behind:

- Arguments are checked before anything starts (nprocs, start_method, args, fn), with errors naming them.
- A function defined in a notebook or another interactive session cannot be imported by a process
  that the 'spawn' start method starts (pytorch/pytorch#20375, "Can't get attribute 'f' on <module
  '__main__'>"): that is reported before starting, pointing to pyddp.notebook_launcher.
- start_method='fork' is refused once this process has used CUDA (through pyddp, even
  pyddp.cuda.is_available(), or torch): the CUDA runtime fails in such a child with
  cudaErrorInitializationError, far from the cause.
- A child whose parent died before the child set up its parent-death signal exits at once.
- When several processes have failed by the time the parent looks, the one that failed first is
  reported (a rank that raises makes its peers' collectives fail within milliseconds, and their
  DistNetworkError is a consequence, not the cause).
- An exception in the parent while it waits (KeyboardInterrupt) terminates the children before it
  propagates; a failure to start the n-th process terminates the ones already started.
- Error files are removed once read.
- Each call gives its processes a fresh PYDDP_SECRET (unless the caller set one), as pyddp-run
  does, so the job's store and connections authenticate: a stranger who reaches the port cannot
  join or send objects to unpickle.  Only these processes know it: a job of more processes than
  this call starts (one spawn per node, from its own shell or Slurm task) cannot use it, and
  init_process_group sets it aside there (see _rendezvous.spawn_secret).
"""
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import secrets
import signal
import sys
import tempfile
import time
import warnings

from .. import _config, _threads
from .._lifecycle import die_with_parent, fail_groups_for, signal_name, terminate_with_grace

log = logging.getLogger(__name__)

__all__ = [
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "spawn",
    "SpawnContext",
    "start_processes",
]

# Seconds torch's join waits for SIGTERM'd processes before it sends SIGKILL (grace_period=None).
_TERM_GRACE = 30.0
# Seconds to wait for a SIGKILL'd process to be reaped (it cannot refuse; this only bounds the wait).
_KILL_WAIT = 30.0


class ProcessException(Exception):
    """Base of the errors spawn/join raise when a child failed: ``error_index`` is the failed
    process's index (its rank), ``error_pid`` its pid."""
    __slots__ = ["error_index", "error_pid"]

    def __init__(self, msg: str, error_index: int, error_pid: int):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """Exception raised when a process failed due to an exception raised by the code."""


class ProcessExitedException(ProcessException):
    """Exception raised when a process failed due to signal or exited with a specific code."""

    __slots__ = ["exit_code"]

    def __init__(self, msg: str, error_index: int, error_pid: int, exit_code: int, signal_name=None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return (type(self),
                (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name))


def _write_error(error_file: str, trace: str) -> None:
    # (traceback, CLOCK_MONOTONIC time) - the time lets the parent tell the first failure from
    # the failures it caused.  Written to a temporary name and renamed: a reader never sees half.
    tmp = f"{error_file}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        pickle.dump((trace, time.monotonic()), fh)
    os.replace(tmp, error_file)


def _read_error(error_file: str):
    """(traceback, time) from an error file, or None when there is none (or it is unreadable)."""
    try:
        with open(error_file, "rb") as fh:
            payload = pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError):
        return None
    if isinstance(payload, str):  # torch's format: the traceback alone
        return payload, float("inf")
    return payload


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# In a process started by start_processes with a secret it invented: (nprocs, index, secret).
# That secret is known to those nprocs processes only (_invented_secret).
_invented = None


def _invented_secret():
    """(nprocs, index) when PYDDP_SECRET is still the one the spawn that started this process
    invented for its nprocs processes (index is this process's), else None."""
    if _invented is None:
        return None
    nprocs, index, secret = _invented
    if _config.get("PYDDP_SECRET") != secret:   # fn set one of its own
        return None
    return nprocs, index


def _drop_invented_secret():
    """Forget the invented secret (PYDDP_SECRET unset), for a job it cannot serve."""
    global _invented
    if _invented is not None and _config.get("PYDDP_SECRET") == _invented[2]:
        os.environ.pop("PYDDP_SECRET", None)
    _invented = None


def _wrap(fn, i, args, error_file, parent_pid=None, secret=None, nprocs=None):
    # The job's secret travels with the arguments (a pipe, not the command line), so it reaches
    # the child whatever the start method (a forkserver's children have the server's environment).
    global _invented
    if secret is not None:
        os.environ["PYDDP_SECRET"] = secret
        _invented = (nprocs, i, secret)
    # prctl(2) is Linux-specific (elsewhere this does nothing): a child whose parent dies gets SIGINT,
    # as in torch, so it can leave its process group cleanly.  A parent that died before that took
    # effect will never join this process.
    if die_with_parent(signal.SIGINT, parent_pid):
        sys.exit(1)
    _threads.in_child()
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # SIGINT: killed by the parent, do nothing
    except Exception as e:
        # Propagate the exception to the parent, keeping the original traceback; its time is
        # recorded before the peers learn of it, so this failure is the first the parent sees.
        import traceback

        _write_error(error_file, traceback.format_exc())
        fail_groups_for(e)   # the peers learn it now, whatever this process still does on exit
        sys.exit(1)


class ProcessContext:
    """The processes started by start_processes/spawn(join=False): call ``join(timeout)`` until it
    returns True; the first failure raises."""
    _quiet = False  # log the SIGTERM / SIGKILL of surviving processes, as torch does

    def __init__(self, processes, error_files):
        self.error_files = error_files
        self.processes = processes
        self.sentinels = {process.sentinel: index for index, process in enumerate(processes)}

    def pids(self):
        """The pids of the processes, in index order."""
        return [int(process.pid) for process in self.processes]

    def _join_procs_with_timeout(self, timeout: float):
        """Attempt to join all processes with a shared timeout."""
        end = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, end - time.monotonic()))

    # How a process is stopped; notebook_launcher signals the process group instead.
    def _terminate_process(self, process):
        process.terminate()

    def _kill_process(self, process):
        process.kill()

    def _before_reap(self):
        """Called before processes that may have exited are reaped (notebook_launcher kills what they
        left in their process group while their pid still names it)."""

    def _stop_all(self, grace: float, quiet: bool = False):
        """SIGTERM every live process, SIGKILL what is left after `grace` seconds, reap them all."""
        def send(process, sig):
            if sig == signal.SIGKILL:
                if not quiet:
                    log.warning("Unable to shutdown process %s via SIGTERM , forcefully exiting via "
                                "SIGKILL", process.pid)
                self._kill_process(process)
            else:
                if not quiet:
                    log.warning("Terminating process %s via signal SIGTERM", process.pid)
                self._terminate_process(process)

        def running(processes):
            return [process for process in processes if process.is_alive()]

        def wait_grace(live):
            try:
                self._join_procs_with_timeout(grace)
            except KeyboardInterrupt:  # a second Ctrl-C: stop waiting, kill
                pass
            return running(live)

        terminate_with_grace(self.processes, send, running, wait_grace)
        self._before_reap()
        for process in self.processes:
            process.join(_KILL_WAIT)
        self.sentinels.clear()

    def _first_failure(self, index):
        """Among the processes that have failed by now, the one that failed first.

        A process that exited without an error file (killed, sys.exit, os._exit) counts as earlier than
        any that raised: a raise caused by a peer's death comes after that death.  A process still
        exiting that has recorded its exception counts too: it raised, and told its peers at once
        (pyddp._lifecycle.fail_groups_for), so their errors, which may end them sooner, are its
        consequences."""
        def key(i):
            err = _read_error(self.error_files[i])
            return (0, 0.0, i) if err is None else (1, err[1], i)

        failed = [i for i, p in enumerate(self.processes)
                  if i == index or (p.exitcode is not None and p.exitcode != 0)
                  or (self.error_files[i] and os.path.exists(self.error_files[i]))]
        return min(failed, key=key)

    def _cleanup_files(self):
        for f in self.error_files:
            if f:
                _remove(f)

    def join(self, timeout=None, grace_period=None):
        r"""Join one or more processes within spawn context.

        Attempt to join one or more processes in this spawn context.
        If one of them exited with a non-zero exit status, this function
        kills the remaining processes (optionally with a grace period)
        and raises an exception with the cause of the first process exiting.

        Returns ``True`` if all processes have been joined successfully,
        ``False`` if there are more processes that need to be joined.

        Args:
            timeout (float): Wait this long (in seconds) before giving up on waiting.
            grace_period (float): When any processes fail, wait this long (in seconds)
                for others to shutdown gracefully before terminating them. If they
                still don't exit, wait another grace period before killing them.
        """
        # Ensure this function can be called even when we're done.
        if len(self.sentinels) == 0:
            return True

        # Wait for any process to fail or all of them to succeed.
        ready = multiprocessing.connection.wait(self.sentinels.keys(), timeout=timeout)
        if ready:
            self._before_reap()

        error_index = None
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            process = self.processes[index]
            process.join(_KILL_WAIT)  # its sentinel is ready: it has exited, this only reaps it
            if process.exitcode != 0:
                error_index = index
                break

        # Return if there was no error.
        if error_index is None:
            # Return whether or not all processes have been joined.
            return len(self.sentinels) == 0

        self._before_reap()
        error_index = self._first_failure(error_index)
        # An error occurred. Clean-up all processes before returning.
        # First, allow a grace period for processes to shutdown themselves.
        if grace_period is not None:
            self._join_procs_with_timeout(grace_period)
        # Then terminate the processes still alive (SIGTERM), and SIGKILL those that do not go
        # within another grace period (a process stuck in C code never runs Python's handler).
        self._stop_all(_TERM_GRACE if grace_period is None else grace_period, quiet=self._quiet)

        failed_process = self.processes[error_index]
        err = _read_error(self.error_files[error_index])
        self._cleanup_files()
        if err is None:
            exitcode = failed_process.exitcode
            if exitcode < 0:
                name = signal_name(-exitcode, unknown="<Unknown signal {}>")
                raise ProcessExitedException(
                    f"process {error_index:d} terminated with signal {name}",
                    error_index=error_index,
                    error_pid=failed_process.pid,
                    exit_code=exitcode,
                    signal_name=name,
                )
            raise ProcessExitedException(
                f"process {error_index:d} terminated with exit code {exitcode:d}",
                error_index=error_index,
                error_pid=failed_process.pid,
                exit_code=exitcode,
            )

        msg = f"\n\n-- Process {error_index:d} terminated with the following error:\n"
        msg += err[0]
        raise ProcessRaisedException(msg, error_index, failed_process.pid)


class SpawnContext(ProcessContext):
    """Deprecated name of ProcessContext (torch's; warns when constructed)."""

    def __init__(self, processes, error_files):
        warnings.warn("SpawnContext is renamed to ProcessContext since 1.4 release.", stacklevel=2)
        super().__init__(processes, error_files)


# ------------------------------------------------------------------------------- argument checks

def _check_nprocs(nprocs):
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs must be an int, got {type(nprocs).__name__} ({nprocs!r})")
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")


def _check_fn_args(fn, args):
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of arguments for fn, got {type(args).__name__} "
                        f"({args!r}); for one argument write args=(x,)")


def _check_start_method(start_method):
    methods = multiprocessing.get_all_start_methods()
    if start_method not in methods:
        raise ValueError(f"start_method must be one of {methods} on this platform, got {start_method!r}")


def _interactive_main_name(fn):
    """fn's name when fn lives in an interactive __main__ (notebook, REPL, python -c), else None."""
    target = getattr(fn, "func", fn)  # functools.partial
    if getattr(target, "__module__", None) != "__main__":
        return None
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None):
        return None
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)


def _check_importable(fn, start_method):
    if start_method == "fork":
        return
    name = _interactive_main_name(fn)
    if name is not None:
        raise ValueError(
            f"fn {name!r} is defined in an interactive session (a notebook cell, the REPL or python -c), "
            f"and start_method={start_method!r} starts fresh interpreters that cannot import it (they "
            f"would fail with \"Can't get attribute '{name}' on <module '__main__'>\", "
            "pytorch/pytorch#20375). From a notebook use pyddp.notebook_launcher(fn, args, nprocs), "
            "or pyddp.multiprocessing.start_processes(fn, args, nprocs, start_method='fork'), or move fn "
            "into a module and import it.")


def _cuda_used_here():
    """What used CUDA in this process ('pyddp' or 'torch'), or None: a child forked from it cannot
    use CUDA (the runtime fails there with cudaErrorInitializationError)."""
    from .. import _C

    if _C.cuda_fork_state() != 0:
        return "pyddp"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and callable(getattr(cuda, "is_initialized", None)) and cuda.is_initialized():
        return "torch"
    return None


def _check_fork_safe(start_method, launcher=None):
    # A forked child inherits the parent's default process group without its threads or connections,
    # and cannot use CUDA once the parent has: refused up front, as HF accelerate's notebook_launcher
    # does (the ranks of a job nearly always use CUDA when the parent did).
    if start_method != "fork":
        return
    dist = sys.modules.get("pyddp.distributed")
    if dist is not None and dist.is_initialized():
        raise RuntimeError(
            "start_method='fork' with a pyddp process group initialized in this process: the children "
            "would inherit it without its threads; call pyddp.distributed.destroy_process_group() "
            "first, or use start_method='spawn'")
    who = _cuda_used_here()
    if who is None:
        return
    calls = ("pyddp.cuda.is_available(), device_count() or set_device(), a collective on a CUDA array"
             if who == "pyddp" else "a CUDA tensor, torch.cuda.init()")
    if launcher is None:
        what = "start_method='fork'"
        fix = ("use start_method='spawn' (pyddp.multiprocessing.spawn), or make no CUDA call in this "
               "process before starting the processes")
    else:
        what = f"{launcher} (it forks the ranks)"
        fix = ("restart the kernel and make no CUDA call before calling it (CUDA only inside fn), or "
               "put fn in a module and use pyddp.multiprocessing.spawn")
    raise RuntimeError(
        f"{what} after {who} used CUDA in this process ({calls}, ...): a forked child cannot use CUDA "
        f"(the runtime fails there with cudaErrorInitializationError); {fix}")


def _start_all(mp, fn, args, nprocs, daemon, parent_pid, processes, error_files, context, secret):
    for i in range(nprocs):
        # Each process is assigned a file to write tracebacks to.  We use the file being
        # non-empty to indicate an exception occurred (vs an expected shutdown).  A file rather
        # than a multiprocessing.Queue, as in torch: a one-shot message cannot deadlock.
        tf = tempfile.NamedTemporaryFile(prefix="pyddp-errorfile-", suffix=".pickle", delete=False)
        tf.close()
        os.unlink(tf.name)
        error_files.append(tf.name)
        process = mp.Process(target=_wrap, args=(fn, i, tuple(args), tf.name, parent_pid, secret, nprocs),
                             daemon=daemon)
        process.start()
        processes.append(process)
        context.sentinels[process.sentinel] = i


def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """Start nprocs processes running fn(i, *args) with the given multiprocessing start method.

    Returns None once every process has exited 0 (join=True), or a ProcessContext to join (join=False).
    Raises ProcessRaisedException / ProcessExitedException as described in the module.
    start_method='fork' is refused (RuntimeError) in a process with a pyddp process group, or one that
    has used CUDA through pyddp or torch: a forked child cannot use CUDA then."""
    _check_fn_args(fn, args)
    _check_nprocs(nprocs)
    _check_start_method(start_method)
    _check_importable(fn, start_method)
    _check_fork_safe(start_method)

    mp = multiprocessing.get_context(start_method)
    # The forkserver's children are the server's, not ours: no parent check for them.
    parent_pid = os.getpid() if start_method in ("fork", "spawn") else None
    error_files = []
    processes = []
    context = ProcessContext(processes, error_files)
    # A fresh secret per job, as pyddp-run gives: the store and the ranks' connections then
    # authenticate, and a stranger on the port cannot join (or feed object collectives).  One the
    # caller has set (PYDDP_SECRET) is kept, so jobs spanning several spawns can share it; a job
    # larger than nprocs sets the invented one aside at init (_rendezvous.spawn_secret).
    secret = None if _config.get("PYDDP_SECRET") else secrets.token_hex(32)
    try:
        with _threads.for_children(nprocs):   # OMP_NUM_THREADS=1 for the ranks, as launchers do
            _start_all(mp, fn, args, nprocs, daemon, parent_pid, processes, error_files, context,
                       secret)
    except BaseException:
        context._stop_all(5.0, quiet=True)
        context._cleanup_files()
        raise
    if not join:
        return context

    # Loop on join until it returns True or raises an exception.
    try:
        while not context.join():
            pass
    except ProcessException:
        raise
    except BaseException:  # KeyboardInterrupt, SystemExit: leave no child behind
        context._stop_all(5.0, quiet=True)
        context._cleanup_files()
        raise


def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    r"""Spawns ``nprocs`` processes that run ``fn`` with ``args``.

    If one of the processes exits with a non-zero exit status, the
    remaining processes are killed and an exception is raised with the
    cause of termination. In the case an exception was caught in the
    child process, it is forwarded and its traceback is included in
    the exception raised in the parent process.

    Args:
        fn (function): Function is called as the entrypoint of the
            spawned process. This function must be defined at the top
            level of a module so it can be pickled and spawned. This
            is a requirement imposed by multiprocessing.  (From a Jupyter
            notebook use :func:`pyddp.notebook_launcher`.)

            The function is called as ``fn(i, *args)``, where ``i`` is
            the process index and ``args`` is the passed through tuple
            of arguments.

        args (tuple): Arguments passed to ``fn``.
        nprocs (int): Number of processes to spawn.
        join (bool): Perform a blocking join on all processes.
        daemon (bool): The spawned processes' daemon flag. If set to True,
                       daemonic processes will be created.
        start_method (str): (deprecated) this method will always use ``spawn``
                               as the start method. To use a different start method
                               use ``start_processes()``.

    Returns:
        None if ``join`` is ``True``,
        :class:`~ProcessContext` if ``join`` is ``False``
    """
    _check_start_method(start_method)
    if start_method != "spawn":
        msg = (f"This method only supports start_method=spawn (got: {start_method}).\n"
               "To use a different start_method use:\n\t\t"
               " pyddp.multiprocessing.start_processes(...)")
        warnings.warn(msg, FutureWarning, stacklevel=2)
    return start_processes(fn, args, nprocs, join, daemon, start_method="spawn")
