"""What env:// learns from the launcher that started this process: torchrun, Open MPI, MPICH/Intel MPI
(Hydra), Slurm or a bare PMI.

Each launcher is a group of variables (rank, size, local rank, local size) and a rule for the master's
address and port when MASTER_ADDR / MASTER_PORT are unset.  Every rank of a job sees the same group, so
every rank derives the same address and port without talking to the others.

Order (the first group whose rank variable is set wins):

1. torchrun / pyddp.run / notebook_launcher: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
2. Open MPI's mpirun: OMPI_COMM_WORLD_*.  Before Slurm because a rank that mpirun starts inside a Slurm
   allocation inherits SLURM_PROCID / SLURM_NTASKS of the daemon (or batch step) that started it, which
   count nodes or steps, not ranks; OMPI_COMM_WORLD_* exist only in processes Open MPI's launcher started.
3. MPICH / Intel MPI's Hydra mpiexec: PMI_RANK, PMI_SIZE with MPI_LOCALRANKID, MPI_LOCALNRANKS (Hydra
   sets these; Slurm's own PMI does not), before Slurm for the same reason.
4. Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.  Master: the first host of the step's (else
   the job's) node list; port: 15000 + SLURM_JOB_ID % 10000 (PyTorch Lightning's rule).
5. Any other PMI launcher: PMI_RANK, PMI_SIZE (PMI_LOCAL_RANK, PMI_LOCAL_SIZE when set).

MPI launchers do not say which host runs rank 0, so MASTER_ADDR defaults to 127.0.0.1 only when every
rank is on this host (local size == size); the port is derived from the job id the launcher put in the
environment (Open MPI's OMPI_MCA_ess_base_jobid, else PMIX_NAMESPACE), which every rank of the job shares
and concurrent jobs do not.
"""
from __future__ import annotations

import hashlib
import re
import zlib
from typing import Iterator, Mapping, NamedTuple, Optional

_ENV_ERROR = "init_process_group (env://): environment variable {name} is not set"
_LAUNCH_HINT = ("; a launcher sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank: start "
                "the script with `pyddp-run --standalone --nproc-per-node N script.py` (torchrun's "
                "options), `python -m pyddp.launch`, mpirun or srun, or pass rank=, world_size= and "
                "init_method='tcp://host:port' (or 'file:///path') to init_process_group")

# Ports derived from job ids stay below Linux's default ephemeral range (32768-60999), so they do not
# collide with the ports the kernel hands out for outgoing connections.
SLURM_PORT_BASE = 15000
SLURM_PORT_SPAN = 10000
MPI_PORT_BASE = 20000
MPI_PORT_SPAN = 10000


class _Launcher(NamedTuple):
    name: str            # what the messages call it
    rank: str
    size: str
    local_rank: Optional[str]
    local_size: Optional[str]
    requires: tuple = ()  # further variables that must be set for this group to apply


_TORCHRUN = _Launcher("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_OMPI = _Launcher("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
_HYDRA = _Launcher("MPICH/Hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                   requires=("MPI_LOCALNRANKS",))
_SLURM = _Launcher("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None)
_PMI = _Launcher("PMI", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE")

LAUNCHERS = (_TORCHRUN, _OMPI, _HYDRA, _SLURM, _PMI)

# Open MPI gives every job a random key (for its PSM transports) that all of the job's ranks see:
# when PYDDP_SECRET is unset, the job's connections are authenticated with a secret derived from it,
# so a rank of another job that derived the same port cannot join this one.
_OMPI_JOB_KEYS = ("OMPI_MCA_orte_precondition_transports", "OMPI_MCA_opal_precondition_transports")


class EnvRendezvous(NamedTuple):
    """What env:// uses, and what it derived (exported to os.environ by the caller when absent)."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    launcher: Optional[str]          # None when no launcher's rank variable is set
    derived: dict                    # variable -> value derived from the launcher's variables


def _set(env: Mapping[str, str], name: Optional[str]) -> Optional[str]:
    if name is None:
        return None
    v = env.get(name)
    return v if v not in (None, "") else None


def _int(env: Mapping[str, str], name: str) -> int:
    v = env[name]
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {v!r}") from None


def detect_launcher(env: Mapping[str, str]) -> Optional[_Launcher]:
    """The first launcher group (in the module's order) whose rank variable is set."""
    for launcher in LAUNCHERS:
        if _set(env, launcher.rank) is not None and all(_set(env, r) for r in launcher.requires):
            return launcher
    return None


def resolve(env: Mapping[str, str], rank: Optional[int] = None,
            world_size: Optional[int] = None) -> EnvRendezvous:
    """Rank, world size, master address and port for env://.

    rank / world_size: the values passed to init_process_group (None or negative: read them from the
    launcher's variables).  Raises ValueError naming the variable that is missing or malformed."""
    launcher = detect_launcher(env)
    derived = {}

    if rank is None or rank < 0:
        if launcher is None:
            raise ValueError(_ENV_ERROR.format(name="RANK") + _LAUNCH_HINT)
        rank = _int(env, launcher.rank)
        if launcher is not _TORCHRUN:
            derived["RANK"] = str(rank)
    if world_size is None or world_size < 0:
        if launcher is None or _set(env, launcher.size) is None:
            raise ValueError(_ENV_ERROR.format(name=launcher.size if launcher else "WORLD_SIZE")
                             + (_LAUNCH_HINT if launcher is None else ""))
        world_size = _int(env, launcher.size)
        if launcher is not _TORCHRUN:
            derived["WORLD_SIZE"] = str(world_size)
    if launcher is not None and launcher is not _TORCHRUN:
        for src, dst in ((launcher.local_rank, "LOCAL_RANK"), (launcher.local_size, "LOCAL_WORLD_SIZE")):
            if _set(env, src) is not None:
                derived[dst] = str(_int(env, src))

    addr = _set(env, "MASTER_ADDR")
    if addr is None:
        addr = _default_master_addr(env, launcher, world_size)
        derived["MASTER_ADDR"] = addr
    port_s = _set(env, "MASTER_PORT")
    if port_s is None:
        port = _default_master_port(env, launcher)
        derived["MASTER_PORT"] = str(port)
    else:
        try:
            port = int(port_s)
        except ValueError:
            raise ValueError(f"environment variable MASTER_PORT must be an integer, got {port_s!r}") from None
    if launcher is _OMPI and _set(env, "PYDDP_SECRET") is None:
        for key in _OMPI_JOB_KEYS:
            if _set(env, key) is not None:
                derived["PYDDP_SECRET"] = hashlib.sha256(b"pyddp/ompi/" + env[key].encode()).hexdigest()
                break
    return EnvRendezvous(rank, world_size, addr, port, launcher.name if launcher else None, derived)


def _all_local(env, launcher, world_size) -> bool:
    local = _set(env, launcher.local_size)
    if local is None:
        return False
    try:
        return int(local) == world_size
    except ValueError:
        return False


def _default_master_addr(env, launcher, world_size) -> str:
    missing = _ENV_ERROR.format(name="MASTER_ADDR")
    if launcher is None or launcher is _TORCHRUN:
        raise ValueError(missing + _LAUNCH_HINT)
    if launcher is _SLURM:
        for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            nodelist = _set(env, var)
            if nodelist is not None:
                return first_host(nodelist, var)
        raise ValueError(f"{missing} (under Slurm it defaults to the first host of SLURM_JOB_NODELIST, "
                         "which is not set either)")
    if _all_local(env, launcher, world_size):
        return "127.0.0.1"
    raise ValueError(
        f"{missing}: {launcher.name} started {world_size} ranks, not all on this host "
        f"({launcher.local_size or 'the local size'} != {launcher.size}), and an MPI launcher does not "
        "say which host runs rank 0; set MASTER_ADDR to that host for every rank (Open MPI: "
        "mpirun -x MASTER_ADDR=host0; MPICH: mpiexec -genv MASTER_ADDR host0)")


def _default_master_port(env, launcher) -> int:
    missing = _ENV_ERROR.format(name="MASTER_PORT")
    if launcher is None or launcher is _TORCHRUN:
        raise ValueError(missing + _LAUNCH_HINT)
    if launcher is _SLURM:
        job = _set(env, "SLURM_JOB_ID") or _set(env, "SLURM_JOBID")
        if job is None:
            raise ValueError(f"{missing} (under Slurm it defaults to {SLURM_PORT_BASE} + SLURM_JOB_ID % "
                             f"{SLURM_PORT_SPAN}, and SLURM_JOB_ID is not set either)")
        try:
            return slurm_port(job)
        except ValueError:
            raise ValueError(f"environment variable SLURM_JOB_ID must be an integer, got {job!r}") from None
    for var in ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"):
        job = _set(env, var)
        if job is not None:
            return mpi_port(job)
    raise ValueError(f"{missing}: {launcher.name} put no job id in the environment to derive a port "
                     "from; set MASTER_PORT for every rank (Open MPI: mpirun -x MASTER_PORT=29500; "
                     "MPICH: mpiexec -genv MASTER_PORT 29500)")


def slurm_port(job_id) -> int:
    """The default MASTER_PORT of Slurm job job_id."""
    return SLURM_PORT_BASE + int(job_id) % SLURM_PORT_SPAN


def mpi_port(job_id: str) -> int:
    """The default MASTER_PORT of an MPI job whose launcher named it job_id."""
    return MPI_PORT_BASE + zlib.crc32(job_id.encode()) % MPI_PORT_SPAN


# ------------------------------------------------------------------------------ Slurm host lists

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _split_top(s: str, what: str):
    """Split a host list at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"cannot parse Slurm host list {what}={s!r}: nested '['")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"cannot parse Slurm host list {what}={s!r}: ']' without '['")
        elif c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"cannot parse Slurm host list {what}={s!r}: '[' without ']'")
    parts.append(s[start:])
    return parts


def _ranges(body: str, s: str, what: str):
    """The values of one bracket, "01-03,07" -> ["01", "02", "03", "07"], zero padding kept."""
    out = []
    for item in body.split(","):
        item = item.strip()
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"cannot parse Slurm host list {what}={s!r}: bad range {item!r}")
        if not sep:
            out.append((lo, lo))
            continue
        if int(hi) < int(lo):
            raise ValueError(f"cannot parse Slurm host list {what}={s!r}: range {item!r} runs backwards")
        out.append((lo, hi))
    return out


def _expand_one(host: str, s: str, what: str) -> Iterator[str]:
    # "rack[1-2]-node[01-02]": the cartesian product of every bracket, left to right.
    pieces = _BRACKET.split(host)   # text, bracket, text, bracket, ..., text
    texts, brackets = pieces[0::2], [_ranges(b, s, what) for b in pieces[1::2]]

    def rec(i, prefix):
        if i == len(brackets):
            yield prefix + texts[i]
            return
        for lo, hi in brackets[i]:
            width = len(lo)
            for n in range(int(lo), int(hi) + 1):
                yield from rec(i + 1, f"{prefix}{texts[i]}{n:0{width}d}")

    return rec(0, "")


def expand_hostlist(s: str, what: str = "SLURM_JOB_NODELIST") -> Iterator[str]:
    """Expand Slurm's compressed host list lazily: "node[01-03,07],gpu5" -> node01, node02, node03,
    node07, gpu5 (what scontrol show hostnames prints).  Raises ValueError naming `what` for text that
    is not a host list."""
    s = s.strip()
    if not s:
        raise ValueError(f"cannot parse Slurm host list {what}={s!r}: empty")
    hosts = [h.strip() for h in _split_top(s, what)]
    for h in hosts:
        if not h:
            raise ValueError(f"cannot parse Slurm host list {what}={s!r}: empty host name")
    for h in hosts:
        # check every bracket of every host before yielding anything
        for b in _BRACKET.findall(h):
            _ranges(b, s, what)
    for h in hosts:
        yield from _expand_one(h, s, what)


def first_host(s: str, what: str = "SLURM_JOB_NODELIST") -> str:
    """The first host of a Slurm host list (where srun puts task 0 by default)."""
    return next(iter(expand_hostlist(s, what)))
