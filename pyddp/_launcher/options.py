"""The launcher's command line: torchrun's options, defaults and spellings, checked into a LaunchConfig.

Every option takes the dash and the underscore spelling (``--nproc-per-node``/``--nproc_per_node``),
and, as in torchrun, its default can come from a ``PET_<NAME>`` environment variable
(``PET_NPROC_PER_NODE=4``), so job schedulers can configure the launcher without editing commands.
Bad values fail here, before any worker starts, with a message naming the option.
"""
import argparse
import os
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

# torchrun's Std: which of a worker's streams an option applies to.
STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3

# torchrun's default port for --rdzv-endpoint without one.
DEFAULT_RDZV_PORT = 29400
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


@dataclass
class LaunchConfig:
    """One node's share of a job, everything the agent needs (all values already checked)."""

    prog: str                      # "pyddp.run" or "pyddp.launch": prefixes the launcher's messages
    nnodes: int
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int
    run_id: str
    role: str
    max_restarts: int
    monitor_interval: float
    log_dir: Optional[str]
    redirects: Dict[int, int]      # local rank -> STD_* bits sent only to the log file
    tee: Dict[int, int]            # local rank -> STD_* bits sent to the console (prefixed) and file
    local_ranks_filter: Optional[Set[int]]
    kind: str                      # "script" (python file), "module" (-m) or "exec" (--no-python)
    target: str                    # the script path, module name or executable
    script_args: List[str] = field(default_factory=list)
    local_rank_arg: Optional[str] = None  # pyddp.launch: "--local_rank" or "--local-rank" to pass
    timeline: Optional[str] = None  # --timeline DIR: per-rank traces there, merged at the end
    elastic: bool = False          # --elastic: in-process recovery (pyddp.elastic), the agent's store
    min_nproc: int = 1             # --elastic: fewest workers the job goes on with
    max_nodes: int = 0             # --nnodes MIN:MAX: MAX (0: as nnodes)
    rdzv_conf: Dict[str, float] = field(default_factory=dict)  # --rdzv-conf, checked
    dynamic: bool = False          # c10d rendezvous numbering the nodes (torchrun's elasticity:
    #                                every membership change restarts every worker; rdzv_agent.py)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def _env_default(dest, default):
    return os.environ.get("PET_" + dest.upper(), default)


def _env_flag(dest):
    return os.environ.get("PET_" + dest.upper(), "").strip().lower() in ("1", "true", "yes", "on")


def _spellings(name):
    """'--nproc-per-node' -> ['--nproc-per-node', '--nproc_per_node'] (one entry when equal)."""
    under = name.replace("-", "_")
    under = "--" + under[2:]
    return [name] if under == name else [name, under]


def _opt(parser, name, *short, **kw):
    dest = name[2:].replace("-", "_")
    kw.setdefault("dest", dest)
    if kw.get("action") == "store_true":
        kw["default"] = _env_flag(dest)
    else:
        kw["default"] = _env_default(dest, kw.get("default"))
    parser.add_argument(*short, *_spellings(name), **kw)


def add_launcher_arguments(parser):
    """torchrun's options (those that mean something without elastic rendezvous backends)."""
    _opt(parser, "--nnodes", default="1",
         help="number of nodes, N or MIN:MAX (a range: with --rdzv-backend c10d, torchrun's "
              "elasticity, or --elastic); default 1")
    _opt(parser, "--nproc-per-node", default="1",
         help="workers per node: an integer, or 'auto'/'cpu' for this node's CPU count; default 1")
    _opt(parser, "--node-rank", default=None,
         help="this node's rank, 0..nnodes-1; default 0")
    _opt(parser, "--master-addr", default=None,
         help=f"address of node 0, where rank 0 hosts the rendezvous store; default {DEFAULT_MASTER_ADDR}")
    _opt(parser, "--master-port", default=None,
         help=f"port of rank 0's rendezvous store on the master; default {DEFAULT_MASTER_PORT}")
    _opt(parser, "--standalone", action="store_true",
         help="single-node job on a free port of localhost (ignores --master-addr/--master-port)")
    _opt(parser, "--cuda-on-cpu", action="store_true",
         help="run a GPU script on this machine's CPU (PYDDP_CUDA_ON_CPU=1 for every worker: one "
              "emulated CUDA device per local rank, 'nccl' on the cpu backend); refused where a "
              "GPU is visible")
    _opt(parser, "--rdzv-backend", default="static",
         help="'static' (default: rank 0 hosts the store at the endpoint, every node gives "
              "--node-rank) or 'c10d' (the agents' store at the endpoint numbers the nodes; with "
              "--nnodes MIN:MAX membership changes restart every worker, as torchrun)")
    _opt(parser, "--rdzv-endpoint", default="",
         help=f"host[:port] of the rendezvous (port default {DEFAULT_RDZV_PORT}); sets MASTER_ADDR/PORT")
    _opt(parser, "--rdzv-id", default="none", help="job id, exported as TORCHELASTIC_RUN_ID")
    _opt(parser, "--rdzv-conf", default="",
         help="rendezvous settings key=value,...: last_call_timeout (seconds the job waits, once "
              "--nnodes MIN nodes are there, for more; default 2), join_timeout (seconds to wait "
              "for MIN nodes; default 600), read_timeout and timeout (accepted)")
    _opt(parser, "--role", default="default", help="worker role name (ROLE_NAME); default 'default'")
    _opt(parser, "--max-restarts", default="0",
         help="restart all workers up to this many times after a failure; default 0")
    _opt(parser, "--elastic", action="store_true",
         help="in-process recovery (pyddp.elastic): the launcher holds the store and the job's "
              "membership; a dead worker is restarted (up to --max-restarts) and joins at the "
              "survivors' next commit instead of every worker restarting; one node")
    _opt(parser, "--min-nproc", default="1",
         help="with --elastic: the fewest workers the job goes on with; default 1")
    _opt(parser, "--monitor-interval", default="0.1",
         help="longest pause, in seconds, between checks of the workers; default 0.1")
    _opt(parser, "--start-method", default="spawn", choices=["spawn", "fork", "forkserver"],
         help="accepted for torchrun compatibility; workers always start as fresh interpreters")
    _opt(parser, "--log-dir", default=None,
         help="directory for the workers' log and error files (<log-dir>/<run-id>_<x>/attempt_<n>/<local rank>/)")
    _opt(parser, "--timeline", default=None,
         help="write a Chrome / Perfetto trace of every rank's collectives and DDP events into "
              "this directory (PYDDP_TIMELINE), merged into DIR/timeline.json when the job ends")
    _opt(parser, "--redirects", "-r", default="0",
         help="send worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both, "
              "or per local rank, e.g. 0:1,1:2")
    _opt(parser, "--tee", "-t", default="0",
         help="copy worker streams to the console with a [rankN]: prefix, whole lines only "
              "(and to log files with --log-dir); same values as --redirects")
    _opt(parser, "--local-ranks-filter", default="",
         help="comma-separated local ranks whose output reaches the console, e.g. 0; "
              "the others' output goes to their log files")
    _opt(parser, "--module", "-m", action="store_true",
         help="training_script is a module, run as python -m")
    _opt(parser, "--no-python", action="store_true",
         help="training_script is an executable, run without python")
    _opt(parser, "--run-path", action="store_true",
         help="run training_script with runpy.run_path (what pyddp always does for scripts)")
    parser.add_argument("training_script", help="the script (or module, or executable) every worker runs")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER,
                        help="arguments passed to the script")


def build_parser(prog, description):
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    add_launcher_arguments(parser)
    return parser


# ---------------------------------------------------------------- checking


def _int(parser, name, value, minimum=None, maximum=None):
    try:
        v = int(str(value).strip())
    except ValueError:
        parser.error(f"argument {name}: expected an integer, got {value!r}")
    if minimum is not None and v < minimum or maximum is not None and v > maximum:
        lo = "" if minimum is None else str(minimum)
        hi = "" if maximum is None else str(maximum)
        parser.error(f"argument {name}: {v} is out of range [{lo}, {hi}]")
    return v


def cpu_count() -> int:
    """CPUs this process can keep busy (honours taskset, cpusets and the cgroup's CPU limit,
    unlike os.cpu_count())."""
    from .. import _threads

    return _threads.cores()


def _nnodes(parser, value, elastic=False):
    """(MIN, MAX) nodes: 'N' or 'MIN:MAX' (a range needs --elastic or --rdzv-backend c10d)."""
    s = str(value).strip()
    if ":" in s:
        lo, _, hi = s.partition(":")
        lo = _int(parser, "--nnodes", lo, 1)
        hi = _int(parser, "--nnodes", hi, 1)
        if hi < lo:
            parser.error(f"argument --nnodes: {s}: MAX is below MIN")
        if lo != hi and not elastic:
            parser.error(f"argument --nnodes: a range ({s}) needs --rdzv-backend c10d (torchrun's "
                         "elasticity: every membership change restarts every worker with the new "
                         "world size; the script resumes from its snapshot) or --elastic (workers "
                         "recover in process with pyddp.elastic), see docs/launching.md; or give a "
                         f"fixed number of nodes, e.g. --nnodes {hi}")
        return lo, hi
    n = _int(parser, "--nnodes", s, 1)
    return n, n


def _gpu_count():
    from .. import cuda

    return cuda.device_count()


_RDZV_KEYS = ("last_call_timeout", "join_timeout", "read_timeout", "timeout", "close_timeout")


def _rdzv_conf(parser, value) -> Dict[str, float]:
    """torchrun's --rdzv-conf 'key=value,...' (the keys pyddp's rendezvous reads: seconds)."""
    out: Dict[str, float] = {}
    for part in str(value or "").split(","):
        if not part.strip():
            continue
        key, sep, v = part.partition("=")
        key = key.strip()
        if not sep or key not in _RDZV_KEYS:
            parser.error(f"argument --rdzv-conf: {part.strip()!r}: expected key=value with key one "
                         f"of {', '.join(_RDZV_KEYS)}")
        try:
            out[key] = float(v)
        except ValueError:
            out[key] = -1.0
        if not out[key] >= 0:
            parser.error(f"argument --rdzv-conf: {key} must be a number of seconds >= 0, got "
                         f"{v.strip()!r}")
    return out


def _nproc(parser, value):
    s = str(value).strip().lower()
    if s == "cpu":
        return cpu_count()
    if s in ("gpu", "auto"):
        # torchrun: 'gpu' counts the CUDA devices; 'auto' counts them too where there are any,
        # else the CPUs
        n = _gpu_count()
        if n == 0 and s == "gpu":
            parser.error("argument --nproc-per-node: 'gpu': no CUDA device is visible here "
                         "(CUDA_VISIBLE_DEVICES, driver); use an integer or 'cpu'")
        return n or cpu_count()
    try:
        n = int(s)
    except ValueError:
        parser.error(f"argument --nproc-per-node: expected a positive integer or 'auto', got {value!r}")
    if n < 1:
        parser.error(f"argument --nproc-per-node: expected a positive integer or 'auto', got {value!r}")
    return n


def parse_std(parser, name, value, nproc) -> Dict[int, int]:
    """torchrun's Std spec: '3' for every local rank, or '0:1,1:2' per local rank."""
    s = str(value).strip()

    def std(v):
        if v not in ("0", "1", "2", "3"):
            parser.error(f"argument {name}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), "
                         f"or local_rank:value pairs like 0:1,1:2; got {value!r}")
        return int(v)

    if ":" not in s:
        bits = std(s)
        return {r: bits for r in range(nproc)}
    out = {}
    for part in s.split(","):
        rank, _, v = part.partition(":")
        r = _int(parser, name, rank, 0, nproc - 1)
        out[r] = std(v.strip())
    return out


def _ranks_filter(parser, value, nproc) -> Optional[Set[int]]:
    s = str(value).strip()
    if not s:
        return None
    ranks = set()
    for part in s.split(","):
        try:
            ranks.add(int(part))
        except ValueError:
            parser.error(f"argument --local-ranks-filter: expected comma-separated local ranks like 0,1; "
                         f"got {value!r}")
    bad = sorted(r for r in ranks if not 0 <= r < nproc)
    if bad:
        parser.error(f"argument --local-ranks-filter: local ranks {bad} are out of range [0, {nproc - 1}]")
    return ranks


def _endpoint(parser, value):
    s = value.strip()
    if s.startswith("["):            # [ipv6]:port
        host, _, rest = s[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif s.count(":") == 1:
        host, _, port = s.partition(":")
    else:
        host, port = s, ""
    if not host:
        parser.error(f"argument --rdzv-endpoint: expected host[:port], got {value!r}")
    port = _int(parser, "--rdzv-endpoint", port, 1, 65535) if port else DEFAULT_RDZV_PORT
    return host, port


def config_from_args(parser, args, prog, local_rank_arg=None) -> LaunchConfig:
    """Check every option and turn the namespace into a LaunchConfig (parser.error on bad input)."""
    backend = str(args.rdzv_backend).strip().lower()
    if backend not in ("static", "c10d"):
        parser.error(f"argument --rdzv-backend: {args.rdzv_backend!r} is not supported; pyddp's rendezvous "
                     "is static (rank 0 hosts the store at the master address) or c10d (the agents' "
                     "store numbers the nodes): use 'static' or 'c10d'")
    nnodes, max_nodes = _nnodes(parser, args.nnodes, args.elastic or backend == "c10d")
    nproc = _nproc(parser, args.nproc_per_node)
    # torchrun's c10d rendezvous: the nodes are numbered as they arrive, a range of nodes, every
    # membership change restarts every worker (a fixed --node-rank keeps the static rendezvous)
    dynamic = (not args.elastic and backend == "c10d" and not args.standalone
               and (max_nodes != nnodes or (max_nodes > 1 and args.node_rank is None)))
    if args.elastic and max_nodes > 1:
        node_rank = 0  # numbered by the job's store as the nodes arrive
    elif dynamic:
        if args.node_rank is not None:
            print(f"{prog}: note: the c10d rendezvous numbers the nodes; ignoring --node-rank",
                  file=sys.stderr)
        node_rank = 0
    elif args.node_rank is None:
        node_rank = 0
    else:
        node_rank = _int(parser, "--node-rank", args.node_rank, 0)
        if node_rank >= nnodes:
            parser.error(f"argument --node-rank: {node_rank} is out of range for --nnodes {nnodes} "
                         f"(expected 0..{nnodes - 1})")

    run_id = str(args.rdzv_id)
    if args.standalone:
        if max_nodes != 1:
            parser.error(f"argument --standalone: runs a single node, but --nnodes is {nnodes}")
        ignored = [n for n, v in (("--master-addr", args.master_addr), ("--master-port", args.master_port),
                                  ("--rdzv-endpoint", args.rdzv_endpoint)) if v]
        if ignored:
            print(f"{prog}: note: --standalone picks a free port on localhost; ignoring {', '.join(ignored)}",
                  file=sys.stderr)
        master_addr, master_port = "127.0.0.1", 0   # the agent picks the port
        if run_id == "none":
            run_id = str(uuid.uuid4())
    elif args.rdzv_endpoint:
        master_addr, master_port = _endpoint(parser, args.rdzv_endpoint)
    else:
        master_addr = args.master_addr or DEFAULT_MASTER_ADDR
        master_port = DEFAULT_MASTER_PORT
        if args.master_port is not None:
            master_port = _int(parser, "--master-port", args.master_port, 0, 65535)
            if master_port == 0:
                parser.error("argument --master-port: 0 cannot be shared with the other ranks; use "
                             "--standalone for a free port on localhost, or give a port number")

    if args.cuda_on_cpu:
        # the workers inherit it; said (or refused, where a GPU is visible) here, once
        os.environ["PYDDP_CUDA_ON_CPU"] = "1"
        from ..cuda import _emulation
        _emulation._on = None
        try:
            _emulation.announce()
        except RuntimeError as e:
            parser.error(f"argument --cuda-on-cpu: {e}")

    max_restarts = _int(parser, "--max-restarts", args.max_restarts, 0)
    min_nproc = _int(parser, "--min-nproc", args.min_nproc, 1)
    rdzv_conf = _rdzv_conf(parser, args.rdzv_conf)
    if min_nproc > nproc:
        parser.error(f"argument --min-nproc: {min_nproc} is more than --nproc-per-node {nproc}")
    try:
        monitor_interval = float(args.monitor_interval)
    except ValueError:
        monitor_interval = -1.0
    if not monitor_interval > 0:
        parser.error(f"argument --monitor-interval: expected a positive number of seconds, "
                     f"got {args.monitor_interval!r}")

    if args.module and args.no_python:
        parser.error("argument --no-python: cannot be combined with -m/--module")
    if args.run_path and (args.module or args.no_python):
        parser.error("argument --run-path: cannot be combined with -m/--module or --no-python")
    target = args.training_script
    if args.no_python:
        kind = "exec"
        if shutil.which(target) is None:
            parser.error(f"argument training_script: {target!r} is not an executable file or a command "
                         "on PATH (--no-python runs it directly)")
    elif args.module:
        kind = "module"
    else:
        kind = "script"
        if not os.path.isfile(target):
            parser.error(f"argument training_script: {target!r}: no such file")

    log_dir = args.log_dir
    if log_dir is not None and os.path.exists(log_dir) and not os.path.isdir(log_dir):
        parser.error(f"argument --log-dir: {log_dir!r} exists and is not a directory")

    timeline = args.timeline
    if timeline is not None and os.path.exists(timeline) and not os.path.isdir(timeline):
        parser.error(f"argument --timeline: {timeline!r} exists and is not a directory")

    return LaunchConfig(
        prog=prog,
        nnodes=nnodes,
        nproc_per_node=nproc,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        run_id=run_id,
        role=str(args.role),
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        log_dir=log_dir,
        redirects=parse_std(parser, "--redirects", args.redirects, nproc),
        tee=parse_std(parser, "--tee", args.tee, nproc),
        local_ranks_filter=_ranks_filter(parser, args.local_ranks_filter, nproc),
        kind=kind,
        target=target,
        script_args=list(args.training_script_args),
        local_rank_arg=local_rank_arg,
        timeline=timeline,
        elastic=bool(args.elastic),
        max_nodes=max_nodes,
        rdzv_conf=rdzv_conf,
        min_nproc=min_nproc,
        dynamic=dynamic,
    )
