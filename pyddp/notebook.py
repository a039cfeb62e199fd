"""notebook_launcher: run a function as a pyddp job of nprocs ranks from a Jupyter notebook.

The ranks are forked from the kernel, so a function defined in a notebook cell runs as it is (the
'spawn' start method would have to import it by name and fails: pytorch/pytorch#20375).  Each rank gets
torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free
MASTER_PORT) and a fresh PYDDP_SECRET, so fn just calls init_process_group().  What a rank writes to its
stdout and stderr, from Python or from C, comes back through a pipe and is printed in the cell as it
arrives, one whole line at a time, prefixed "[rankN]: " (a line redrawn with carriage returns, a
progress bar, as one line updated in place); what a rank displays and its matplotlib figures come back
through a third pipe (pyddp._rank_io).  The first rank to fail makes the others
terminate and the call raises ProcessRaisedException with that rank's traceback (or
ProcessExitedException); otherwise it returns rank 0's return value.  However the call ends - success,
failure, or the cell interrupted (KeyboardInterrupt) - every rank it started has been reaped: each rank
runs in its own process group, which is SIGTERM'd then SIGKILL'd, and a rank whose launcher dies is
SIGKILL'd by the kernel (Linux parent-death signal).

Ranks (pyddp._notebook_ranks, and the %ddp / %%ddp magics of ``%load_ext pyddp``) is the other way:
N persistent ranks, fresh interpreters kept alive across cells, that run the notebook's cells.
"""
import glob
import io
import multiprocessing
import multiprocessing.connection
import os
import pickle
import secrets
import signal
import socket
import struct
import sys
import tempfile
import time
import warnings

from . import _rank_io
from ._lifecycle import die_with_parent, fail_groups_for, load_prctl, signal_group
from .multiprocessing.spawn import (ProcessContext, ProcessExitedException, ProcessRaisedException,
                                    _check_fn_args, _check_fork_safe, _check_nprocs, _remove,
                                    _write_error)

from ._notebook_ranks import CellResult, Ranks, RanksError  # noqa: E402  (persistent ranks)

__all__ = ["notebook_launcher", "Ranks", "RanksError", "CellResult"]

# Seconds a rank that was told to stop (SIGTERM) gets before SIGKILL.
_STOP_GRACE = 3.0
# Seconds to keep reading a rank's output after it exited (a process it started may hold the pipe).
_DRAIN = 2.0
# Bytes of a line without its newline that are held back before they are printed anyway.
_LONGEST_LINE = 1 << 16
# How often the launcher wakes up when nothing happens (bounds the delay of noticing an exit).
_POLL = 0.1


def _free_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _text_stream(fd):
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True, write_through=True)


def _one_thread_per_rank():
    """torchrun's policy for ranks sharing a host: one OpenMP/BLAS thread each, unless the user set
    OMP_NUM_THREADS.  The ranks are forked from a kernel whose NumPy (and torch) already started a
    thread per core, so the environment variable alone would come too late: the loaded thread pools are
    limited too (threadpoolctl when installed, torch.set_num_threads when torch is loaded)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        try:
            threadpool_limits(1)
        except Exception:  # an unusual BLAS build: run with its threads rather than fail
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(1)
        except Exception:
            pass


class _MessagePipe:
    """A rank's messages to the launcher (display(), figures): length-prefixed pickles on a pipe."""

    def __init__(self, fd):
        self.fd = fd

    def __call__(self, message):
        data = pickle.dumps(message)
        view = memoryview(struct.pack("!I", len(data)) + data)
        while view:
            view = view[os.write(self.fd, view):]


def _kernel_shell():
    """The kernel's InteractiveShell this rank was forked with, or None."""
    if "IPython" not in sys.modules:
        return None
    try:
        from IPython.core.interactiveshell import InteractiveShell

        return InteractiveShell.instance() if InteractiveShell.initialized() else None
    except Exception:
        return None


def _rank_main(fn, args, rank, env, out_w, err_w, msg_w, error_file, result_file, parent_pid,
               figures):
    """A rank: runs in the forked child."""
    # Die with the launcher (the thread that forked us), whatever we are doing.
    if die_with_parent(signal.SIGKILL, parent_pid):   # it died already
        os._exit(1)
    try:
        os.setpgid(0, 0)  # own process group: stopping the rank stops what it started too
    except OSError:
        pass
    # stdout and stderr, of Python and of C, into the launcher's pipes.  The kernel's sys.stdout
    # would send to the notebook over ZeroMQ from a thread that does not exist in this process.
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    old = [(sys.stdout, "stdout"), (sys.stderr, "stderr"), (sys.__stdout__, "stdout"),
           (sys.__stderr__, "stderr")]
    sys.stdout = sys.__stdout__ = _text_stream(1)
    sys.stderr = sys.__stderr__ = _text_stream(2)
    # the kernel's logging handlers wrote to its streams: now to this rank's, prefixed in the cell
    _rank_io.redirect_logging(old, sys.stdout, sys.stderr)
    # display() (the kernel's display publisher) and matplotlib figures: to the launcher
    _rank_io.install(_MessagePipe(msg_w), rank, figures=figures, shell=_kernel_shell())
    user_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ.update(env)
    if not user_threads and int(env["LOCAL_WORLD_SIZE"]) > 1:
        _one_thread_per_rank()
    # The kernel's asyncio loop is running in the thread that forked us; fn may start its own.
    aio = sys.modules.get("asyncio")
    if aio is not None:
        try:
            aio.events._set_running_loop(None)
        except Exception:
            pass
    try:
        try:
            result = fn(*args)
        finally:
            try:   # the figures still open, as at the end of a cell
                _rank_io.flush_figures()
            except Exception as e:
                print(f"[pyddp] could not send the figures: {e!r}", file=sys.stderr)
        if rank == 0:
            try:
                data = pickle.dumps(result)
            except Exception as e:
                raise TypeError(f"rank 0 returned a {type(result).__name__}, which cannot be pickled "
                                f"back to the notebook: {e}") from e
            with open(result_file + ".tmp", "wb") as fh:
                fh.write(data)
            os.replace(result_file + ".tmp", result_file)
    except SystemExit:
        raise
    except BaseException as e:  # KeyboardInterrupt included: the rank did not finish its work
        import traceback

        _write_error(error_file, traceback.format_exc())   # its time first: the root cause
        fail_groups_for(e)
        sys.exit(1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class _Output:
    """The ranks' pipes, read without blocking: text goes to a pyddp._rank_io.Presenter (each line
    with its rank's prefix, lines redrawn with \\r as one updating line), messages (display(),
    figures) too."""

    def __init__(self, presenter):
        self.fds = {}   # fd -> [rank, kind ('out', 'err', 'msg'), pending message bytes]
        self.presenter = presenter

    def add(self, fd, rank, kind):
        os.set_blocking(fd, False)
        self.fds[fd] = [rank, kind, b""]

    def _feed(self, entry, chunk, final=False):
        rank, kind = entry[0], entry[1]
        if kind != "msg":
            self.presenter.feed(rank, kind == "err", chunk, final=final)
            return
        entry[2] += chunk
        while len(entry[2]) >= 4:
            n = struct.unpack("!I", entry[2][:4])[0]
            if len(entry[2]) < 4 + n:
                break
            data, entry[2] = entry[2][4:4 + n], entry[2][4 + n:]
            try:
                message = pickle.loads(data)
            except Exception:
                continue
            # the text printed before it first (it was flushed before the message was sent)
            self.pump([fd for fd, e in self.fds.items() if e[0] == rank and e[1] != "msg"])
            self.presenter.show(rank, message)

    def _close(self, fd):
        entry = self.fds.pop(fd)
        self._feed(entry, b"", final=True)
        try:
            os.close(fd)
        except OSError:
            pass

    def pump(self, fds=None):
        """Read what is there and show it."""
        for fd in list(self.fds if fds is None else fds):
            if fd not in self.fds:
                continue
            entry = self.fds[fd]
            chunks, closed = _rank_io.read_available(fd)
            for chunk in chunks:
                self._feed(entry, chunk)
            if closed:
                self._close(fd)
        self.presenter.tick()
        self.presenter.flush()

    def drain(self, seconds):
        """Read until every pipe is closed or `seconds` pass, then close them all."""
        deadline = time.monotonic() + seconds
        while self.fds:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = multiprocessing.connection.wait(list(self.fds), timeout=min(left, _POLL))
            self.pump(ready)
        for fd in list(self.fds):
            self._close(fd)
        self.presenter.finish()


def _unreaped(process) -> bool:
    """Whether the rank is running or exited but not yet waited for, found without reaping it."""
    if not hasattr(os, "waitid"):
        return process.exitcode is None
    try:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return False  # reaped already
    return True


class _GroupContext(ProcessContext):
    """Stops a rank's whole process group (what the rank started, too), quietly: the exception
    notebook_launcher raises says what happened."""

    _quiet = True

    def _signal_group(self, process, sig):
        # Only while the rank is unreaped: until then its pid, the group's id, cannot be reused.
        # Asked without reaping it: process.exitcode would reap a rank that has just exited and then
        # leave what it started in its group running (a rank returning as another one failed).
        if _unreaped(process) and not signal_group(process.pid, sig):
            try:
                os.kill(process.pid, sig)
            except OSError:
                pass

    def _before_reap(self):
        # A rank that has exited but is not reaped yet still owns its group id: SIGKILL what it left
        # in its group (processes it started), which nothing else would stop.
        if not hasattr(os, "waitid"):
            return
        by_sentinel = {p.sentinel: p for p in self.processes}
        for sentinel in multiprocessing.connection.wait(list(by_sentinel), timeout=0):
            process = by_sentinel[sentinel]
            try:
                # The sentinel closes as the process exits, a moment before it becomes a zombie:
                # wait for that moment (WNOWAIT: without reaping it).
                os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
            except (ChildProcessError, OSError):
                continue  # reaped already
            signal_group(process.pid, signal.SIGKILL)

    def _terminate_process(self, process):
        self._signal_group(process, signal.SIGTERM)

    def _kill_process(self, process):
        self._signal_group(process, signal.SIGKILL)


def _check_port(master_port):
    if master_port is None:
        return
    if isinstance(master_port, bool) or not isinstance(master_port, int):
        raise TypeError(f"master_port must be an int or None, got {type(master_port).__name__}")
    if not 1 <= master_port <= 65535:
        raise ValueError(f"master_port must be in [1, 65535], got {master_port}")


class _NoLostInterrupt:
    """Ctrl-C (or Jupyter's interrupt) while ranks are being forked must not be lost.

    A SIGINT that lands while the parent runs Python's after-fork callbacks (logging's, for one) raises
    KeyboardInterrupt inside them, where Python prints it as "Exception ignored" and goes on: the launcher
    then waits for ranks that never finish (seen under load, where a rank runs before its parent is back
    from fork).  So while forking, SIGINT also sets a flag, and ``check()`` re-raises an interrupt the
    fork swallowed.  Only in the main thread (signal handlers live there) and only over Python's default
    handler: a handler of the caller's own is left alone."""

    def __init__(self):
        self.fired = False
        self.previous = None

    def __enter__(self):
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self.previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:   # not the main thread
            self.previous = None
        return self

    def _handler(self, signum, frame):
        self.fired = True
        raise KeyboardInterrupt

    def check(self):
        if self.fired:
            self.fired = False
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def _is_local_address(addr):
    """Whether ``addr`` is one of this host's addresses (a socket can be bound to it)."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def _int_arg(name, value, lowest):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < lowest:
        raise ValueError(f"{name} must be >= {lowest}, got {value}")
    return value


def _accelerate_names(fn, function, nprocs, num_processes, master_port, use_port, master_addr,
                      mixed_precision, num_nodes=1, node_rank=0):
    """Merge accelerate's keyword names into ours; the same thing given twice is a TypeError."""
    def one(ours, theirs, a, b, default=None):
        if ours is not None and theirs is not None:
            raise TypeError(f"notebook_launcher() got both '{a}' and '{b}' (the same argument, "
                            "pyddp's and accelerate's name)")
        return ours if ours is not None else theirs if theirs is not None else default
    fn = one(fn, function, "fn", "function")
    if fn is None:
        raise TypeError("notebook_launcher() missing required argument 'fn' (or 'function')")
    nprocs = one(nprocs, num_processes, "nprocs", "num_processes", 2)
    if isinstance(use_port, str):
        if not use_port.strip().isdigit():
            raise ValueError(f"use_port must be a port number, got {use_port!r}")
        use_port = int(use_port)
    master_port = one(master_port, use_port, "master_port", "use_port")
    num_nodes = _int_arg("num_nodes", num_nodes, 1)
    node_rank = _int_arg("node_rank", node_rank, 0)
    if node_rank >= num_nodes:
        raise ValueError(f"node_rank must be in [0, num_nodes={num_nodes}), got {node_rank}")
    if master_addr is not None and not isinstance(master_addr, str):
        raise TypeError(f"master_addr must be a str, got {type(master_addr).__name__}")
    if num_nodes > 1:
        if master_addr is None or master_port is None:
            raise ValueError(f"num_nodes={num_nodes}: every node's launcher needs the same "
                             "master_addr (node 0's address) and master_port (or use_port)")
        if not _config_secret():
            raise ValueError(f"num_nodes={num_nodes}: set PYDDP_SECRET to the same value in every "
                             "node's kernel (os.environ['PYDDP_SECRET'] = '...'), so that the "
                             "nodes' ranks authenticate each other")
    if master_addr is not None and node_rank == 0 and not _is_local_address(master_addr):
        raise ValueError(f"master_addr={master_addr!r}: the ranks forked here include rank 0, which "
                         "serves the rendezvous, so the address must be local, one of this "
                         "machine's (127.0.0.1, the default, for one node)")
    if mixed_precision not in ("no", None):
        raise ValueError(f"mixed_precision={mixed_precision!r}: pyddp's notebook_launcher does not "
                         "change precision; use pyddp.autocast or pyddp.amp inside the function")
    return fn, nprocs, master_port, master_addr, num_nodes, node_rank


def _config_secret():
    from . import _config

    return _config.get("PYDDP_SECRET") or None


def _start_ranks(guard, ctx, nprocs, port, secret, fn, args, error_files, result_file, parent_pid,
                 processes, context, output, addr=None, num_nodes=1, node_rank=0, figures=frozenset()):
    """Fork the ranks; each is recorded (to be stopped on any exit) before the next is forked."""
    for local in range(nprocs):
        rank = node_rank * nprocs + local
        env = {
            "RANK": str(rank), "LOCAL_RANK": str(local), "GROUP_RANK": str(node_rank),
            "WORLD_SIZE": str(nprocs * num_nodes), "LOCAL_WORLD_SIZE": str(nprocs),
            "MASTER_ADDR": addr or "127.0.0.1", "MASTER_PORT": str(port),
            "PYDDP_SECRET": secret, "PYTHONUNBUFFERED": "1",
        }
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        msg_r, msg_w = os.pipe()
        p = None
        try:
            p = ctx.Process(target=_rank_main, name=f"rank{rank}",
                            args=(fn, tuple(args), local, env, out_w, err_w, msg_w,
                                  error_files[local], result_file, parent_pid,
                                  figures == "all" or rank in figures))
            with warnings.catch_warnings():
                # Python 3.12+ warns about fork() in a process with threads (the kernel has
                # some); the child only uses what it sets up itself.
                warnings.simplefilter("ignore", DeprecationWarning)
                p.start()
        except BaseException:
            for fd in (out_r, err_r, msg_r):
                os.close(fd)
            if p is not None and p.pid is not None:   # forked before the interrupt: stopped with the rest
                processes.append(p)
                context.sentinels[p.sentinel] = local
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
            os.close(msg_w)
        processes.append(p)
        context.sentinels[p.sentinel] = local
        try:
            os.setpgid(p.pid, p.pid)  # also here, so that it holds before the child runs
        except OSError:
            pass
        output.add(out_r, rank, "out")
        output.add(err_r, rank, "err")
        output.add(msg_r, rank, "msg")
        guard.check()   # a Ctrl-C swallowed by the fork, now that this rank is recorded


def notebook_launcher(fn=None, args=(), nprocs=None, master_port=None, *, function=None,
                      num_processes=None, use_port=None, master_addr=None, mixed_precision="no",
                      num_nodes=1, node_rank=0, max_restarts=0, quiet_others=False, figures=0):
    """Run ``fn(*args)`` as a pyddp job of ``nprocs`` ranks and return rank 0's return value.

    Made for Jupyter notebooks: ``fn`` may be defined in the notebook itself.  Each rank is forked from
    the calling process with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR (127.0.0.1),
    MASTER_PORT (``master_port``, or a free port) and a fresh PYDDP_SECRET in its environment, so ``fn``
    calls ``pyddp.distributed.init_process_group()`` with no arguments.  Every line a rank prints (to
    stdout or stderr, from Python or C) appears in the cell as it is printed, prefixed ``[rankN]: ``; a
    line redrawn with carriage returns (a tqdm progress bar) is shown as one line updated in place.
    What a rank displays (``IPython.display.display``) is shown in the cell, and so are rank 0's
    matplotlib figures, on ``plt.show()`` and when fn returns (``figures``: a rank, a list of ranks,
    "all" or None).  Logging handlers configured in the kernel write to the rank's own output, so
    their lines are prefixed too.  ``quiet_others=True`` shows only rank 0's output; the others' errors
    still show (the exception raised here, and the last stderr lines of the rank that failed).

    Raises ProcessRaisedException carrying the traceback of the first rank that raised (the other ranks
    are terminated), or ProcessExitedException when a rank exited with a non-zero code or a signal.
    ``max_restarts=N``: after such a failure all the ranks are started again, up to N times (as
    torchrun's --max-restarts), before the failure is raised.  Interrupting the cell terminates every
    rank before KeyboardInterrupt propagates.

    Like torchrun, each rank runs with one OpenMP/BLAS thread when ``nprocs > 1`` and OMP_NUM_THREADS is
    unset (so the ranks do not oversubscribe the host); set OMP_NUM_THREADS to choose otherwise.

    Needs the 'fork' start method (Linux, macOS); the calling process must not have a pyddp process
    group initialized (the ranks would inherit it), nor have used CUDA, through pyddp (even
    ``pyddp.cuda.is_available()``) or torch: a forked rank cannot use CUDA then, so that is refused
    (as HF accelerate's notebook_launcher refuses).

    Accelerate's keyword names are accepted too, as notebooks written for it call this:
    ``function`` (= fn), ``num_processes`` (= nprocs, the ranks of this node), ``use_port``
    (= master_port, a str or int), ``master_addr``, ``mixed_precision="no"`` (pyddp leaves precision to
    the script: use pyddp.autocast / amp in fn), ``max_restarts``, and ``num_nodes`` / ``node_rank``:
    with ``num_nodes > 1`` each node's kernel calls notebook_launcher with the same ``master_addr``
    (node 0's address), ``master_port`` and PYDDP_SECRET (set it in each kernel's environment), its
    own ``node_rank``, and forks its ``nprocs`` ranks: global ranks ``node_rank * nprocs ...``; each
    call returns the return value of its node's first rank.
    """
    fn, nprocs, master_port, addr, num_nodes, node_rank = _accelerate_names(
        fn, function, nprocs, num_processes, master_port, use_port, master_addr, mixed_precision,
        num_nodes, node_rank)
    _check_fn_args(fn, args)
    _check_nprocs(nprocs)
    _check_port(master_port)
    max_restarts = _int_arg("max_restarts", max_restarts, 0)
    if max_restarts and num_nodes > 1:
        raise ValueError("max_restarts with num_nodes > 1: restarting ranks on several nodes needs "
                         "a rendezvous that waits for every node again; use pyddp-run's elastic "
                         "mode (--nnodes, --max-restarts) for that")
    if not isinstance(quiet_others, bool):
        raise TypeError(f"quiet_others must be a bool, got {type(quiet_others).__name__}")
    from ._notebook_ranks import _check_figures

    figures = _check_figures(figures)
    if "fork" not in multiprocessing.get_all_start_methods():
        raise RuntimeError("notebook_launcher needs the 'fork' start method, which this platform lacks; "
                           "put fn in a module and use pyddp.multiprocessing.spawn instead")
    _check_fork_safe("fork", "notebook_launcher")

    for attempt in range(max_restarts + 1):
        port = master_port if master_port is not None else _free_port()
        # one node: a fresh secret per job; several: the one every node's kernel was given
        secret = _config_secret() if num_nodes > 1 else secrets.token_hex(32)
        try:
            return _launch(fn, args, nprocs, port, secret, addr, num_nodes, node_rank, quiet_others,
                           figures)
        except (ProcessRaisedException, ProcessExitedException) as e:
            if attempt == max_restarts:
                raise e.with_traceback(None) from None
            first = next((line for line in reversed(str(e).strip().splitlines()) if line.strip()),
                         type(e).__name__)
            print(f"[pyddp] rank {node_rank * nprocs + e.error_index} failed ({first}); starting "
                  f"the {nprocs} ranks again (restart {attempt + 1} of {max_restarts})",
                  file=sys.stderr, flush=True)


def _launch(fn, args, nprocs, port, secret, addr, num_nodes, node_rank, quiet_others, figures):
    """One run of the job's ranks on this node: rank 0's result, or the first failure raised."""
    # Files a rank creates only when it has something to report (an error, rank 0's result), under
    # unguessable names: a launcher killed before it cleans up leaves nothing behind otherwise.
    stem = os.path.join(tempfile.gettempdir(), f"pyddp-notebook-{secrets.token_hex(12)}")
    result_file = f"{stem}-result.pickle"
    error_files = [f"{stem}-error{r}.pickle" for r in range(nprocs)]
    ctx = multiprocessing.get_context("fork")
    processes = []
    context = _GroupContext(processes, error_files)
    output = _Output(_rank_io.Presenter(quiet_others=quiet_others, longest_line=_LONGEST_LINE))
    parent_pid = os.getpid()
    load_prctl()   # here: a forked rank must only call it
    guard = _NoLostInterrupt()
    try:
        with guard:
            _start_ranks(guard, ctx, nprocs, port, secret, fn, args, error_files, result_file, parent_pid,
                         processes, context, output, addr, num_nodes, node_rank, figures)

        failure = None
        while True:
            ready = multiprocessing.connection.wait(list(output.fds) + list(context.sentinels),
                                                    timeout=_POLL)
            output.pump([fd for fd in ready if isinstance(fd, int) and fd in output.fds])
            try:
                if context.join(timeout=0):
                    break
            except Exception as e:  # ProcessRaisedException / ProcessExitedException
                failure = e
                break
        output.drain(_DRAIN)
        if failure is not None:
            output.presenter.reveal(node_rank * nprocs + getattr(failure, "error_index", 0))
            # Its traceback would show the launcher's internals; the rank's traceback is in its message.
            raise failure.with_traceback(None)
        if not os.path.exists(result_file):
            return None  # rank 0 left through sys.exit(0)
        with open(result_file, "rb") as fh:
            return pickle.load(fh)
    except KeyboardInterrupt:
        # The cell was interrupted: the ranks are stopped below.  A fresh exception, so the cell shows
        # where the launcher was called, not the selector it was waiting in.
        raise KeyboardInterrupt(f"notebook_launcher was interrupted; its {nprocs} ranks are stopped") \
            from None
    finally:
        # Reached with ranks alive only on an exception here (KeyboardInterrupt): stop them all.
        context._before_reap()
        if any(p.exitcode is None for p in processes):
            context._stop_all(_STOP_GRACE, quiet=True)
        output.drain(0.2 if output.fds else 0)
        for f in glob.glob(glob.escape(stem) + "-*"):   # with any half-written temporary file
            _remove(f)
