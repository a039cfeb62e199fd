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
