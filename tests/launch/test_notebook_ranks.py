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
from _launch import Watched as _Watched, alive, assert_all_gone, bounded as _bounded, terminal_lines as _terminal_lines
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
    with _bounded(ranks, WAIT), pytest.raises(RanksError) as info:
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


class _InterruptAfterSend:
    """A rank's connection whose send is interrupted (KeyboardInterrupt) right after it went out:
    the kernel's interrupt landing while a cell is being sent to the ranks."""

    def __init__(self, conn):
        self.conn = conn
        self.armed = True

    def send(self, obj):
        self.conn.send(obj)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_an_interrupt_while_the_cell_is_being_sent_interrupts_it(ranks):
    """Before, an interrupt between sending the cell to rank 0 and to rank 1 escaped run() (a
    KeyboardInterrupt out of the call, rank 0 left running the cell, and under pytest-xdist the
    worker crashed); now it is the cell's interrupt: rank 0 stops, rank 1 is not sent it."""
    rk0 = ranks._ranks[0]
    real = rk0.conn
    rk0.conn = _InterruptAfterSend(real)
    try:
        start = time.monotonic()
        with _bounded(ranks, 30), pytest.raises(RanksError) as info:
            ranks.run("import time\ntime.sleep(60)\n")
        assert time.monotonic() - start < 30
    finally:
        rk0.conn = real
    assert str(info.value).startswith("interrupted") and set(info.value.errors) == {0}
    assert "KeyboardInterrupt" in info.value.errors[0]
    assert ranks.run("'both'").agreed() == "'both'"


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


_BAR = """\
import os, time
from tqdm import tqdm
for i in tqdm(range(30), mininterval=0, ascii=True):
    if i == 10 and os.environ["RANK"] == "0":
        deadline = time.monotonic() + 30
        while not os.path.exists({flag!r}):
            if time.monotonic() > deadline:
                raise RuntimeError("the bar's update was not shown while it ran")
            time.sleep(0.01)
"""


def test_a_progress_bar_is_one_updating_line_shown_while_it_runs(ranks, tmp_path, monkeypatch):
    pytest.importorskip("tqdm")
    flag = str(tmp_path / "seen")
    err = _Watched(sys.stderr, "10/30", flag)
    monkeypatch.setattr(sys, "stderr", err)
    ranks.run(_BAR.format(flag=flag), ranks=[0])
    monkeypatch.undo()
    text = err.text()
    assert os.path.exists(flag)
    assert "\r[rank0]: " in text           # redrawn in place, not one line per update
    bars = [line for line in _terminal_lines(text) if "%|" in line]
    assert len(bars) == 1 and bars[0].startswith("[rank0]: 100%|") and "30/30" in bars[0], text
    # never two redraws concatenated into one line
    assert all(line.count("it/s]") + line.count("?it/s") <= 1 for line in _terminal_lines(text))


class _Rich:
    """An object with an HTML representation, defined on the ranks by a cell."""


def test_figures_displays_and_kernel_logging_come_back(ranks, capsys):
    pytest.importorskip("matplotlib")
    import logging

    handler = logging.StreamHandler(sys.stderr)   # (capsys's stderr) as logging.basicConfig does
    handler.setFormatter(logging.Formatter("LOG %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        res = ranks.run(textwrap.dedent("""\
            import logging, os
            import matplotlib.pyplot as plt
            from IPython.display import display
            class Rich:
                def _repr_html_(self):
                    return "<b>rank " + os.environ["RANK"] + "</b>"
            print("before")
            display(Rich())
            plt.plot([1, 2, 3])
            plt.show()
            plt.figure()                 # left open: sent when the cell ends
            plt.plot([3, 1])
            logging.getLogger("train").info("step %d", 3)
            """))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    out, err = capsys.readouterr()
    html = sorted((r, d["text/html"]) for r, d in res.displays if "text/html" in d)
    assert html == [(0, "<b>rank 0</b>"), (1, "<b>rank 1</b>")]
    assert len(res.figures) == 2 and all(f.startswith(b"\x89PNG") for f in res.figures)
    assert [r for r, d in res.displays if "image/png" in d] == [0, 0]   # rank 0's by default
    assert out.index("[rank0]: before") < out.index("[rank0]: <")      # printed before displayed
    assert "[rank0]: <Figure size 640x480 with 1 Axes> (image/png kept in the CellResult" in out
    for r in range(2):
        assert f"[rank{r}]: LOG INFO train: step 3\n" in err
    # every rank's figures, then none; the figures of a cell are closed once sent
    ranks.figures = "all"
    res = ranks.run("plt.plot([1]); plt.show(); len(plt.get_fignums())")
    assert sorted(r for r, d in res.displays if "image/png" in d) == [0, 1]
    assert res.agreed() == "0"
    ranks.figures = None
    res = ranks.run("plt.plot([1]); plt.show()\nplt.figure()\nlen(plt.get_fignums())")
    assert res.figures == [] and res.agreed() == "1"   # show() closed the first, unseen
    assert ranks.run("len(plt.get_fignums())").agreed() == "0"
    with pytest.raises(ValueError, match="figures must be"):
        ranks.figures = "rank 0"
        ranks.run("1")
    ranks.figures = 0


def test_quiet_others_shows_a_failing_rank_s_stderr(ranks, capsys):
    ranks.quiet_others = True
    try:
        with pytest.raises(RanksError) as info:
            ranks.run("import os, sys\nprint('out', os.environ['RANK'])\n"
                      "print('warned', os.environ['RANK'], file=sys.stderr)\n"
                      "if os.environ['RANK'] == '1':\n    raise ValueError('rank 1 failed')\n")
    finally:
        ranks.quiet_others = False
    out, err = capsys.readouterr()
    assert "[rank0]: out 0" in out and "[rank1]: out" not in out
    assert "ValueError: rank 1 failed" in str(info.value)
    assert "[rank1]: warned 1" in err and "held back by quiet_others" in err


def test_mismatched_collectives_fail_on_every_rank_and_the_group_is_reinitialised(ranks, capsys):
    code = ("import numpy as np, pyddp.distributed as dist\nx = np.ones(4)\n"
            "if dist.get_rank() == 0:\n    dist.all_reduce(x)\nelse:\n    dist.broadcast(x, 0)\n")
    start = time.monotonic()
    with pytest.raises(RanksError) as info:
        ranks.run(code)
    assert time.monotonic() - start < 60
    assert set(info.value.errors) == {0, 1}
    assert all("collective mismatch between ranks" in e for e in info.value.errors.values())
    assert "every rank has re-initialised its default process group" in str(info.value)
    # the next cell runs collectives on a working group
    assert ranks.run("y = np.arange(3.0) * (dist.get_rank() + 1)\ndist.all_reduce(y)\ny.tolist()") \
        .agreed() == "[0.0, 3.0, 6.0]"
    # a cell that destroys the group gets a fresh one too
    ranks.run("dist.destroy_process_group()")
    assert "re-initialised" in capsys.readouterr().err
    assert ranks.run("dist.is_initialized() and dist.get_world_size()").agreed() == "2"


def _sitecustomize(tmp_path, monkeypatch, body):
    """Code every rank runs as it starts, before it connects (a sitecustomize on PYTHONPATH)."""
    d = tmp_path / "site"
    d.mkdir()
    (d / "sitecustomize.py").write_text(textwrap.dedent(body))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(d), REPO] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))


def test_start_fails_within_its_timeout_when_a_rank_never_comes_up(tmp_path, monkeypatch):
    _sitecustomize(tmp_path, monkeypatch, f"""\
        import os, time
        if os.environ.get("PYDDP_RANKS_ADDR") and os.environ.get("RANK") == "1":
            open({str(tmp_path)!r} + "/stuck.pid", "w").write(str(os.getpid()))
            time.sleep(600)
        """)
    r = Ranks(nprocs=2, start_timeout=4)
    start = time.monotonic()
    with pytest.raises(RanksError, match=r"ranks \[1\] did not connect within 4 s"):
        r.start()
    assert time.monotonic() - start < 40
    assert not r.running
    _wait_files([str(tmp_path / "stuck.pid")], timeout=0)
    assert_all_gone([int((tmp_path / "stuck.pid").read_text())])
    with pytest.raises(ValueError, match="start_timeout"):
        Ranks(nprocs=2, start_timeout=0)


def test_a_silent_connection_does_not_hold_up_start(tmp_path, monkeypatch):
    # rank 1 first opens a connection to the kernel's port that never says anything (as any local
    # process could), then starts as usual: the kernel's handshake with it must time out
    _sitecustomize(tmp_path, monkeypatch, """\
        import os, socket, builtins
        addr = os.environ.get("PYDDP_RANKS_ADDR")
        if addr and os.environ.get("RANK") == "1":
            host, _, port = addr.rpartition(":")
            builtins._pyddp_test_silent = socket.create_connection((host, int(port)))
        """)
    import pyddp._notebook_ranks as nr

    monkeypatch.setattr(nr, "_HANDSHAKE", 2.0)
    r = Ranks(nprocs=2, start_timeout=60)
    start = time.monotonic()
    r.start()
    try:
        assert time.monotonic() - start < 50
        assert r.run("import pyddp.distributed as d\nd.get_world_size()").agreed() == "2"
    finally:
        pids = _pids(r)
        r.stop()
    assert_all_gone(pids)


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
    "%%ddp\nfrom tqdm import tqdm\nimport matplotlib.pyplot as plt\nfrom IPython.display import HTML\n"
    "for i in tqdm(range(20), mininterval=0, ascii=True):\n    time.sleep(0.01)\n"
    "display(HTML('<b>rank %d</b>' % dist.get_rank()))\nplt.plot([1, 2, 3])\nprint('done')",
    "%%ddp\nx = np.ones(4)\nif dist.get_rank() == 0:\n    dist.all_reduce(x)\nelse:\n"
    "    dist.broadcast(x, 0)",
    "%%ddp\nx = np.ones(4)\ndist.all_reduce(x)\nx.tolist()",
    "%ddp stop",
    # a function defined in the kernel, pushed to the ranks; a value pulled back
    "%ddp start -n 2",
    "def tenfold(v):\n    return v * 10",
    "%ddp push tenfold",
    "%%ddp\nimport numpy as np, pyddp.distributed as dist\nw = np.arange(3) * (dist.get_rank() + 1)\n"
    "tenfold(dist.get_rank())",
    "%ddp pull w --rank 1",
    # a rank that dies is reported in the running cell; restart brings the job back
    "%%ddp --ranks 1\nimport os\nos._exit(3)",
    "%ddp restart",
    "%%ddp\nimport os, pyddp.distributed as dist\nprint('pid', os.getpid())\ndist.get_world_size()",
    # (no %ddp stop: the kernel's shutdown takes the ranks with it)
]
SLEEP, FAILS, STATUS, RICH, MISMATCH, AFTER, STOP = 7, 8, 9, 10, 11, 12, 13
PUSHED, PULL, DIES, RESTART, LAST = 17, 18, 19, 20, 21


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
    pytest.importorskip("tqdm")
    pytest.importorskip("matplotlib")
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
    # a tqdm bar per rank: one display output each, updated in place to its end; no redraws in text
    rich = cells[RICH].outputs
    bars = [o["data"]["text/plain"] for o in rich if o.get("output_type") == "display_data"
            and "%|" in o["data"].get("text/plain", "")]
    assert sorted(b[:12] for b in bars) == ["[rank0]: 100", "[rank1]: 100"], rich
    assert all("20/20" in b for b in bars) and "%|" not in _text(cells[RICH])
    assert sorted(o["data"]["text/html"] for o in rich if "text/html" in o.get("data", {})) == \
        ["<b>rank 0</b>", "<b>rank 1</b>"]
    assert [o["data"]["image/png"][:8] for o in rich if "image/png" in o.get("data", {})] == \
        ["iVBORw0K"]       # rank 0's figure, base64 PNG, shown when the cell ended
    assert "[rank0]: done" in _text(cells[RICH]) and "[rank1]: done" in _text(cells[RICH])
    # ranks calling different collectives: the mismatch on every rank, then a working group
    errors = [o for o in cells[MISMATCH].outputs if o.get("output_type") == "error"]
    tb = "\n".join(errors[0]["traceback"])
    assert tb.count("collective mismatch between ranks") >= 2 and "--- rank 1 ---" in tb
    assert "re-initialised its default process group" in tb
    results = [o for o in cells[AFTER].outputs if o.get("output_type") == "execute_result"]
    assert results and results[0]["data"]["text/plain"] == "[2.0, 2.0, 2.0, 2.0]", cells[AFTER].outputs
    assert "ranks stopped" in _text(cells[STOP])
    assert_all_gone(pids)
    results = [o for o in cells[PUSHED].outputs if o.get("output_type") == "execute_result"]
    assert results and results[0]["data"]["text/plain"] == "[rank0]: 0\n[rank1]: 10", \
        cells[PUSHED].outputs
    pulled = [o for o in cells[PULL].outputs if o.get("output_type") in ("execute_result",
                                                                          "display_data")]
    assert pulled and pulled[0]["data"]["text/plain"] == "array([0, 2, 4])", cells[PULL].outputs
    errors = [o for o in cells[DIES].outputs if o.get("output_type") == "error"]
    tb = "\n".join(errors[0]["traceback"]) if errors else ""
    assert "rank 1" in tb and "exit code 3" in tb, cells[DIES].outputs
    assert "restart" in (_text(cells[RESTART]) + tb).lower()
    results = [o for o in cells[LAST].outputs if o.get("output_type") == "execute_result"]
    assert results and results[0]["data"]["text/plain"] == "2", cells[LAST].outputs
    # the kernel shut down (the client's context ended): its ranks went with it
    last = [int(p) for p in re.findall(r"^\[rank\d\]: pid (\d+)$", _text(cells[LAST]), re.M)]
    assert len(last) == 2, _text(cells[LAST])
    assert_all_gone(last)


def test_nccl_ranks_with_cuda_on_the_cpu_run_a_gpu_cell(monkeypatch, capsys):
    """`%ddp start --backend nccl --cuda-on-cpu` (Ranks(..., cuda_on_cpu=True)): each rank has its
    own emulated device set before the group is made, and a GPU cell's all_reduce on 'cuda'
    tensors sums over the ranks (said once, in this process, that CUDA is emulated)."""
    from pyddp.cuda import _emulation

    monkeypatch.delenv("PYDDP_CUDA_ON_CPU", raising=False)
    monkeypatch.delenv(_emulation._SAID_ENV, raising=False)
    try:
        with pytest.raises(ValueError, match="cuda_on_cpu must be True or False"):
            Ranks(nprocs=2, backend="nccl", cuda_on_cpu="yes")
        r = Ranks(nprocs=2, backend="nccl", cuda_on_cpu=True, start_timeout=WAIT).start()
        pids = _pids(r)
        try:
            res = r.run(textwrap.dedent("""\
                import pyddp, pyddp.distributed as dist, pyddp.cuda as cuda
                x = pyddp.ones(4, device="cuda") * (dist.get_rank() + 1)
                dist.all_reduce(x)
                (str(x.device), cuda.current_device(), x.cpu().numpy().tolist(), dist.get_backend())
                """))
            assert "cuda_on_cpu=True" in repr(r)
        finally:
            r.stop()
        assert_all_gone(pids)
        assert res.values == {0: "('cuda:0', 0, [3.0, 3.0, 3.0, 3.0], 'nccl')",
                              1: "('cuda:1', 1, [3.0, 3.0, 3.0, 3.0], 'nccl')"}
        err = capsys.readouterr().err
        assert err.count("CUDA is emulated on the CPU") == 1, err
    finally:
        _emulation._on = None
        os.environ.pop(_emulation._SAID_ENV, None)
