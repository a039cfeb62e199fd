"""Loss-scale dynamics: pyddp.amp.LossScaler (apex's rules, through amp.scale_loss) and
pyddp.amp.GradScaler (torch's state machine) against torch.amp.GradScaler on the CPU and against
apex's rules as the reference states them."""
import pickle

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp import amp
from pyddp.amp._amp_state import _amp_state
from pyddp.amp.scaler import LossScaler


@pytest.fixture(autouse=True)
def _reset_amp():
    yield
    _amp_state.reset()


# overflowing steps of a 40-step run: runs of clean steps long enough to grow (window 4)
PATTERN = [s in {0, 1, 7, 8, 9, 20, 33} for s in range(40)]


def _apex_rule(pattern, window, start=2.0 ** 16, lo=None, hi=2.0 ** 24):
    """apex's LossScaler as the reference describes it: start at min(hi, 2**16); overflow ->
    skip, max(lo, s/2), count reset; `window` clean steps in a row -> min(hi, 2s)."""
    s, good, scales, skips = min(hi, start), 0, [], []
    for overflow in pattern:
        if overflow:
            s = s / 2 if lo is None else max(lo, s / 2)
            good = 0
        else:
            good += 1
            if good == window:
                s, good = min(hi, s * 2), 0
        scales.append(s)
        skips.append(overflow)
    return scales, skips


@pytest.mark.parametrize("lo,hi", [(None, 2.0 ** 24), (2.0 ** 14, 2.0 ** 24),
                                   (None, 2.0 ** 16)])
def test_loss_scaler_follows_apex_rules(lo, hi):
    ls = LossScaler("dynamic", scale_window=4, min_loss_scale=lo, max_loss_scale=hi)
    scales, skips = [], []
    for overflow in PATTERN:
        ls.clear_overflow_state()
        g = np.ones(5, np.float32) * 8.0
        if overflow:
            g[2] = np.inf
        ls.unscale([g], ls.loss_scale())
        skips.append(ls.update_scale())
        scales.append(ls.loss_scale())
    assert (scales, skips) == _apex_rule(PATTERN, 4, lo=lo, hi=hi)


def test_static_loss_scaler_never_skips():
    ls = LossScaler(128.0)
    for overflow in PATTERN[:10]:
        ls.clear_overflow_state()
        ls.unscale([np.array([np.inf if overflow else 1.0], np.float32)], 128.0)
        assert ls.update_scale() is False
    assert ls.loss_scale() == 128.0


def test_scale_loss_dynamics_and_skips():
    """Through amp.initialize/scale_loss (window 2000, as apex): the scale and skipped steps of
    a pattern with overflows, then 2000 clean steps doubling the scale."""
    pyddp.manual_seed(0)
    m = nn.Linear(3, 2)
    o = pyddp.optim.SGD(m.parameters(), lr=0.01)
    m, o = amp.initialize(m, o, opt_level="O1", verbosity=0, min_loss_scale=2.0 ** 13)
    pattern = [True, False, True, True, True, False]
    x = pyddp.tensor(np.ones((2, 3), np.float32))
    scales, skips = [], []
    for overflow in pattern:
        o.zero_grad()
        with amp.scale_loss(m(x).float().sum() * 1e-3, o) as sl:
            sl.backward()
            if overflow:
                m.weight.grad._data[0, 0] = np.inf
        w = m.weight._data.copy()
        o.step()
        skips.append(np.array_equal(w, m.weight._data))
        scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
    want_scales, want_skips = _apex_rule(pattern, 2000, lo=2.0 ** 13)
    assert scales == want_scales and skips == want_skips
    # 2000 clean steps in a row double it (driven through the scaler the handle uses)
    scaler = _amp_state.loss_scalers[0]
    assert scaler._unskipped == 1  # the pattern ends with one clean step
    for _ in range(1998):
        scaler.clear_overflow_state()
        scaler.update_scale()
    assert scaler.loss_scale() == want_scales[-1] and scaler._unskipped == 1999
    scaler.clear_overflow_state()
    scaler.update_scale()
    assert scaler.loss_scale() == 2 * want_scales[-1] and scaler._unskipped == 0


def _pyddp_run(pattern, interval, fused):
    pyddp.manual_seed(0)
    w0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    p = nn.Parameter(pyddp.tensor(w0.copy()))
    opt = pyddp.optim.SGD([p], lr=0.1, momentum=0.9)
    if not fused:
        opt._step_supports_amp_scaling = False
    scaler = amp.GradScaler("cpu", growth_interval=interval)
    x = pyddp.tensor(np.arange(4, dtype=np.float32))
    scales, skips = [], []
    for i, overflow in enumerate(pattern):
        opt.zero_grad()
        loss = ((p @ x) ** 2).sum() * (i + 1) / 10
        scaler.scale(loss).backward()
        if overflow:
            p.grad._data[1, 2] = np.nan
        before = p._data.copy()
        scaler.step(opt)
        scaler.update()
        skips.append(np.array_equal(before, p._data))
        scales.append(scaler.get_scale())
    return scales, skips, p._data.copy(), scaler.state_dict()


def _torch_run(torch, pattern, interval):
    w0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    p = torch.nn.Parameter(torch.tensor(w0.copy()))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", growth_interval=interval)
    x = torch.arange(4, dtype=torch.float32)
    scales, skips = [], []
    for i, overflow in enumerate(pattern):
        opt.zero_grad()
        loss = ((p @ x) ** 2).sum() * (i + 1) / 10
        scaler.scale(loss).backward()
        if overflow:
            p.grad[1, 2] = float("nan")
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        skips.append(bool(torch.equal(before, p.detach())))
        scales.append(scaler.get_scale())
    return scales, skips, p.detach().numpy().copy(), scaler.state_dict()


@pytest.mark.parametrize("fused", [False, True])
def test_gradscaler_dynamics_match_torch(fused):
    torch = pytest.importorskip("torch")
    ours = _pyddp_run(PATTERN, 4, fused)
    ref = _torch_run(torch, PATTERN, 4)
    assert ours[0] == ref[0]
    assert ours[1] == ref[1] == PATTERN
    assert ours[3] == ref[3]
    np.testing.assert_allclose(ours[2], ref[2], rtol=1e-5, atol=1e-6)
    # and apex's rules give the same scales and skips for the same pattern
    assert (ours[0], ours[1]) == _apex_rule(PATTERN, 4)


def test_gradscaler_dynamics_torch_optimizer():
    """pyddp's GradScaler driving a torch optimizer: same as torch's GradScaler, bit for bit."""
    torch = pytest.importorskip("torch")
    ref = _torch_run(torch, PATTERN, 4)
    orig = torch.amp.GradScaler
    try:
        torch.amp.GradScaler = lambda device, **kw: amp.GradScaler(device, **kw)
        ours = _torch_run(torch, PATTERN, 4)
    finally:
        torch.amp.GradScaler = orig
    assert ours[0] == ref[0] and ours[1] == ref[1] and ours[3] == ref[3]
    np.testing.assert_array_equal(ours[2], ref[2])


def test_gradscaler_state_machine_errors():
    p = nn.Parameter(pyddp.tensor(np.ones(3, np.float32)))
    opt = pyddp.optim.SGD([p], lr=0.1)
    opt._step_supports_amp_scaling = False
    s = amp.GradScaler()
    assert s.is_enabled() and s.get_scale() == 65536.0
    with pytest.raises(AssertionError, match="Attempted unscale_ but _scale is None"):
        s.unscale_(opt)
    s.scale(p.sum()).backward()
    s.unscale_(opt)
    np.testing.assert_array_equal(p.grad._data, np.ones(3, np.float32))
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) has already been called on this "
                       r"optimizer since the last update\(\).$"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(RuntimeError, match=r"^step\(\) has already been called since the last "
                       r"update\(\).$"):
        s.step(opt)
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) is being called after step\(\).$"):
        s.unscale_(opt)
    s.update()
    with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
        s.step(opt, closure=lambda: 0)
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update."):
        s.update()
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        s.scale([1.0])
    p16 = nn.Parameter(pyddp.tensor(np.ones(3, np.float16)))
    o16 = pyddp.optim.SGD([p16], lr=0.1)
    s.scale(p16.float().sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        s.unscale_(o16)
    with pytest.raises(AssertionError, match="The growth factor must be > 1.0."):
        amp.GradScaler(growth_factor=1.0)
    with pytest.raises(RuntimeError, match="The source state dict is empty"):
        amp.GradScaler().load_state_dict({})


def test_gradscaler_disabled_update_and_state():
    p = nn.Parameter(pyddp.tensor(np.ones(3, np.float32)))
    opt = pyddp.optim.SGD([p], lr=0.5)
    off = amp.GradScaler(enabled=False)
    loss = p.sum()
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}
    loss.backward()
    off.step(opt)
    np.testing.assert_array_equal(p._data, np.full(3, 0.5, np.float32))
    s = amp.GradScaler(init_scale=8.0, growth_interval=3)
    s.scale(p.sum()).backward()
    s.step(opt)
    s.update(2.0)
    assert s.get_scale() == 2.0
    sd = s.state_dict()
    assert sd == {"scale": 2.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 3, "_growth_tracker": 0}
    s2 = pickle.loads(pickle.dumps(s))
    assert s2.state_dict() == sd
    s3 = amp.GradScaler()
    s3.load_state_dict(sd)
    assert s3.state_dict() == sd


def test_gradscaler_loads_torch_state_dict():
    torch = pytest.importorskip("torch")
    ts = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    ts.scale(torch.ones(1))
    s = amp.GradScaler()
    s.load_state_dict(ts.state_dict())
    assert s.state_dict() == ts.state_dict()
