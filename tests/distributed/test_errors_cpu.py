"""Initialisation paths and every failure mode of a process group: bad arguments, mismatched
collectives, a killed rank, timeouts, authentication, a port in use, and resource leaks over
1000 init/destroy cycles. Every case runs in real processes with deadlines on every wait."""
import os
import re
import secrets
import signal
import socket
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

import pyddp.distributed as dist
import _paths
from _mp import free_port, free_ports, run, run_outcomes
from _ref import Checker, assert_clean
from _tiers import FULL, full

pytestmark = pytest.mark.timeout(180)

ENV_VARS = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]


def _exc_info(e):
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}


def _sum_check(rank, ws):
    a = np.full(6, rank + 1.0)
    dist.all_reduce(a)
    assert np.all(a == ws * (ws + 1) / 2), a
    return a.tolist()


# ----------------------------------------------------------------------------------------------
# initialisation


def _missing_env_child(rank, ws, var):
    try:
        dist.init_process_group("cpu", timeout=timedelta(seconds=5))
    except Exception as e:
        return _exc_info(e)
    dist.destroy_process_group()
    return None


@pytest.mark.parametrize("var", ENV_VARS)
def test_env_init_without_a_variable_raises_value_error_naming_it(var):
    (res,) = run(_missing_env_child, 1, var, init=False, env={var: None}, timeout=30)
    assert res is not None, f"init_process_group succeeded without {var}"
    assert "ValueError" in res["mro"], f"raised {res['type']}, want ValueError: {res['msg']}"
    assert var in res["msg"], f"message does not name {var}: {res['msg']!r}"


def _explicit_rank_child(rank, ws):
    dist.init_process_group("cpu", rank=rank, world_size=ws)
    try:
        assert dist.get_rank() == rank and dist.get_world_size() == ws
        return _sum_check(rank, ws)
    finally:
        dist.destroy_process_group()


def test_env_init_takes_rank_and_world_size_from_arguments():
    run(_explicit_rank_child, 2, init=False, env={"RANK": None, "WORLD_SIZE": None}, timeout=30)


def _tcp_init_child(rank, ws, port):
    dist.init_process_group("cpu", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    try:
        return _sum_check(rank, ws)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ws", [2, 3])
def test_tcp_init_method_with_rank_and_world_size(ws):
    port = free_port()
    run(_tcp_init_child, ws, port, init=False, env={v: None for v in ENV_VARS}, timeout=30)


def _file_init_child(rank, ws, path):
    dist.init_process_group("cpu", init_method=f"file://{path}", rank=rank, world_size=ws)
    try:
        return _sum_check(rank, ws)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ws", [2, 3])
def test_file_init_method_with_rank_and_world_size(ws, tmp_path):
    run(_file_init_child, ws, str(tmp_path / "rendezvous"), init=False, env={v: None for v in ENV_VARS},
        timeout=30)


def _store_init_child(rank, ws, kind, where):
    if kind == "tcp":
        store = dist.TCPStore("127.0.0.1", where, ws, rank == 0, timedelta(seconds=30))
    elif kind == "file":
        store = dist.FileStore(where, ws)
    else:
        store = dist.HashStore()
    dist.init_process_group("cpu", store=store, rank=rank, world_size=ws)
    try:
        assert dist.is_initialized()
        return _sum_check(rank, ws)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind,ws", [("tcp", 2), ("tcp", 3), ("file", 2), ("hash", 1)])
def test_explicit_store_argument(kind, ws, tmp_path):
    where = free_port() if kind == "tcp" else str(tmp_path / "store")
    run(_store_init_child, ws, kind, where, init=False, env={v: None for v in ENV_VARS}, timeout=30)


def _init_misuse_child(rank, ws, port):
    ck = Checker(rank)
    ck.expect("is_available", None if dist.is_available() else "False")
    ck.expect("is_initialized before init", None if not dist.is_initialized() else "True")
    for label, call in [
        ("all_reduce before init", lambda: dist.all_reduce(np.ones(2))),
        ("get_rank before init", lambda: dist.get_rank()),
        ("get_world_size before init", lambda: dist.get_world_size()),
    ]:
        ck.count += 1
        try:
            call()
            ck.failures.append(f"{label}: did not raise")
        except (ValueError, RuntimeError):
            pass
        except Exception as e:
            ck.failures.append(f"{label}: raised {type(e).__name__}: {e}")

    def expect_raise(label, call, types, words):
        ck.count += 1
        try:
            call()
            ck.failures.append(f"{label}: did not raise")
            if dist.is_initialized():
                dist.destroy_process_group()
        except types as e:
            low = str(e).lower()
            if not any(w in low for w in words):
                ck.failures.append(f"{label}: message names none of {words}: {e}")
        except Exception as e:
            ck.failures.append(f"{label}: raised {type(e).__name__} (want {types}): {e}")

    short = timedelta(seconds=3)
    url = f"tcp://127.0.0.1:{port}"
    expect_raise("rank >= world_size", lambda: dist.init_process_group(
        "cpu", init_method=url, rank=2, world_size=2, timeout=short), ValueError, ["rank"])
    expect_raise("negative rank with tcp://", lambda: dist.init_process_group(
        "cpu", init_method=url, rank=-5, world_size=2, timeout=short), ValueError, ["rank"])
    expect_raise("world_size 0", lambda: dist.init_process_group(
        "cpu", init_method=url, rank=0, world_size=0, timeout=short), ValueError, ["world_size", "world size"])
    expect_raise("store and init_method together", lambda: dist.init_process_group(
        "cpu", init_method=url, store=dist.HashStore(), rank=0, world_size=1, timeout=short),
        (ValueError, AssertionError), ["store", "init_method"])
    expect_raise("unknown backend", lambda: dist.init_process_group(
        "no-such-backend", init_method=url, rank=0, world_size=1, timeout=short), (ValueError, RuntimeError),
        ["backend", "no-such-backend"])
    expect_raise("unknown init_method scheme", lambda: dist.init_process_group(
        "cpu", init_method="bogus://x", rank=0, world_size=1, timeout=short), (ValueError, RuntimeError),
        ["init_method", "bogus"])

    for backend in ("cpu", "gloo", None):
        label = f"init backend={backend!r}"
        if ck.call(label, lambda: dist.init_process_group(backend, init_method=url, rank=0, world_size=1)):
            ck.expect(label + " is_initialized", None if dist.is_initialized() else "False")
            ck.expect(label + " get_backend", None if dist.get_backend() in ("cpu", "gloo")
                      else repr(dist.get_backend()))
            expect_raise("second init", lambda: dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{port + 0}", rank=0, world_size=1),
                (ValueError, RuntimeError), ["twice", "already"])
            a = np.arange(3.0)
            ck.call(label + " world-size-1 all_reduce", lambda: dist.all_reduce(a))
            ck.expect(label + " world-size-1 all_reduce", None if np.array_equal(a, np.arange(3.0)) else str(a))
            ck.call(label + " destroy", lambda: dist.destroy_process_group())
            ck.expect(label + " is_initialized after destroy", None if not dist.is_initialized() else "True")
    return ck.report()


def test_init_argument_errors_and_lifecycle_queries():
    assert_clean(run(_init_misuse_child, 1, free_port(), init=False, env={v: None for v in ENV_VARS},
                     timeout=60))


# ----------------------------------------------------------------------------------------------
# bad arguments to collectives (every rank makes the same bad call, so each fails locally)


def _ro(a):
    a = np.array(a)
    a.setflags(write=False)
    return a


def _bad_args_child(rank, ws):
    ck = Checker(rank)
    other = (rank + 1) % ws
    f = lambda n: np.arange(n, dtype=np.float32)  # noqa: E731
    V, T = ValueError, TypeError
    noncontig = np.arange(20, dtype=np.float32)[::2]
    cases = [
        # (label, call, accepted exception types, words one of which the message must contain)
        ("broadcast src=world_size", lambda: dist.broadcast(f(4), ws), (V,), ["src"]),
        ("broadcast src=-1", lambda: dist.broadcast(f(4), -1), (V,), ["src"]),
        ("reduce dst=world_size", lambda: dist.reduce(f(4), ws), (V,), ["dst"]),
        ("gather dst=world_size", lambda: dist.gather(f(4), None, dst=ws), (V,), ["dst"]),
        ("scatter src=world_size", lambda: dist.scatter(f(4), None, src=ws), (V,), ["src"]),
        ("send dst=world_size", lambda: dist.send(f(4), ws), (V,), ["dst"]),
        ("send to self", lambda: dist.send(f(4), rank), (V,), ["dst", "destination", "self"]),
        ("recv src=world_size", lambda: dist.recv(f(4), ws), (V,), ["src"]),
        ("isend dst=-1", lambda: dist.isend(f(4), -1), (V,), ["dst"]),
        ("all_reduce of a list", lambda: dist.all_reduce([1.0, 2.0]), (T,), ["tensor"]),
        ("all_reduce of a str array", lambda: dist.all_reduce(np.array(["a", "b"])), (T,), ["tensor", "dtype"]),
        ("all_reduce of an object array", lambda: dist.all_reduce(np.array([1, None], dtype=object)), (T,),
         ["tensor", "dtype"]),
        ("all_reduce of datetime64", lambda: dist.all_reduce(np.zeros(3, "datetime64[s]")), (T,),
         ["tensor", "dtype"]),
        ("all_reduce op is not a ReduceOp", lambda: dist.all_reduce(f(4), op=42), (T,), ["op"]),
        # issue 35: a bool, a float or a string was once taken as an op (True ran AVG, 3.0 MIN)
        ("all_reduce op=True", lambda: dist.all_reduce(f(4), op=True), (T,), ["op"]),
        ("all_reduce op=3.0", lambda: dist.all_reduce(f(4), op=3.0), (T,), ["op"]),
        ("all_reduce op='sum'", lambda: dist.all_reduce(f(4), op="sum"), (T,), ["op"]),
        ("all_reduce op=None", lambda: dist.all_reduce(f(4), op=None), (T,), ["op"]),
        ("all_reduce async op=True", lambda: dist.all_reduce(f(4), op=True, async_op=True), (T,), ["op"]),
        ("reduce op=1", lambda: dist.reduce(f(4), 0, op=1), (T,), ["op"]),
        ("reduce_scatter_tensor op='max'", lambda: dist.reduce_scatter_tensor(f(4), f(4 * ws), op="max"), (T,),
         ["op"]),
        ("reduce_scatter op=2.0", lambda: dist.reduce_scatter(f(4), [f(4)] * ws, op=2.0), (T,), ["op"]),
        ("all_reduce non-contiguous", lambda: dist.all_reduce(noncontig), (V, T), ["contiguous"]),
        ("all_reduce read-only", lambda: dist.all_reduce(_ro(f(4))), (V, T), ["tensor"]),
        ("broadcast non-contiguous", lambda: dist.broadcast(noncontig, 0), (V, T), ["contiguous"]),
        # torch (gloo) raises RuntimeError for an output that is not the inputs stacked
        ("all_gather_into_tensor output too small",
         lambda: dist.all_gather_into_tensor(f(4 * ws - 1), f(4)), (RuntimeError,), ["tensor size"]),
        ("all_gather_into_tensor output too large",
         lambda: dist.all_gather_into_tensor(f(4 * ws + 1), f(4)), (RuntimeError,), ["tensor size"]),
        ("all_gather_into_tensor output read-only",
         lambda: dist.all_gather_into_tensor(_ro(f(4 * ws)), f(4)), (V, T), ["output"]),
        ("all_gather_into_tensor output dtype differs",
         lambda: dist.all_gather_into_tensor(np.zeros(4 * ws), f(4)), (V, T), ["dtype"]),
        ("all_gather_into_tensor non-contiguous input",
         lambda: dist.all_gather_into_tensor(f(10 * ws), noncontig), (V, T), ["contiguous"]),
        ("all_gather list too long", lambda: dist.all_gather([f(4) for _ in range(ws + 1)], f(4)), (V,),
         ["tensor_list", "list", "world"]),
        ("all_gather list too short", lambda: dist.all_gather([f(4) for _ in range(ws - 1)], f(4)), (V,),
         ["tensor_list", "list", "world"]),
        ("all_gather list element read-only",
         lambda: dist.all_gather([_ro(f(4)) for _ in range(ws)], f(4)), (V, T), ["tensor_list", "output"]),
        ("reduce_scatter_tensor input wrong size",
         lambda: dist.reduce_scatter_tensor(f(4), f(4 * ws + 1)), (V,), ["input"]),
        ("reduce_scatter_tensor output read-only",
         lambda: dist.reduce_scatter_tensor(_ro(f(4)), f(4 * ws)), (V, T), ["output"]),
        ("reduce_scatter list too short",
         lambda: dist.reduce_scatter(f(4), [f(4) for _ in range(ws - 1)]), (V,), ["input_list", "list"]),
        ("all_to_all_single output wrong size",
         lambda: dist.all_to_all_single(f(4 * ws + 2), f(4 * ws)), (V,), ["output"]),
        ("all_to_all_single splits do not add up",
         lambda: dist.all_to_all_single(f(4 * ws), f(4 * ws), [4] * ws, [4] * (ws - 1) + [5]), (V,),
         ["split"]),
        ("all_to_all_single wrong number of splits",
         lambda: dist.all_to_all_single(f(4 * ws), f(4 * ws), [4] * ws, [4 * ws]), (V,), ["split"]),
        ("all_to_all_single output read-only",
         lambda: dist.all_to_all_single(_ro(f(4 * ws)), f(4 * ws)), (V, T), ["output"]),
        ("all_to_all output list too long",
         lambda: dist.all_to_all([f(4) for _ in range(ws + 1)], [f(4) for _ in range(ws)]), (V,),
         ["output_tensor_list", "list"]),
        ("recv into read-only", lambda: dist.recv(_ro(f(4)), other), (V, T), ["tensor"]),
        ("irecv into non-contiguous", lambda: dist.irecv(noncontig, other), (V, T), ["contiguous"]),
    ]
    for label, call, types, words in cases:
        ck.count += 1
        try:
            call()
            ck.failures.append(f"{label}: did not raise")
        except types as e:
            low = str(e).lower()
            if not any(w in low for w in words):
                ck.failures.append(f"{label}: {type(e).__name__} message names none of {words}: {e}")
        except Exception as e:
            ck.failures.append(f"{label}: raised {type(e).__name__} (want {'/'.join(t.__name__ for t in types)}): "
                               f"{e}")
    # what torch accepts as an op is still accepted: a RedOpType and a premul-sum object
    x = np.arange(4, dtype=np.float32) + rank
    ref = sum(np.arange(4, dtype=np.float32) + r for r in range(ws))
    ck.call("all_reduce op=ReduceOp.RedOpType.MAX",
            lambda: dist.all_reduce(x.copy(), op=dist.ReduceOp.RedOpType.MAX))
    y = x.copy()
    ck.call("all_reduce premul-sum", lambda: dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.5)))
    ck.expect("all_reduce premul-sum result", None if np.allclose(y, ref * 0.5) else str(y))
    z = np.zeros(4, np.float32)
    ck.call("reduce_scatter_tensor premul-sum",
            lambda: dist.reduce_scatter_tensor(z, np.tile(x, ws), op=dist._make_nccl_premul_sum(2.0)))
    ck.expect("reduce_scatter_tensor premul-sum result", None if np.allclose(z, ref * 2.0) else str(z))
    w = x.copy()
    ck.call("reduce premul-sum", lambda: dist.reduce(w, 0, op=dist._make_nccl_premul_sum(3.0)))
    ck.expect("reduce premul-sum result", None if np.allclose(w, ref * 3.0 if rank == 0 else x) else str(w))
    # a non-contiguous array that was rejected was not touched
    ck.expect("rejected array untouched", None if np.array_equal(noncontig, np.arange(0, 20, 2, dtype=np.float32))
              else str(noncontig))
    # the rejected calls consumed nothing: the group is still in step
    ck.call("all_reduce after rejected calls", lambda: _sum_check(rank, ws))
    ck.call("broadcast after rejected calls", lambda: dist.broadcast(np.zeros(3), 0))
    return ck.report()


@pytest.mark.parametrize("ws", [2, 3])
def test_bad_arguments_raise_value_or_type_error_naming_the_argument(ws):
    assert_clean(run(_bad_args_child, ws, timeout=60), min_checks=30)


# ----------------------------------------------------------------------------------------------
# mismatched collectives


def _mismatch_call(case, rank, ws):
    f32 = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    last = rank == ws - 1
    if case == "count":
        return dist.all_reduce(f32(20 if last else 10))
    if case == "count_large":
        return dist.all_reduce(f32((1 << 20) + (1 if last else 0)))
    if case == "dtype":
        return dist.all_reduce(np.ones(10, dtype=np.float64 if last else np.float32))
    if case == "op":
        return dist.all_reduce(f32(10), op=dist.ReduceOp.MAX if last else dist.ReduceOp.SUM)
    if case == "kind":
        return dist.broadcast(f32(10), 0) if last else dist.all_reduce(f32(10))
    if case == "src":
        return dist.broadcast(f32(10), 1 if last else 0)
    if case == "dst":
        return dist.reduce(f32(10), 1 if last else 0)
    if case == "gather_vs_allreduce":
        return dist.all_gather([f32(10) for _ in range(ws)], f32(10)) if last else dist.all_reduce(f32(10))
    raise ValueError(case)


# words the message must contain (both sides named), per case
_MISMATCH_WORDS = {
    "count": [["10"], ["20"]],
    "count_large": [[str(1 << 20)], [str((1 << 20) + 1)]],
    "dtype": [["float32"], ["float64"]],
    "op": [["sum"], ["max"]],
    "kind": [["allreduce", "all_reduce"], ["broadcast"]],
    "src": [["src", "root"]],
    "dst": [["dst", "root"]],
    "gather_vs_allreduce": [["allreduce", "all_reduce"], ["allgather", "all_gather"]],
}


def _mismatch_child(rank, ws, case):
    # two good collectives first, so the mismatch is not the group's first operation
    _sum_check(rank, ws)
    _sum_check(rank, ws)
    t0 = time.monotonic()
    try:
        _mismatch_call(case, rank, ws)
        res = {"type": None, "elapsed": time.monotonic() - t0}
    except Exception as e:
        res = dict(_exc_info(e), elapsed=time.monotonic() - t0)
        res["is_dist_error"] = isinstance(e, dist.DistError)
    if res["type"] is None and case == "src":
        # A broadcast's root publishes its data and may return before a rank that also thinks it
        # is the root has looked: the mismatch then reaches it as the group's error at its next
        # call, at once (the group is failed), never as a hang or a wrong result.
        try:
            dist.barrier()
        except Exception as e:  # noqa: BLE001
            res = dict(_exc_info(e), elapsed=time.monotonic() - t0, deferred=True)
            res["is_dist_error"] = isinstance(e, dist.DistError)
    time.sleep(1.0)  # let every rank see the mismatch before this one tears its group down
    return res


# quick tier: the first three mismatches at 2 ranks (each call waits a second); --full every one, and 3, 4 ranks
@pytest.mark.parametrize("ws,case", [pytest.param(2, c, marks=FULL if i >= 3 else ())
                                     for i, c in enumerate(_MISMATCH_WORDS)]
                         + [pytest.param(*c, marks=FULL) for c in [(3, "count"), (3, "kind"), (4, "dtype")]])
def test_mismatched_collectives_raise_dist_error_on_every_rank_quickly(ws, case):
    res = run(_mismatch_child, ws, case, init_kwargs={"timeout": timedelta(seconds=60)}, timeout=60)
    problems = []
    for rank, r in enumerate(res):
        if r["type"] is None:
            problems.append(f"rank {rank}: returned normally after {r['elapsed']:.2f} s (wrong result)")
            continue
        if not r["is_dist_error"]:
            problems.append(f"rank {rank}: raised {r['type']}, not DistError: {r['msg']}")
        if r["elapsed"] > 5:
            problems.append(f"rank {rank}: took {r['elapsed']:.2f} s to report the mismatch")
        low = r["msg"].lower()
        for alternatives in _MISMATCH_WORDS[case]:
            if not any(re.search(rf"(?<![0-9a-z]){re.escape(w)}(?![0-9a-z])", low) for w in alternatives):
                problems.append(f"rank {rank}: message does not name {'/'.join(alternatives)}: {r['msg']!r}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------
# a killed rank


def _kill_child(rank, ws, victim, mode, killed_at):
    n = 1 << 20  # 4 MiB of float32
    a = np.ones(n, dtype=np.float32)
    if rank == victim:
        if mode == "while_peers_wait":
            dist.all_reduce(a)
            time.sleep(1.0)  # the others are already blocked in the next all_reduce
            killed_at.value = time.time()
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            def killer():
                time.sleep(0.5)
                killed_at.value = time.time()
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Thread(target=killer, daemon=True).start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            a[:] = 1
            dist.all_reduce(a)
        return "victim survived"
    ok = 0
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            a[:] = 1
            dist.all_reduce(a)
            if not np.all(a == ws):
                return {"wrong": True, "iterations": ok, "sample": a[:4].tolist()}
            ok += 1
        return {"hung": True, "iterations": ok}
    except Exception as e:
        first = dict(_exc_info(e), at=time.time(), iterations=ok,
                     is_net=isinstance(e, dist.DistNetworkError))
    t1 = time.monotonic()
    try:
        dist.all_reduce(np.ones(8, dtype=np.float32))
        second = {"type": None}
    except Exception as e:
        second = dict(_exc_info(e), is_dist=isinstance(e, dist.DistError))
    second["elapsed"] = time.monotonic() - t1
    return {"first": first, "second": second}


@pytest.mark.parametrize("mode", ["mid_transfer", *full("while_peers_wait")])
@pytest.mark.parametrize("ws", [2, *full(3)])
def test_killed_rank_makes_every_survivor_raise_dist_network_error_naming_it(ws, mode):
    import multiprocessing as mp

    killed_at = mp.get_context("fork").Value("d", 0.0)
    victim = 1
    outs = run_outcomes(_kill_child, ws, victim, mode, killed_at, expect_death={victim}, timeout=60,
                        init_kwargs={"timeout": timedelta(seconds=120)})
    assert outs[victim].died and outs[victim].exitcode == -signal.SIGKILL, outs[victim].describe()
    assert killed_at.value > 0
    problems = []
    for o in outs:
        if o.rank == victim:
            continue
        if not o.ok:
            problems.append(o.describe())
            continue
        v = o.value
        if "first" not in v:
            problems.append(f"rank {o.rank}: {v}")
            continue
        first = v["first"]
        delay = first["at"] - killed_at.value
        if not first["is_net"]:
            problems.append(f"rank {o.rank}: raised {first['type']}, not DistNetworkError: {first['msg']}")
        if delay > 5:
            problems.append(f"rank {o.rank}: raised {delay:.2f} s after the kill (limit 5 s)")
        if not re.search(rf"(rank|peer)\D{{0,3}}{victim}\b", first["msg"], re.I):
            problems.append(f"rank {o.rank}: message does not name rank {victim}: {first['msg']!r}")
        second = v["second"]
        if second["type"] is None or not second["is_dist"]:
            problems.append(f"rank {o.rank}: the next all_reduce after the failure did not raise DistError: "
                            f"{second}")
        elif second["elapsed"] > 5:
            problems.append(f"rank {o.rank}: the next all_reduce took {second['elapsed']:.2f} s to fail")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------
# timeouts


def _timeout_child(rank, ws, absent, use_async):
    for _ in range(5):
        _sum_check(rank, ws)
    if rank == absent:
        time.sleep(6)  # never calls the sixth collective
        return None
    t0 = time.monotonic()
    try:
        a = np.ones(100, dtype=np.float32)
        if use_async:
            w = dist.all_reduce(a, async_op=True)
            w.wait()
        else:
            dist.all_reduce(a)
        return {"type": None, "elapsed": time.monotonic() - t0}
    except Exception as e:
        return dict(_exc_info(e), elapsed=time.monotonic() - t0, is_backend=isinstance(e, dist.DistBackendError))


@pytest.mark.parametrize("use_async", [pytest.param(False, id="blocking"),
                                       pytest.param(True, id="async_wait", marks=FULL)])
@pytest.mark.parametrize("ws", [2, *full(3)])
def test_timeout_names_operation_sequence_number_and_missing_rank(ws, use_async):
    absent = ws - 1
    res = run(_timeout_child, ws, absent, use_async, init_kwargs={"timeout": timedelta(seconds=2)}, timeout=60)
    problems = []
    for rank, r in enumerate(res):
        if rank == absent:
            continue
        if r["type"] is None:
            problems.append(f"rank {rank}: all_reduce returned without rank {absent} ({r['elapsed']:.2f} s)")
            continue
        msg = r["msg"]
        if not r["is_backend"]:
            problems.append(f"rank {rank}: raised {r['type']}, not DistBackendError: {msg}")
        if not 1.5 <= r["elapsed"] <= 10:
            problems.append(f"rank {rank}: raised after {r['elapsed']:.2f} s with timeout=2 s")
        if not re.search(r"all_?reduce", msg, re.I):
            problems.append(f"rank {rank}: message does not name the operation all_reduce: {msg!r}")
        m = re.search(r"seq\w*(?:\s*(?:number|no\.?|num|#))?\s*[=:#]?\s*(\d+)", msg, re.I)
        if not m or int(m.group(1)) not in (5, 6):
            problems.append(f"rank {rank}: message does not give the sequence number (5 or 6, 0/1-based "
                            f"after five collectives): {msg!r}")
        if not re.search(rf"rank.{{0,60}}?(?<![\d.]){absent}(?![\d.])", msg, re.I | re.S):
            problems.append(f"rank {rank}: message does not name the missing rank {absent}: {msg!r}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------
# authentication


def _secret_child(rank, ws):
    _sum_check(rank, ws)
    out = [None] * ws
    dist.all_gather_object(out, {"rank": rank})
    assert out == [{"rank": r} for r in range(ws)]
    return True


@pytest.mark.parametrize("ws", [2, 3])
def test_job_with_pyddp_secret_on_every_rank_works(ws):
    run(_secret_child, ws, env={"PYDDP_SECRET": secrets.token_hex(16)}, timeout=60)


def _wrong_secret_child(rank, ws):
    t0 = time.monotonic()
    try:
        dist.init_process_group("cpu", timeout=timedelta(seconds=4))
    except Exception as e:
        return dict(_exc_info(e), elapsed=time.monotonic() - t0, is_dist=isinstance(e, dist.DistError))
    try:
        a = np.ones(4)
        dist.all_reduce(a)
        return {"type": None, "elapsed": time.monotonic() - t0, "value": a.tolist()}
    except Exception as e:
        return dict(_exc_info(e), elapsed=time.monotonic() - t0, is_dist=isinstance(e, dist.DistError))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("variant", ["different_secret", *full("secret_on_rank0_only", "secret_on_rank1_only")])
def test_rank_without_the_right_secret_cannot_join(variant):
    good = secrets.token_hex(16)
    rank_env = {
        "different_secret": {0: {"PYDDP_SECRET": good}, 1: {"PYDDP_SECRET": secrets.token_hex(16)}},
        "secret_on_rank0_only": {0: {"PYDDP_SECRET": good}},
        "secret_on_rank1_only": {1: {"PYDDP_SECRET": good}},
    }[variant]
    res = run(_wrong_secret_child, 2, init=False, rank_env=rank_env, timeout=60)
    problems = []
    for rank, r in enumerate(res):
        if r["type"] is None:
            problems.append(f"rank {rank}: joined and all_reduced ({r['value']}) despite the secret mismatch")
        elif not r["is_dist"]:
            problems.append(f"rank {rank}: raised {r['type']}, not a DistError: {r['msg']}")
        elif r["elapsed"] > 15:
            problems.append(f"rank {rank}: took {r['elapsed']:.1f} s to fail (timeout 4 s)")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------
# port in use


def _port_in_use_child(rank, ws):
    t0 = time.monotonic()
    try:
        dist.init_process_group("cpu", timeout=timedelta(seconds=4))
    except Exception as e:
        return dict(_exc_info(e), elapsed=time.monotonic() - t0, is_net=isinstance(e, dist.DistNetworkError),
                    is_dist=isinstance(e, dist.DistError))
    dist.destroy_process_group()
    return {"type": None}


@pytest.mark.parametrize("ws", [2, *full(3)])
def test_master_port_in_use_raises_dist_network_error_with_address_and_port(ws):
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(16)
        port = squatter.getsockname()[1]
        res = run(_port_in_use_child, ws, init=False, port=port, timeout=60)
    finally:
        squatter.close()
    r0 = res[0]
    assert r0["type"] is not None, "rank 0 started a store server on a port that is in use"
    assert r0["is_net"], f"rank 0 raised {r0['type']}, not DistNetworkError: {r0['msg']}"
    assert str(port) in r0["msg"], f"message lacks the port {port}: {r0['msg']!r}"
    # the address the store tried to bind: MASTER_ADDR's, or the wildcard address
    assert any(h in r0["msg"] for h in ("127.0.0.1", "localhost", "0.0.0.0", "::")), \
        f"message lacks the address: {r0['msg']!r}"
    assert r0["elapsed"] < 10, f"rank 0 took {r0['elapsed']:.1f} s"
    for rank in range(1, ws):
        r = res[rank]
        assert r["type"] is not None, f"rank {rank} joined a group whose store never started"
        assert r["is_dist"], f"rank {rank} raised {r['type']}: {r['msg']}"
        # the squatter accepts but never speaks: the client names it and gives up at the timeout
        assert f"127.0.0.1:{port}" in r["msg"] and "another program" in r["msg"], \
            f"rank {rank}: message does not name the port and the likely cause: {r['msg']!r}"
        # the 4 s timeout ended the wait before the store's own limit (10 s): the message says the
        # timeout ran out, which a store host slow to start causes too, not only a squatter
        assert "timeout (4 s) ran out" in r["msg"], r["msg"]
        assert r["elapsed"] < 12, f"rank {rank} took {r['elapsed']:.1f} s with timeout=4 s"


# ----------------------------------------------------------------------------------------------
# a MASTER_ADDR that does not resolve, or a store that never answers (issue 35, item 4)


def _resolver_child(rank, ws):
    t0 = time.monotonic()
    try:
        dist.init_process_group("cpu")     # the default 30-minute timeout: it must not be waited out
    except Exception as e:
        return dict(_exc_info(e), elapsed=time.monotonic() - t0, is_net=isinstance(e, dist.DistNetworkError))
    dist.destroy_process_group()
    return {"type": None}


@pytest.mark.parametrize("host", ["no-such-host.invalid", *full("999.1.1.1")])
def test_master_addr_that_does_not_resolve_fails_in_seconds_naming_it(host):
    # nothing was said until the 30-minute init timeout, even with PYDDP_DEBUG=INFO
    try:
        socket.getaddrinfo(host, 29500)
        pytest.skip(f"{host} resolves here")
    except socket.gaierror as e:
        resolver = e.strerror          # the resolver's own words, e.g. "Name or service not known"
    res = run(_resolver_child, 2, init=False, env={"MASTER_ADDR": host}, timeout=60)
    for rank, r in enumerate(res):
        assert r["type"] is not None, f"rank {rank} initialised with MASTER_ADDR={host}"
        assert r["is_net"], f"rank {rank} raised {r['type']}: {r['msg']}"
        assert host in r["msg"] and resolver in r["msg"] and "MASTER_ADDR" in r["msg"], r["msg"]
        assert r["elapsed"] < 10, f"rank {rank} took {r['elapsed']:.1f} s to say {r['msg']!r}"
        print(f"rank {rank}: {r['elapsed']:.2f} s: {r['msg']}")


_WAITING = r"""
import os, sys, time
from datetime import timedelta
sys.path.insert(0, os.environ["PYDDP_ROOT"])
import pyddp.distributed as dist
t0 = time.monotonic()
try:
    dist.init_process_group("cpu", timeout=timedelta(seconds=float(sys.argv[1])))
except dist.DistNetworkError as e:
    print(f"ERROR after {time.monotonic() - t0:.1f} s: {e}", flush=True)
"""


@FULL
def test_waiting_for_the_store_says_what_it_waits_for_at_a_bounded_rate():
    # rank 1 of 2 with nobody serving MASTER_PORT: it retries (the server may start late) and says
    # so from the first seconds on, naming the address, how long so far and the last error
    import subprocess
    import sys

    root = _paths.ROOT
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYDDP_SECRET", "PYDDP_DEBUG")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="1", WORLD_SIZE="2", PYDDP_ROOT=root)
    out = subprocess.run([sys.executable, "-c", _WAITING, "14"], env=env, capture_output=True, text=True,
                         timeout=60)
    said = [ln for ln in out.stderr.splitlines() if "still connecting" in ln]
    assert said, f"nothing said while waiting 14 s: {out.stderr!r}"
    assert f"127.0.0.1:{port}" in said[0] and "after 3 s" in said[0] and "refused" in said[0], said[0]
    assert len(said) <= 3, f"said {len(said)} times in 14 s: {said}"   # at 3 s and 12 s
    assert "ERROR after 1" in out.stdout and f"127.0.0.1:{port}" in out.stdout, out.stdout
    # PYDDP_DEBUG=OFF silences it
    env["PYDDP_DEBUG"] = "OFF"
    out = subprocess.run([sys.executable, "-c", _WAITING, "4"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert "still connecting" not in out.stderr, out.stderr


# ----------------------------------------------------------------------------------------------
# no leaks over 1000 init/destroy cycles


def _resources():
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return fds, threads, rss


def _settled_resources(base_threads):
    """Threads of a destroyed group may take a moment to exit: poll briefly."""
    deadline = time.monotonic() + 3
    res = _resources()
    while res[1] > base_threads and time.monotonic() < deadline:
        time.sleep(0.05)
        res = _resources()
    return res


def _cycles_child(rank, ws, mode, cycles, side_port):
    side = None
    if ws > 1:
        side = dist.TCPStore("127.0.0.1", side_port, ws, rank == 0, timedelta(seconds=60))
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()

    def one(i):
        if mode == "env":
            dist.init_process_group("cpu", timeout=timedelta(seconds=30))
        else:
            dist.init_process_group("cpu", store=dist.PrefixStore(f"cycle{i}", side), rank=rank, world_size=ws,
                                    timeout=timedelta(seconds=30))
        a = np.full(16, rank + 1.0)
        dist.all_reduce(a)
        if not np.all(a == ws * (ws + 1) / 2):
            raise AssertionError(f"cycle {i}: wrong all_reduce result {a[:4]}")
        dist.destroy_process_group()
        if mode == "env" and side is not None:
            # the next init must not reach the previous cycle's store server: wait until every rank
            # (rank 0, the server's owner, included) has destroyed its group
            side.add(f"destroyed{i}", 1)
            deadline = time.monotonic() + 30
            while int(side.add(f"destroyed{i}", 0)) < ws:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cycle {i}: peers did not finish destroy")
                time.sleep(0.001)

    warm = 20
    for i in range(warm):
        one(i)
    fds0, thr0, rss0 = _resources()
    t0 = time.monotonic()
    for i in range(warm, warm + cycles):
        one(i)
    elapsed = time.monotonic() - t0
    fds1, thr1, rss1 = _settled_resources(thr0)
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    if shm_after - shm_before:
        # another job on this host may be between creating and unlinking its segments (a
        # moment): count only what is still there a second later
        time.sleep(1.0)
        shm_after &= set(os.listdir("/dev/shm"))
    if side is not None:
        # rank 0 serves the side store: it leaves last
        side.add("finished", 1)
        if rank == 0:
            deadline = time.monotonic() + 30
            while int(side.add("finished", 0)) < ws and time.monotonic() < deadline:
                time.sleep(0.001)
    return {"fds": (fds0, fds1), "threads": (thr0, thr1), "rss": (rss0, rss1), "elapsed": elapsed,
            # sem.mp-*: the test harness's own multiprocessing semaphores
            "shm_new": sorted(f for f in shm_after - shm_before if not f.startswith("sem.mp-")), "cycles": cycles}


def _under_asan():
    return "asan" in os.environ.get("LD_PRELOAD", "") or "ASAN_OPTIONS" in os.environ


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ws,mode,cycles", [pytest.param(1, "env", 1000, marks=FULL),
                                             pytest.param(2, "store", 1000, marks=FULL), pytest.param(2, "env", 1000, marks=FULL)])
def test_init_destroy_cycles_leak_no_fds_threads_memory_or_shm(ws, mode, cycles):
    side_port = free_port()
    res = run(_cycles_child, ws, mode, cycles, side_port, init=False, timeout=250)
    problems = []
    for rank, r in enumerate(res):
        (f0, f1), (t0, t1), (m0, m1) = r["fds"], r["threads"], r["rss"]
        if f1 > f0:
            problems.append(f"rank {rank}: open fds {f0} -> {f1} over {cycles} cycles")
        if t1 > t0:
            problems.append(f"rank {rank}: threads {t0} -> {t1} over {cycles} cycles")
        # Under AddressSanitizer freed memory sits in ASan's quarantine (256 MiB by
        # default), so RSS grows without any leak: there only fds, threads and shm count.
        if m1 - m0 > 16 << 20 and not _under_asan():
            problems.append(f"rank {rank}: RSS grew {(m1 - m0) / 2**20:.1f} MiB over {cycles} cycles")
        if r["shm_new"]:
            problems.append(f"rank {rank}: left files in /dev/shm: {r['shm_new'][:5]}")
    per_cycle = max(r["elapsed"] for r in res) / cycles
    assert not problems, "\n".join(problems) + f"\n({per_cycle * 1000:.1f} ms per cycle)"


# ----------------------------------------------------------------------------------------------
# exception classes


def test_exception_hierarchy_mirrors_torch():
    assert issubclass(dist.DistError, RuntimeError)
    for cls in (dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError):
        assert issubclass(cls, dist.DistError), cls
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        assert hasattr(dist.ReduceOp, name), name
