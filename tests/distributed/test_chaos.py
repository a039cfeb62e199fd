"""Chaos on 3 real rank processes: what a long job meets, with the error and the time it took asserted.

- a rank stopped (SIGSTOP): the others' collective times out, naming it;
- the rank hosting the TCP store killed (SIGKILL): everyone else errors within 5 s, collective and store;
- /dev/shm full or unwritable on one rank (fault injection, PYDDP_TEST_SHM_FAIL; the real /dev/shm is
  untouched): every rank falls back to TCP with a warning naming it, or, with PYDDP_TRANSPORT=shm,
  fails with an error naming it;
- a peer slowed 10x (sleeping, or stopped 90% of the time): every result right, no spurious timeout;
- the launcher killed (SIGKILL, SIGTERM) mid-job: no worker left, no /dev/shm entry of the job left.

(A rank killed outright and a MASTER_PORT already in use are in test_errors_cpu.py / test_launch_run.py.)
"""
import multiprocessing as mp
import os
import re
import signal
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

import _paths
import pyddp.distributed as dist
from _launch import alive, assert_all_gone, finish, launcher_env, start, wait_for, write_script
from _mp import run, run_outcomes
from _tiers import FULL, full

WS = 3

# a hard limit per test on top of every wait's own deadline
pytestmark = pytest.mark.timeout(120)


def _exc_info(e):
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}


def _check_sum(rank, ws, n=16):
    a = np.full(n, rank + 1.0, dtype=np.float32)
    dist.all_reduce(a)
    expect = ws * (ws + 1) / 2
    assert np.all(a == expect), f"rank {rank}: all_reduce gave {a[:4]}, expected {expect}"


def _pids():
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, os.getpid())
    return out


# ----------------------------------------------------------------------------------------------
# 1. a rank stopped with SIGSTOP


def _sigstop_child(rank, ws, victim):
    pids = _pids()
    _check_sum(rank, ws)
    dist.barrier()
    if rank == victim:
        time.sleep(2.0)            # stopped during this sleep by rank 0; continued after the others fail
        t0 = time.monotonic()
        done = 0
        try:
            # The first may still complete, with the right sum (_check_sum checks it): every peer's
            # contribution was already in shared memory when they gave up. The next cannot.
            for _ in range(2):
                _check_sum(rank, ws)
                done += 1
            return {"type": None, "done": done}
        except Exception as e:
            return dict(_exc_info(e), elapsed=time.monotonic() - t0, done=done)
    if rank == 0:
        os.kill(pids[victim], signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        for _ in range(50):   # its contribution to a collective might already be out: one may complete
            _check_sum(rank, ws)
        out = {"type": None}
    except Exception as e:
        out = dict(_exc_info(e), is_backend=isinstance(e, dist.DistBackendError))
    out["elapsed"] = time.monotonic() - t0
    time.sleep(0.5)            # every survivor has its error
    if rank == 0:
        os.kill(pids[victim], signal.SIGCONT)
    return out


def test_a_stopped_rank_makes_the_others_time_out_naming_it():
    victim = 2
    t0 = time.monotonic()
    outs = run_outcomes(_sigstop_child, WS, victim, timeout=60,
                        init_kwargs={"timeout": timedelta(seconds=3)}, env={"PYDDP_EXIT_TIMEOUT": "0.5"})
    total = time.monotonic() - t0
    problems = []
    for o in outs:
        if not o.ok:
            problems.append(o.describe())
            continue
        r = o.value
        if o.rank == victim:
            # continued after the others gave up: its next collective fails, it does not hang
            if r["type"] is None:
                problems.append(f"rank {victim}: two all_reduces succeeded after its peers had failed")
            elif r["elapsed"] > 10:
                problems.append(f"rank {victim}: took {r['elapsed']:.1f} s to fail after SIGCONT")
            continue
        if r["type"] is None:
            problems.append(f"rank {o.rank}: 50 all_reduces completed with rank {victim} stopped")
            continue
        if not r["is_backend"]:
            problems.append(f"rank {o.rank}: raised {r['type']}, not DistBackendError: {r['msg']}")
        if not 2.5 <= r["elapsed"] <= 12:
            problems.append(f"rank {o.rank}: raised after {r['elapsed']:.2f} s with timeout=3 s")
        if not re.search(rf"rank.{{0,60}}?(?<![\d.]){victim}(?![\d.])", r["msg"], re.I | re.S):
            problems.append(f"rank {o.rank}: message does not name the stopped rank {victim}: {r['msg']!r}")
        if "timed out" not in r["msg"].lower() and "timeout" not in r["msg"].lower():
            problems.append(f"rank {o.rank}: message does not say it timed out: {r['msg']!r}")
    assert not problems, "\n".join(problems)
    assert total < 40, f"the job took {total:.1f} s"
    print(f"chaos SIGSTOP: survivors raised after {[round(o.value['elapsed'], 2) for o in outs]} s "
          f"(timeout 3 s)")


# ----------------------------------------------------------------------------------------------
# 2. the rank hosting the TCP store killed


def _store_host_killed_child(rank, ws, killed_at):
    store = dist.distributed_c10d._world.store
    store.set(f"hello/{rank}", str(rank))
    _check_sum(rank, ws)
    dist.barrier()
    if rank == 0:
        time.sleep(0.3)       # the others are waiting in their next all_reduce
        killed_at.value = time.time()
        os.kill(os.getpid(), signal.SIGKILL)
    out = {}
    try:
        for _ in range(1000):
            _check_sum(rank, ws)
        out["coll"] = {"type": None}
    except Exception as e:
        out["coll"] = dict(_exc_info(e), at=time.time(), is_dist=isinstance(e, dist.DistError))
    for what, op in (("get", lambda: store.get(f"hello/{rank}")), ("set", lambda: store.set("x", "1")),
                     ("add", lambda: store.add("n", 1))):
        t0 = time.monotonic()
        try:
            op()
            out[what] = {"type": None}
        except Exception as e:
            out[what] = dict(_exc_info(e), is_dist=isinstance(e, dist.DistError))
        out[what]["elapsed"] = time.monotonic() - t0
    return out


def test_killing_the_store_host_makes_every_other_rank_fail_within_5_s():
    killed_at = mp.get_context("fork").Value("d", 0.0)
    outs = run_outcomes(_store_host_killed_child, WS, killed_at, expect_death={0}, timeout=60,
                        init_kwargs={"timeout": timedelta(seconds=60)}, env={"PYDDP_EXIT_TIMEOUT": "0.5"})
    assert outs[0].died and outs[0].exitcode == -signal.SIGKILL, outs[0].describe()
    assert killed_at.value > 0
    problems = []
    for o in outs[1:]:
        if not o.ok:
            problems.append(o.describe())
            continue
        coll = o.value["coll"]
        if coll["type"] is None:
            problems.append(f"rank {o.rank}: 1000 all_reduces completed without rank 0")
        else:
            delay = coll["at"] - killed_at.value
            if not coll["is_dist"]:
                problems.append(f"rank {o.rank}: collective raised {coll['type']}: {coll['msg']}")
            if delay > 5:
                problems.append(f"rank {o.rank}: the collective failed {delay:.2f} s after the kill")
            if not re.search(r"(rank|peer)\D{0,3}0\b", coll["msg"], re.I):
                problems.append(f"rank {o.rank}: message does not name rank 0: {coll['msg']!r}")
        for what in ("get", "set", "add"):
            r = o.value[what]
            if r["type"] is None:
                problems.append(f"rank {o.rank}: store.{what} succeeded with the store's host dead")
            elif not r["is_dist"]:
                problems.append(f"rank {o.rank}: store.{what} raised {r['type']}, not a DistError: {r['msg']}")
            elif what != "get" and f"TCPStore.{what}" not in r["msg"]:
                # the connection broke in the get: a later call names itself, not the get alone
                problems.append(f"rank {o.rank}: store.{what}'s error does not name it: {r['msg']!r}")
            elif "127.0.0.1:" not in r["msg"]:
                problems.append(f"rank {o.rank}: store.{what}'s error does not name the server: {r['msg']!r}")
            if r["elapsed"] > 5:
                problems.append(f"rank {o.rank}: store.{what} took {r['elapsed']:.2f} s")
    assert not problems, "\n".join(problems)
    print(f"chaos store host SIGKILL: collectives failed "
          f"{[round(o.value['coll']['at'] - killed_at.value, 3) for o in outs[1:]]} s after the kill, "
          f"store.get {[round(o.value['get']['elapsed'], 3) for o in outs[1:]]} s")


# ----------------------------------------------------------------------------------------------
# 3. /dev/shm full or unwritable on one rank


def _shm_fail_child(rank, ws):
    import io
    import logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger("pyddp").addHandler(handler)
    t0 = time.monotonic()
    try:
        dist.init_process_group("cpu", timeout=timedelta(seconds=20))
    except Exception as e:
        return dict(_exc_info(e), elapsed=time.monotonic() - t0, is_dist=isinstance(e, dist.DistError))
    finally:
        logging.getLogger("pyddp").removeHandler(handler)
    try:
        for _ in range(3):
            _check_sum(rank, ws, n=1 << 12)
        out = [None] * ws
        dist.all_gather_object(out, rank)
        assert out == list(range(ws))
        return {"type": None, "elapsed": time.monotonic() - t0, "log": stream.getvalue(),
                "transport": dist.distributed_c10d._default_pg()._cpg.transport}
    finally:
        dist.destroy_process_group()


def _job_shm_entries():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("pyddp.")}
    except OSError:
        return set()


FAULTS = [("ENOSPC", "No space left on device"), ("EACCES", "Permission denied")]


@pytest.mark.parametrize("fault,text", FAULTS)
def test_dev_shm_full_or_unwritable_falls_back_to_tcp_with_a_warning(fault, text):
    bad = 1
    res = run(_shm_fail_child, WS, init=False, rank_env={bad: {"PYDDP_TEST_SHM_FAIL": fault}}, timeout=60)
    problems = []
    for rank, r in enumerate(res):
        if r["type"] is not None:
            problems.append(f"rank {rank}: raised {r['type']} instead of falling back to TCP: {r['msg']}")
            continue
        if r["transport"] != "tcp":
            problems.append(f"rank {rank}: transport {r['transport']!r}, expected the fall back to 'tcp'")
        if r["elapsed"] > 15:
            problems.append(f"rank {rank}: took {r['elapsed']:.1f} s")
        log = r["log"]
        if f"rank {bad} could not set up shared memory" not in log or "use TCP" not in log:
            problems.append(f"rank {rank}: no warning naming rank {bad} and the fall back: {log!r}")
        if rank == bad and (text not in log or "/dev/shm" not in log):
            problems.append(f"rank {bad}: the warning does not give the cause ({text}, /dev/shm): {log!r}")
    assert not problems, "\n".join(problems)
    print(f"chaos /dev/shm {fault}: TCP fall back, init + 3 all_reduces in "
          f"{max(r['elapsed'] for r in res):.2f} s")


def test_dev_shm_unusable_with_pyddp_transport_shm_is_a_clear_error_on_every_rank():
    bad = 2
    res = run(_shm_fail_child, WS, init=False, env={"PYDDP_TRANSPORT": "shm"},
              rank_env={bad: {"PYDDP_TEST_SHM_FAIL": "ENOSPC"}}, timeout=60)
    problems = []
    for rank, r in enumerate(res):
        if r["type"] is None:
            problems.append(f"rank {rank}: init succeeded with PYDDP_TRANSPORT=shm and no shm on rank {bad}")
            continue
        msg = r["msg"]
        if not r["is_dist"]:
            problems.append(f"rank {rank}: raised {r['type']}, not a DistError: {msg}")
        if r["elapsed"] > 15:
            problems.append(f"rank {rank}: took {r['elapsed']:.1f} s to fail")
        if f"rank {bad} could not set up shared memory" not in msg or "PYDDP_TRANSPORT" not in msg:
            problems.append(f"rank {rank}: message does not name rank {bad} and the way out: {msg!r}")
    if "No space left on device" not in res[bad].get("msg", ""):
        problems.append(f"rank {bad}: message does not give the cause: {res[bad].get('msg')!r}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------
# 5. a peer slowed 10x


ITERS = 12
FAST_PAUSE = 0.02
# duty cycle: at least this many rounds, and on until the slow rank has been stopped this many times
# (a fixed number of rounds finished before the third stop on a fast machine)
DUTY_ITERS = 40
DUTY_STOPS = 10


def _slow_peer_child(rank, ws, slow, mode):
    pids = _pids()
    stop = threading.Event()
    cycler = None
    cycles = [0]
    if mode == "duty_cycle" and rank == 0:
        def cycle():  # the slow rank runs 10% of the time: stopped 90 ms of every 100 ms
            while not stop.is_set():
                cycles[0] += 1
                os.kill(pids[slow], signal.SIGSTOP)
                time.sleep(0.09)
                os.kill(pids[slow], signal.SIGCONT)
                time.sleep(0.01)
        cycler = threading.Thread(target=cycle, daemon=True)
        cycler.start()
    t0 = time.monotonic()
    rng = np.random.default_rng(1234)      # same sizes on every rank
    bad = []
    rounds = 0
    try:
        for i in range(ITERS if mode == "sleep" else 1 << 30):
            if mode == "duty_cycle" and i >= DUTY_ITERS:
                # rank 0, which stops and continues the slow rank, says when it has done so often
                # enough; the flag is one more collective that crosses the stops
                enough = np.array([cycles[0] >= DUTY_STOPS], dtype=np.int32)
                dist.broadcast(enough, src=0)
                if enough[0]:
                    break
            rounds += 1
            n = int(rng.integers(1, 1 << 16))
            a = np.full(n, rank + i, dtype=np.float64)
            dist.all_reduce(a)
            if not np.all(a == sum(r + i for r in range(ws))):
                bad.append(("all_reduce", i))
            outs = [np.empty(n, dtype=np.int32) for _ in range(ws)]
            dist.all_gather(outs, np.full(n, rank * 100 + i, dtype=np.int32))
            if any(not np.all(outs[r] == r * 100 + i) for r in range(ws)):
                bad.append(("all_gather", i))
            b = np.full(n, i if rank == slow else -1, dtype=np.float32)
            dist.broadcast(b, src=slow)
            if not np.all(b == i):
                bad.append(("broadcast", i))
            if mode == "sleep":
                time.sleep(FAST_PAUSE * (10 if rank == slow else 1))
    finally:
        stop.set()
        if cycler is not None:
            cycler.join(5)
            os.kill(pids[slow], signal.SIGCONT)
    return {"bad": bad, "elapsed": time.monotonic() - t0, "cycles": cycles[0], "rounds": rounds}


@FULL
@pytest.mark.parametrize("mode", ["sleep", "duty_cycle"])
def test_a_peer_slowed_10x_gives_right_results_and_no_spurious_timeout(mode):
    slow = 2
    # The group's timeout (3 s) is 30x a stop (90 ms): a timeout here is a spurious one.
    res = run(_slow_peer_child, WS, slow, mode, init_kwargs={"timeout": timedelta(seconds=3)}, timeout=90)
    problems = [f"rank {r}: wrong results {v['bad']}" for r, v in enumerate(res) if v["bad"]]
    if len({v["rounds"] for v in res}) != 1:
        problems.append(f"the ranks ran different numbers of rounds: {[v['rounds'] for v in res]}")
    if mode == "sleep":
        # the job runs at the slow rank's pace, ITERS x 0.2 s; 10 s more for a loaded machine
        limit = ITERS * FAST_PAUSE * 10 + 10
        for r, v in enumerate(res):
            if v["elapsed"] > limit:
                problems.append(f"rank {r}: the rounds took {v['elapsed']:.1f} s (limit {limit:.0f} s)")
    else:
        # the rounds went on until the slow rank had been stopped DUTY_STOPS times, on any machine
        # speed (the run's own timeout bounds a hang); each stop lasted 90 ms, collectives in flight
        if res[0]["cycles"] < DUTY_STOPS or res[0]["rounds"] < DUTY_ITERS:
            problems.append(f"the slow rank was stopped only {res[0]['cycles']} times in "
                            f"{res[0]['rounds']} rounds")
    if mode == "sleep":
        floor = ITERS * FAST_PAUSE * 10 * 0.9
        if res[0]["elapsed"] < floor:   # the fast ranks did wait for the slow one
            problems.append(f"rank 0 finished in {res[0]['elapsed']:.2f} s, before the slow rank could")
    assert not problems, "\n".join(problems)
    print(f"chaos slow peer ({mode}): {res[0]['rounds']} rounds, {res[0]['cycles']} stops, "
          f"in {max(v['elapsed'] for v in res):.2f} s")


# ----------------------------------------------------------------------------------------------
# 6. the launcher killed mid-job


JOB_SCRIPT = r"""
import os, re, sys, time
import numpy as np
import pyddp.distributed as dist
dist.init_process_group("cpu")
rank = dist.get_rank()
tokens = set()
with open("/proc/self/maps") as f:
    for line in f:
        m = re.search(r"/dev/shm/(pyddp\.[0-9a-f]{16})\.", line)
        if m:
            tokens.add(m.group(1))
a = np.ones(1 << 14, dtype=np.float32)
dist.all_reduce(a)
with open(os.path.join(sys.argv[1], f"pid{rank}.tmp"), "w") as f:
    f.write(f"{os.getpid()} {' '.join(sorted(tokens))}")
os.rename(os.path.join(sys.argv[1], f"pid{rank}.tmp"), os.path.join(sys.argv[1], f"pid{rank}"))
deadline = time.monotonic() + 60
while time.monotonic() < deadline:          # mid-job: collectives until killed
    a[:] = 1
    dist.all_reduce(a)
    assert a[0] == dist.get_world_size()
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_launcher_mid_job_leaves_no_worker_and_no_shm(tmp_path, sig):
    script = write_script(tmp_path, "job.py", JOB_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = start(["--nproc-per-node", WS, script, out], env=launcher_env(PYDDP_RUN_GRACE="3"))
    try:
        wait_for(lambda: len([n for n in os.listdir(out) if not n.endswith(".tmp")]) == WS, 60,
                 "the workers to run collectives")
        infos = [(out / f"pid{r}").read_text().split() for r in range(WS)]
        pids = [int(i[0]) for i in infos]
        tokens = {t for i in infos for t in i[1:]}
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(sig)
        rc, _, err = finish(proc, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == -sig, err
    assert tokens, "the workers mapped no pyddp shared memory (expected the shm transport on one host)"
    assert_all_gone(pids, timeout=10)
    gone = time.monotonic() - t0
    assert gone < 10, f"workers took {gone:.1f} s to go"
    left = sorted(n for n in _job_shm_entries() if any(n.startswith(t + ".") for t in tokens))
    assert not left, f"/dev/shm entries of the job remain: {left}"
    assert not any(alive(p) for p in pids)
    print(f"chaos launcher {sig.name}: every worker gone {gone:.2f} s after the signal")


# ----------------------------------------------------------------------------------------------
# 7. outsiders (issue 35): a stranger process against the store and the ranks' ports, on loopback

_ROOT = _paths.ROOT


def _listeners(pid="self"):
    """(address, port) of every listening TCP socket process ``pid`` holds."""
    import ipaddress
    import socket
    import struct

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with open(path) as f:
            next(f)
            for line in f:
                parts = line.split()
                if parts[3] != "0A" or parts[9] not in inodes:   # 0A: LISTEN
                    continue
                hexip, hexport = parts[1].split(":")
                raw = bytes.fromhex(hexip)
                if v6:
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    ip = str(ipaddress.IPv6Address(raw))
                else:
                    ip = socket.inet_ntoa(struct.pack("<I", int(hexip, 16)))
                out.append((ip, int(hexport, 16)))
    return out


def _non_loopback_ip():
    """An IPv4 address of this host that is not a loopback one, or None."""
    import subprocess

    try:
        words = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((w for w in words if "." in w and not w.startswith("127.")), None)


def _refused(ip, port):
    import socket

    try:
        socket.create_connection((ip, port), timeout=2).close()
        return False
    except OSError:
        return True


def _loopback_only_child(rank, ws, ip):
    from pyddp.distributed.backends import cpu

    seen = {"listeners": [], "reached": []}

    class Spy:
        """pyddp._C, with ProcessGroup looked at while its listener is open (it closes once the
        mesh is up)."""

        def __init__(self, real):
            self._real = real

        def __getattr__(self, name):
            return getattr(self._real, name)

        def ProcessGroup(self, *args, **kwargs):  # noqa: N802
            pg = self._real.ProcessGroup(*args, **kwargs)
            seen["listeners"] += _listeners()
            if ip and not _refused(ip, pg.port):
                seen["reached"].append(pg.port)
            return pg

    cpu._C = Spy(cpu._C)
    dist.init_process_group("cpu", timeout=timedelta(seconds=60))
    _check_sum(rank, ws)
    if rank == 0:   # the store server listens all job long
        port = int(os.environ["MASTER_PORT"])
        seen["store"] = [(a, p) for a, p in _listeners() if p == port]
        if ip and not _refused(ip, port):
            seen["reached"].append(port)
    seen["secret"] = os.environ.get("PYDDP_SECRET")
    dist.destroy_process_group()
    return seen


def test_a_job_without_a_secret_on_loopback_listens_on_loopback_only():
    # env:// with MASTER_ADDR=127.0.0.1 and no PYDDP_SECRET (the harness removes it): the store and
    # the rank listeners once bound 0.0.0.0, so a stranger on the network could list every key
    ip = _non_loopback_ip()
    outs = run(_loopback_only_child, WS, ip, init=False, timeout=60)
    assert outs[0]["secret"] is None
    assert outs[0]["store"], "rank 0 holds no store listener"
    for rank, out in enumerate(outs):
        assert out["listeners"], f"rank {rank} held no listener"
        wide = [(a, p) for a, p in out["listeners"] + out.get("store", []) if a not in ("127.0.0.1", "::1")]
        assert not wide, f"rank {rank} listens beyond loopback: {wide}"
        assert not out["reached"], f"rank {rank}'s ports {out['reached']} answered at {ip}"


_STRANGER = r"""
import datetime, json, os, socket, sys, time
sys.path.insert(0, os.environ["PYDDP_ROOT"])
from pyddp.distributed.store import TCPStore
store_port = int(sys.argv[1])
out = {}
try:   # the store: list a key, set one, store a big value
    s = TCPStore("127.0.0.1", store_port, timeout=datetime.timedelta(seconds=5))
    out["token"] = s.get("default_pg/pg/0/token").decode()
    s.set("evil", "1")
    s.set("big", b"x" * (64 << 20))
    out["store"] = "in"
except Exception as e:
    out["store"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _spawned_job(i, port, path):
    import hashlib
    import json
    import subprocess
    import sys

    os.environ.update(RANK=str(i), WORLD_SIZE=str(WS), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(WS))
    dist.init_process_group("cpu", timeout=timedelta(seconds=60))
    secret = os.environ.get("PYDDP_SECRET") or ""
    report = {"secret": hashlib.sha256(secret.encode()).hexdigest() if secret else None}
    if i == 0:
        env = {k: v for k, v in os.environ.items() if k != "PYDDP_SECRET"}
        env["PYDDP_ROOT"] = _ROOT
        res = subprocess.run([sys.executable, "-c", _STRANGER, str(port)], env=env,
                             capture_output=True, text=True, timeout=60)
        report["stranger"] = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() \
            else {"error": res.stderr[-2000:]}
    objs = [{"from": 0, "n": 42}] if i == 0 else [None]
    dist.broadcast_object_list(objs, src=0)
    report["object"] = objs[0]
    _check_sum(i, WS)
    with open(f"{path}.{i}", "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


def test_spawn_gives_its_job_a_fresh_secret_and_a_stranger_gets_nothing(tmp_path, monkeypatch):
    # pyddp.multiprocessing.spawn once started jobs with no secret: a stranger listed the group
    # token, set keys, stored a big value, and could feed object collectives (pickle)
    import json

    from _mp import free_port
    from pyddp.multiprocessing import start_processes

    monkeypatch.delenv("PYDDP_SECRET", raising=False)
    secrets_seen = []
    for job in range(2):
        path = str(tmp_path / f"job{job}")
        start_processes(_spawned_job, args=(free_port(), path), nprocs=WS, start_method="fork")
        reports = []
        for i in range(WS):
            with open(f"{path}.{i}") as f:
                reports.append(json.load(f))
        secret = reports[0]["secret"]
        assert secret is not None, "spawn gave the job no PYDDP_SECRET"
        assert all(r["secret"] == secret for r in reports), "the ranks of one job got different secrets"
        secrets_seen.append(secret)
        stranger = reports[0]["stranger"]
        assert "error" not in stranger, stranger
        assert "token" not in stranger and stranger["store"] != "in", stranger
        assert "secret" in stranger["store"], stranger     # "the server requires a secret"
        assert all(r["object"] == {"from": 0, "n": 42} for r in reports)
    assert secrets_seen[0] != secrets_seen[1], "two spawns shared a secret"
    assert "PYDDP_SECRET" not in os.environ


_IDLE = r"""
import datetime, os, socket, sys, time
sys.path.insert(0, os.environ["PYDDP_ROOT"])
from pyddp.distributed.store import TCPStore
port, n, flag, hold = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
# The test's stranger learns rank 0's port from the store (a real one would scan for it).
s = TCPStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=30))
s.wait(["default_pg/pg/0/addr/0"], datetime.timedelta(seconds=30))
rank0 = int(s.get("default_pg/pg/0/addr/0").decode().rpartition(":")[2])
idle = [socket.create_connection(("127.0.0.1", rank0), timeout=5) for _ in range(n)]
time.sleep(0.2)   # rank 0 has them queued before any peer connects
open(flag, "w").close()
end = time.monotonic() + hold
while time.monotonic() < end:    # and one that keeps reconnecting
    try:
        socket.create_connection(("127.0.0.1", rank0), timeout=1).close()
    except OSError:
        pass
    time.sleep(0.05)
"""


def _idle_strangers_child(rank, ws, flag):
    from pyddp.distributed.backends import cpu

    t_flag = None
    if rank > 0:
        # ranks 1.. hold back after rank 0 listens, until the strangers have connected to it
        plan = cpu.listen_plan

        def held(*a, **k):
            nonlocal t_flag
            deadline = time.monotonic() + 30
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            t_flag = time.monotonic()
            return plan(*a, **k)
        cpu.listen_plan = held
    t0 = time.monotonic()
    dist.init_process_group("cpu", timeout=timedelta(seconds=90))
    t1 = time.monotonic()
    _check_sum(rank, ws)
    dist.destroy_process_group()
    return {"init": t1 - t0, "after_strangers": (t1 - t_flag) if t_flag else None}


@pytest.mark.parametrize("secret", [None, "s3cret"], ids=["no_secret", "secret"])
def test_idle_strangers_on_rank_0s_port_do_not_delay_init(tmp_path, secret):
    # six idle connections to rank 0's transport port were served one at a time, 5 s each:
    # init took 30.5 s; now they authenticate concurrently (each still bounded by 5 s)
    import subprocess
    import sys

    from _mp import free_port

    n = 6
    port = free_port()
    flag = str(tmp_path / "strangers-connected")
    env = dict(os.environ, PYDDP_ROOT=_ROOT)
    env.pop("PYDDP_SECRET", None)
    if secret:
        env["PYDDP_SECRET"] = secret
    stranger = subprocess.Popen([sys.executable, "-c", _IDLE, str(port), str(n), flag, "20"], env=env)
    try:
        outs = run(_idle_strangers_child, WS, flag, port=port, init=False, timeout=100,
                   env={"PYDDP_SECRET": secret})
    finally:
        stranger.kill()
        stranger.wait(timeout=10)
    assert os.path.exists(flag), "the strangers never connected"
    delays = [o["after_strangers"] for o in outs[1:]]
    print(f"init after {n} idle strangers ({'secret' if secret else 'no secret'}): "
          + ", ".join(f"{d:.2f} s" for d in delays))
    assert max(delays) < 3.0, f"init waited {max(delays):.1f} s behind {n} idle strangers"


# ----------------------------------------------------------------------------------------------
# 8. a rank stopped inside a collective, every kind and root (issues 35, 50): every survivor's error
# names it, whether the survivor's own clock ran out or a peer's timeout failed the group first
# (rank 0 stopped inside a gather, rank 2 inside a scatter once gave "ranks that never arrived: []";
# later one survivor in four still said only that, while the other named the stopped rank)

_KINDS = ["all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
          "all_to_all", "barrier"]


def _one_call(kind, rank, ws, root):
    n = 4
    a = np.full(n, rank + 1.0, np.float32)
    if kind == "all_reduce":
        dist.all_reduce(a)
    elif kind == "broadcast":
        dist.broadcast(a, root)
    elif kind == "reduce":
        dist.reduce(a, root)
    elif kind == "all_gather":
        dist.all_gather_into_tensor(np.zeros(n * ws, np.float32), a)
    elif kind == "gather":
        dist.gather(a, [np.zeros(n, np.float32) for _ in range(ws)] if rank == root else None, dst=root)
    elif kind == "scatter":
        dist.scatter(a, [np.full(n, r, np.float32) for r in range(ws)] if rank == root else None, src=root)
    elif kind == "reduce_scatter":
        dist.reduce_scatter_tensor(np.zeros(n, np.float32), np.ones(n * ws, np.float32))
    elif kind == "all_to_all":
        dist.all_to_all_single(np.zeros(n * ws, np.float32), np.ones(n * ws, np.float32))
    else:
        dist.barrier()


def _stopped_inside_child(rank, ws, kind, root, victim):
    pids = _pids()
    dist.barrier()
    ctl = next(r for r in range(ws) if r != victim)   # stops and continues the victim
    if rank == victim:
        try:
            # inside the first call when it is stopped (waiting for the others), or, where its part
            # of the first needs nobody (an eager root), inside the next
            for _ in range(4):
                _one_call(kind, rank, ws, root)
            return {"type": None}
        except Exception as e:
            return _exc_info(e)
    time.sleep(0.4)
    if rank == ctl:
        os.kill(pids[victim], signal.SIGSTOP)
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        for _ in range(4):
            _one_call(kind, rank, ws, root)
        out = {"type": None}
    except Exception as e:
        out = _exc_info(e)
    out["elapsed"] = time.monotonic() - t0
    time.sleep(0.5)   # every survivor has its error
    if rank == ctl:
        os.kill(pids[victim], signal.SIGCONT)
    return out


def _culprits(msg):
    """The ranks a timeout message blames: never arrived, did not answer, stopped, or entered but
    stuck."""
    named = set()
    for clause in re.findall(r"ranks (?:that never arrived|that did not answer|stopped \(SIGSTOP or a "
                             r"debugger\)): \[([^\]]*)\]", msg):
        named.update(int(x) for x in re.findall(r"(?:^|, )(\d+)", clause))
    named.update(int(x) for x in re.findall(r"rank (\d+) entered it but never did its part", msg))
    return named


def _each_survivor_names(outs, victim, bound=15):
    """Every rank but the victim raised a DistError within bound s whose message names the victim:
    its own timeout's, or, where a peer's timeout failed the group first, that peer's (never "rank N
    has left the group" about a survivor that left after its own timeout)."""
    problems = []
    for rank, out in enumerate(outs):
        if rank == victim:
            continue
        if out["type"] is None:
            problems.append(f"rank {rank} finished with rank {victim} stopped")
            continue
        if "DistError" not in out["mro"]:
            problems.append(f"rank {rank} raised {out['type']}: {out['msg']}")
        if out["elapsed"] >= bound:
            problems.append(f"rank {rank} took {out['elapsed']:.1f} s")
        # a rank still blocked on the culprit when this one's clock ran out (a root, or a peer
        # relaying over TCP) may be listed beside it (seen: scatter over TCP named [0, 2] with 2
        # stopped); the culprit itself must be there, in every survivor's message
        if victim not in _culprits(out["msg"]):
            problems.append(f"rank {rank} does not name rank {victim}: {out['msg']}")
    return problems


# every kind; the rooted ones with the root stopped, a non-root stopped, and rank 0 (the store's
# host) stopped while another rank is the root; rank 0 stopped in every kind
_STOP_CASES = [(k, root, victim) for k in _KINDS
               for root, victim in ([(0, 0), (0, 2), (1, 0)] if k in ("broadcast", "reduce", "gather",
                                                                     "scatter")
                                    else [(0, 1), (0, 0)])]
_STOP_IDS = [f"{k}-root{r}-stop{v}" for k, r, v in _STOP_CASES]
# the quick tier stops a rank in one kind (issue 50's all_gather); --full in every kind and root
_STOP_PARAMS = [pytest.param(*c, id=i, marks=() if c == ("all_gather", 0, 1) else FULL)
                for c, i in zip(_STOP_CASES, _STOP_IDS)]


def _stop_inside(kind, root, victim, transport):
    outs = run(_stopped_inside_child, WS, kind, root, victim, timeout=60,
               init_kwargs={"timeout": timedelta(seconds=3)},
               env={"PYDDP_EXIT_TIMEOUT": "0.5", "PYDDP_TRANSPORT": transport})
    problems = _each_survivor_names(outs, victim)
    timeouts = [o["msg"] for r, o in enumerate(outs) if r != victim and "timed out" in o["msg"]]
    if not timeouts:
        problems.append(f"no rank timed out: {outs}")
    assert not problems, f"{kind} root {root}, rank {victim} stopped, {transport}:\n" + "\n".join(problems)


@FULL
@pytest.mark.parametrize("transport", ["shm", *full("tcp")])
@pytest.mark.parametrize("kind,root,victim", _STOP_PARAMS)
def test_a_rank_stopped_inside_any_collective_is_named_by_the_timeout(kind, root, victim, transport):
    _stop_inside(kind, root, victim, transport)


# the same many times over (the bug showed in one run in four): PYDDP_SLOW_TESTS=1, about 25 min
@FULL
@pytest.mark.skipif(os.environ.get("PYDDP_SLOW_TESTS") != "1",
                    reason="the stop-a-rank matrix 5 times over, ~25 min: PYDDP_SLOW_TESTS=1")
@pytest.mark.parametrize("rep", range(5))
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("kind,root,victim", _STOP_CASES, ids=_STOP_IDS)
def test_a_rank_stopped_inside_any_collective_is_named_by_every_survivor_repeatedly(kind, root, victim,
                                                                                   transport, rep):
    _stop_inside(kind, root, victim, transport)


def _all_gather_loop_child(rank, ws, victim, stop_after, cont_after):
    """Issue 50's loop: all_gather into a fresh list, over and over; a peer stops the victim after
    stop_after s, wherever it is (inside a collective, or between two), and continues it cont_after
    s after its own error (0: at once, while the other survivor may still be waiting)."""
    pids = _pids()
    ctl = next(r for r in range(ws) if r != victim)
    x = np.ones(4096, np.float32)
    t0 = time.monotonic()
    stopped_at = None
    calls = 0
    try:
        while True:
            if rank == ctl and stopped_at is None and time.monotonic() - t0 > stop_after:
                os.kill(pids[victim], signal.SIGSTOP)
                stopped_at = time.monotonic()
            dist.all_gather([np.empty_like(x) for _ in range(ws)], x)
            calls += 1
            if time.monotonic() - t0 > stop_after + 30:
                return {"type": None, "calls": calls}
    except Exception as e:
        out = dict(_exc_info(e), calls=calls)
    # from the stop (the controller's clock; the others' within a few ms of it)
    out["elapsed"] = time.monotonic() - (stopped_at or t0 + stop_after)
    if rank == ctl:
        time.sleep(cont_after)
        os.kill(pids[victim], signal.SIGCONT)
    if rank != victim:
        time.sleep(1.0)   # the victim, continued, meets its error before its peers leave
    return out


# continued at once: the victim's clock ran out while it was stopped, and its own late verdict
# (blaming the ranks that gave up on it) reached a survivor still waiting (before the fix: once in
# 72 runs of this loop on a loaded 2-core machine; tests/c/test_group.c's test_stopped_* every time)
@pytest.mark.parametrize("cont_after", [pytest.param(0.0, id="cont_at_once"),
                                        pytest.param(0.5, id="cont_after_0.5s", marks=FULL)])
@pytest.mark.parametrize("transport", ["shm", *full("tcp")])
@pytest.mark.parametrize("victim", [*full(1, 0)])
def test_a_rank_stopped_in_an_all_gather_loop_is_named_by_every_survivor(victim, transport, cont_after):
    outs = run(_all_gather_loop_child, WS, victim, 1.5, cont_after, timeout=90,
               init_kwargs={"timeout": timedelta(seconds=3)},
               env={"PYDDP_EXIT_TIMEOUT": "0.5", "PYDDP_TRANSPORT": transport})
    problems = _each_survivor_names(outs, victim)
    assert not problems, "\n".join(problems)
    assert min(o["calls"] for r, o in enumerate(outs) if r != victim) > 10, outs


_BOUNDED = r"""
import datetime, json, os, select, socket, sys, time
sys.path.insert(0, os.environ["PYDDP_ROOT"])
from pyddp.distributed.store import TCPStore
port, flag = int(sys.argv[1]), sys.argv[2]
s = TCPStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=30))
s.wait(["default_pg/pg/0/addr/0"], datetime.timedelta(seconds=30))
rank0 = int(s.get("default_pg/pg/0/addr/0").decode().rpartition(":")[2])
idle = [socket.create_connection(("127.0.0.1", rank0), timeout=5) for _ in range(2)]
t0 = time.monotonic()
open(flag, "w").close()
closed = {}
while len(closed) < len(idle) and time.monotonic() < t0 + 12:
    ready, _, _ = select.select([c for c in idle if c.fileno() not in closed], [], [], 0.1)
    for c in ready:
        try:
            data = c.recv(4096)    # the server's hello, then EOF when it gives up on us
        except OSError:
            data = b""
        if not data:
            closed[c.fileno()] = time.monotonic() - t0
print(json.dumps(sorted(closed.values())))
"""


def _slow_peers_child(rank, ws, flag, hold):
    from pyddp.distributed.backends import cpu

    if rank > 0:
        # ranks 1.. publish their addresses, then stall before connecting: rank 0 sits in its
        # accept loop with the strangers' connections for `hold` seconds
        choice = cpu.transport_choice

        def slow(*a, **k):
            deadline = time.monotonic() + 30
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(hold)
            return choice(*a, **k)
        cpu.transport_choice = slow
    dist.init_process_group("cpu", timeout=timedelta(seconds=60))
    _check_sum(rank, ws)
    dist.destroy_process_group()
    return True


@FULL
def test_an_idle_stranger_is_dropped_after_its_own_5_s_bound(tmp_path):
    # concurrency must not lift the bound on each connection: a stranger that says nothing is
    # hung up on after about 5 s, while rank 0 still waits for its peers
    import json
    import subprocess
    import sys

    from _mp import free_port

    port = free_port()
    flag = str(tmp_path / "connected")
    env = dict(os.environ, PYDDP_ROOT=_ROOT)
    env.pop("PYDDP_SECRET", None)
    stranger = subprocess.Popen([sys.executable, "-c", _BOUNDED, str(port), flag], env=env,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert all(run(_slow_peers_child, WS, flag, 7.5, port=port, init=False, timeout=100))
        out, _ = stranger.communicate(timeout=30)
    finally:
        stranger.kill()
        stranger.wait(timeout=10)
    closed = json.loads(out.strip().splitlines()[-1])
    print(f"idle strangers dropped after {closed} s")
    assert len(closed) == 2, f"rank 0 kept an idle stranger's connection: {closed}"
    assert all(4.0 < t < 7.0 for t in closed), f"idle strangers dropped after {closed} s (bound: 5 s)"
