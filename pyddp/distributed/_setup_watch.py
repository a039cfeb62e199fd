"""What a group's setup waits for, said while it waits (backends.cpu.connect_group).

Setup is a few rounds of "publish my key, wait for everyone's" through the store.  A plain
``store.get`` there would wait the whole timeout without a word when a rank never comes, died
after it came, or was started with another world size.  So every rank of a round:

- records its arrival under the round counter's value (``<name>/arrival/<n>`` = "rank size pid
  host"): the ranks of one round are the arrivals of one window of ``size`` counts, and an arrival
  with another size in the window (or one just before it that expected company) is a WORLD_SIZE
  mismatch, two arrivals with one rank a duplicate RANK: ValueError on every rank that sees it;
- leaves a will on its store connection (TCPStore): when the connection closes, the store server
  sets ``<prefix>/gone/<rank>`` and ``<prefix>/gone``, so the others learn within a second that a
  rank that reached the store exited or was killed, and name it (one check per second, whatever
  the world size), in the store's waits and, through ``watch_connect``, while the C core waits for
  its connection;
- waits in slices of a second; past a few seconds it says which ranks arrived, which did not and
  at which store, then at a growing interval up to a minute; a timeout names the same.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

from . import _observe
from .store import DistBackendError, DistNetworkError, DistStoreError, PrefixStore, TCPStore

__all__ = ["SetupWatch"]

# A wait is cut into slices this long, between which gone ranks and mismatches are looked for.
SLICE_S = 1.0
# A failing setup on the rank that serves the store keeps the server up this long at most, until
# the others have read why (each checks every SLICE_S), rather than leave them "connection lost".
LINGER_S = 2.5
# The first progress notice after this long, then at doubling intervals up to NOTICE_MAX_S.
NOTICE_FIRST_S = 5.0
NOTICE_MAX_S = 60.0


def _base_and_prefix(store):
    """(the store under every PrefixStore, the prefix they add to a key, with its '/')."""
    parts = []
    while isinstance(store, PrefixStore):
        parts.append(store._prefix)
        store = store.underlying_store
    return store, "".join(p + "/" for p in reversed(parts))


def _parse_arrival(raw):
    rank, size, pid, host = raw.decode(errors="replace").split(" ", 3)
    return int(rank), int(size), pid, host


class SetupWatch:
    """One rank's view of one setup round of a group (``name``: the group's key prefix)."""

    def __init__(self, store, name, rank, size, timeout, label):
        self.store, self.rank, self.size = store, rank, size
        self.timeout = float(timeout)
        self.label = label
        self.start = time.monotonic()
        # notices count from the start of the round, across its waits
        self._next_notice = self.start + NOTICE_FIRST_S
        self._interval = NOTICE_FIRST_S
        self.n = int(store.add(f"{name}/round", 1))
        # Several rounds may use the same store (init, destroy, init again): the counter gives
        # each round its own keys, so no rank reads a stale address.
        self.gen = (self.n - 1) // size
        self.name = name
        self.prefix = f"{name}/{self.gen}"
        self.me = f"{rank} {size} {os.getpid()} {socket.gethostname()}"
        self.arrivals = {}  # counter value -> (rank, size, pid, host)
        base, kprefix = _base_and_prefix(store)
        self._serves = getattr(base, "_serves", False)
        # pyddp-run --elastic: the launcher's agent serves the store, not a rank
        self._agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in \
            ("1", "true")
        self.where = f"{base.host}:{base.port}" if isinstance(base, TCPStore) else repr(base)
        self._will = None
        if isinstance(base, TCPStore) and size > 1:
            # before the arrival is visible: a rank seen to arrive always has its will
            gone = f"{kprefix}{self.prefix}/gone"
            self._will = (base, [f"{gone}/{rank}", gone])
            for k in self._will[1]:
                base._c.set_will(k, self.me)
        store.set(f"{name}/arrival/{self.n}", self.me)

    def done(self):
        """Setup went through: a later exit is no longer news to this round's waiters."""
        if self._will is not None:
            base, keys = self._will
            self._will = None
            for k in keys:
                base._c.clear_will(k)

    # ------------------------------------------------------------------ waiting

    def wait(self, what, desc):
        """Wait until every rank has set ``<prefix>/<what>/<rank>`` (``desc``: what that key is,
        for messages)."""
        try:
            self._wait(what, desc)
        except DistNetworkError as e:
            if self._serves:
                raise
            # the store went away under a waiting rank: its host failed or exited in setup
            raise DistNetworkError(
                f"{self.label}: lost the store at {self.where} while waiting for every rank's "
                f"{desc}: the process that serves it (rank 0, or the launcher's agent) failed or "
                f"exited during setup (see its output): {e}") from None

    def _wait(self, what, desc):
        keys = [f"{self.prefix}/{what}/{r}" for r in range(self.size)]
        deadline = self.start + self.timeout if self.timeout > 0 else None
        while True:
            left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
            if left > 0:
                try:
                    self.store.wait(keys, timedelta(seconds=left))
                    return
                except NotImplementedError:
                    # a user's Store without wait: each key the way setup always read them
                    for k in keys:
                        self.store.get(k)
                    return
                except Exception as e:  # pyddp's DistStoreError, or torch's (the torch bridge)
                    if "timeout" not in str(e).lower():
                        raise
            try:
                self._check_sizes()
                self._check_gone(keys, desc)
            except (ValueError, DistBackendError) as e:
                self._failing()
                raise e from None
            except NotImplementedError:
                pass  # a user's Store without check: no diagnosis, the wait goes on
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                try:
                    msg = self._timeout_message(keys, desc)
                except NotImplementedError:
                    msg = f"{self.label}: wait timeout after {int(self.timeout * 1000)}ms"
                raise DistStoreError(msg)
            if now >= self._next_notice:
                try:
                    _observe.log.warning("%s", self._progress(keys, desc))
                except NotImplementedError:
                    pass  # a user's Store without check: nothing to say who arrived
                self._interval = min(self._interval * 2, NOTICE_MAX_S)
                self._next_notice = now + self._interval

    def _failing(self):
        """Count this rank among those that saw the round fail; the rank serving the store waits
        (LINGER_S at most) for the others that are not gone to see it too."""
        try:
            self.store.set(f"{self.prefix}/failed/{self.rank}", "1")
            if not self._serves:
                return
            # every rank that neither saw it nor is gone, those still on their way included (a
            # rank that arrives after the server closed would only learn "connection lost")
            left = set(range(self.size)) - {self.rank}
            end = time.monotonic() + LINGER_S
            while left and time.monotonic() < end:
                left = {r for r in left
                        if not self.store.check([f"{self.prefix}/failed/{r}"])
                        and not self.store.check([f"{self.prefix}/gone/{r}"])}
                if left:
                    time.sleep(0.1)
        except Exception:  # noqa: BLE001 (best effort: the error being raised says what matters)
            pass

    def _gone(self, keys=None):
        """The first rank (but this one) whose store connection closed in this round, and had
        not set its key in ``keys`` (all of them when None), with its pid and host; None."""
        if not self.store.check([f"{self.prefix}/gone"]):
            return None
        for r in range(self.size):
            if r != self.rank and self.store.check([f"{self.prefix}/gone/{r}"]) and \
                    (keys is None or not self.store.check([keys[r]])):
                _, _, pid, host = _parse_arrival(self.store.get(f"{self.prefix}/gone/{r}"))
                return r, pid, host
        return None

    def _gone_message(self, r, pid, host, when):
        return (f"{self.label}: rank {r} (pid {pid} on {host}) reached the store at {self.where} "
                f"and then closed its connection (it exited or was killed) {when}; this rank "
                f"({self.rank}) cannot complete the setup of {self.size} ranks: see rank {r}'s "
                f"output for why it stopped")

    def _check_gone(self, keys, desc):
        gone = self._gone(keys)
        if gone is not None:
            raise DistBackendError(self._gone_message(*gone, f"before publishing its {desc}"))

    def watch_connect(self, cpg):
        """While ``cpg.connect`` runs (in C, waiting for the ranks that connect to this one), a
        thread looks for a gone rank every SLICE_S / 2 and cancels the connect naming it.  Returns
        the function that stops the thread (call it once connect returned)."""
        if self._will is None:
            return lambda: None
        stop = threading.Event()

        def look():
            while not stop.wait(SLICE_S / 2):
                try:
                    gone = self._gone()
                except DistNetworkError as e:
                    # the store's host (rank 0) is gone, so is the setup, unless a launcher's
                    # agent serves the store (it may come back elsewhere)
                    if not self._agent_store:
                        cpg.cancel_connect(
                            f"{self.label}: lost the store at {self.where} while the ranks "
                            f"connected to each other: the process that serves it (rank 0) "
                            f"failed or exited during setup (see its output): {e}")
                    return
                except Exception:  # noqa: BLE001 (the connect reports what breaks)
                    return
                if gone is not None:
                    cpg.cancel_connect(self._gone_message(
                        *gone, "while the ranks connected to each other"))
                    return

        th = threading.Thread(target=look, name="pyddp-setup-watch", daemon=True)
        th.start()

        def end():
            stop.set()
            th.join()
        return end

    def _read_arrivals(self, lo, hi):
        """The arrival records with counter values in [lo, hi] that are set (read once each)."""
        for n in range(max(lo, 1), hi + 1):
            if n not in self.arrivals and self.store.check([f"{self.name}/arrival/{n}"]):
                self.arrivals[n] = _parse_arrival(self.store.get(f"{self.name}/arrival/{n}"))
        return {n: a for n, a in self.arrivals.items() if lo <= n <= hi}

    def _check_sizes(self):
        """ValueError when a rank of this round was started with another world size (or the same
        rank twice)."""
        lo = self.gen * self.size + 1
        hi = lo + self.size - 1
        seen = {}  # rank -> (pid, host) of the round's arrivals
        for n, (r, size, pid, host) in sorted(self._read_arrivals(lo - 1, hi).items()):
            if n == lo - 1:
                # the arrival just before this round: did it expect the next ones in its round?
                if size == self.size or ((n - 1) // size + 1) * size <= n:
                    continue
            elif size == self.size:
                if r in seen:
                    # every rank of the round says so (the duplicates' key satisfies the waits)
                    raise ValueError(
                        f"{self.label}: two processes were started as rank {r} of {self.size}: "
                        f"pid {seen[r][0]} on {seen[r][1]} and pid {pid} on {host}; every rank "
                        f"needs its own RANK")
                seen[r] = (pid, host)
                continue
            if n != self.n:
                raise self._mismatch(f"rank {r} (pid {pid} on {host})", size)

    def _mismatch(self, other, size):
        return ValueError(
            f"{self.label}: ranks disagree on the world size: this rank ({self.rank}) has "
            f"WORLD_SIZE {self.size}, {other} has WORLD_SIZE {size} (both reached the store at "
            f"{self.where}); start every rank with the same WORLD_SIZE / world_size")

    def check_sizes(self, sizes):
        """ValueError when a rank's published world size (``sizes[r]``) is not this rank's: ranks
        of different sizes may complete a wait together (their keys are alike)."""
        for r, size in enumerate(sizes):
            if size != self.size:
                lo = self.gen * self.size + 1
                who = {a[0]: a for a in self._read_arrivals(lo - 1, lo + self.size).values()
                       if a[1] == size}
                other = f"rank {r} (pid {who[r][2]} on {who[r][3]})" if r in who else f"rank {r}"
                self._failing()
                raise self._mismatch(other, size)

    def _who(self, keys):
        """(ranks whose key is set, {rank: (pid, host)} of those that reached the store)."""
        have = [r for r in range(self.size) if self.store.check([keys[r]])]
        lo = self.gen * self.size + 1
        came = {a[0]: (a[2], a[3]) for a in self._read_arrivals(lo, lo + self.size - 1).values()
                if a[1] == self.size}
        return have, came

    def _missing_text(self, keys, desc):
        have, came = self._who(keys)
        missing = [r for r in range(self.size) if r not in have]
        absent = [r for r in missing if r not in came]
        stalled = [r for r in missing if r in came]
        parts = []
        if absent:
            parts.append(f"{_ranks(absent)} never reached the store")
        if stalled:
            parts.append(f"{_ranks(stalled)} reached it ("
                         + ", ".join(f"{r}: pid {came[r][0]} on {came[r][1]}" for r in stalled)
                         + f") but have not published their {desc} yet")
        return missing, have, "; ".join(parts)

    def _progress(self, keys, desc):
        missing, have, text = self._missing_text(keys, desc)
        waited = time.monotonic() - self.start
        limit = f"{self.timeout:.0f} s" if self.timeout > 0 else "no limit"
        return (f"{self.label}: still waiting after {waited:.0f} s (timeout {limit}) for "
                f"{len(missing)} of {self.size} ranks at the store {self.where}: {text}; "
                f"arrived: {_ranks(have) if have else 'none'}")

    def _timeout_message(self, keys, desc):
        missing, have, text = self._missing_text(keys, desc)
        return (f"{self.label}: timed out after {self.timeout:.0f} s waiting for {len(missing)} of "
                f"{self.size} ranks to publish their {desc} at the store {self.where}: {text} "
                f"(arrived: {_ranks(have) if have else 'none'}); wait timeout after "
                f"{int(self.timeout * 1000)}ms, keys: "
                + ", ".join("/" + _base_and_prefix(self.store)[1] + keys[r] for r in missing))


def _ranks(rs):
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)
