"""The multi-process harness itself: results by rank, exceptions, deaths, timeouts, no orphans."""
import os
import signal
import time

import pytest

from _mp import run, run_outcomes

pytestmark = pytest.mark.timeout(60)


def _square(rank, ws, k):
    return {"rank": rank, "ws": ws, "v": rank * rank + k, "env": (os.environ["RANK"], os.environ["WORLD_SIZE"],
                                                                  os.environ["MASTER_ADDR"])}


def test_values_come_back_by_rank_with_rendezvous_environment():
    res = run(_square, 3, 10, init=False)
    assert [r["v"] for r in res] == [10, 11, 14]
    assert [r["env"] for r in res] == [(str(r), "3", "127.0.0.1") for r in range(3)]


def _raise_on_1(rank, ws):
    if rank == 1:
        raise KeyError("boom")
    return rank


def test_exception_is_reported_with_type_and_traceback():
    outs = run_outcomes(_raise_on_1, 2, init=False)
    assert outs[0].ok and outs[0].value == 0
    assert not outs[1].ok and outs[1].raised("KeyError") and outs[1].raised("LookupError")
    assert "boom" in outs[1].message and "_raise_on_1" in outs[1].traceback
    with pytest.raises(AssertionError, match="KeyError"):
        run(_raise_on_1, 2, init=False)


def _die(rank, ws):
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def test_dead_rank_is_reported_without_waiting_for_the_timeout():
    t0 = time.monotonic()
    outs = run_outcomes(_die, 2, init=False, timeout=30)
    assert time.monotonic() - t0 < 10
    assert outs[0].died and outs[0].exitcode == -signal.SIGKILL
    assert outs[1].ok


def _hang(rank, ws, pidfile):
    with open(f"{pidfile}.{rank}", "w") as f:
        f.write(str(os.getpid()))
    if rank == 1:
        time.sleep(3600)
    return rank


def test_timeout_kills_every_child_and_names_the_missing_ranks(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"ranks \[1\] did not finish"):
        run_outcomes(_hang, 2, str(tmp_path / "pid"), init=False, timeout=3)
    assert time.monotonic() - t0 < 15
    pid = int((tmp_path / "pid.1").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _env(rank, ws):
    return os.environ.get("X"), os.environ.get("Y"), os.environ.get("PYDDP_SECRET")


def test_extra_and_per_rank_environment(monkeypatch):
    monkeypatch.setenv("PYDDP_SECRET", "leak")  # scrubbed unless the test sets it
    res = run(_env, 2, init=False, env={"X": "1"}, rank_env={1: {"Y": "2"}})
    assert res == [("1", None, None), ("1", "2", None)]
