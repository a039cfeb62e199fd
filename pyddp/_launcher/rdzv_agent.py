"""torchrun's elasticity for plain scripts: ``pyddp-run --nnodes MIN:MAX --rdzv-backend c10d
--rdzv-endpoint HOST:PORT --max-restarts N script.py`` (also ``--nnodes N`` with c10d and no
``--node-rank``: the rendezvous numbers the nodes).

Every change of membership stops every worker of every node and starts them again with the new
world size, as torchrun's agent does; the script resumes from its own snapshot.  Unlike
``--elastic`` (pyddp.elastic: workers recover inside their process, see docs/elastic.md) the
script needs nothing from pyddp beyond the environment.

One store for the job, a TCPStore on the endpoint, hosted by the agent that binds it there (its
*leader*, which closes rounds; the others are clients).  A *round* is one membership:

- ``rdzv/round`` is the current round r; an agent joins r when it is open, r+1 when r is closed
  (``rdzv/r/<r>/closed`` = N, the number of nodes): ``add(rdzv/r/<r>/n)`` gives its arrival
  index i, node rank i-1 when i <= N (an agent past N waits for the next round);
- the leader closes the open round once MIN nodes are in and either every live agent is in, MAX
  are in, or no node arrived for ``last_call_timeout`` seconds (--rdzv-conf, default 2);
- node rank 0's agent publishes MASTER_ADDR:MASTER_PORT for the workers' own store;
- every agent beats ``rdzv/hb/<agent id>`` every 0.5 s.

While the workers run, an agent moves the job to round r+1 (``compare_set`` of ``rdzv/round``, so
one agent wins) when:

- a node is waiting (``rdzv/r/<r+1>/n`` > 0): a node joined within the range; this does not count as
  a restart (torchrun: "membership changes do not count as retries");
- one of its workers failed, or a member node's heartbeat stopped for 3 s (a node lost): the job's
  restart count (``rdzv/restarts``, TORCHELASTIC_RESTART_COUNT) goes up by one, bounded by
  --max-restarts; past it the job fails on every node (``rdzv/failed``).

Every agent that sees the round move stops its workers and joins the next round.  A node whose
workers all succeeded is done; the leader keeps the store up until the other members are done or
gone.  The leader's node cannot be lost without losing the job (as torchrun's c10d store host).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import time

from datetime import timedelta

from .._lifecycle import describe_exit
from .errors import LaunchError, LauncherInterrupted, first_failure_order, format_summary, read_failure
from .output import OutputPump
from .workers import Worker, worker_argv, worker_env

HB_S = 0.5       # heartbeat period of every agent
STALE_S = 3.0    # a member whose heartbeat did not move for this long is lost
LINGER_S = 60.0  # the leader keeps the store up this long at most for the members still running


class _StoreLost(Exception):
    pass


class RendezvousNode:
    """This node's share of a job in torchrun's mode (see the module docstring)."""

    def __init__(self, agent, secret, omp, logs):
        self.a = agent
        self.cfg = agent.cfg
        self.secret, self.omp, self.logs = secret, omp, logs
        self.min_nodes = self.cfg.nnodes
        self.max_nodes = max(self.cfg.max_nodes, self.cfg.nnodes)
        conf = self.cfg.rdzv_conf
        self.last_call = float(conf.get("last_call_timeout", 2.0))
        self.join_timeout = float(conf.get("join_timeout", 600.0))
        self.last_hb = 0.0
        self.hb_seen = {}      # agent id -> (value, monotonic time it last moved)
        self.round_seen = {}   # round -> (count, monotonic time it last moved)
        self.attempt = 0

    # ------------------------------------------------------------------ the store

    def _connect(self):
        from ..distributed.store import TCPStore

        cfg = self.cfg
        os.environ["PYDDP_SECRET"] = self.secret   # the store authenticates its clients with it
        self.leader = False
        from .elastic_agent import _is_local
        if _is_local(cfg.master_addr):
            try:
                self.store = TCPStore(cfg.master_addr, cfg.master_port, None, True,
                                      wait_for_workers=False)
                self.leader = True
            except Exception:
                pass   # another agent on this host hosts it: a client like the other nodes
        if not self.leader:
            try:
                self.store = TCPStore(cfg.master_addr, cfg.master_port, None, False,
                                      wait_for_workers=False,
                                      timeout=timedelta(seconds=self.join_timeout))
            except Exception as e:
                raise LaunchError(f"cannot reach the rendezvous at {cfg.master_addr}:"
                                  f"{cfg.master_port} (--rdzv-endpoint): {e}") from None
        if self.leader:
            self.store.compare_set("rdzv/round", "", "0")
        self.aid = self.store.add("rdzv/agents", 1)
        self.host = self._my_address()

    def _my_address(self):
        cfg = self.cfg
        from .elastic_agent import _is_local
        if _is_local(cfg.master_addr):
            return cfg.master_addr
        try:
            with socket.create_connection((cfg.master_addr, cfg.master_port), timeout=10) as s:
                return s.getsockname()[0]
        except OSError:
            return socket.gethostname()

    def _get(self, key):
        return self.store.get(key).decode()

    def _has(self, key):
        return self.store.check([key])

    def _int(self, key, default=0):
        return int(self._get(key)) if self._has(key) else default

    def _round(self):
        return self._int("rdzv/round")

    # ------------------------------------------------------------------ every tick

    def _tick(self):
        """Heartbeat, and the leader's closing of the open round."""
        t = time.monotonic()
        if t - self.last_hb >= HB_S:
            self.last_hb = t
            self.store.add(f"rdzv/hb/{self.aid}", 1)
        if self.leader:
            self._lead()

    def _live_agents(self):
        """The agents whose heartbeat moved within STALE_S."""
        now = time.monotonic()
        n = self._int("rdzv/agents")
        live = []
        for aid in range(1, n + 1):
            v = self._int(f"rdzv/hb/{aid}")
            old = self.hb_seen.get(aid)
            if old is None or old[0] != v:
                self.hb_seen[aid] = (v, now)
            if now - self.hb_seen[aid][1] < STALE_S:
                live.append(aid)
        return live

    def _lead(self):
        r = self._round()
        if self._has(f"rdzv/r/{r}/closed"):
            return
        n = self._int(f"rdzv/r/{r}/n")
        now = time.monotonic()
        old = self.round_seen.get(r)
        if old is None or old[0] != n:
            self.round_seen[r] = (n, now)
        if n < self.min_nodes:
            return
        quiet = now - self.round_seen[r][1]
        if n >= self.max_nodes or n >= len(self._live_agents()) or quiet >= self.last_call:
            self.store.compare_set(f"rdzv/r/{r}/closed", "", str(min(n, self.max_nodes)))

    def _stale_member(self, r, n):
        """A member agent of round r whose heartbeat stopped (its node is lost), or None."""
        self._live_agents()
        now = time.monotonic()
        for i in range(1, n + 1):
            aid = self._int(f"rdzv/r/{r}/aid/{i}")
            seen = self.hb_seen.get(aid)
            if aid and aid != self.aid and seen is not None and now - seen[1] >= STALE_S:
                if not self._has(f"rdzv/done/{aid}"):
                    return i - 1
        return None

    # ------------------------------------------------------------------ joining a round

    def _wait(self, cond, what, timeout):
        deadline = time.monotonic() + timeout
        while True:
            if self.a._signum is not None:
                raise LauncherInterrupted(self.a._signum)
            self._tick()
            v = cond()
            if v:
                return v
            if self._has("rdzv/failed"):
                return None
            if time.monotonic() > deadline:
                raise LaunchError(f"rendezvous: no {what} within {timeout:.0f} s "
                                  "(join_timeout in --rdzv-conf)")
            time.sleep(min(self.cfg.monitor_interval, 0.1))

    def _join(self):
        """Join the next round that takes this node: (round, nodes, node rank, master)."""
        r = self._round()
        target = r + 1 if self._has(f"rdzv/r/{r}/closed") else r
        while True:
            i = self.store.add(f"rdzv/r/{target}/n", 1)
            self.store.set(f"rdzv/r/{target}/aid/{i}", str(self.aid))
            closed = self._wait(lambda: self._has(f"rdzv/r/{target}/closed"),
                                f"--nnodes {self.min_nodes} nodes", self.join_timeout)
            if closed is None:
                return None
            n = int(self._get(f"rdzv/r/{target}/closed"))
            if i <= n:
                break
            self.a.note(f"the job has its {n} node(s) (--nnodes ...:{self.max_nodes}); waiting "
                        "for the next membership change")
            target += 1
            self._wait(lambda: self._round() >= target, "room in the job", 1e9)
        node_rank = i - 1
        key = f"rdzv/r/{target}/master"
        if node_rank == 0:
            with socket.socket() as s:   # the workers' store port (rank 0 binds it soon after)
                s.bind(("", 0))
                port = s.getsockname()[1]
            self.store.set(key, f"{self.host}:{port}")
        master = self._wait(lambda: self._has(key) and self._get(key), "master address",
                            self.join_timeout)
        return target, n, node_rank, master

    # ------------------------------------------------------------------ one round's workers

    def _run_round(self, r, n, node_rank, master, restart):
        a, cfg = self.a, self.cfg
        addr, _, port = master.rpartition(":")
        rcfg = dataclasses.replace(cfg, nnodes=n, node_rank=node_rank, master_addr=addr)
        pump = OutputPump()
        if a._wakeup is not None:
            pump.add_wakeup(a._wakeup)
        workers = []
        try:
            for lr in range(cfg.nproc_per_node):
                d = self.logs.rank_dir(self.attempt, lr)
                err = os.path.join(d, "error.json")
                env = worker_env(rcfg, lr, restart, int(port), self.secret, err, self.omp)
                w = Worker(lr, node_rank * cfg.nproc_per_node + lr, worker_argv(rcfg, lr), env, err)
                workers.append(w)
                try:
                    a._start(w, d, pump)
                except OSError as e:
                    raise LaunchError(f"cannot start worker {lr}: {e}") from None
                a._guardian.watch(w.pid)
            while True:
                pump.pump(min(cfg.monitor_interval, HB_S))
                if a._signum is not None:
                    return "signal", []
                self._tick()
                now = time.time()
                for w in workers:
                    w.poll(now)
                failed = [w for w in workers if w.returncode not in (None, 0)]
                if failed:
                    a._let_exiting_exit(workers, pump)
                    return "failed", first_failure_order(
                        [read_failure(w, self.logs.keep) for w in failed])
                if all(w.returncode == 0 for w in workers):
                    deadline = time.monotonic() + 1.0
                    while pump.pending() and time.monotonic() < deadline:
                        pump.pump(0.05)
                    return "done", []
                if self._has("rdzv/failed"):
                    return "abort", []
                if self._round() != r:
                    return "moved", []
                if self._int(f"rdzv/r/{r + 1}/n") > 0:
                    return "waiting", []
                lost = self._stale_member(r, n)
                if lost is not None:
                    return "lost", [lost]
        finally:
            a._stop(workers, pump, signal.SIGTERM)
            started = [w for w in workers if w.proc is not None]
            a._clean_groups(started)
            for w in started:
                a._guardian.forget(w.pid)
            pump.close()

    # ------------------------------------------------------------------ the job

    def _next_round(self, r, count):
        """Move the job from round r to r+1 (one agent wins); ``count``: a restart (failure or a
        lost node) rather than a membership change.  False when the restarts are spent."""
        if count:
            if self._int("rdzv/restarts") >= self.cfg.max_restarts:
                self.store.set("rdzv/failed", "1")
                return False
        won = self.store.compare_set("rdzv/round", str(r), str(r + 1)).decode() == str(r + 1)
        if won and count:
            self.store.add("rdzv/restarts", 1)
        return True

    def run(self) -> int:
        try:
            self._connect()
            return self._run()
        except _StoreLost as e:
            raise LaunchError(str(e)) from None
        finally:
            self.store = None

    def _run(self) -> int:
        cfg = self.cfg
        while True:
            joined = self._join()
            if joined is None:
                self.a.note("the job failed on another node; stopping")
                return 1
            r, n, node_rank, master = joined
            restart = self._int("rdzv/restarts")
            self.a.note(f"round {r}: {n} node(s), this is node {node_rank}; world size "
                        f"{n * cfg.nproc_per_node} (restart {restart} of {cfg.max_restarts})")
            why, info = self._run_round(r, n, node_rank, master, restart)
            self.attempt += 1
            if why == "signal":
                self.a.note(f"received {self.a._signum}: stopped all workers")
                raise LauncherInterrupted(self.a._signum)
            if why == "done":
                self.store.set(f"rdzv/done/{self.aid}", "1")
                if self.leader:
                    self._linger(r, n)
                return 0
            if why == "abort":
                self.a.note("the job failed on another node (no restart left); stopping")
                return 1
            if why == "moved":
                self.a.note("the job's membership changed: restarting this node's workers")
                continue
            if why == "waiting":
                self.a.note("a node is waiting to join: restarting every worker with the new "
                            "membership (not counted as a restart)")
                self._next_round(r, count=False)
                continue
            if why == "lost":
                self.a.note(f"node {info[0]} is lost (no heartbeat for {STALE_S:.0f} s)")
            else:
                root = info[0]
                self.a.note(f"rank {root.rank} failed ({describe_exit(root.returncode)})")
            if not self._next_round(r, count=True):
                if why == "failed":
                    sys.stdout.flush()
                    print(format_summary(cfg.target, info, self.a.host, restart, cfg.max_restarts),
                          file=sys.stderr, flush=True)
                else:
                    self.a.note(f"no restart left (--max-restarts {cfg.max_restarts})")
                return 1
            self.a.note(f"restarting every worker (restart {self._int('rdzv/restarts')} of "
                        f"{cfg.max_restarts})")

    def _linger(self, r, n):
        """Keep the store up while other members of the last round still run (bounded)."""
        deadline = time.monotonic() + LINGER_S
        while time.monotonic() < deadline and self.a._signum is None:
            self._tick()
            if self._round() != r and not self._has("rdzv/failed"):
                return   # (a later round goes on without this node's store: nothing to keep)
            running = 0
            for i in range(1, n + 1):
                aid = self._int(f"rdzv/r/{r}/aid/{i}")
                if aid and not self._has(f"rdzv/done/{aid}") and self._stale_member(r, n) != i - 1:
                    running += 1
            if running == 0:
                return
            time.sleep(0.2)


