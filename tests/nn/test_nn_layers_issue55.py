"""Issue 55's layers against torch 2.13: GroupNorm / F.group_norm, BatchNorm3d, F.interpolate and
the Upsample modules (every mode, align_corners, size and scale_factor, recompute_scale_factor),
PixelShuffle / PixelUnshuffle, the padding modules and F.pad's modes; each compares the output,
the input gradient and the parameter gradients for the same input and upstream gradient, and the
errors for bad arguments (type and text)."""
import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
from pyddp.nn import functional as F
from _tiers import FULL

torch = pytest.importorskip("torch")
tnn, TF = torch.nn, torch.nn.functional

pytestmark = pytest.mark.timeout(300)
RNG = np.random.default_rng(55)


def full(*cases):
    """Cases (tuples of the parameters) that run only in the full tier."""
    return [pytest.param(*c, marks=FULL) for c in cases]


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = np.max(np.abs(b)) if b.size else 0.0
    if scale == 0.0:
        return float(np.max(np.abs(a))) if a.size else 0.0
    return float(np.max(np.abs(a - b)) / scale)


def check(fp, ft, *arrays, tol=1e-5, params=()):
    """fp(*pyddp tensors) and ft(*torch tensors): output and every input's gradient agree.
    ``params``: pairs (pyddp tensor, torch tensor) whose gradients agree too."""
    ps = [pyddp.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    yp, yt = fp(*ps), ft(*ts)
    assert tuple(yp.shape) == tuple(yt.shape), (yp.shape, yt.shape)
    assert str(yp.dtype) == str(yt.dtype).replace("torch.", "")
    e = rel_err(yp.detach().numpy(), yt.detach().numpy())
    assert e <= tol, f"forward: {e:.3g}"
    g = RNG.standard_normal(tuple(yt.shape)).astype(arrays[0].dtype)
    yp.backward(pyddp.tensor(g))
    yt.backward(torch.tensor(g))
    for i, (p, t) in enumerate(list(zip(ps, ts)) + list(params)):
        e = rel_err(p.grad.numpy(), t.grad.numpy())
        assert e <= tol, f"gradient {i}: {e:.3g}"
    return yp, yt


def both_raise(fp, ft):
    with pytest.raises(Exception) as et:
        ft()
    with pytest.raises(type(et.value)) as ep:
        fp()
    assert str(ep.value) == str(et.value), (str(ep.value), str(et.value))


def normal(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def copy_params(mp, mt):
    mp.load_state_dict({k: v.detach().numpy().copy() for k, v in mt.state_dict().items()})
    pairs = dict(mt.named_parameters())
    return [(p, pairs[n]) for n, p in mp.named_parameters()]


# --- GroupNorm ----------------------------------------------------------------------------------

@pytest.mark.parametrize("groups,shape,kw", [
    (2, (3, 4, 5), {}), (1, (2, 6, 3, 3), {}), (3, (2, 6, 2, 3), dict(eps=1e-3)),
    (6, (2, 6, 4), dict(affine=False)), (2, (3, 16), dict(bias=False)),
    *full((4, (2, 8, 2, 2, 3), {}), (2, (1, 4, 7), {})),
])
def test_groupnorm_vs_torch(groups, shape, kw):
    mt = tnn.GroupNorm(groups, shape[1], **kw)
    with torch.no_grad():
        for p in mt.parameters():
            p.copy_(torch.randn(p.shape))
    mp = nn.GroupNorm(groups, shape[1], **kw)
    params = copy_params(mp, mt)
    check(mp, mt, normal(*shape), params=params)
    assert repr(mp) == repr(mt)
    assert list(mp.state_dict()) == list(mt.state_dict())


def test_group_norm_functional_and_float64():
    x, w, b = normal(2, 6, 5, dtype=np.float64), normal(6, dtype=np.float64), \
        normal(6, dtype=np.float64)
    check(lambda x, w, b: F.group_norm(x, 3, w, b, 1e-4),
          lambda x, w, b: TF.group_norm(x, 3, w, b, 1e-4), x, w, b, tol=1e-10)
    check(lambda x: F.group_norm(x, 2), lambda x: TF.group_norm(x, 2), normal(3, 4, 2, 2))


def test_group_norm_float16():
    x = normal(2, 4, 3).astype(np.float16)
    yp = F.group_norm(pyddp.tensor(x), 2)
    yt = TF.group_norm(torch.tensor(x).float(), 2).half()
    assert yp.dtype == np.float16
    assert rel_err(yp.numpy(), yt.numpy()) < 2e-3


def test_groupnorm_errors():
    both_raise(lambda: nn.GroupNorm(4, 6), lambda: tnn.GroupNorm(4, 6))
    both_raise(lambda: F.group_norm(pyddp.zeros(2, 6, 4), 4),
               lambda: TF.group_norm(torch.zeros(2, 6, 4), 4))
    both_raise(lambda: F.group_norm(pyddp.zeros(6), 3), lambda: TF.group_norm(torch.zeros(6), 3))
    both_raise(lambda: F.group_norm(pyddp.zeros(2, 6, 4), 3, pyddp.ones(5)),
               lambda: TF.group_norm(torch.zeros(2, 6, 4), 3, torch.ones(5)))
    both_raise(lambda: nn.GroupNorm(2, 6)(pyddp.zeros(2, 4, 3)),
               lambda: tnn.GroupNorm(2, 6)(torch.zeros(2, 4, 3)))


# --- BatchNorm3d --------------------------------------------------------------------------------

@pytest.mark.parametrize("train", [True, False])
def test_batchnorm3d_vs_torch(train):
    mt, mp = tnn.BatchNorm3d(3), nn.BatchNorm3d(3)
    with torch.no_grad():
        mt.weight.copy_(torch.randn(3))
        mt.bias.copy_(torch.randn(3))
        mt.running_mean.copy_(torch.randn(3))
        mt.running_var.copy_(torch.rand(3) + 0.5)
    params = copy_params(mp, mt)
    mt.train(train)
    mp.train(train)
    check(mp, mt, normal(2, 3, 2, 3, 4), params=params)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert rel_err(getattr(mp, name).numpy(), getattr(mt, name).numpy()) < 1e-6, name
    assert repr(mp) == repr(mt)
    both_raise(lambda: mp(pyddp.zeros(2, 3, 4, 4)), lambda: mt(torch.zeros(2, 3, 4, 4)))


# --- interpolate / Upsample -----------------------------------------------------------------------

INTERP = [
    # (input shape, kwargs)
    ((1, 2, 4, 5), dict(scale_factor=2)),
    ((1, 2, 4, 5), dict(size=(7, 3))),
    ((2, 1, 5, 5), dict(scale_factor=0.5)),
    ((1, 1, 4, 6), dict(scale_factor=1.7)),
    ((1, 1, 4, 6), dict(scale_factor=1.7, recompute_scale_factor=True)),
    ((1, 1, 4, 6), dict(scale_factor=(1.5, 0.6))),
    ((1, 1, 3, 3), dict(size=(3, 3))),
    ((1, 1, 5, 4), dict(size=1)),
    ((2, 3, 9), dict(scale_factor=2.5)),
    ((2, 3, 9), dict(size=4)),
    ((1, 2, 3, 4, 5), dict(scale_factor=2)),
    ((1, 2, 3, 4, 5), dict(size=(2, 5, 3))),
]
MODES2D = ["nearest", "nearest-exact", "bilinear", "bicubic", "area"]


def _modes(shape):
    if len(shape) == 3:
        return ["nearest", "nearest-exact", "linear", "area"]
    if len(shape) == 5:
        return ["nearest", "nearest-exact", "trilinear", "area"]
    return MODES2D


@pytest.mark.parametrize("shape,kw", INTERP[:4] + [INTERP[8], INTERP[10]] +
                         full(*INTERP[4:8], INTERP[9], INTERP[11]))
def test_interpolate_vs_torch(shape, kw):
    x = normal(*shape)
    for mode in _modes(shape):
        aligns = [None] if mode in ("nearest", "nearest-exact", "area") else [False, True]
        for ac in aligns:
            check(lambda t: F.interpolate(t, mode=mode, align_corners=ac, **kw),
                  lambda t: TF.interpolate(t, mode=mode, align_corners=ac, **kw), x)


def test_interpolate_float64_and_float16():
    x = normal(1, 2, 5, 4, dtype=np.float64)
    for mode in ("bilinear", "bicubic", "nearest"):
        check(lambda t: F.interpolate(t, scale_factor=1.5, mode=mode),
              lambda t: TF.interpolate(t, scale_factor=1.5, mode=mode), x, tol=1e-12)
    h = normal(1, 1, 3, 3).astype(np.float16)
    yp = F.interpolate(pyddp.tensor(h), scale_factor=2, mode="bilinear")
    yt = TF.interpolate(torch.tensor(h).float(), scale_factor=2, mode="bilinear")
    assert yp.dtype == np.float16
    assert rel_err(yp.numpy(), yt.numpy()) < 2e-3


def test_upsample_modules_vs_torch():
    x = normal(2, 3, 4, 5)
    for mp, mt in [(nn.Upsample(scale_factor=2), tnn.Upsample(scale_factor=2)),
                   (nn.Upsample(size=(5, 7), mode="bilinear"),
                    tnn.Upsample(size=(5, 7), mode="bilinear")),
                   (nn.Upsample(scale_factor=(2, 3), mode="bicubic", align_corners=True),
                    tnn.Upsample(scale_factor=(2, 3), mode="bicubic", align_corners=True)),
                   (nn.UpsamplingNearest2d(scale_factor=3),
                    tnn.UpsamplingNearest2d(scale_factor=3)),
                   (nn.UpsamplingBilinear2d(size=(6, 9)), tnn.UpsamplingBilinear2d(size=(6, 9)))]:
        check(mp, mt, x)
        assert repr(mp) == repr(mt)
    with pytest.warns(UserWarning, match="upsample` is deprecated"):
        F.upsample(pyddp.zeros(1, 1, 2, 2), scale_factor=2)


@pytest.mark.parametrize("call", [
    lambda m, F: F.interpolate(m.zeros(1, 1, 4, 4), size=3, scale_factor=2),
    lambda m, F: F.interpolate(m.zeros(1, 1, 4, 4)),
    lambda m, F: F.interpolate(m.zeros(1, 1, 4, 4), scale_factor=2, align_corners=True),
    lambda m, F: F.interpolate(m.zeros(1, 1, 4), scale_factor=2, mode="bilinear"),
    lambda m, F: F.interpolate(m.zeros(1, 1, 4, 4), scale_factor=2, mode="linear"),
    lambda m, F: F.interpolate(m.zeros(1, 1, 4, 4), size=(2, 3, 4)),
    lambda m, F: F.interpolate(m.zeros(1, 1, 4, 4), scale_factor=(2, 3, 4)),
    lambda m, F: F.interpolate(m.zeros(1, 1, 4, 4), scale_factor=2, mode="foo"),
    lambda m, F: F.interpolate(m.zeros(4, 4), scale_factor=2),
    lambda m, F: F.interpolate(m.zeros(1, 1, 4, 4), scale_factor=0.1),
], ids=["both", "neither", "align_nearest", "bilinear3d", "linear4d", "size_len", "scale_len",
        "mode", "2d", "empty_output"])
def test_interpolate_errors(call):
    both_raise(lambda: call(pyddp, F), lambda: call(torch, TF))


# --- pixel shuffle --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,r", [((1, 8, 3, 2), 2), ((2, 9, 2, 2), 3), ((4, 4, 5), 2),
                                     *full(((2, 2, 12, 3, 2), 2))])
def test_pixel_shuffle_vs_torch(shape, r):
    check(nn.PixelShuffle(r), tnn.PixelShuffle(r), normal(*shape))
    check(lambda t: F.pixel_shuffle(t, r), lambda t: TF.pixel_shuffle(t, r), normal(*shape))
    un = shape[:-3] + (shape[-3], shape[-2] * r, shape[-1] * r)
    check(nn.PixelUnshuffle(r), tnn.PixelUnshuffle(r), normal(*un))
    assert repr(nn.PixelShuffle(r)) == repr(tnn.PixelShuffle(r))
    assert repr(nn.PixelUnshuffle(r)) == repr(tnn.PixelUnshuffle(r))


def test_pixel_shuffle_errors():
    both_raise(lambda: F.pixel_shuffle(pyddp.zeros(1, 5, 2, 2), 2),
               lambda: TF.pixel_shuffle(torch.zeros(1, 5, 2, 2), 2))
    both_raise(lambda: F.pixel_unshuffle(pyddp.zeros(1, 1, 3, 2), 2),
               lambda: TF.pixel_unshuffle(torch.zeros(1, 1, 3, 2), 2))
    both_raise(lambda: F.pixel_unshuffle(pyddp.zeros(1, 1, 2, 3), 2),
               lambda: TF.pixel_unshuffle(torch.zeros(1, 1, 2, 3), 2))
    both_raise(lambda: F.pixel_shuffle(pyddp.zeros(5, 2), 2),
               lambda: TF.pixel_shuffle(torch.zeros(5, 2), 2))


# --- padding -----------------------------------------------------------------------------------

PADS = [
    ("ConstantPad1d", ((1, 2), 1.5), (2, 3, 4)), ("ConstantPad2d", (1, -0.5), (1, 2, 3, 4)),
    ("ConstantPad3d", ((1, 0, 2, 1, 0, 1), 2.0), (1, 2, 2, 3, 2)),
    ("ZeroPad1d", (2,), (3, 4)), ("ZeroPad2d", ((1, 2, 0, 3),), (2, 3, 4)),
    ("ZeroPad3d", (1,), (1, 1, 2, 2, 2)),
    ("ReflectionPad1d", (2,), (2, 3, 4)), ("ReflectionPad1d", ((3, 1),), (3, 4)),
    ("ReflectionPad2d", ((1, 2, 2, 1),), (1, 2, 3, 4)), ("ReflectionPad2d", (1,), (2, 3, 3)),
    ("ReflectionPad3d", (1,), (1, 1, 2, 3, 4)),
    ("ReplicationPad1d", ((2, 3),), (2, 3, 4)), ("ReplicationPad2d", ((1, 0, 3, 2),), (1, 2, 3, 4)),
    ("ReplicationPad3d", ((1, 2, 0, 1, 2, 0),), (1, 2, 2, 3, 2)),
    ("CircularPad1d", ((2, 3),), (2, 3, 4)), ("CircularPad2d", ((1, 2, 3, 1),), (1, 2, 3, 4)),
    ("CircularPad3d", (1,), (1, 1, 2, 3, 2)),
    ("ReflectionPad2d", ((-1, 1, 0, 2),), (1, 1, 3, 4)),
    ("ReplicationPad1d", ((-1, 2),), (1, 3, 4)),
    ("CircularPad1d", ((2, -1),), (1, 3, 4)),
]


@pytest.mark.parametrize("name,args,shape", PADS, ids=[f"{p[0]}-{i}" for i, p in enumerate(PADS)])
def test_padding_modules_vs_torch(name, args, shape):
    mp, mt = getattr(nn, name)(*args), getattr(tnn, name)(*args)
    check(mp, mt, normal(*shape))
    assert repr(mp) == repr(mt)


@pytest.mark.parametrize("call", [
    lambda F, x: F.pad(x(1, 2, 3), (3, 3), mode="reflect"),
    lambda F, x: F.pad(x(1, 2, 3, 4), (1, 1, 3, 3), mode="reflect"),
    lambda F, x: F.pad(x(1, 2, 3, 4), (4, 4, 0, 0), mode="reflect"),
    lambda F, x: F.pad(x(1, 2, 3), (4, 4), mode="circular"),
    lambda F, x: F.pad(x(1, 2, 0), (1, 1), mode="replicate"),
    lambda F, x: F.pad(x(3), (1, 1), mode="reflect"),
    lambda F, x: F.pad(x(1, 2, 3), (1, 1), mode="foo"),
    lambda F, x: F.pad(x(1, 2, 3), (1, 1, 1)),
    lambda F, x: F.pad(x(1, 2, 3), (1, 1), mode="reflect", value=2),
    lambda F, x: F.pad(x(3), (1, 1, 1, 1, 1, 1, 1, 1)),
], ids=["reflect1d", "reflect2d_h", "reflect2d_w", "circular", "replicate_empty",
        "reflect_1d_input", "mode", "odd", "value", "too_long"])
def test_pad_errors(call):
    both_raise(lambda: call(F, pyddp.zeros), lambda: call(TF, torch.zeros))


# --- weight_norm ---------------------------------------------------------------------------------

def _twin(make_p, make_t):
    mt = make_t()
    mp = make_p()
    mp.load_state_dict({k: v.detach().numpy().copy() for k, v in mt.state_dict().items()})
    return mp, mt


def _grads_match(mp, mt, x, tol=1e-5):
    yp, yt = mp(pyddp.tensor(x)), mt(torch.tensor(x))
    assert rel_err(yp.detach().numpy(), yt.detach().numpy()) <= tol
    g = normal(*yt.shape)
    yp.backward(pyddp.tensor(g))
    yt.backward(torch.tensor(g))
    tp = dict(mt.named_parameters())
    names = [n for n, _ in mp.named_parameters()]
    assert names == list(tp)
    for n, p in mp.named_parameters():
        assert rel_err(p.grad.numpy(), tp[n].grad.numpy()) <= tol, n


@pytest.mark.parametrize("layer,dim,shape", [
    ("linear", 0, (4, 3)), ("linear", 1, (4, 3)), ("linear", None, (4, 3)),
    ("conv", 0, (2, 2, 5, 5)), ("conv", 1, (2, 2, 5, 5)),
])
def test_weight_norm_vs_torch(layer, dim, shape):
    def make(lib):
        m = lib.Linear(3, 5) if layer == "linear" else lib.Conv2d(2, 3, 3)
        return m
    torch.manual_seed(0)
    mt = tnn.utils.parametrizations.weight_norm(make(tnn), dim=dim)
    mp = nn.utils.parametrizations.weight_norm(make(nn), dim=dim)
    assert list(mp.state_dict()) == list(mt.state_dict())
    mp.load_state_dict({k: v.detach().numpy().copy() for k, v in mt.state_dict().items()})
    assert repr(mp) == repr(mt)
    assert type(mp).__name__ == type(mt).__name__
    _grads_match(mp, mt, normal(*shape))
    # the legacy hook-based one: weight_g / weight_v
    with pytest.warns(FutureWarning, match="weight_norm` is deprecated"):
        mp2 = nn.utils.weight_norm(make(nn), dim=dim)
    with pytest.warns(FutureWarning):
        mt2 = tnn.utils.weight_norm(make(tnn), dim=dim)
    assert list(mp2.state_dict()) == list(mt2.state_dict())
    assert [tuple(v.shape) for v in mp2.state_dict().values()] == \
        [tuple(v.shape) for v in mt2.state_dict().values()]
    mp2.load_state_dict({k: v.detach().numpy().copy() for k, v in mt2.state_dict().items()})
    _grads_match(mp2, mt2, normal(*shape))


def test_weight_norm_registration_values_remove_and_errors():
    lt = tnn.Linear(3, 4)
    lp = nn.Linear(3, 4)
    lp.load_state_dict({k: v.detach().numpy().copy() for k, v in lt.state_dict().items()})
    w0 = lp.weight.detach().numpy().copy()
    with pytest.warns(FutureWarning):
        tnn.utils.weight_norm(lt)
        nn.utils.weight_norm(lp)
    assert rel_err(lp.weight_g.detach().numpy(), lt.weight_g.detach().numpy()) < 1e-6
    assert rel_err(lp.weight.detach().numpy(), w0) < 1e-6
    with pytest.warns(FutureWarning):
        both_raise(lambda: nn.utils.weight_norm(lp), lambda: tnn.utils.weight_norm(lt))
    nn.utils.remove_weight_norm(lp)
    assert [n for n, _ in lp.named_parameters()] == ["bias", "weight"]
    assert rel_err(lp.weight.detach().numpy(), w0) < 1e-6
    both_raise(lambda: nn.utils.remove_weight_norm(nn.Linear(2, 2)),
               lambda: tnn.utils.remove_weight_norm(tnn.Linear(2, 2)))
    # parametrizations: remove keeps the value and the class comes back
    pp = nn.utils.parametrizations.weight_norm(nn.Linear(3, 4))
    w1 = pp.weight.detach().numpy().copy()
    nn.utils.parametrize.remove_parametrizations(pp, "weight")
    assert type(pp) is nn.Linear and "parametrizations" not in pp._modules
    assert isinstance(pp.weight, nn.Parameter)
    np.testing.assert_allclose(pp.weight.detach().numpy(), w1, rtol=1e-6)
    both_raise(lambda: nn.utils.parametrize.remove_parametrizations(nn.Linear(2, 2), "weight"),
               lambda: tnn.utils.parametrize.remove_parametrizations(tnn.Linear(2, 2), "weight"))


def test_parametrizations_weight_norm_loads_legacy_checkpoints():
    with pytest.warns(FutureWarning):
        old = tnn.utils.weight_norm(tnn.Linear(3, 2))
    new = nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))
    new.load_state_dict({k: v.detach().numpy().copy() for k, v in old.state_dict().items()})
    x = normal(4, 3)
    assert rel_err(new(pyddp.tensor(x)).detach().numpy(), old(torch.tensor(x)).detach().numpy()) \
        < 1e-6


def test_register_parametrization_single_tensor_and_cached():
    class Sym(nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(-1, -2)

    class TSym(tnn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(-1, -2)
    mp, mt = _twin(lambda: nn.Linear(3, 3), lambda: tnn.Linear(3, 3))
    nn.utils.parametrize.register_parametrization(mp, "weight", Sym())
    tnn.utils.parametrize.register_parametrization(mt, "weight", TSym())
    assert list(mp.state_dict()) == list(mt.state_dict())
    assert nn.utils.parametrize.is_parametrized(mp, "weight")
    _grads_match(mp, mt, normal(2, 3))
    with nn.utils.parametrize.cached():
        assert mp.weight is mp.weight
    assert mp.weight is not mp.weight


# --- no NumPy warnings from inf / NaN (a skipped fp16 step prints nothing, as torch) --------------

class _Net(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = act
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        x = getattr(F, self.act)(self.conv(x))
        x = self.ln(self.gn(self.bn(x)))
        x = F.avg_pool2d(F.interpolate(x, scale_factor=2, mode="bilinear"), 2)
        return self.fc(F.dropout(x, 0.1).flatten(1))


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("act", ["gelu", "mish"] + [
    pytest.param(a, marks=FULL) for a in ("relu", "silu", "softplus", "hardswish", "softsign",
                                          "elu", "logsigmoid")])
def test_inf_nan_forward_backward_is_silent(dtype, act):
    x = RNG.standard_normal((4, 3, 8, 8)).astype(dtype)
    x[0, 0, 0, 0], x[1, 1, 1, 1], x[2, 0, 0, 0], x[3] = np.inf, np.nan, -np.inf, 6e4
    m = _Net(act)
    if dtype == np.float16:
        m = m.half()
    y = m(pyddp.tensor(x, requires_grad=True))
    t = pyddp.randint(0, 10, (4,))
    for loss in (F.cross_entropy(y, t), F.mse_loss(y, pyddp.zeros_like(y)),
                 F.l1_loss(y, pyddp.zeros_like(y)), F.nll_loss(F.log_softmax(y, 1), t),
                 F.binary_cross_entropy_with_logits(y, pyddp.ones_like(y))):
        loss.backward(retain_graph=True)
    assert not np.isfinite(m.conv.weight.grad.numpy()).all()


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("autocast", [False, True])
def test_gradscaler_overflowing_step_is_silent(autocast):
    import contextlib

    from pyddp import amp
    lin = nn.Linear(3, 2)
    opt = pyddp.optim.SGD(lin.parameters(), lr=0.1)
    opt._step_supports_amp_scaling = False
    scaler = amp.GradScaler("cpu", init_scale=2.0 ** 127)
    before = lin.weight.detach().numpy().copy()
    x = pyddp.tensor(np.full((4, 3), 1e3, np.float32))
    ctx = pyddp.autocast(device_type="cpu", dtype=pyddp.float16) if autocast else \
        contextlib.nullcontext()
    with ctx:
        loss = F.mse_loss(lin(x), pyddp.zeros(4, 2))
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    np.testing.assert_array_equal(lin.weight.detach().numpy(), before)   # skipped
    assert scaler.get_scale() == 2.0 ** 126
