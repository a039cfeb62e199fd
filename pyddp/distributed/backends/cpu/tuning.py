"""The rules file of backend "cpu": the crossovers of algorithm choice measured on this host.

The C core chooses, per collective kind and message size, between the shared-memory banks and
single copies (cross-memory attach) on one host, and between the direct algorithms and the rings
over TCP (csrc/coll/rules.h).  Its built-in crossovers were measured on one machine;
``python -m pyddp.tools.tune`` measures them on this one and writes a rules file, which every
group reads at creation:

- ``PYDDP_TUNING_FILE``: the file to read (an error when it cannot be read);
- else the per-user cache file of this host (``default_path()``: ``$XDG_CACHE_HOME/pyddp/tuning``
  or ``~/.cache/pyddp/tuning``, named by the host's CPU model, core count and kernel), when it
  exists;
- ``PYDDP_TUNING=0``: none (the built-in constants).

A host without a rules file is measured by its first jobs (``PYDDP_TUNING_AUTO``, on by default):
the default group of a job whose ranks all share this host, each with a core of its own, times both
candidates of every kind at a few sizes as it starts (``crossovers.first_job``, well under a second
for 2 ranks), applies the crossovers rank 0 found on every rank, and rank 0 writes them to the
per-user cache as this host's rules file, so later jobs start with them; the first FIRST_JOBS jobs
at a rank count measure, each adding its pairs to the earlier ones'; one job measures at a time (a
lock beside the file), the others run on what is there meanwhile.  A file measured on
another host (its ``host`` facts differ from this one's: copied, or a home directory shared by
different machines) is not used.

A file holds one table per number of ranks it was measured with; a group of ``n`` ranks uses the
table of the largest count ``<= n``.  Rank 0 reads the file and sends its table to the others with
the group's address exchange (``encode``/``decode``): every rank applies the same rules, as
algorithm choice must agree across ranks.
"""
from __future__ import annotations

import json
import os
import warnings

from .... import _C, _config

__all__ = ["FORMAT", "host_facts", "host_key", "default_path", "path_in_force", "load", "table_for",
           "encode", "decode", "describe", "KIND_NAMES", "PROBE", "auto_claim", "auto_save",
           "auto_release"]

FORMAT = 1
# kind name -> code, for the kinds a rule can change (pyddp._C.KINDS: the C core's table)
KIND_NAMES = {name: info["code"] for name, info in _C.KINDS.items()
              if info["shm"] and name not in ("barrier",)}
_NKINDS = _C.NKINDS  # entries of a per-kind table of the C core
_warned = set()
# rank 0's rules text that asks every rank to measure the host's crossovers as the group starts
PROBE = "probe"
_claim = None   # (lock file, path, facts, earlier measurement) while this process's job measures
# the first jobs at a rank count on a host measure it, each adding its pairs to the earlier ones'
# (a machine whose speed changes for minutes at a time is then measured at several moments)
FIRST_JOBS = 3
_host_facts = None


def host_facts() -> dict:
    """What a rules file is keyed by: CPU model, the host's online cores, kernel release.

    The host's cores, not the calling process's CPU affinity: a launcher that binds each rank to a
    core of its own (mpirun does by default, Slurm with --cpu-bind) leaves every rank one CPU in
    its affinity mask on the very host the tuner measured, with a core per rank as the tuner had;
    keyed by the affinity, those ranks looked for another host's file, found none, and ran with
    the built-in constants (a 4 MiB all_to_all 1.6x slower here).  The C core decides whether
    ranks have cores of their own from the online count too (group/setup.c)."""
    global _host_facts
    if _host_facts is not None:
        return dict(_host_facts)
    import platform  # (here: groups without a rules file never need it)

    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = os.cpu_count() or 1
    _host_facts = {"cpu": model or platform.processor() or platform.machine(), "cores": cores,
                   "kernel": platform.release()}
    return dict(_host_facts)


def host_key(facts=None) -> str:
    """A file name for this host's rules (``<cores>c-<hash of the facts>``)."""
    import hashlib

    facts = facts or host_facts()
    h = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]
    return f"{facts['cores']}c-{h}"


def default_path(facts=None) -> str:
    """This host's rules file in the per-user cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pyddp", "tuning", f"{host_key(facts)}.json")


def path_in_force():
    """(path, explicit): the file groups read now (None: none, built-in constants), and whether
    PYDDP_TUNING_FILE named it."""
    if not _config.get("PYDDP_TUNING"):
        return None, False
    named = (_config.get("PYDDP_TUNING_FILE") or "").strip()
    if named:
        return named, True
    path = default_path()
    return (path, False) if os.path.exists(path) else (None, False)


def _check_size(v, where):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{where} must be a byte count >= 0 or null, got {v!r}")
    return v


def validate(doc, path="the rules file") -> dict:
    """``doc`` (a parsed rules file) checked: ValueError naming what is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a pyddp rules file of format {FORMAT} (write one with "
                         "python -m pyddp.tools.tune)")
    tables = doc.get("tables")
    if not isinstance(tables, dict):
        raise ValueError(f"{path}: 'tables' must map rank counts to tables")
    for n, t in tables.items():
        if not str(n).isdigit() or int(n) < 1 or not isinstance(t, dict):
            raise ValueError(f"{path}: tables[{n!r}] must be a table for a rank count >= 1")
        for rule in ("cma_from", "small_bytes"):
            for kind, v in (t.get(rule) or {}).items():
                if kind not in KIND_NAMES:
                    raise ValueError(f"{path}: tables[{n}].{rule} names an unknown collective "
                                     f"{kind!r} (expected one of {', '.join(KIND_NAMES)})")
                _check_size(v, f"{path}: tables[{n}].{rule}.{kind}")
                if rule == "small_bytes" and v is None:
                    raise ValueError(f"{path}: tables[{n}].small_bytes.{kind} must be a byte "
                                     "count")
        for kind, v in (t.get("cma_gap") or {}).items():
            where = f"{path}: tables[{n}].cma_gap.{kind}"
            if kind not in KIND_NAMES:
                raise ValueError(f"{where}: unknown collective (expected one of "
                                 f"{', '.join(KIND_NAMES)})")
            if (not isinstance(v, list) or len(v) != 2 or
                    any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v) or
                    v[0] >= v[1]):
                raise ValueError(f"{where} must be [lo, hi], byte counts with lo < hi, got {v!r}")
            if (t.get("cma_from") or {}).get(kind) is None:
                raise ValueError(f"{where}: a gap needs a cma_from threshold for {kind}")
    phased = doc.get("phased", {})
    if not isinstance(phased, dict):
        raise ValueError(f"{path}: 'phased' must map rank counts to the phases' rules")
    for n, ph in phased.items():
        where = f"{path}: phased[{n!r}]"
        if str(n) not in tables or not isinstance(ph, dict):
            raise ValueError(f"{where} must be the phases' rules of a rank count in 'tables'")
        ns = ph.get("phase_ns")
        if isinstance(ns, bool) or not isinstance(ns, (int, float)) or not 0 < ns <= 1e9:
            raise ValueError(f"{where}.phase_ns must be a number of ns in (0, 1e9], got {ns!r}")
        for key in ("fast", "slow"):
            if not isinstance(ph.get(key), dict):
                raise ValueError(f"{where}.{key} must be a table of cma_from (and cma_gap)")
            validate({"format": FORMAT, "tables": {str(n): ph[key]}}, f"{where}.{key}")
    return doc


def load(path) -> dict:
    """The parsed and checked rules file at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ValueError(f"rules file {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"rules file {path}: not JSON ({e})") from None
    return validate(doc, path)


def table_for(doc, size):
    """The table of ``doc`` for a group of ``size`` ranks (the largest count <= size), or None."""
    counts = sorted(int(n) for n in doc["tables"] if int(n) <= size)
    return doc["tables"][str(counts[-1])] if counts else None


def _read(path, explicit, stacklevel=4):
    """The rules file at ``path`` (path_in_force's), or None where the cache file cannot be used:
    unreadable, or measured on another host (warned once); PYDDP_TUNING_FILE's is an error when
    unreadable and used wherever it was measured."""
    try:
        doc = load(path)
    except ValueError as e:
        if explicit:
            raise ValueError(f"PYDDP_TUNING_FILE: {e}") from None
        _warn_once(path, f"pyddp: ignoring the rules file of this host ({e}); rerun "
                   "python -m pyddp.tools.tune", stacklevel)
        return None
    if not explicit and foreign(doc):
        _warn_once(path, f"pyddp: ignoring {path}: it was measured on another host "
                   f"({doc.get('host')}, this one is {host_facts()}); rerun python -m "
                   "pyddp.tools.tune here, or name it in PYDDP_TUNING_FILE to use it anyway",
                   stacklevel)
        return None
    return doc


def foreign(doc) -> bool:
    """Whether a rules file says it was measured on a host other than this one."""
    host = doc.get("host")
    return isinstance(host, dict) and host != host_facts()


def _warn_once(path, msg, stacklevel):
    if path not in _warned:  # the cache file: warn once, run on the constants
        _warned.add(path)
        warnings.warn(msg, RuntimeWarning, stacklevel=stacklevel)


def encode(size, local=None, probe=None) -> str:
    """Rank 0's rules for a group of ``size`` ranks (``local`` of them on its host: the phases'
    rules need a core for each), compact, for the address exchange: '' for the built-in
    constants.  ``probe``: (ranks of the group on this host, the cores they can keep busy)
    for a job's default group, which measures a host that has no rules for it yet (``PROBE``:
    every rank measures as the group starts; ``auto_claim``)."""
    path, explicit = path_in_force()
    if size < 2:
        return ""
    doc = _read(path, explicit) if path is not None else None
    # (a file of this host's name that cannot be used, unreadable or another host's, is the
    # user's to replace: warned, never measured over)
    if probe is not None and (path is None or doc is not None) and auto_claim(size, doc, *probe):
        return PROBE
    if doc is None:
        return ""
    t = table_for(doc, size)
    if t is None:
        return ""
    small = [0] * _NKINDS
    for kind, v in (t.get("small_bytes") or {}).items():
        small[KIND_NAMES[kind]] = v
    ph = phased_for(doc, size, local)
    if ph is None:
        return json.dumps([_cma_list(t), small], separators=(",", ":"))
    # each phase's own single-copy rules; the group switches between them at run time
    return json.dumps([_cma_list(ph["fast"]), small, _cma_list(ph["slow"]), ph["phase_ns"]],
                      separators=(",", ":"))


# --------------------------------------------------------------- the first job on a host measures it

# ranks that share cores measure up to this many per core (4 ranks on 2 cores took 0.46-0.82 s; 8
# on 2 took 1.85 s, past what a first job may pay)
SHARED_MEASURE = 2


def auto_claim(size, doc, local, cores) -> bool:
    """Whether rank 0 of a job's default group of ``size`` ranks, ``local`` of them on this host
    (whose ranks can keep ``cores`` cores busy), measures this host's crossovers as the group
    starts, and if so holds the lock beside the host's rules file until ``auto_save`` or
    ``auto_release``.  Only with PYDDP_TUNING_AUTO (default on), PYDDP_TUNING on, no
    PYDDP_TUNING_FILE and no PYDDP_CMA_THRESHOLD (which overrides every rule), every rank on this
    host (a measurement of a network says little about the next job's), and where ``doc`` (the
    host's file, None: none usable) is none or one that fewer than FIRST_JOBS earlier jobs of
    ``size`` ranks wrote (a hand-run tuner's file is kept as it is).  Ranks that share cores
    (up to SHARED_MEASURE per core) measure too: their table is for jobs of that many ranks on this host, which share them the
    same way (4 ranks on 2 cores: out of the box ahead of Open MPI at 57 of 64 points measured,
    54 on the constants, whose scatter kept the banks where single copies halve the bytes copied;
    docs/benchmarks.md).  Never waits: another job measuring now holds the lock and this one runs
    on what is there."""
    global _claim
    if (not _config.get("PYDDP_TUNING_AUTO") or not _config.get("PYDDP_TUNING")
            or (_config.get("PYDDP_TUNING_FILE") or "").strip()
            or _config.get("PYDDP_CMA_THRESHOLD") is not None
            or size < 2 or local != size or local > SHARED_MEASURE * max(1, cores)
            or _claim is not None):
        return False
    if doc is not None and not _wants(doc, size):
        return False
    import fcntl

    path = default_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False   # a read-only or missing cache directory: the constants
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False   # another job is measuring this host now
    # (that job may have written the file since this one read it)
    try:
        fresh = load(path) if os.path.exists(path) else None
    except ValueError:
        fresh = None
    if fresh is not None and foreign(fresh):
        fresh = None
    if fresh is not None and not _wants(fresh, size):
        os.close(fd)
        return False
    earlier = ((fresh or {}).get("measured") or {}).get(str(size)) or [None]
    _claim = (fd, path, host_facts(), earlier[0] if isinstance(earlier[0], dict) else None)
    return True


def _wants(doc, size) -> bool:
    """Whether a job of ``size`` ranks measures the host whose rules file is ``doc``: one the
    first jobs wrote, fewer than FIRST_JOBS of them at this rank count."""
    if doc.get("source") != "first job":
        return False
    jobs = (doc.get("jobs") or {}).get(str(size), 1 if str(size) in doc["tables"] else 0)
    return not isinstance(jobs, int) or jobs < FIRST_JOBS


def claimed_measurement():
    """Rank 0 of a job that measures the host: the earlier jobs' measurement at its rank count
    (crossovers._paired's result, their pairs together), or None."""
    return _claim[3] if _claim is not None else None


def auto_release():
    """Rank 0 gives up its claim (the measurement failed): the next job measures."""
    global _claim
    if _claim is not None:
        os.close(_claim[0])
        _claim = None


def auto_save(size, res, table, seconds):
    """Rank 0, after its job's default group measured the host (``res``: crossovers._paired's
    result for ``size`` ranks, the earlier jobs' pairs merged in, ``table`` the crossovers it
    applied, ``seconds`` it took): this host's rules file gets the table of that rank count (a file written by an earlier job keeps its other counts' tables), written whole
    into place, and the claim is released.  Returns the path, or None where it could not be
    written (the job keeps the rules it measured)."""
    import datetime

    if _claim is None:
        return None
    _, path, facts, _ = _claim
    try:
        doc = None
        if os.path.exists(path):
            try:
                doc = load(path)
            except ValueError:
                doc = None
        if doc is None or foreign(doc) or doc.get("source") != "first job":
            doc = {"format": FORMAT, "host": facts, "source": "first job", "tables": {},
                   "measured": {}}
        doc["created"] = datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        table = dict(table)
        phases = table.pop("phased", None)   # (first_job_table: pairs seen in both phases)
        doc["tables"][str(size)] = table
        if phases is not None:
            doc.setdefault("phased", {})[str(size)] = phases
        elif str(size) in (doc.get("phased") or {}):
            del doc["phased"][str(size)]
        doc["measured"][str(size)] = [res]
        jobs = doc.setdefault("jobs", {})
        jobs[str(size)] = int(res.get("jobs", 1))
        doc.setdefault("seconds", {})[str(size)] = round(seconds, 3)
        validate(doc, path)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
        return path
    except OSError:
        return None
    finally:
        auto_release()


def _cma_list(t):
    """A table's single-copy rules as set_rules takes them, one entry per kind (0: default)."""
    cma = [0] * _NKINDS
    gaps = t.get("cma_gap") or {}
    for kind, v in (t.get("cma_from") or {}).items():
        # a gap: the banks again in [lo, hi) above the threshold
        cma[KIND_NAMES[kind]] = [v] + list(gaps[kind]) if kind in gaps else v
    return cma


def phased_for(doc, size, local):
    """The phases' rules of ``doc`` for a group of ``size`` ranks, ``local`` of them on each
    host at most, or None: only for the rank count the table in force was measured at, and only
    where each local rank has a core (the probe that switches phases spins on two of them; ranks
    sharing cores keep the table made for both phases)."""
    counts = sorted(int(n) for n in doc["tables"] if int(n) <= size)
    if not counts:
        return None
    n = str(counts[-1])
    ph = (doc.get("phased") or {}).get(n)
    cores = (doc.get("host") or {}).get("cores") or 0
    if ph is None or local is None or local > cores:
        return None
    return ph


def describe() -> str:
    """One line naming the rules groups apply now (benchmarks print it beside their tables)."""
    try:
        path, explicit = path_in_force()
        if path is None:
            return "built-in constants" + (" (PYDDP_TUNING=0)" if not _config.get(
                "PYDDP_TUNING") else (" (no rules file yet: the first jobs on this host measure "
                                      "it)" if _config.get(
                                          "PYDDP_TUNING_AUTO") else ""))
        doc = load(path)
    except ValueError as e:
        return f"built-in constants ({e})"
    if not explicit and foreign(doc):
        return f"built-in constants ({os.path.basename(path)} was measured on another host)"
    how = "measured by this host's first job" if doc.get("source") == "first job" else "tuned"
    phased = sorted(doc.get("phased") or {}, key=int)
    # (rules of their own for the machine's slow phase, switched to at run time)
    phases = f"; each phase's rules for {', '.join(phased)} ranks" if phased else ""
    return (f"{how} {doc.get('created', '?')} ({os.path.basename(path)}"
            f"{', PYDDP_TUNING_FILE' if explicit else ''}{phases}; python -m pyddp.tools.tune --show)")


def decode(text):
    """(cma_from, small_bytes) lists for ``ProcessGroup.set_rules``, with the slow phase's
    cma_from and the phase threshold (ns) for ``set_slow_rules`` after them where the file has
    the phases' rules; None for ''."""
    if not text:
        return None
    parts = json.loads(text)

    def cma(v):
        return [tuple(x) if isinstance(x, list) else x for x in v]

    if len(parts) == 4:
        return cma(parts[0]), parts[1], cma(parts[2]), float(parts[3])
    return cma(parts[0]), parts[1]
