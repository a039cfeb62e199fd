"""pyddp.amp's apex frontend on pyddp.nn models: initialize's opt levels, overrides and errors,
O1 casts, O2 masters and float32 state_dict, scale_loss's unscale/skip, gradient accumulation,
convergence against float32 training."""
import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp import amp
from pyddp.amp._amp_state import _amp_state


@pytest.fixture(autouse=True)
def _reset_amp():
    yield
    _amp_state.reset()  # O1 switches pyddp's autocast on process-wide


def _net(seed=0, bn=True):
    pyddp.manual_seed(seed)
    layers = [nn.Linear(10, 32)]
    if bn:
        layers.append(nn.BatchNorm1d(32))
    layers += [nn.ReLU(), nn.Linear(32, 3)]
    return nn.Sequential(*layers)


def _data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 10)).astype(np.float32)
    W = rng.standard_normal((10, 3)).astype(np.float32)
    return X, (X @ W).argmax(1)


# ------------------------------------------------------------------ initialize
def test_initialize_shapes_and_disabled():
    m1, m2 = _net(0), _net(1)
    o1 = pyddp.optim.SGD(m1.parameters(), lr=0.1)
    o2 = pyddp.optim.SGD(m2.parameters(), lr=0.1)
    r = amp.initialize([m1, m2], [o1, o2], opt_level="O1", verbosity=0)
    assert isinstance(r, tuple) and r[0] == [m1, m2] and r[1] == [o1, o2]
    m3 = _net(2)
    o3 = pyddp.optim.SGD(m3.parameters(), lr=0.1)
    assert amp.initialize(m3, o3, opt_level="O0", verbosity=0) == (m3, o3)
    m4 = _net(3)
    assert amp.initialize(m4, opt_level="O0", verbosity=0) is m4
    assert amp.initialize([m4], opt_level="O0", verbosity=0) == [m4]
    m5 = _net(4)
    o5 = pyddp.optim.SGD(m5.parameters(), lr=0.1)
    assert amp.initialize(m5, o5, enabled=False) == (m5, o5)
    loss = pyddp.tensor(np.float32(3.0))
    with amp.scale_loss(loss, o5) as sl:
        assert sl is loss


def test_initialize_errors():
    from pyddp.nn.parallel.distributed import _pyddp_impl

    cls = _pyddp_impl()
    wrapped = cls.__new__(cls)  # an instance of pyddp's DDP class (no process group needed)
    with pytest.raises(RuntimeError, match="Incoming model is an instance of "
                       "pyddp.nn.parallel.DistributedDataParallel. Parallel wrappers should only "
                       "be applied to the model"):
        amp.initialize(wrapped, opt_level="O1", verbosity=0)
    m = _net()
    o = pyddp.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="Unexpected optimization level 01"):
        amp.initialize(m, o, opt_level="01", verbosity=0)
    with pytest.raises(RuntimeError, match="should only be passed through amp.initialize once"):
        amp.initialize([m], [o, o], opt_level="O1", verbosity=0)
    amp.initialize(m, o, opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="should only be passed through amp.initialize once"):
        amp.initialize(_net(), o, opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="With O1, your model weights themselves should be "
                       "FP32.  If you're sure"):
        amp.initialize(_net(), opt_level="O1", master_weights=True, verbosity=0)
    with pytest.raises(RuntimeError, match="O1 inserts casts around Torch functions"):
        amp.initialize(_net(), opt_level="O1", cast_model_type=pyddp.float16, verbosity=0)
    with pytest.raises(RuntimeError, match="expected float32"):
        amp.initialize(_net().half(), opt_level="O2", verbosity=0)
    with pytest.raises(AssertionError, match="keep_batchnorm_fp32 must be a boolean"):
        amp.initialize(_net(), opt_level="O2", keep_batchnorm_fp32="yes", verbosity=0)
    with pytest.raises(TypeError, match="models must be either a single model or a list"):
        amp.initialize("model", opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="internal Amp state has not been initialized"):
        _amp_state.reset()
        with amp.scale_loss(pyddp.tensor(1.0), o):
            pass


def test_overrides_and_messages(capsys):
    m = _net()
    o = pyddp.optim.SGD(m.parameters(), lr=0.1)
    amp.initialize(m, o, opt_level="O2", keep_batchnorm_fp32="False", loss_scale=128,
                   verbosity=1)
    out = capsys.readouterr().out
    assert "Selected optimization level O2:  FP16 training with FP32 batchnorm and FP32 master" \
        in out
    props = _amp_state.opt_properties.options
    assert props["keep_batchnorm_fp32"] is False and props["loss_scale"] == 128.0
    assert props["master_weights"] is True and props["cast_model_type"] == "float16"
    # keep_batchnorm_fp32=False: batch norm went to float16 too; static scale 128
    assert m[1].weight.dtype == pyddp.float16
    assert amp.state_dict() == {"loss_scaler0": {"loss_scale": 128.0, "unskipped": 0}}
    amp.initialize(_net(), opt_level="O3", hard_override=True, patch_torch_functions=True,
                   verbosity=0)
    assert "Warning:  Currently, patch_torch_functions=True should only be set" \
        in capsys.readouterr().out


# ------------------------------------------------------------------ O1 / O2 / O3 behaviour
def test_o1_casts():
    m = _net()
    o = pyddp.optim.SGD(m.parameters(), lr=0.1)
    amp.initialize(m, o, opt_level="O1", verbosity=0)
    x = pyddp.tensor(np.ones((4, 10), np.float32))
    h = m[0](x)
    assert h.dtype == pyddp.float16 and m[0].weight.dtype == pyddp.float32
    # float16 numerics: inputs rounded to float16, float32 accumulation, result rounded
    w = m[0].weight
    ref = (x._data.astype(np.float16).astype(np.float32)
           @ w._data.astype(np.float16).astype(np.float32).T).astype(np.float16)
    np.testing.assert_array_equal((x @ w.t())._data, ref)
    assert F.softmax(h, 1).dtype == pyddp.float32
    assert F.cross_entropy(h, pyddp.tensor(np.zeros(4, np.int64))).dtype == pyddp.float32
    assert h.sum().dtype == pyddp.float32 and h.exp().dtype == pyddp.float32
    with amp.disable_casts():
        assert m[0](x).dtype == pyddp.float32
    assert pyddp.is_autocast_enabled()
    _amp_state.reset()
    assert not pyddp.is_autocast_enabled()


def test_o2_masters_state_dict_and_step():
    m = _net()
    o = pyddp.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    model_params = list(m.parameters())
    m, o = amp.initialize(m, o, opt_level="O2", verbosity=0)
    assert m[0].weight.dtype == pyddp.float16 and m[1].weight.dtype == pyddp.float32  # bn fp32
    assert m[1].running_mean.dtype == pyddp.float32
    masters = list(amp.master_params(o))
    assert all(p.dtype == pyddp.float32 for p in masters)
    assert masters[0] is not model_params[0] and masters[2] is model_params[2]  # bn kept
    X, y = _data(32)
    out = m(pyddp.tensor(X))  # float32 input cast to float16 inside, output back to float32
    assert out.dtype == pyddp.float32
    with amp.scale_loss(F.cross_entropy(out, pyddp.tensor(y)), o) as sl:
        assert sl.dtype == pyddp.float32
        sl.backward()
    assert masters[0].grad.dtype == pyddp.float32
    # the master gradient is the float16 model gradient, widened and divided by the scale
    np.testing.assert_array_equal(masters[0].grad._data,
                                  model_params[0].grad._data.astype(np.float32) / 65536.0)
    before = masters[0]._data.copy()
    o.step()
    assert not np.array_equal(before, masters[0]._data)
    np.testing.assert_array_equal(model_params[0]._data, masters[0]._data.astype(np.float16))
    assert masters[0].grad is None
    sd = m.state_dict()
    assert all(v.dtype == pyddp.float32 for v in sd.values() if v.dtype != pyddp.int64)
    np.testing.assert_array_equal(sd["0.weight"]._data, masters[0]._data)  # exact masters
    # optimizer state refers to the masters
    assert o.state[masters[0]]["momentum_buffer"].dtype == np.float32
    # load_state_dict writes the float32 values into the masters as well
    sd2 = {k: pyddp.tensor(v._data + np.float32(0.25)) if v.dtype == pyddp.float32 else v
           for k, v in sd.items()}
    want = sd2["0.weight"]._data.copy()
    m.load_state_dict(sd2)
    np.testing.assert_array_equal(masters[0]._data, want)
    np.testing.assert_array_equal(model_params[0]._data, want.astype(np.float16))


def test_o3_everything_half():
    m = _net()
    o = pyddp.optim.SGD(m.parameters(), lr=0.1)
    m, o = amp.initialize(m, o, opt_level="O3", verbosity=0)
    assert all(p.dtype == pyddp.float16 for p in m.parameters())
    assert all(p.dtype == pyddp.float16 for p in amp.master_params(o))
    assert m(pyddp.tensor(np.ones((4, 10), np.float32))).dtype == pyddp.float32


# ------------------------------------------------------------------ scale_loss
@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_overflow_skips_one_step(opt_level, capsys):
    m = _net()
    o = pyddp.optim.SGD(m.parameters(), lr=0.1)
    m, o = amp.initialize(m, o, opt_level=opt_level, verbosity=1)
    capsys.readouterr()
    X, y = _data(16)
    params = list(m.parameters())
    for step in range(3):
        loss = F.cross_entropy(m(pyddp.tensor(X)), pyddp.tensor(y))
        o.zero_grad()
        with amp.scale_loss(loss, o) as sl:
            sl.backward()
            if step == 1:
                params[0].grad._data[1, 1] = np.nan
        before = [p._data.copy() for p in params]
        o.step()
        same = all(np.array_equal(b, p._data) for b, p in zip(before, params))
        assert same == (step == 1)
        assert o.last_step_skipped == (step == 1)
    assert capsys.readouterr().out == ("Gradient overflow.  Skipping step, loss scaler 0 "
                                       "reducing loss scale to 32768.0\n")
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 32768.0, "unskipped": 1}


def test_static_scale_never_skips():
    m = _net(bn=False)
    o = pyddp.optim.SGD(m.parameters(), lr=0.1)
    m, o = amp.initialize(m, o, opt_level="O1", loss_scale=8.0, verbosity=0)
    X, y = _data(16)
    loss = F.cross_entropy(m(pyddp.tensor(X)), pyddp.tensor(y))
    with amp.scale_loss(loss, o) as sl:
        np.testing.assert_allclose(float(sl), 8.0 * float(loss), rtol=1e-6)
        sl.backward()
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 8.0, "unskipped": 1}


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_gradient_accumulation(opt_level):
    """Two scale_loss blocks before one step: the gradients add up, each unscaled once."""
    X, y = _data(32)
    grads = []
    for split in (False, True):
        m = _net(bn=False)
        o = pyddp.optim.SGD(m.parameters(), lr=0.1)
        m, o = amp.initialize(m, o, opt_level=opt_level, verbosity=0)
        o.zero_grad()
        halves = [(X[:16], y[:16]), (X[16:], y[16:])] if split else [(X, y)]
        for xb, yb in halves:
            loss = F.cross_entropy(m(pyddp.tensor(xb)), pyddp.tensor(yb)) * (len(xb) / len(X))
            with amp.scale_loss(loss, o) as sl:
                sl.backward()
        grads.append([p.grad._data.astype(np.float64) for p in amp.master_params(o)])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2)


def test_delay_unscale():
    m = _net(bn=False)
    o = pyddp.optim.SGD(m.parameters(), lr=0.1)
    m, o = amp.initialize(m, o, opt_level="O1", verbosity=0)
    X, y = _data(16)
    loss = F.cross_entropy(m(pyddp.tensor(X)), pyddp.tensor(y))
    with amp.scale_loss(loss, o, delay_unscale=True) as sl:
        sl.backward()
    g = m[0].weight.grad._data.copy()
    assert np.abs(g).max() > 10.0  # still scaled by 65536
    assert o._amp_stash.params_have_scaled_gradients


# ------------------------------------------------------------------ convergence
def _train(opt_level, steps=80):
    X, y = _data(512)
    m = _net()
    o = pyddp.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    if opt_level is not None:
        m, o = amp.initialize(m, o, opt_level=opt_level, verbosity=0)
    rng = np.random.default_rng(5)
    for _ in range(steps):
        idx = rng.integers(0, 512, 64)
        loss = F.cross_entropy(m(pyddp.tensor(X[idx])), pyddp.tensor(y[idx]))
        o.zero_grad()
        if opt_level is None:
            loss.backward()
        else:
            with amp.scale_loss(loss, o) as sl:
                sl.backward()
        o.step()
    m.eval()
    Xt, yt = _data(512, seed=0)
    with pyddp.no_grad():
        acc = float((m(pyddp.tensor(Xt)).float()._data.argmax(1) == yt).mean())
    masters = list(amp.master_params(o))
    _amp_state.reset()
    return acc, masters


def test_o1_o2_converge_like_float32():
    acc32, _ = _train(None)
    acc1, _ = _train("O1")
    acc2, masters = _train("O2")
    assert acc32 > 0.9
    assert acc1 >= acc32 - 0.03 and acc2 >= acc32 - 0.03
    assert all(p.dtype == pyddp.float32 for p in masters)


def test_cast_model_outputs():
    m = _net(bn=False)
    amp.initialize(m, opt_level="O2", cast_model_outputs=pyddp.float16, verbosity=0)
    assert m(pyddp.tensor(np.ones((2, 10), np.float32))).dtype == pyddp.float16
    m1 = _net(bn=False)
    amp.initialize(m1, opt_level="O0", cast_model_outputs=pyddp.float64, verbosity=0)
    out = m1(pyddp.tensor(np.ones((2, 10), np.float32)))
    assert out.dtype == pyddp.float64 and m1[0].weight.dtype == pyddp.float32


def test_o2_state_dict_under_wrapper_prefix():
    """state_dict hooks work per module, so a parent (as DDP's 'module.' prefix) sees masters."""
    inner = _net()
    o = pyddp.optim.SGD(inner.parameters(), lr=0.1)
    inner, o = amp.initialize(inner, o, opt_level="O2", verbosity=0)
    outer = nn.Sequential(inner)
    sd = outer.state_dict()
    master = next(iter(amp.master_params(o)))
    np.testing.assert_array_equal(sd["0.0.weight"]._data, master._data)
    assert sd["0.0.weight"].dtype == pyddp.float32
