"""examples/notebook_ranks.ipynb executes on a real Jupyter kernel (nbclient + ipykernel; skipped
when those are not installed): persistent ranks build a model, train, are inspected, get a new
learning rate, resume, have a long cell interrupted (as Jupyter's stop button does: SIGINT to the
kernel) and plot inline."""
import os
import re
import signal
import threading
import time

import pytest

import _paths
from _launch import assert_all_gone

ROOT = _paths.ROOT
EXAMPLES = os.path.join(ROOT, "examples")
WAIT = 60.0


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def _interrupt_when(cell, needle, kernel_pid, seen):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if needle in _text(cell):
            seen["running"] = True
            break
        time.sleep(0.05)
    time.sleep(0.5)    # a few training steps into the cell
    pgid = os.getpgid(kernel_pid)
    if pgid != os.getpgrp():
        os.killpg(pgid, signal.SIGINT)    # what jupyter_client's interrupt_kernel does
    else:
        os.kill(kernel_pid, signal.SIGINT)
    seen["interrupted_at"] = time.monotonic()


@pytest.mark.timeout(180)
def test_notebook_ranks_example_executes():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    nb = nbformat.read(os.path.join(EXAMPLES, "notebook_ranks.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:   # what the file holds must not count: only what this run produces
        cell.outputs = []
    long_cell = next(c for c in code if "a long cell" in c.source)
    assert "raises-exception" in long_cell.metadata.get("tags", [])
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYDDP_SECRET"):
        env.pop(k, None)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": EXAMPLES}})
    seen = {}
    start = time.monotonic()
    with client.setup_kernel(env=env):
        kernel_pid = client.km.provisioner.process.pid
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            watcher = None
            if cell is long_cell:
                watcher = threading.Thread(target=_interrupt_when,
                                           args=(cell, "[rank0]: a long cell", kernel_pid, seen),
                                           daemon=True)
                watcher.start()
            if "%ddp stop" in cell.source:
                seen["pids"] = [int(p) for p in re.findall(r"pid (\d+)", _status(client, nb))]
            client.execute_cell(cell, i)   # raises CellExecutionError on an unexpected error
            if watcher is not None:
                watcher.join(WAIT)
                seen["returned_at"] = time.monotonic()
    elapsed = time.monotonic() - start

    out = [_text(c) for c in code]
    assert "2 ranks started" in out[0]
    assert "[rank0]: rank 0 of 2: 899 samples" in out[1] and "[rank1]: rank 1 of 2: 898 samples" in out[1]
    first = re.findall(r"^\[rank0\]: loss after 60 steps: ([0-9.]+)$", out[2], re.M)
    assert first and float(first[0]) < 2.3, out[2]
    bars = [o["data"]["text/plain"] for o in code[2].outputs if o.get("output_type") == "display_data"]
    assert len(bars) == 1 and "60/60" in bars[0] and bars[0].startswith("[rank0]: 100%"), bars
    sums = re.findall(r"^\[rank(\d)\]: parameter checksum (\S+), first sample of my shard: (\d)$",
                      out[3], re.M)
    assert sorted((r, s) for r, _, s in sums) == [("0", "0"), ("1", "1")]
    assert sums[0][1] == sums[1][1]                      # the same parameters on both ranks
    assert "60 steps, last loss" in out[4]
    assert re.search(r"^\[rank0\]: lr 0\.05, loss after 40 more steps: [0-9.]+$", out[5], re.M)
    # the interrupted cell: KeyboardInterrupt on every rank, soon; the ranks went on afterwards
    assert seen.get("running") and seen["returned_at"] - seen["interrupted_at"] < 30
    errors = [o for o in long_cell.outputs if o.get("output_type") == "error"]
    assert errors and errors[0]["ename"] == "RanksError"
    tb = "\n".join(errors[0]["traceback"])
    assert tb.startswith("interrupted") and tb.count("KeyboardInterrupt") >= 2
    steps = [int(n) for n in re.findall(r"^\[rank\d\]: still here after (\d+) steps$", out[7], re.M)]
    assert len(steps) == 2 and steps[0] == steps[1] and 100 < steps[0] < 700, out[7]
    # the plot: one PNG, from rank 0
    images = [o for o in code[8].outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1, code[8].outputs
    assert "ranks stopped" in out[9]
    assert_all_gone(seen["pids"])
    assert elapsed < 120


def _status(client, nb):
    """The ranks' pids, from a %ddp status run in the kernel before they stop."""
    from nbformat.v4 import new_code_cell

    cell = new_code_cell("%ddp status")
    nb.cells.append(cell)
    try:
        client.execute_cell(cell, len(nb.cells) - 1)
    finally:
        nb.cells.pop()
    return _text(cell)
