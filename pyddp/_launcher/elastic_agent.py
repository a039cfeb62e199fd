"""pyddp-run --elastic: nodes and workers join and leave a running job (pyddp.elastic in the workers).

One agent per node.  The agent on the rendezvous endpoint's host (``--rdzv-endpoint``, or
``--master-addr``/``--master-port``; with ``--standalone`` the only one) hosts the job's store and is
its *leader*: the only one that writes the membership, so there is one writer and no split brain.

Every agent, the leader included:

- registers its node (``elastic/nodes``: a counter; a node past ``--nnodes MAX`` is refused), starts its
  workers, each with an id ``<node>.<local rank>.<spawn>`` in ``PYDDP_ELASTIC_ID``;
- publishes what its workers are doing, ``elastic/node/<n>/workers`` = ``{"live": [...], "finished":
  [...], "failed": [...]}``, on every change, and beats ``elastic/node/<n>/hb`` (an add) every 0.5 s;
- restarts its own dead workers while ``--max-restarts`` allows (``elastic/dead/<id>`` marks the dead).

The leader, from those keys, every ``--monitor-interval``:

- starts the job (generation 0: every worker of every node) once ``--nnodes MIN`` nodes are there and
  a last call (``PYDDP_ELASTIC_LAST_CALL`` seconds, default 2) passed or MAX arrived;
- publishes generation n+1 (``elastic/members/<n+1>``, then ``elastic/gen`` += 1) when a member is no
  longer live (its worker died, or its node's heartbeat stopped for 3 s) and when a worker that is
  not a member announced itself ready (``elastic/ready/<id>``: a replacement, or the workers of a node
  that arrived late): survivors first, in their order, so rank 0 always holds the state;
- stops the job when no member is left and none finished (nothing holds the state), and keeps the
  store up until every node is done (``elastic/node/<n>/done``) or gone.

The store survives the loss of any one node: every other agent keeps a standby store server and
publishes its address (``elastic/node/<n>/store``), and caches every node's address, the newest
generation and its members.  When the store cannot be reached, each agent tries the nodes in index
order, skipping the lost leader: the first that answers is the new store (the agent whose turn it is
takes over: its standby becomes the job's store, it leads from the generation and members it cached,
numbering on from there).  Agents re-register there and write the address to the file their workers
read (``PYDDP_ELASTIC_STORE_FILE``), and the workers reconnect (pyddp.elastic's ``_Link``).  The new
leader gives the others a grace of a few heartbeats to re-register before it counts anyone lost.
"""
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Dict, List

from .._lifecycle import describe_exit
from .errors import first_failure_order, format_summary, read_failure
from .workers import Worker, worker_argv, worker_env

HB_S = 0.5     # heartbeat period of every agent
STALE_S = 3.0  # a node whose heartbeat did not move for this long is gone
GRACE_S = 2.0  # a new leader waits this long for the others to re-register
_K_GEN = "elastic/gen"


def _last_call() -> float:
    from .. import _config

    return _config.get("PYDDP_ELASTIC_LAST_CALL")


def _is_local(host) -> bool:
    """Whether ``host`` names an address of this machine (a socket can bind to it)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False
    for *_, addr in infos:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


def _reachable(host, port) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


class StoreLost(Exception):
    """The leader's store cannot be reached (its node is gone)."""


class ElasticNode:
    """This node's share of an elastic job (see the module docstring); ``agent`` is the Agent
    whose worker starting, stopping, output and signals it uses."""

    def __init__(self, agent, port, secret, omp, logs):
        self.a = agent
        self.cfg = agent.cfg
        self.port, self.secret, self.omp, self.logs = port, secret, omp, logs
        self.workers: Dict[str, Worker] = {}   # id -> running worker of this node
        self.finished: List[str] = []
        self.failed: List[str] = []
        self.failures = []
        self.restarts = 0
        self.spawned = 0
        self.published = None
        self.last_hb = 0.0
        self.endpoints: Dict[int, tuple] = {}  # node -> (host, port) of its store server
        self.seen_gen, self.seen_members = -1, []
        self.standby = None
        self.grace_until = 0.0
        self.dir = tempfile.mkdtemp(prefix="pyddp-elastic-")
        self.store_file = os.path.join(self.dir, "store")

    # ------------------------------------------------------------------ the store

    def _connect(self):
        from ..distributed.store import TCPStore

        cfg = self.cfg
        os.environ["PYDDP_SECRET"] = self.secret  # the store authenticates its clients with it
        self.leader = False
        if cfg.max_nodes <= 1 or _is_local(cfg.master_addr):
            try:
                if cfg.max_nodes <= 1:
                    self.a._check_port(self.port)
                self.store = TCPStore(cfg.master_addr, self.port, None, True, wait_for_workers=False)
                self.leader = True
                return
            except Exception:
                if cfg.max_nodes <= 1:
                    raise
                # another agent on this host hosts it: a client like the other nodes
        from datetime import timedelta

        self.store = TCPStore(cfg.master_addr, self.port, None, False, wait_for_workers=False,
                              timeout=timedelta(seconds=60))

    # ------------------------------------------------------------------ this node

    def _spawn(self, local_rank):
        cfg = self.cfg
        wid = f"{self.node}.{local_rank}.{self.spawned}"
        self.spawned += 1
        d = self.logs.rank_dir(self.restarts, local_rank)
        err = os.path.join(d, "error.json")
        env = worker_env(cfg, local_rank, self.restarts, self.port, self.secret, err, self.omp)
        env["PYDDP_ELASTIC_ID"] = wid
        env["PYDDP_ELASTIC_STORE_FILE"] = self.store_file
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        env["GROUP_RANK"] = str(self.node)
        w = Worker(local_rank, local_rank, worker_argv(cfg, local_rank), env, err)
        self.workers[wid] = w
        try:
            self.a._start(w, d, self.pump)
        except OSError as e:
            from .errors import LaunchError

            raise LaunchError(f"cannot start worker {local_rank}: {e}") from None
        self.a._guardian.watch(w.pid)
        return wid

    def _publish(self):
        now = {"live": sorted(self.workers), "finished": self.finished, "failed": self.failed}
        if now != self.published:
            self.store.set(f"elastic/node/{self.node}/workers", json.dumps(now))
            self.published = json.loads(json.dumps(now))

    def _beat(self):
        t = time.monotonic()
        if t - self.last_hb >= HB_S:
            self.last_hb = t
            self.store.add(f"elastic/node/{self.node}/hb", 1)

    def _poll_workers(self):
        """Reap exited workers of this node; restart dead ones while restarts are left."""
        now = time.time()
        for wid, w in list(self.workers.items()):
            rc = w.poll(now)
            if rc is None:
                continue
            del self.workers[wid]
            self.a._guardian.forget(w.pid)
            if rc == 0:
                self.finished.append(wid)
                continue
            self.failed.append(wid)
            self.failures.append(read_failure(w, self.logs.keep))
            self.store.set(f"elastic/dead/{wid}", "1")
            if self.restarts < self.cfg.max_restarts and not self.job_over():
                self.restarts += 1
                self._spawn(w.local_rank)
                self.a.note(f"worker {w.local_rank} failed ({describe_exit(rc)}); restarted it "
                            f"(restart {self.restarts} of {self.cfg.max_restarts}): it joins at the "
                            "survivors' next commit")
            else:
                self.a.note(f"worker {w.local_rank} failed ({describe_exit(rc)}); no restart left "
                            f"(--max-restarts {self.cfg.max_restarts})")

    def job_over(self) -> bool:
        try:
            return self.store.check(["elastic/job"])
        except Exception:
            return False

    # ------------------------------------------------------------------ the leader

    def _lead_init(self):
        self.gen = -1
        self.members: List[str] = []
        self.ready = set()
        self.hb: Dict[int, tuple] = {}   # node -> (last count, when it last moved)
        self.started_at = None

    def _nodes(self):
        """({node: its published dict} of the nodes still there (heartbeat moving, not done),
        the ids of every worker that finished, on any node)."""
        n = int(self.store.add("elastic/nodes", 0))
        out, finished = {}, set()
        t = time.monotonic()
        for i in range(n):
            if not self.store.check([f"elastic/node/{i}/workers"]):
                continue
            d = json.loads(self.store.get(f"elastic/node/{i}/workers").decode())
            finished.update(d["finished"])
            if self.store.check([f"elastic/node/{i}/done"]):
                continue
            c = int(self.store.add(f"elastic/node/{i}/hb", 0))
            last = self.hb.get(i)
            if last is None or last[0] != c:
                self.hb[i] = (c, t)
            elif t - last[1] > STALE_S:
                continue  # gone
            out[i] = d
        return out, finished

    def _post(self, members):
        self.gen += 1
        self.members = list(members)
        self.store.set(f"elastic/members/{self.gen}", json.dumps(self.members))
        cur = int(self.store.add(_K_GEN, 0))
        if self.gen > cur:  # (a store that took over starts its counter at 0)
            self.store.add(_K_GEN, self.gen - cur)

    def _lead(self) -> bool:
        """One round of the leader's duties; False once the job is over."""
        cfg = self.cfg
        if time.monotonic() < self.grace_until:
            return True  # a new leader: the others re-register first
        nodes, finished = self._nodes()
        live = {w for d in nodes.values() for w in d["live"]}
        registered = int(self.store.add("elastic/nodes", 0))
        if self.gen < 0:  # the start: MIN nodes, then the last call (or MAX)
            if len(nodes) < cfg.nnodes:
                if time.monotonic() - self.begun > self.join_timeout:
                    self.store.set("elastic/job", f"failed: {len(nodes)} of --nnodes MIN "
                                                  f"{cfg.nnodes} nodes joined within join_timeout "
                                                  f"{self.join_timeout:g} s")
                    return False
                return True
            if self.started_at is None:
                self.started_at = time.monotonic()
            if registered < cfg.max_nodes and time.monotonic() - self.started_at < self.last_call:
                return True
            order = sorted(live, key=lambda w: tuple(int(x) for x in w.split(".")))
            self._post(order)
            if cfg.max_nodes > 1:
                self.a.note(f"elastic job started: {len(nodes)} node(s), {len(order)} workers")
            return True
        alive = [m for m in self.members if m in live]
        if not alive:
            if not self.store.check(["elastic/job"]):
                # no member runs: the job is over, done if one of them finished its work
                verdict = "done" if set(self.members) & finished else \
                    "failed: every worker holding the training state failed"
                self.store.set("elastic/job", verdict)
            return False
        # a member that finished its work is no reason for a new generation (the others finish
        # too), unless a member still running reported that a collective failed without it
        lost = [m for m in self.members if m not in live and m not in finished]
        done = [m for m in self.members if m in finished]
        stuck = done and any(self.store.check([f"elastic/failed/{self.gen}/{m}"]) for m in alive)
        joiners = []
        for w in sorted(live - set(self.members)):
            if w in self.ready or self.store.check([f"elastic/ready/{w}"]):
                self.ready.add(w)
                joiners.append(w)
        starting = len(live - set(alive) - set(joiners))  # not ready yet
        if len(alive) + len(joiners) + starting < cfg.min_nproc:
            self.store.set("elastic/job", f"failed: {len(alive) + len(joiners) + starting} "
                                          f"workers left, fewer than --min-nproc {cfg.min_nproc}")
            return False
        if lost or joiners or stuck:
            alive += joiners
            self._post(alive)
            self.a.note(f"generation {self.gen}: {len(alive)} workers on "
                        f"{len({w.split('.')[0] for w in alive})} node(s)")
        return True

    # ------------------------------------------------------------------ the store's survival

    def _announce(self, host, port):
        """Tell this node's workers where the store is (they read the file when it fails)."""
        tmp = self.store_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{host}:{port}")
        os.replace(tmp, self.store_file)

    def _standby_up(self):
        """A store server of this node's own, published for a takeover (not on the leader)."""
        from ..distributed.store import TCPStore

        try:
            host = self.store.local_addr() or "127.0.0.1"
        except Exception:
            host = "127.0.0.1"
        self.standby = TCPStore(host, 0, None, True, wait_for_workers=False)
        self.endpoints[self.node] = (host, self.standby.port)

    def _register(self):
        """This node's keys in the (current) store."""
        if self.node in self.endpoints:
            h, p = self.endpoints[self.node]
            self.store.set(f"elastic/node/{self.node}/store", f"{h}:{p}")
        self.published = None
        self._publish()
        self.store.add(f"elastic/node/{self.node}/hb", 1)

    def _cache(self):
        """What a takeover needs: every node's store address, the newest generation and its
        members."""
        n = int(self.store.add("elastic/nodes", 0))
        for i in range(n):
            if i not in self.endpoints and self.store.check([f"elastic/node/{i}/store"]):
                h, _, p = self.store.get(f"elastic/node/{i}/store").decode().rpartition(":")
                self.endpoints[i] = (h, int(p))
        g = int(self.store.add(_K_GEN, 0))
        if g != self.seen_gen and self.store.check([f"elastic/members/{g}"]):
            self.seen_gen = g
            self.seen_members = json.loads(self.store.get(f"elastic/members/{g}").decode())

    def _failover(self, err):
        """The store is gone with its node: move to the first node, in index order, that
        answers (this one, when its turn comes: it takes over)."""
        from datetime import timedelta

        from ..distributed.store import TCPStore

        lost = self.leader_node
        for i in sorted(i for i in self.endpoints if i != lost):
            host, port = self.endpoints[i]
            if i == self.node:
                self.store, self.leader, self.leader_node = self.standby, True, i
                self._lead_init()
                self.gen, self.members = self.seen_gen, list(self.seen_members)
                self.started_at = time.monotonic()
                have = int(self.store.add("elastic/nodes", 0))
                want = max(self.endpoints) + 1
                if want > have:
                    self.store.add("elastic/nodes", want - have)
                self.grace_until = time.monotonic() + GRACE_S
                self.store.set("elastic/leader", str(self.node))
                self._register()
                self._announce(host, port)
                self.a.note(f"the node holding the job's store is gone ({err}); this node "
                            f"holds it now ({host}:{port}) and leads from generation {self.gen}")
                return
            if _reachable(host, port):
                self.store = TCPStore(host, port, None, False, wait_for_workers=False,
                                      timeout=timedelta(seconds=60))
                self.leader_node = i
                self._register()
                self._announce(host, port)
                self.a.note(f"the node holding the job's store is gone ({err}); the store is "
                            f"now node {i}'s ({host}:{port})")
                return
        raise StoreLost(f"the job's store is gone ({err}) and no other node answers")

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        from .errors import LaunchError, LauncherInterrupted
        from .output import OutputPump
        from .._lifecycle import signal_name

        cfg = self.cfg
        self.last_call = cfg.rdzv_conf.get("last_call_timeout", _last_call())
        self.join_timeout = cfg.rdzv_conf.get("join_timeout", 600.0)
        self.begun = time.monotonic()
        self._connect()
        self.node = int(self.store.add("elastic/nodes", 1)) - 1
        if self.node >= cfg.max_nodes:
            raise LaunchError(f"--nnodes {cfg.nnodes}:{cfg.max_nodes}: the job already has "
                              f"{cfg.max_nodes} nodes; this one is not admitted", exit_code=2)
        self._announce(cfg.master_addr, self.port)
        if self.leader:
            self._lead_init()
            self.endpoints[self.node] = (cfg.master_addr, self.port)
            self.store.set("elastic/leader", str(self.node))
            self.leader_node = self.node
        else:
            if cfg.max_nodes > 1:
                self._standby_up()
            self.leader_node = int(self.store.get("elastic/leader").decode())
        self.pump = OutputPump()
        if self.a._wakeup is not None:
            self.pump.add_wakeup(self.a._wakeup)
        why = None
        try:
            for lr in range(cfg.nproc_per_node):
                self._spawn(lr)
            self._register()
            if not self.leader and cfg.max_nodes > 1:
                self._cache()
            while True:
                self.pump.pump(cfg.monitor_interval)
                if self.a._signum is not None:
                    self.a._stop(list(self.workers.values()), self.pump, self.a._signum)
                    self.a.note(f"received {signal_name(self.a._signum)}: stopped all workers")
                    raise LauncherInterrupted(self.a._signum)
                try:
                    self._poll_workers()
                    self._publish()
                    self._beat()
                    if self.leader:
                        self._lead()
                    elif cfg.max_nodes > 1:
                        self._cache()
                    over = self.job_over()
                except LaunchError:
                    raise
                except Exception as e:  # the store is gone with the leader's node
                    if self.leader or cfg.max_nodes <= 1:
                        why = f"the job's store cannot be used: {e}"
                        break
                    try:
                        self._failover(e)
                    except StoreLost as lost:
                        why = str(lost)
                        break
                    continue
                if over:
                    verdict = self.store.get("elastic/job").decode()
                    if verdict != "done":
                        why = verdict
                # a node ends when its workers did (the leader, which holds the store, not
                # before the job), or when the job is over: what still runs then is not a member
                # (a replacement not yet joined) or waits for a generation that will not come
                if over or (not self.workers and not self.leader):
                    break
            if self.workers:
                self.a._stop(list(self.workers.values()), self.pump, signal.SIGTERM)
            try:
                self.store.set(f"elastic/node/{self.node}/done", "1")
            except Exception:
                pass
            if self.leader:
                self._linger()
        finally:
            self.a._stop(list(self.workers.values()), self.pump, signal.SIGTERM)
            self.pump.close()
            shutil.rmtree(self.dir, ignore_errors=True)
        if why is not None or (not self.finished and self.failures):
            if why is not None:
                self.a.note(why)
            if self.failures:
                sys.stdout.flush()
                print(format_summary(cfg.target, first_failure_order(self.failures),
                                     self.a.host, self.restarts, cfg.max_restarts),
                      file=sys.stderr, flush=True)
            return 1
        return 0

    def _linger(self):
        """The leader keeps the store up until every other node is done or gone."""
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            try:
                if not self._nodes()[0]:
                    return
            except Exception:
                return
            time.sleep(0.1)
