"""Backend "cpu" (alias "gloo"): pyddp's own C core, shared memory between the ranks of a host and
TCP between hosts (csrc/group, csrc/transport, csrc/coll).

Its backend object is the C process group itself (``pyddp._C.ProcessGroup``): ``submit`` takes a
``Request``'s fields positionally (backends.interface), and of the interface's optional members it
has ``fast`` (a small blocking collective in one C call), ``shared_alloc`` (a buffer every rank of
the host maps), ``explain``, ``transport``, ``error`` and ``fail``.  It supports every kind, dtype
and op.  This module connects one: the address exchange through the group's store, the transport
choice (PYDDP_TRANSPORT, as rank 0 has it), the host identity that decides which ranks share
memory.  Its registry entry's ``host`` hook makes the host group a device backend keeps beside its
communicators (the signature check, object collectives) and the torch bridge's group
(registry.host_group).  Beside it, the C core's rules of algorithm choice: ``tuning`` (the rules
file a group reads at creation) and ``crossovers`` (measuring them on running ranks: the tuner,
and the default group under PYDDP_TUNING_ONLINE=1).
"""
from __future__ import annotations

import os
import secrets
import socket

from .... import _C, _config, _threads
from ... import _observe
from ..._setup_watch import SetupWatch
from ...store import DistError, HashStore, PrefixStore, TCPStore, bind_address, job_secret
from ..registry import BackendEntry, register

__all__ = ["connect_group", "create", "host", "listen_plan"]


def advertised_host(store) -> str:
    host = _config.get("PYDDP_HOST")
    if host:
        return host
    base = store
    while isinstance(base, PrefixStore):
        base = base.underlying_store
    if isinstance(base, TCPStore):
        try:
            local = base.local_addr()
            if local:
                return local
        except (AttributeError, DistError, OSError):
            pass
    if isinstance(base, (HashStore,)):
        return "127.0.0.1"
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


TRANSPORTS = {"": 0, "auto": 0, "tcp": 1, "shm": 2}


def transport_wanted_shm() -> bool:
    """Whether PYDDP_TRANSPORT (as this rank has it) leaves shared memory possible."""
    return _config.get("PYDDP_TRANSPORT") != "tcp"


def transport_choice(store, prefix, rank) -> int:
    """PYDDP_TRANSPORT as rank 0 has it (every rank must make the same choice)."""
    if rank == 0:
        want = _config.get("PYDDP_TRANSPORT")
        store.set(f"{prefix}/transport", want)
    return TRANSPORTS[store.get(f"{prefix}/transport").decode()]


def node_id() -> str:
    """This host's identity: ranks with equal ids share memory (hostname plus boot id, so two
    machines with one name differ; PYDDP_NODE_ID overrides it, e.g. to test several hosts)."""
    nid = _config.get("PYDDP_NODE_ID")
    if nid:
        return nid
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _net_id() -> str:
    """This process's network namespace (ranks of one host in different namespaces, as containers
    are, cannot reach each other on loopback)."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def listen_plan(store, where, rank) -> tuple:
    """(address to advertise, address to bind) for this rank's transport listener: loopback when
    every rank is on this host and in its network namespace (``where``: each rank's host and
    namespace), else the address its peers reach it at (PYDDP_HOST, or the interface that reaches
    the store), bound alone when it is one of this host's."""
    explicit = _config.get("PYDDP_HOST")
    if explicit:
        return explicit, bind_address(explicit, f"rank {rank}'s transport")
    if len(set(where)) == 1:
        return "127.0.0.1", "127.0.0.1"
    host = advertised_host(store)
    return host, bind_address(host, f"rank {rank}'s transport")


def _forget_setup(store, watch, once):
    """Every rank has read what the others published in ``watch``'s round (each calls this after
    connecting): the last to arrive deletes those keys, so a job that makes and destroys groups
    all along does not grow its store; with ``once`` the round counter too (no other group uses
    the name).  A store without delete_key keeps them."""
    prefix, size = watch.prefix, watch.size
    keys = [f"{prefix}/{part}/{r}" for part in ("node", "net", "cpus", "addr") for r in range(size)]
    first = watch.gen * size + 1
    keys += [f"{watch.name}/arrival/{n}" for n in range(first, first + size)]
    keys += [f"{prefix}/token", f"{prefix}/transport", f"{prefix}/connected"]
    if once:
        keys.append(f"{watch.name}/round")
    if int(store.add(f"{prefix}/connected", 1)) != size:
        return
    try:
        for key in keys:
            store.delete_key(key)
    except NotImplementedError:
        pass  # a user's Store without delete_key (an optional method) keeps them, as torch's


def connect_group(store, rank, size, timeout, name, label=None, backend="cpu", once=False,
                  first_job=False):
    """Create this rank's member of a group and connect it to the others through `store`.
    ``label`` names the group in logs, flight-recorder files and the timeline (default: name).
    ``once``: no other group of this job will use ``name`` in ``store`` (new_group's groups): its
    round counter goes with the rest of the setup keys.  ``first_job``: the job's default group,
    which measures a host that has no rules yet as it starts (tuning.auto_claim).

    Returns (C process group, round number)."""
    from . import tuning  # the rules file (read by rank 0 at each group's creation)

    _config.check()  # a bad PYDDP_* value is an error before the C core reads it
    # the round's keys, and waits that say what they wait for (a rank that never came, died,
    # or has another world size) instead of a silent store.get
    watch = SetupWatch(store, name, rank, size, timeout,
                       f"rank {rank}: setting up group {label or name}")
    gen, prefix = watch.gen, watch.prefix
    secret = job_secret()
    cpg = None
    try:
        if size > 1:
            # where every rank is decides where this one listens: nothing wider than needed
            # (node last: once a rank's node key is there, so are the others)
            store.set(f"{prefix}/net/{rank}", _net_id())
            store.set(f"{prefix}/cpus/{rank}", _threads.encode_cpus(_threads.affinity()))
            # (with the world size: ranks started with different ones must not pass this wait)
            store.set(f"{prefix}/node/{rank}", f"{size} {node_id()}")
            watch.wait("node", "host")
            nodes = [store.get(f"{prefix}/node/{r}").decode().split(" ", 1) for r in range(size)]
            watch.check_sizes([int(n[0]) for n in nodes])
            nodes = [n[1] for n in nodes]
            # the cores this host's ranks can keep busy at once (their CPU sets together, within
            # the cgroup's CPU limit): the C core spins only where each rank has one
            cpus = set()
            for r in range(size):
                if nodes[r] == nodes[rank]:
                    cpus |= _threads.decode_cpus(store.get(f"{prefix}/cpus/{r}").decode())
            host_cores = _threads.cores(cpus)
            nets = [store.get(f"{prefix}/net/{r}").decode() for r in range(size)]
            host, bind = listen_plan(store, list(zip(nodes, nets)), rank)
            cpg = _C.ProcessGroup(rank, size, timeout, secret, bind)
            if rank == 0:
                # the group's random id and rank 0's rules of algorithm choice (backends.tuning):
                # every rank applies the same ones
                # (the phases' rules only where each of this host's ranks has a core)
                local = nodes.count(nodes[rank])
                own = local <= host_cores
                probe = (local, host_cores) if first_job and transport_wanted_shm() else None
                store.set(f"{prefix}/token", f"{secrets.randbits(63)} "
                          f"{tuning.encode(size, local if own else None, probe)}")
                store.set(f"{prefix}/transport", _config.get("PYDDP_TRANSPORT"))
            # (rank 0's token and transport before its address: once every address is there,
            # so are they)
            store.set(f"{prefix}/addr/{rank}", f"{host}:{cpg.port}")
            watch.wait("addr", "transport address")
            transport = transport_choice(store, prefix, rank)
            token, _, rules = store.get(f"{prefix}/token").decode().partition(" ")
            token = int(token)
            probe = rules == tuning.PROBE
            rules = None if probe else tuning.decode(rules)
            hosts, ports = [], []
            for r in range(size):
                h, _, p = store.get(f"{prefix}/addr/{r}").decode().rpartition(":")
                hosts.append(h)
                ports.append(int(p))
        else:
            cpg = _C.ProcessGroup(rank, size, timeout, secret, "127.0.0.1")
            token, hosts, ports, nodes, transport, rules = 0, ["127.0.0.1"], [0], None, 0, None
            probe = False
            host_cores = _threads.cores()
        # a rank that dies while the others wait for its connection is named within a second
        stop_watch = watch.watch_connect(cpg) if size > 1 else (lambda: None)
        try:
            cpg.connect(hosts, ports, token, nodes, transport, host_cores)
        finally:
            stop_watch()
        if rules is not None:
            cpg.set_rules(*rules[:2])
            if len(rules) == 4:  # the phases' rules: rules[0] fast, rules[2] slow
                cpg.set_slow_rules(rules[2], rules[1], rules[3])
    except BaseException:
        if rank == 0:
            tuning.auto_release()
        if cpg is not None:
            cpg.destroy()
        raise
    watch.done()
    if size > 1:
        _forget_setup(store, watch, once)
        # ranks started without a launcher's OMP_NUM_THREADS: each takes its share of the cores
        _threads.limit_for_group(nodes.count(nodes[rank]), rank, host_cores)
        hostsn = len(set(nodes))
        why = ("PYDDP_TRANSPORT=" + _config.get("PYDDP_TRANSPORT")
               if transport else
               "every rank on this host" if hostsn == 1 else f"ranks on {hostsn} hosts")
        if cpg.shm_fallback:
            # a full or unwritable /dev/shm somewhere: the job runs, slower, and says why
            why = cpg.shm_fallback
            _observe.log.warning("[rank %d] group %s: %s", _observe._global_rank(rank), label or name,
                                 cpg.shm_fallback)
    else:
        why = "one rank"
    if probe:
        # the first job on a host without rules measures it (every rank; rank 0 keeps them)
        from . import crossovers

        try:
            if cpg.transport == "shm" and cpg.single_copy:
                # (every rank is on this host; the phase probe only where each has a core)
                crossovers.first_job(cpg, phases=size <= host_cores)
            elif rank == 0:
                tuning.auto_release()
        except BaseException:
            if rank == 0:
                tuning.auto_release()
            cpg.destroy()
            raise
    _observe.attach(cpg, label or name, rank, size, token, backend, why)
    return cpg, gen


def create(opts):
    """The factory registered for backend 'cpu': the C process group of one group and rank.
    The job's default group measures its crossovers of algorithm choice on its own ranks first
    when PYDDP_TUNING_ONLINE=1 (crossovers.online, a collective)."""
    cpg, opts.round = connect_group(opts.store, opts.group_rank, opts.group_size,
                                    opts.timeout.total_seconds(), "pg", label=opts.group_id,
                                    once=opts.once, first_job=bool(opts.default))
    if opts.default and opts.group_size > 1 and _config.get("PYDDP_TUNING_ONLINE"):
        from . import crossovers

        try:
            crossovers.online(cpg)
        except BaseException:
            cpg.destroy()
            raise
    return cpg


def host(opts, name, label=None, backend="cpu"):
    """The registry's ``host`` hook: a host group beside a device backend or the torch bridge,
    connected under ``name`` in ``opts.store`` (``label`` and ``backend``: connect_group's)."""
    cpg, opts.round = connect_group(opts.store, opts.group_rank, opts.group_size,
                                    opts.timeout.total_seconds(), name, label=label,
                                    backend=backend, once=opts.once)
    return cpg


register(BackendEntry("cpu", ("cpu",), create, aliases=("gloo",), host=host))
