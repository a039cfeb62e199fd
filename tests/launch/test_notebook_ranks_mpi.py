"""Persistent notebook ranks on backend "mpi" (``%ddp start --backend mpi``, ``Ranks(backend="mpi")``):
one real ``mpirun`` starts the ranks (they are MPI_COMM_WORLD's), their output comes back apart,
per rank, and interrupts, deaths (with mpirun's word for how), mismatches, restarts and a dying
kernel behave as on the other backends.  Skipped without mpirun and mpi4py; the refusal of a
missing launcher runs everywhere.  Every wait has a deadline; no rank or mpirun outlives a test."""
import _thread
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest

import _paths
from _launch import alive, assert_all_gone, bounded
from pyddp.notebook import Ranks, RanksError

pytestmark = pytest.mark.timeout(240)

REPO = _paths.ROOT
WAIT = 60.0
HAVE_MPI = ((shutil.which("mpirun") or shutil.which("mpiexec")) is not None
            and importlib.util.find_spec("mpi4py") is not None)
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs mpirun and mpi4py (pip install 'pyddp[mpi]')")


def _fifo_dirs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "pyddp-ranks-*")))


@pytest.fixture
def mpi_ranks():
    before = _fifo_dirs()
    r = Ranks(nprocs=2, backend="mpi", start_timeout=WAIT, interrupt_grace=5.0).start()
    pids = [s["pid"] for s in r.status()]
    launcher = r._launcher.proc.pid
    yield r
    r.stop()
    assert_all_gone(pids + [launcher])
    assert _fifo_dirs() <= before   # the FIFOs' directory went with the ranks


@needs_mpi
def test_three_mpi_ranks_on_two_cores_keep_state_and_print_apart(capsys):
    """3 ranks (more than this machine's cores: mpirun is told it may) sum with MPI, keep their
    namespaces across cells, take pushed objects and give values back; each line they print comes
    with its rank's prefix (their stdout reaches the kernel through a FIFO each)."""
    r = Ranks(nprocs=3, backend="mpi", start_timeout=WAIT).start()
    pids = [s["pid"] for s in r.status()]
    try:
        res = r.run(textwrap.dedent("""\
            import numpy as np
            import pyddp.distributed as dist
            a = np.arange(5, dtype=np.float64) * (dist.get_rank() + 1)
            dist.all_reduce(a)
            print("sum", dist.get_rank(), a.tolist())
            (dist.get_backend(), dist.get_rank(), dist.get_world_size())
            """))
        assert res.values == {r_: repr(("mpi", r_, 3)) for r_ in range(3)}
        out = capsys.readouterr().out
        want = (np.arange(5, dtype=np.float64) * 6).tolist()
        for k in range(3):
            assert f"[rank{k}]: sum {k} {want}" in out, out
        r.push(scale=np.float64(0.5))
        r.run("b = a * scale")
        for k in range(3):
            np.testing.assert_array_equal(r.pull("b", rank=k), np.asarray(want) * 0.5)
        assert len(set(pids)) == 3 and all(alive(p) for p in pids)
    finally:
        r.stop()
    assert_all_gone(pids)


@needs_mpi
def test_interrupting_an_mpi_cell_leaves_the_ranks_usable(mpi_ranks, tmp_path):
    marks = [str(tmp_path / f"{k}.sleeping") for k in range(2)]
    code = (f"import time, pyddp.distributed as dist\nopen({str(tmp_path)!r} + '/' + "
            "str(dist.get_rank()) + '.sleeping', 'w').close()\ntime.sleep(120)\n")

    def interrupt():
        deadline = time.monotonic() + WAIT
        while not all(os.path.exists(p) for p in marks) and time.monotonic() < deadline:
            time.sleep(0.02)
        _thread.interrupt_main()

    t = threading.Thread(target=interrupt, daemon=True)
    start = time.monotonic()
    t.start()
    with bounded(mpi_ranks, WAIT), pytest.raises(RanksError) as info:
        mpi_ranks.run(code)
    t.join(WAIT)
    assert time.monotonic() - start < 60
    assert str(info.value).startswith("interrupted") and set(info.value.errors) == {0, 1}
    assert all("KeyboardInterrupt" in e for e in info.value.errors.values())
    res = mpi_ranks.run("import numpy as np\nx = np.ones(3)\ndist.all_reduce(x)\nx.tolist()")
    assert res.agreed() == "[2.0, 2.0, 2.0]"


@needs_mpi
def test_mismatched_collectives_under_mpi_fail_on_every_rank_then_the_group_works(mpi_ranks):
    mpi_ranks.run("import numpy as np, pyddp.distributed as dist")
    with pytest.raises(RanksError) as info:
        mpi_ranks.run("x = np.ones(3)\nif dist.get_rank() == 0:\n    dist.all_reduce(x)\n"
                      "else:\n    dist.broadcast(x, 0)\n")
    assert set(info.value.errors) == {0, 1}
    assert "re-initialised" in str(info.value)
    res = mpi_ranks.run("x = np.full(3, dist.get_rank() + 1.0)\ndist.all_reduce(x)\nx.tolist()")
    assert res.agreed() == "[3.0, 3.0, 3.0]"


@needs_mpi
@pytest.mark.parametrize("how, cause", [
    ("os.kill(os.getpid(), signal.SIGKILL)", "signal SIGKILL"),
    ("os._exit(3)", "exit code 3"),
])
def test_a_dead_mpi_rank_is_reported_with_mpirun_s_cause_and_restart_brings_the_job_back(
        mpi_ranks, how, cause):
    """A rank that dies ends the MPI job (mpirun stops the others): the cell names the dead rank's
    cause as mpirun reported it and says why the other rank ended; restart() starts a new job."""
    with bounded(mpi_ranks, WAIT), pytest.raises(RanksError) as info:
        mpi_ranks.run(f"import os, signal, time, pyddp.distributed as dist\n"
                      f"if dist.get_rank() == 1:\n    {how}\ntime.sleep(30)\n")
    assert set(info.value.errors) == {0, 1}
    assert f"died ({cause})" in info.value.errors[1], info.value.errors
    assert "after rank 1 died" in info.value.errors[0], info.value.errors
    st = mpi_ranks.status()
    assert [s["alive"] for s in st] == [False, False] and st[1]["exit"] == cause
    with pytest.raises(RanksError, match="is dead"):
        mpi_ranks.run("1")
    old = [s["pid"] for s in st]
    mpi_ranks.restart()
    assert_all_gone(old)
    assert mpi_ranks.run("import pyddp.distributed as dist\ndist.get_world_size()").agreed() == "2"


@needs_mpi
def test_mpi_ranks_and_mpirun_die_with_their_kernel():
    code = textwrap.dedent("""\
        import sys
        from pyddp.notebook import Ranks
        r = Ranks(2, backend="mpi").start()
        print(" ".join(str(s["pid"]) for s in r.status()), r._launcher.proc.pid, flush=True)
        sys.stdin.read()
        """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO] + ([os.environ["PYTHONPATH"]]
                                                              if os.environ.get("PYTHONPATH") else [])))
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 3 and all(alive(q) for q in pids)
        p.kill()
        p.wait(WAIT)
        assert_all_gone(pids, timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(WAIT)


def test_a_missing_mpi_launcher_is_named_at_start(monkeypatch):
    before = _fifo_dirs()
    monkeypatch.setenv("PYDDP_MPIRUN", "/nonexistent/mpirun")
    r = Ranks(nprocs=2, backend="mpi")
    with pytest.raises(RuntimeError, match=r"PYDDP_MPIRUN='/nonexistent/mpirun': no such program"):
        r.start()
    assert not r.running and _fifo_dirs() <= before
    monkeypatch.setenv("PYDDP_MPIRUN", "")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="starts its ranks with mpirun, which is not on the PATH"):
        r.start()
    assert not r.running and _fifo_dirs() <= before


@needs_mpi
def test_ddp_start_backend_mpi_in_a_real_notebook(tmp_path):
    """`%ddp start -n 2 --backend mpi` in a Jupyter kernel (nbclient, ipykernel): a %%ddp cell sums
    with MPI, each rank's line streamed with its prefix; the kernel's shutdown takes mpirun's ranks
    with it."""
    nbformat = pytest.importorskip("nbformat")  # noqa: F841
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [
        "%load_ext pyddp",
        "%ddp start -n 2 --backend mpi --timeout 60",
        "%%ddp\nimport os, numpy as np, pyddp.distributed as dist\nx = np.full(2, dist.get_rank() + 1.0)\n"
        "dist.all_reduce(x)\nprint('sum', dist.get_backend(), x.tolist(), os.getpid())",
        "%ddp status",
    ]
    nb = new_notebook()
    nb.cells = [new_code_cell(c) for c in cells]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO] + ([os.environ["PYTHONPATH"]]
                                                              if os.environ.get("PYTHONPATH") else [])))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYDDP_SECRET"):
        env.pop(k, None)
    client = nbclient.NotebookClient(nb, timeout=90, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)   # the kernel is shut down when it returns

    def text(cell):
        return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")

    assert "2 ranks started (backend 'mpi'" in text(nb.cells[1]), nb.cells[1].outputs
    import re
    out = text(nb.cells[2])
    pids = [int(p) for p in re.findall(r"^\[rank\d\]: sum mpi \[3\.0, 3\.0\] (\d+)$", out, re.M)]
    assert len(pids) == 2, nb.cells[2].outputs
    assert text(nb.cells[3]).count("idle") == 2, nb.cells[3].outputs
    assert_all_gone(pids, timeout=20)
