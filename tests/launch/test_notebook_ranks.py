"""Persistent ranks for notebooks: pyddp.notebook.Ranks driven directly, and the %ddp / %%ddp magics
in a real notebook executed by nbclient on an ipykernel (skipped when those are not installed).

Every wait has a deadline; every test checks that no rank outlives stop()."""
import _thread
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from _tiers import FULL

import _paths
from _launch import alive, assert_all_gone
from pyddp.notebook import Ranks, RanksError

pytestmark = pytest.mark.timeout(240)

REPO = _paths.ROOT
WAIT = 60.0


def _pids(ranks):
    return [s["pid"] for s in ranks.status()]


@pytest.fixture
def ranks():
    r = Ranks(nprocs=2, backend="cpu", start_timeout=WAIT, interrupt_grace=5.0).start()
    pids = _pids(r)
    yield r
    r.stop()
    assert_all_gone(pids)


def _wait_files(paths, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise AssertionError(f"not written in time: {paths}")
        time.sleep(0.02)


def test_all_reduce_state_push_pull(ranks, capsys):
    env = ranks.run(textwrap.dedent("""\
        import os, numpy as np
        import pyddp.distributed as dist
        a = np.arange(4, dtype=np.float64) * (dist.get_rank() + 1)
        dist.all_reduce(a)
        print("sum", a.tolist())
        {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "PYDDP_SECRET")}
        """))
    out = capsys.readouterr().out
    for r in range(2):
        assert f"[rank{r}]: sum [0.0, 3.0, 6.0, 9.0]\n" in out
    envs = [eval(env.values[r]) for r in range(2)]
    assert [e["RANK"] for e in envs] == ["0", "1"] and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} and {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["PYDDP_SECRET"] for e in envs}) == 1 and re.fullmatch(r"[0-9a-f]{64}",
                                                                         envs[0]["PYDDP_SECRET"])
    assert env.agreed() is None and "[rank1]: " in repr(env)

    # state persists across runs; the same value on every rank is shown once
    res = ranks.run("a.sum()")
    assert res.agreed() == repr(np.float64(18.0)) and repr(res) == repr(np.float64(18.0))
    assert not ranks.run("b = 1")   # no last expression, nothing to show

    def scaled(x, k=3):
        return x * k

    ranks.push(scaled, offset=np.full(4, 0.5))
    assert ranks.run("scaled(a) + offset").agreed() == repr(np.arange(4) * 3.0 * 3 + 0.5)
    pulled = ranks.pull("a")
    assert isinstance(pulled, list) and len(pulled) == 2
    np.testing.assert_array_equal(pulled[1], np.arange(4) * 3.0)
    ranks.run("r = dist.get_rank() * 10", ranks=[1])
    assert ranks.pull("r", rank=1) == 10
    with pytest.raises(RanksError, match="not defined on rank 0"):
        ranks.pull("r", rank=0)


def test_push_refuses_what_cannot_be_sent(ranks):
    with pytest.raises(TypeError, match="'lock'.*cannot be pickled"):
        ranks.push(lock=threading.Lock())


def test_push_without_cloudpickle_sends_notebook_functions_by_source(ranks, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cloudpickle", None)   # as if it were not installed
    src = tmp_path / "cell_source.py"
    src.write_text("class Box:\n    def __init__(self, v):\n        self.v = v\n\n"
                   "def double(x):\n    return Box(2 * x)\n")
    ns = {"__name__": "__main__"}   # what a notebook cell defines: functions of __main__
    exec(compile(src.read_text(), str(src), "exec"), ns)
    ranks.push("double", "Box", namespace=ns)
    assert ranks.run("double(21).v").agreed() == "42"
    assert ranks.run("type(double(1)).__name__").agreed() == "'Box'"
    with pytest.raises(TypeError, match="lambda or a nested function.*cloudpickle"):
        ranks.push(f=lambda x: x)


def test_an_exception_on_one_rank_leaves_both_usable(ranks, capsys):
    with pytest.raises(RanksError) as info:
        ranks.run("import pyddp.distributed as dist\n"
                  "if dist.get_rank() == 1:\n    raise ValueError('rank 1 cannot go on')\n")
    assert set(info.value.errors) == {1}
    assert "ValueError: rank 1 cannot go on" in str(info.value) and 'File "<ddp-cell' in str(info.value)
    assert "_notebook_ranks" not in info.value.errors[1]
    status = ranks.status()
    assert status[1]["last_error"] and status[0]["last_error"] is None
    assert all(s["alive"] and not s["busy"] for s in status)
    assert ranks.run("import numpy as np\nx = np.ones(2)\ndist.all_reduce(x)\nx.tolist()").agreed() \
        == "[2.0, 2.0]"


def test_a_syntax_error_fails_once_in_this_process(ranks):
    with pytest.raises(SyntaxError):
        ranks.run("x = = 1")
    assert ranks.run("1 + 1").agreed() == "2"


# A KeyboardInterrupt raised in the test process (_thread.interrupt_main, as the kernel's interrupt
# button does) would stop a pytest-xdist worker's whole session: these run in one process, in the
# full tier (CI runs it with -n 0).
_NO_XDIST = pytest.mark.skipif(bool(os.environ.get("PYTEST_XDIST_WORKER")),
                               reason="interrupts the test process: run with -n 0")


@FULL
@_NO_XDIST
def test_interrupt_a_sleeping_cell(ranks, tmp_path):
    marks = [str(tmp_path / f"{r}.sleeping") for r in range(2)]
    code = (f"import os, time\nopen({str(tmp_path)!r} + '/' + os.environ['RANK'] + '.sleeping', 'w')"
            ".close()\ntime.sleep(120)\n")
    t = threading.Thread(target=lambda: (_wait_files(marks), _thread.interrupt_main()), daemon=True)
    start = time.monotonic()
    t.start()
    with pytest.raises(RanksError) as info:
        ranks.run(code)
    t.join(WAIT)
    assert time.monotonic() - start < 60
    assert str(info.value).startswith("interrupted") and set(info.value.errors) == {0, 1}
    assert all("KeyboardInterrupt" in e for e in info.value.errors.values())
    assert ranks.run("'still here'").agreed() == "'still here'"


@FULL
@_NO_XDIST
def test_a_rank_that_does_not_stop_is_reported_and_restart_brings_the_job_back(tmp_path):
    r = Ranks(nprocs=2, start_timeout=WAIT, interrupt_grace=1.0).start()
    pids = _pids(r)
    try:
        marks = [str(tmp_path / f"{k}.m") for k in range(2)]
        code = (f"import os, time\nopen({str(tmp_path)!r} + '/' + os.environ['RANK'] + '.m', 'w').close()\n"
                "if os.environ['RANK'] == '1':\n"
                "    while True:\n        try:\n            time.sleep(60)\n"
                "        except KeyboardInterrupt:\n            pass\n"
                "time.sleep(60)\n")
        t = threading.Thread(target=lambda: (_wait_files(marks), _thread.interrupt_main()), daemon=True)
        t.start()
        with pytest.raises(RanksError) as info:
            r.run(code)
        t.join(WAIT)
        assert "KeyboardInterrupt" in info.value.errors[0]
        assert "did not stop" in info.value.errors[1]
        assert r.status()[1]["busy"]
        with pytest.raises(RanksError, match="still busy"):
            r.run("1")
        r.restart()
        assert_all_gone(pids)
        pids = _pids(r)
        assert r.run("import pyddp.distributed as d\nd.get_world_size()").agreed() == "2"
    finally:
        r.stop()
    assert_all_gone(pids)


def test_a_rank_that_dies_is_reported_with_its_exit_cause(ranks):
    with pytest.raises(RanksError, match=r"rank 1[\s\S]*died \(exit code 3\)"):
        ranks.run("import os\nif os.environ['RANK'] == '1':\n    os._exit(3)\n")
    assert not ranks.status()[1]["alive"] and ranks.status()[1]["exit"] == "exit code 3"
    assert ranks.run("'alive'", ranks=[0]).agreed() == "'alive'"
    with pytest.raises(RanksError, match="rank 1 is dead"):
        ranks.run("1")
    ranks.restart()
    assert ranks.run("2").agreed() == "2"


def test_start_twice_and_run_before_start_are_explained():
    r = Ranks(nprocs=1)
    with pytest.raises(RuntimeError, match="not running"):
        r.run("1")
    r.start()
    try:
        with pytest.raises(RuntimeError, match="running already"):
            r.start()
    finally:
        r.stop()


def test_ranks_die_with_their_kernel(tmp_path):
    code = textwrap.dedent("""\
        import sys
        from pyddp.notebook import Ranks
        r = Ranks(2).start()
        print(" ".join(str(s["pid"]) for s in r.status()), flush=True)
        sys.stdin.read()
        """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO] + ([os.environ["PYTHONPATH"]]
                                                              if os.environ.get("PYTHONPATH") else [])))
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        pids = [int(x) for x in line.split()]
        assert len(pids) == 2 and all(alive(q) for q in pids)
        p.kill()
        p.wait(WAIT)
        assert_all_gone(pids)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(WAIT)


# ----------------------------------------------------------------------------- a real notebook

_CELLS = [
    "import os, json\nprint(json.dumps({'pid': os.getpid()}))",
    "%load_ext pyddp",
    "%%ddp\nprint('too early')",
    "%ddp start -n 2",
    "%ddp start -n 2",
    "%%ddp\nimport os, numpy as np\nimport pyddp.distributed as dist\n"
    "a = np.ones(2) * (dist.get_rank() + 1)\ndist.all_reduce(a)\nprint('sum', a.tolist(), os.getpid())",
    "%%ddp --quiet-others\nprint('again', a.tolist())\nfloat(a.sum())",
    "%%ddp\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)",
    "%%ddp\nif dist.get_rank() == 1:\n    raise ValueError('only rank 1')\n'after ' + str(a.sum())",
    "%ddp status",
    "%ddp stop",
]
SLEEP, FAILS, STATUS, STOP = 7, 8, 9, 10


def _interrupt_when_sleeping(client, cell, seen):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        text = _text(cell)
        if "[rank0]: sleeping" in text and "[rank1]: sleeping" in text:
            seen["streamed"] = True
            break
        time.sleep(0.05)
    seen["interrupted_at"] = time.monotonic()
    pid = seen["kernel_pid"]
    pgid = os.getpgid(pid)
    if pgid != os.getpgrp():
        os.killpg(pgid, signal.SIGINT)    # what jupyter_client's interrupt_kernel does
    else:
        os.kill(pid, signal.SIGINT)


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def test_a_notebook_runs_cells_on_persistent_ranks(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook()
    nb.cells = [new_code_cell(s) for s in _CELLS]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO] + ([os.environ["PYTHONPATH"]]
                                                              if os.environ.get("PYTHONPATH") else [])))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYDDP_SECRET"):
        env.pop(k, None)
    client = nbclient.NotebookClient(nb, timeout=90, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    seen = {}
    with client.setup_kernel(env=env):
        for i, cell in enumerate(nb.cells):
            watcher = None
            if i == SLEEP:
                watcher = threading.Thread(target=_interrupt_when_sleeping, args=(client, cell, seen),
                                           daemon=True)
                watcher.start()
            client.execute_cell(cell, i)
            if i == 0:
                seen["kernel_pid"] = json.loads(_text(cell).strip().splitlines()[-1])["pid"]
            if watcher is not None:
                watcher.join(WAIT)
                seen["returned_at"] = time.monotonic()
    cells = nb.cells
    early = _text(cells[2]) + "".join(o.get("evalue", "") for o in cells[2].outputs)
    assert "no ranks are running" in early and "too early" not in early
    assert "2 ranks started" in _text(cells[3])
    assert "running already" in _text(cells[4])
    out = _text(cells[5])
    pids = [int(p) for p in re.findall(r"^\[rank\d\]: sum \[3\.0, 3\.0\] (\d+)$", out, re.M)]
    assert len(pids) == 2, out
    assert _text(cells[6]) == "[rank0]: again [3.0, 3.0]\n"
    results = [o for o in cells[6].outputs if o.get("output_type") == "execute_result"]
    assert results and results[0]["data"]["text/plain"] == "6.0"
    # interrupting the kernel interrupts the ranks' cell; output was streamed in while it ran
    assert seen.get("streamed") and seen["returned_at"] - seen["interrupted_at"] < 30
    errors = [o for o in cells[SLEEP].outputs if o.get("output_type") == "error"]
    assert errors and errors[0]["ename"] == "RanksError", cells[SLEEP].outputs
    tb = "\n".join(errors[0]["traceback"])
    assert tb.startswith("interrupted") and tb.count("KeyboardInterrupt") >= 2
    # an exception on one rank: its traceback, and the other rank's value was computed too
    errors = [o for o in cells[FAILS].outputs if o.get("output_type") == "error"]
    tb = "\n".join(errors[0]["traceback"])
    assert "--- rank 1 ---" in tb and "ValueError: only rank 1" in tb and "--- rank 0 ---" not in tb
    status = _text(cells[STATUS])
    assert status.count("idle") == 2 and "ValueError: only rank 1" in status
    assert "ranks stopped" in _text(cells[STOP])
    assert_all_gone(pids)
