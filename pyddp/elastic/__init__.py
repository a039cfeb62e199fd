"""In-process recovery: a dead rank costs the steps since the last commit, not the job.

Horovod elastic's model (``hvd.elastic.run``, ``State.commit()``) on pyddp's groups::

    import pyddp.elastic as elastic

    state = elastic.State(model=model, optimizer=opt, epoch=0, batch=0)

    @elastic.run
    def train(state):
        sampler = elastic.ElasticSampler(len(dataset), state, batch_size=64, seed=0)
        for state.epoch in range(state.epoch, epochs):
            for idx in sampler:                 # this rank's share of the next global batch
                step(idx)                       # forward, backward, all_reduce, optimizer
                state.batch += 1
                state.commit()                  # a consistent point (in memory)
            state.batch = 0

    train(state)

run under ``pyddp-run --elastic --nproc-per-node N --max-restarts R train.py``.  The launcher
holds the job's store and its membership: a generation number and the list of its workers.
``run`` initialises the process group of the current generation (its rank: the worker's place in
the list) and makes every rank's state equal to rank 0's (``State.sync``: a broadcast, so a new
or restarted worker gets the state from a peer, not from disk), then calls the function.

When a peer dies, the survivors' collectives raise; ``run`` catches that, destroys the group,
rolls the state back to its last commit, and waits for the launcher's next generation (the
survivors; the launcher restarts the dead worker while ``--max-restarts`` allows), joins it and
calls the function again: the loop goes on from the committed epoch and batch, and
``ElasticSampler`` deals the rest of the epoch's samples to the new set of ranks, so each is still
seen once.  A restarted or added worker joins at the next ``commit()``: there every rank learns
(one small broadcast from rank 0, which asks the store) that a newer generation exists, and they
re-form together.  Membership is the launcher's: a worker it declared dead that comes back is
refused (``RemovedFromJob``), so there is no split brain.

Covered now: the cpu backend, the workers of one ``pyddp-run`` (one host: the store lives in the
launcher, which survives any worker).  Not yet: several hosts (the store would need to survive
the loss of its host), nccl groups (communicator rebuild), a rank that hangs without dying (its
peers time out and wait for a generation that does not come: ``ElasticError`` after the timeout).
"""
from __future__ import annotations

import copy
import functools
import json
import os
import time
from datetime import timedelta

import numpy as np

__all__ = ["State", "run", "ElasticSampler", "ElasticError", "RemovedFromJob", "current_generation"]

ENV_ID = "PYDDP_ELASTIC_ID"  # the worker's id in the launcher's membership lists
_K_GEN = "elastic/gen"  # add(_K_GEN, 0): the newest generation
POLL_S = 0.05  # rank 0 asks the launcher's store for a newer generation at most this often


def _k_members(g):
    return f"elastic/members/{g}"


class ElasticError(RuntimeError):
    """The job cannot go on elastically (no generation came within the timeout, ...)."""


class RemovedFromJob(ElasticError):
    """This worker was declared dead by the launcher and is no longer a member of the job."""


class _Reform(BaseException):
    """Raised by State.commit() on every rank at once when a newer generation exists (a
    BaseException, so that a user's ``except Exception`` does not swallow it)."""


# ----------------------------------------------------------------------------------- State

def _copy(src, old=None):
    """A deep copy of ``src`` (dicts, lists, tuples, NumPy arrays, torch tensors, anything
    ``copy.deepcopy`` takes), writing arrays into those of ``old`` (the previous snapshot) where
    shape and dtype match: a commit then allocates nothing for the model and optimizer."""
    if isinstance(src, np.ndarray):
        if isinstance(old, np.ndarray) and old.shape == src.shape and old.dtype == src.dtype:
            np.copyto(old, src)
            return old
        return src.copy()
    if isinstance(src, dict):
        o = old if isinstance(old, dict) else {}
        return {k: _copy(v, o.get(k)) for k, v in src.items()}
    if isinstance(src, (list, tuple)) and type(src) in (list, tuple):
        o = old if isinstance(old, (list, tuple)) and len(old) == len(src) else [None] * len(src)
        return type(src)(_copy(v, ov) for v, ov in zip(src, o))
    if type(src).__name__ == "Tensor" and hasattr(src, "detach") and hasattr(src, "copy_"):
        t = src.detach()
        if (old is not None and type(old) is type(src) and old.shape == t.shape
                and old.dtype == t.dtype and old.device == t.device):
            old.copy_(t)
            return old
        return t.clone()
    return copy.deepcopy(src)


class State:
    """What a training loop needs to go on after a failure: objects with ``state_dict`` /
    ``load_state_dict`` (model, optimizer, amp scaler, lr scheduler) and plain values (epoch,
    batch, anything picklable), given as keyword arguments and read and set as attributes.

    ``commit()`` records them (deep copies, in memory); ``restore()`` goes back to the last
    commit; ``sync()`` makes every rank's state equal to rank 0's."""

    def __init__(self, **items):
        object.__setattr__(self, "_objects", {})
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_snapshot", None)
        object.__setattr__(self, "_commits", 0)
        object.__setattr__(self, "check_every", 1)
        object.__setattr__(self, "_disk", None)  # (path, every): checkpoint_to
        for k, v in items.items():
            setattr(self, k, v)
        self._take()

    def __getattr__(self, name):
        for d in (self._objects, self._values):
            if name in d:
                return d[name]
        raise AttributeError(f"State has no item {name!r}")

    def __setattr__(self, name, value):
        if name.startswith("_") or name in ("check_every", "checkpoint_to"):
            object.__setattr__(self, name, value)
            return
        if type(value).__name__ == "ZeroRedundancyOptimizer":
            raise ElasticError(f"State.{name}: a ZeroRedundancyOptimizer is not covered yet (each "
                               "rank holds only its shard of the optimizer state, which a rank "
                               "that dies takes with it); use a plain optimizer")
        if hasattr(value, "state_dict") and hasattr(value, "load_state_dict"):
            self._values.pop(name, None)
            self._objects[name] = value
        else:
            self._objects.pop(name, None)
            self._values[name] = value

    def _take(self):
        old = self._snapshot or {"objects": {}, "values": {}}
        snap = {"objects": {k: _copy(o.state_dict(), old["objects"].get(k))
                            for k, o in self._objects.items()},
                "values": _copy(self._values, old["values"])}
        object.__setattr__(self, "_snapshot", snap)

    def _load(self, snap):
        for k, sd in snap["objects"].items():
            if k not in self._objects:
                raise ElasticError(f"State.sync: rank 0's state has an object {k!r} this rank's "
                                   "has not (every rank must build the same State)")
            self._objects[k].load_state_dict(copy.deepcopy(sd))
        self._values.clear()
        self._values.update(copy.deepcopy(snap["values"]))

    def checkpoint_to(self, path, every=100):
        """Also write every ``every``-th commit to ``path`` (rank 0 of the group, atomically), for
        what memory cannot survive: every worker holding the state lost, or the job stopped.  When
        ``path`` exists already (a job started again), the state is loaded from it now."""
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"checkpoint_to: every must be an int >= 1, got {every!r}")
        path = os.fspath(path)
        object.__setattr__(self, "_disk", (path, every))
        if os.path.exists(path):
            import pickle

            with open(path, "rb") as f:
                snap = pickle.load(f)
            object.__setattr__(self, "_snapshot", snap)
            self._load(snap)

    def _write(self):
        import pickle

        import pyddp.distributed as dist

        path, _ = self._disk
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(self._snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)

    def commit(self):
        """Record the state as a consistent point; every ``check_every`` commits, learn (all
        ranks together) whether the membership changed, and if so re-form the group here."""
        self._take()
        object.__setattr__(self, "_commits", self._commits + 1)
        if self._disk is not None and self._commits % self._disk[1] == 0:
            self._write()
        ctx = _ctx
        if ctx is not None and self._commits % max(1, int(self.check_every)) == 0:
            ctx.check_generation()

    def restore(self):
        """Go back to the last commit."""
        self._load(self._snapshot)

    def sync(self, src=0):
        """Every rank takes rank ``src``'s last commit (a broadcast of the snapshot)."""
        import pyddp.distributed as dist

        box = [self._snapshot if dist.get_rank() == src else None]
        dist.broadcast_object_list(box, src=src)
        object.__setattr__(self, "_snapshot", box[0])
        self._load(box[0])


# ---------------------------------------------------------------------------- membership

_ctx = None  # the _Context of the running elastic.run


def current_generation():
    """(generation, rank, world size) of the running ``elastic.run``, or None outside it."""
    c = _ctx
    return None if c is None or c.gen is None else (c.gen, c.rank, c.size)


def _store_errors():
    from pyddp import _C

    return (_C.DistError, OSError)


def _recoverable(e):
    from pyddp import _C

    return isinstance(e, (_C.DistError, ConnectionError))


class _Link:
    """The worker's connection to the job's store.  The launcher that holds it may change (its
    node lost: another launcher takes over, see pyddp/_launcher/elastic_agent.py) and writes the
    new address to ``PYDDP_ELASTIC_STORE_FILE``; ``call`` then reconnects there and retries."""

    def __init__(self, timeout):
        from pyddp import _config

        self.file = _config.get("PYDDP_ELASTIC_STORE_FILE")
        self.timeout = timeout
        self.endpoint = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]))
        self.store = self._connect(self.endpoint)
        self.moved = False  # set when call() reconnected elsewhere

    def _connect(self, ep):
        from pyddp.distributed.store import TCPStore

        return TCPStore(ep[0], ep[1], None, False, wait_for_workers=False,
                        timeout=timedelta(seconds=min(30.0, self.timeout)))

    def _announced(self):
        try:
            with open(self.file, encoding="utf-8") as f:
                host, _, port = f.read().strip().rpartition(":")
            return host, int(port)
        except (OSError, TypeError, ValueError):
            return None

    def call(self, name, *args):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return getattr(self.store, name)(*args)
            except _store_errors() as e:
                err = e
            ep = self._announced() if self.file else None
            if ep is not None and ep != self.endpoint:
                try:
                    self.store, self.endpoint, self.moved = self._connect(ep), ep, True
                    continue
                except _store_errors() as e:
                    err = e
            if time.monotonic() > deadline or not self.file:
                raise ElasticError(f"the job's store at {self.endpoint[0]}:{self.endpoint[1]} "
                                   f"cannot be reached ({err})") from None
            time.sleep(0.2)


class _Context:
    """One worker's view of the launcher's membership (the store keys of the module docstring)."""

    def __init__(self, backend, timeout):
        self.id = os.environ[ENV_ID]
        self.backend = backend
        self.timeout = timeout
        self.link = _Link(timeout)
        self.gen = self.rank = self.size = None
        self.next_gen = 0  # the first generation this worker may join
        self._flag = np.zeros(1, dtype=np.int64)  # rank 0's verdict: a newer generation exists
        self._polled = 0.0

    @property
    def store(self):
        return self.link.store

    def _members(self, g):
        return json.loads(self.link.call("get", _k_members(g)).decode())

    def _newest(self):
        return int(self.link.call("add", _K_GEN, 0))

    def join(self, state):
        """Join the first generation >= next_gen that lists this worker and that every member
        reached (see _decide); initialise its group; make the state rank 0's.  After the store
        moved to another launcher, the newest generation there (its numbers go on from the last
        one that launcher saw)."""
        import pyddp.distributed as dist

        call = self.link.call
        call("set", f"elastic/ready/{self.id}", "1")
        deadline = time.monotonic() + self.timeout
        g = max(self.next_gen, 0)
        while True:
            if time.monotonic() > deadline:
                raise ElasticError(f"no generation {g} from the launcher within "
                                   f"{self.timeout:.0f} s (joined: {self.gen})")
            if self.link.moved:  # a new store: say again that this worker is ready
                self.link.moved = False
                call("set", f"elastic/ready/{self.id}", "1")
                g = self._newest()
            if not call("check", [_k_members(g)]):
                newest = self._newest()
                if newest > g and call("check", [_k_members(newest)]):
                    g = newest  # a store that took over: its numbering
                time.sleep(0.02)
                continue
            members = self._members(g)
            if self.id not in members:
                if call("check", [f"elastic/dead/{self.id}"]):
                    raise RemovedFromJob(f"worker {self.id} was declared dead by the launcher "
                                         f"(generation {g} does not list it): it leaves the job")
                g += 1  # a generation from before this worker was ready: the next one
                continue
            if self._decide(g, members, deadline):
                break
            g += 1
        self.gen, self.rank, self.size = g, members.index(self.id), len(members)
        self._flag[0] = 0
        # torchrun's variables for this generation, for code that reads them (DataLoaders, logs)
        nodes = sorted({m.split(".")[0] for m in members})
        mine = [m for m in members if m.split(".")[0] == self.id.split(".")[0]]
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.size),
                          ROLE_RANK=str(self.rank), ROLE_WORLD_SIZE=str(self.size),
                          GROUP_WORLD_SIZE=str(len(nodes)),
                          LOCAL_WORLD_SIZE=str(len(mine)), LOCAL_RANK=str(mine.index(self.id)))
        self.next_gen = g + 1
        dist.init_process_group(self.backend, store=dist.PrefixStore(f"elastic/g{g}", self.store),
                                rank=self.rank, world_size=self.size,
                                timeout=timedelta(seconds=self.timeout))
        state.sync(0)

    def _decide(self, g, members, deadline):
        """Whether generation g goes ahead: every member arrived (the last to arrive says 'go'),
        or a newer generation appeared first (anyone says 'off').  One compare_set decides, so
        every member follows the same answer."""
        key = f"elastic/g{g}/decision"
        call = self.link.call
        if int(call("add", f"elastic/g{g}/arrived", 1)) == len(members):
            call("compare_set", key, "", "go")
        while True:
            if self.link.moved:  # the store moved: this generation is gone with the old one
                return False
            if call("check", [key]):
                return call("get", key).decode() == "go"
            if self._newest() > g:
                call("compare_set", key, "", "off")
                continue
            if time.monotonic() > deadline:
                raise ElasticError(f"generation {g}: not every member arrived within "
                                   f"{self.timeout:.0f} s (members {members})")
            time.sleep(0.01)

    def check_generation(self):
        """At a commit: rank 0 asks the store whether a newer generation exists and tells the
        others (one broadcast), so every rank re-forms at the same commit."""
        import pyddp.distributed as dist

        flag = self._flag
        if self.rank == 0:
            now = time.monotonic()
            # the store at most every POLL_S (a round trip to the launcher), the verdict at
            # every check (one 8-byte broadcast), so every rank re-forms at the same commit
            if now - self._polled >= POLL_S:
                self._polled = now
                try:  # one try: a store that moved is found by the recovery that follows
                    flag[0] = int(self.store.add(_K_GEN, 0)) > self.gen
                except _store_errors():
                    flag[0] = 0
        dist.broadcast(flag, src=0)
        if flag[0]:
            raise _Reform()

    def leave(self):
        import pyddp.distributed as dist

        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # a failed group: nothing more to say to its peers
                pass

    def report(self, e):
        self.link.call("set", f"elastic/failed/{self.gen}/{self.id}", str(e)[:2000])


def run(fn=None, *, backend="cpu", timeout=300.0):
    """Decorator: run ``fn(state, ...)`` with recovery (see the module docstring).  Outside
    ``pyddp-run --elastic`` (no membership to follow) it initialises the group from the
    environment if needed and calls ``fn`` once, without recovery."""
    if fn is None:
        return functools.partial(run, backend=backend, timeout=timeout)

    @functools.wraps(fn)
    def wrapper(state, *args, **kwargs):
        global _ctx
        import pyddp.distributed as dist

        if not isinstance(state, State):
            raise TypeError(f"elastic.run: the first argument must be an elastic.State, got "
                            f"{type(state).__name__}")
        if str(backend).lower() not in ("cpu", "gloo"):
            raise ElasticError(f"elastic.run: backend {backend!r} is not covered yet (its "
                               "communicators are not rebuilt after a failure); use 'cpu'")
        if ENV_ID not in os.environ:
            if not dist.is_initialized():
                dist.init_process_group(backend)
            return fn(state, *args, **kwargs)
        if dist.is_initialized():
            raise ElasticError("elastic.run initialises the process group of each generation "
                               "itself: do not call init_process_group before it")
        ctx = _ctx = _Context(backend, timeout)
        try:
            while True:
                ctx.join(state)
                try:
                    return fn(state, *args, **kwargs)
                except _Reform:
                    ctx.leave()  # every rank at the same commit: the state is that commit
                except Exception as e:
                    if not _recoverable(e):
                        raise
                    ctx.report(e)
                    ctx.leave()
                    state.restore()
        finally:
            _ctx = None
            ctx.leave()

    return wrapper


# ----------------------------------------------------------------------------------- data

class ElasticSampler:
    """This rank's share of each global batch, read from ``state``: the epoch's permutation
    (``seed + epoch``, or in order without ``shuffle``) cut into global batches of
    ``batch_size``; batch ``state.batch`` onward, each split over the current ranks as evenly as
    possible (the first ranks take one more).  After a re-form the rest of the epoch is dealt
    to the new ranks: every sample of the epoch is seen once.  Iterating yields arrays of sample
    indices; the caller advances ``state.batch`` and commits."""

    def __init__(self, num_samples, state, batch_size, shuffle=True, seed=0, drop_last=False):
        if num_samples < 0 or batch_size < 1:
            raise ValueError("ElasticSampler: num_samples must be >= 0 and batch_size >= 1")
        self.num_samples, self.state, self.batch_size = int(num_samples), state, int(batch_size)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last

    def _order(self):
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng(self.seed + int(self.state.epoch)).permutation(
            self.num_samples)

    def __len__(self):
        n, b = self.num_samples, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self):
        import pyddp.distributed as dist

        order = self._order()
        rank, size = dist.get_rank(), dist.get_world_size()
        while self.state.batch < len(self):
            start = int(self.state.batch) * self.batch_size
            batch = order[start:start + self.batch_size]
            yield np.array_split(batch, size)[rank]
