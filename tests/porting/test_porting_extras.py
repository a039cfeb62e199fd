"""What ported scripts import beyond the core: pyddp.utils.tensorboard.SummaryWriter (a well-kept
writer, imported lazily, a clear error naming what to install) and apex.fp16_utils."""
import sys
import types

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn


class _FakeWriter:
    calls = []

    def __init__(self, log_dir=None, **kw):
        self.log_dir = log_dir
        _FakeWriter.calls.append(("init", log_dir, kw))

    def add_scalar(self, tag, value, step=None):
        _FakeWriter.calls.append(("add_scalar", tag, value, step))

    def add_scalars(self, tag, values, step=None):
        _FakeWriter.calls.append(("add_scalars", tag, values, step))

    def close(self):
        _FakeWriter.calls.append(("close",))


def test_summary_writer_is_lazy_and_names_what_to_install(monkeypatch):
    import pyddp.utils.tensorboard as tb
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboardX"):
        tb.SummaryWriter("runs/x")


def test_summary_writer_forwards_with_numpy(monkeypatch, tmp_path):
    fake = types.ModuleType("tensorboardX")
    fake.SummaryWriter = _FakeWriter
    monkeypatch.setitem(sys.modules, "tensorboardX", fake)
    from pyddp.utils.tensorboard import SummaryWriter
    _FakeWriter.calls.clear()
    loss = pyddp.tensor(0.25)
    with SummaryWriter(str(tmp_path), flush_secs=5) as w:
        w.add_scalar("loss", loss, 3)
        w.add_scalars("acc", {"top1": pyddp.tensor(71.0), "top5": 90.0}, 3)
        assert w.log_dir == str(tmp_path)
    kinds = [c[0] for c in _FakeWriter.calls]
    assert kinds == ["init", "add_scalar", "add_scalars", "close"]
    value = _FakeWriter.calls[1][2]
    assert isinstance(value, np.ndarray) and value == 0.25
    assert isinstance(_FakeWriter.calls[2][2]["top1"], np.ndarray)
    with pytest.raises(NotImplementedError, match="pyddp.nn"):
        SummaryWriter(str(tmp_path)).add_graph(nn.Linear(2, 2))


def test_fp16_utils_as_apex_imagenet_uses_them():
    from pyddp.fp16_utils import FP16_Optimizer, network_to_half, to_python_float
    pyddp.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model = network_to_half(net)
    assert [p.dtype for p in model.parameters()] == [np.float16] * 2 + [np.float32] * 2 + \
        [np.float16] * 2
    opt = FP16_Optimizer(pyddp.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True,
                         verbose=False)
    x, y = pyddp.randn(16, 4), pyddp.randint(0, 2, (16,))
    losses = []
    for _ in range(20):
        out = model(x)
        assert out.dtype == np.float16
        loss = nn.functional.cross_entropy(out.float(), y)
        opt.zero_grad()
        opt.backward(loss)
        opt.step()
        losses.append(to_python_float(loss))
    assert losses[-1] < losses[0] * 0.8
    # masters are float32 and the model holds their float16 rounding
    m = opt.fp32_from_fp16_groups[0][0]
    assert m.dtype == np.float32
    np.testing.assert_array_equal(model[1][0].weight.numpy(), m.numpy().astype(np.float16))
    # an overflow skips the step and halves the scale
    before = [p.numpy().copy() for p in model.parameters()]
    scale = opt.loss_scale
    opt.zero_grad()
    opt.backward(model(x).float().sum() * 1e30)
    opt.step()
    assert opt.overflow and opt.loss_scale == scale / 2
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters()))
    assert opt.clip_master_grads(1.0) == -1
    opt.load_state_dict(opt.state_dict())
    assert to_python_float([3.5]) == 3.5


def test_summary_writer_log_dir_and_logdir(monkeypatch, tmp_path):
    """torch's writer names its directory log_dir, tensorboardX's logdir: both work, and
    get_logdir(), whichever writer is underneath."""
    fake = types.ModuleType("tensorboardX")

    class _TBX:   # tensorboardX's shape: logdir and get_logdir()
        def __init__(self, logdir=None, **kw):
            self.logdir = logdir

        def get_logdir(self):
            return self.logdir

        def close(self):
            pass

    for cls in (_TBX, _FakeWriter):
        fake.SummaryWriter = cls
        monkeypatch.setitem(sys.modules, "tensorboardX", fake)
        from pyddp.utils.tensorboard import SummaryWriter
        w = SummaryWriter(str(tmp_path))
        assert w.log_dir == w.logdir == w.get_logdir() == str(tmp_path)
        w.close()


# A stand-in for tensorboardX's writer with its hazard: a daemon thread reading a
# multiprocessing.Queue, which multiprocessing's exit closes under the thread ("OSError: handle is
# closed") unless the writer was closed first.  It records its close in a file.
_FAKE_TBX = '''
import multiprocessing, os, queue, threading

class SummaryWriter:
    def __init__(self, logdir=None, flush_secs=120, **kw):
        self.logdir = logdir
        os.makedirs(logdir, exist_ok=True)
        self._q = multiprocessing.Queue(10)
        self._events = []
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while True:
            try:
                item = self._q.get(True, 0.01)
            except queue.Empty:
                continue
            if item is None:
                return
            self._events.append(item)

    def add_scalar(self, tag, value, step=None):
        self._q.put((tag, float(value), step))

    def get_logdir(self):
        return self.logdir

    def close(self):
        if self._q is None:
            return
        self._q.put(None)
        self._t.join()
        self._q.close()
        self._q = None
        with open(os.path.join(self.logdir, "closed"), "w") as f:
            f.write(str(len(self._events)))
'''

_NEVER_CLOSED = '''
import sys
import pyddp
import pyddp.multiprocessing as mp
from pyddp.utils.tensorboard import SummaryWriter


def rank(r, root):
    w = SummaryWriter(f"{root}/rank{r}", flush_secs=1)
    for i in range(20):
        w.add_scalar("loss", pyddp.tensor(1.0 / (i + 1)), i)
    # never closed


if __name__ == "__main__":
    root = sys.argv[2]
    if sys.argv[1] == "spawn":
        mp.spawn(rank, args=(root,), nprocs=2)
    elif sys.argv[1] == "fork":
        mp.start_processes(rank, args=(root,), nprocs=2, start_method="fork")
    else:
        rank(0, root)
    print("done")
'''


def _run_never_closed(tmp_path, how, fake):
    import os
    import subprocess

    import _paths
    script = tmp_path / "never_closed.py"
    script.write_text(_NEVER_CLOSED)
    env = dict(os.environ)
    path = [_paths.ROOT]
    if fake:
        (tmp_path / "fake" / "tensorboardX").mkdir(parents=True)
        (tmp_path / "fake" / "tensorboardX" / "__init__.py").write_text(_FAKE_TBX)
        path.insert(0, str(tmp_path / "fake"))
    env["PYTHONPATH"] = os.pathsep.join(path)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        env.pop(k, None)
    root = tmp_path / how
    root.mkdir()
    p = subprocess.run([sys.executable, str(script), how, str(root)], env=env,
                       capture_output=True, text=True, timeout=120)
    return p, root


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["main", "spawn", "fork"])
def test_writer_never_closed_exits_cleanly(tmp_path, how):
    """A script (or a spawned/forked rank) that never closes its writer: the writer is flushed
    and closed at exit, before multiprocessing closes its queue under the writer thread; stderr
    stays clean and every event was written."""
    p, root = _run_never_closed(tmp_path, how, fake=True)
    assert p.returncode == 0 and "done" in p.stdout, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "handle is closed" not in p.stderr, p.stderr
    ranks = [0] if how == "main" else [0, 1]
    for r in ranks:
        assert (root / f"rank{r}" / "closed").read_text() == "20", p.stderr


def _records(path):
    """The number of TFRecord records in an event file (length, crc, data, crc)."""
    import struct
    data = path.read_bytes()
    n = i = 0
    while i + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[i:i + 8])
        i += 12 + length + 4
        n += 1
    return n


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["main", "spawn"])
def test_tensorboardx_writer_never_closed_exits_cleanly(tmp_path, how):
    """The same with the real tensorboardX (where installed): its thread raised OSError: handle
    is closed in a spawned rank that never closed its writer; now stderr is clean and the event
    files hold all 20 scalars (and the file-version record)."""
    pytest.importorskip("tensorboardX")
    p, root = _run_never_closed(tmp_path, how, fake=False)
    assert p.returncode == 0 and "done" in p.stdout, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "handle is closed" not in p.stderr, p.stderr
    for r in ([0] if how == "main" else [0, 1]):
        files = list((root / f"rank{r}").glob("events.out.tfevents.*"))
        assert len(files) == 1 and _records(files[0]) == 21
