"""One worker process: its command line, its environment, and its own process group.

Each worker starts in a new session (so its process group holds it and every process it forks, e.g.
data-loader workers): stopping a worker signals the whole group, and the terminal's Ctrl-C reaches the
launcher alone, which forwards it once to every group.  Each worker also asks the kernel for SIGKILL when
the launcher dies (PR_SET_PDEATHSIG), so even a SIGKILLed launcher leaves no worker behind.
"""
import os
import signal
import subprocess
import sys
import time
from typing import Optional, Set

from .. import _lifecycle, _threads

BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")


def _child_setup(launcher_pid):
    """A worker's preexec_fn: it runs in the forked child before exec (the launcher is single-threaded,
    so this is safe)."""
    _lifecycle.load_prctl()   # here, in the launcher: the forked child must only call it

    def setup():
        if _lifecycle.die_with_parent(signal.SIGKILL, launcher_pid):   # the launcher died already
            os.kill(os.getpid(), signal.SIGKILL)
    return setup


def worker_argv(cfg, local_rank):
    """The command of one worker: ``python -u`` through the bootstrap, or the executable itself."""
    args = list(cfg.script_args)
    if cfg.local_rank_arg:   # pyddp.launch: torch.distributed.launch puts it before the script's args
        args.insert(0, f"{cfg.local_rank_arg}={local_rank}")
    if cfg.kind == "exec":
        return [cfg.target] + args
    mode = "--module" if cfg.kind == "module" else "--script"
    return [sys.executable, "-u", BOOTSTRAP, mode, cfg.target] + args


def worker_env(cfg, local_rank, restart, master_port, secret, error_file, omp_threads):
    """The launcher's environment plus torchrun's variables for this worker."""
    rank = cfg.node_rank * cfg.nproc_per_node + local_rank
    env = dict(os.environ)
    env.update({
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(cfg.world_size),
        "LOCAL_WORLD_SIZE": str(cfg.nproc_per_node),
        "GROUP_RANK": str(cfg.node_rank),
        "GROUP_WORLD_SIZE": str(cfg.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": cfg.role,
        "ROLE_WORLD_SIZE": str(cfg.world_size),
        "MASTER_ADDR": cfg.master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts),
        "TORCHELASTIC_RUN_ID": cfg.run_id,
        "TORCHELASTIC_ERROR_FILE": error_file,
        "PYDDP_SECRET": secret,
    })
    if omp_threads is not None:
        env["OMP_NUM_THREADS"] = str(omp_threads)
    _threads.huge_pages(env, cfg.nproc_per_node)   # torch's large tensors on huge pages
    if cfg.timeline:
        env["PYDDP_TIMELINE"] = os.path.join(os.path.abspath(cfg.timeline), "")
    return env


class Worker:
    """A started worker; ``exit_time`` is when the launcher first saw it gone (orders failures)."""

    def __init__(self, local_rank, rank, argv, env, error_file):
        self.local_rank = local_rank
        self.rank = rank
        self.argv = argv
        self.env = env
        self.error_file = error_file
        self.proc: Optional[subprocess.Popen] = None
        self.exit_time: Optional[float] = None

    def start(self, stdout=None, stderr=None):
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=stdout, stderr=stderr, close_fds=True,
            start_new_session=True, preexec_fn=_child_setup(os.getpid()))

    @property
    def pid(self):
        return self.proc.pid

    def poll(self, now: Optional[float] = None) -> Optional[int]:
        """The exit status, or None while running; the first time it is seen, exit_time = now
        (the agent passes one `now` per check, so workers found gone together tie)."""
        rc = self.proc.poll()
        if rc is not None and self.exit_time is None:
            self.exit_time = time.time() if now is None else now
        return rc

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode

    def signal_group(self, sig) -> bool:
        """Send sig to the worker's process group; False when no process is left in it."""
        return _lifecycle.signal_group(self.proc.pid, sig)


def live_groups(pgids) -> Set[int]:
    """Which of the process groups pgids still hold a live (not zombie) process, from /proc.

    Zombies do not count: an orphan's zombie waits for PID 1 to reap it, which in a container without
    an init may be never, and signalling it is pointless.  Without /proc, a group that accepts signal 0
    counts as live."""
    pgids = set(pgids)
    try:
        names = os.listdir("/proc")
    except OSError:
        names = None
    if names is None:
        out = set()
        for g in pgids:
            try:
                os.killpg(g, 0)
                out.add(g)
            except OSError:
                pass
        return out
    out = set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so cut at the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 3 and fields[0] not in (b"Z", b"X"):
            g = int(fields[2])
            if g in pgids:
                out.add(g)
    return out
