"""Issue 55's next nn rows against torch 2.13: F.rms_norm / nn.RMSNorm, F.kl_div / nn.KLDivLoss,
F.smooth_l1_loss / nn.SmoothL1Loss, F.huber_loss / nn.HuberLoss, F.binary_cross_entropy /
nn.BCELoss (values and gradients, reductions, errors), nn.Unflatten, and the in-place
activations' functional spellings (F.relu_, F.elu_, ...)."""
import warnings

import numpy as np
import pytest

import pyddp
import pyddp.nn as pnn
import pyddp.nn.functional as PF

torch = pytest.importorskip("torch")
import torch.nn as tnn  # noqa: E402
import torch.nn.functional as TF  # noqa: E402

pytestmark = pytest.mark.timeout(120)

RNG = np.random.default_rng(5556)


def f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def compare(fp, ft, arrays, tol=1e-5):
    P = [pyddp.tensor(a, requires_grad=True) for a in arrays]
    T = [torch.tensor(a, requires_grad=True) for a in arrays]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rp, rt = fp(*P), ft(*T)
    assert tuple(rp.shape) == tuple(rt.shape)
    assert str(rp.dtype) == str(rt.dtype).replace("torch.", "")
    np.testing.assert_allclose(rp.detach().numpy(), rt.detach().numpy(), rtol=tol, atol=tol)
    g = RNG.standard_normal(tuple(rt.shape)).astype(np.float32)
    rp.backward(pyddp.tensor(g))
    rt.backward(torch.tensor(g))
    for p, t in zip(P, T):
        if t.grad is not None:
            np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


def both_raise(fp, ft):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as et:
            ft()
        with pytest.raises(type(et.value)) as ep:
            fp()
    assert str(ep.value) == str(et.value), (str(ep.value), str(et.value))


PROB = (np.abs(f(3, 4)) % 1).astype(np.float32)

CASES = [
    ("rms_norm", lambda F, a, w: F.rms_norm(a, (4,), w), [f(3, 4), f(4)]),
    ("rms_norm_2d", lambda F, a: F.rms_norm(a, [3, 4], eps=1e-2), [f(2, 3, 4)]),
    ("rms_norm_default_eps", lambda F, a: F.rms_norm(a, (4,)), [f(5, 4) * 1e-4]),
]
for _r in ("mean", "sum", "none", "batchmean"):
    CASES.append((f"kl_div_{_r}", lambda F, a, b, r=_r: F.kl_div(a.log_softmax(-1),
                                                              b.softmax(-1), reduction=r),
                  [f(3, 4), f(3, 4)]))
    CASES.append((f"kl_div_log_{_r}", lambda F, a, b, r=_r: F.kl_div(a, b, reduction=r,
                                                                  log_target=True),
                  [f(3, 4), f(3, 4)]))
for _r in ("mean", "sum", "none"):
    for _beta in (1.0, 0.3, 0.0):
        CASES.append((f"smooth_l1_{_r}_{_beta}", lambda F, a, b, r=_r, be=_beta:
                      F.smooth_l1_loss(a, b, reduction=r, beta=be), [f(3, 4), f(3, 4)]))
    for _delta in (1.0, 0.4):
        CASES.append((f"huber_{_r}_{_delta}", lambda F, a, b, r=_r, d=_delta:
                      F.huber_loss(a, b, reduction=r, delta=d), [f(3, 4), f(3, 4)]))
    CASES.append((f"bce_{_r}", lambda F, a, b, r=_r: F.binary_cross_entropy(
        a.sigmoid(), b, reduction=r), [f(3, 4), PROB]))
_W = np.abs(f(4))
CASES.append(("bce_weight", lambda F, a, b: F.binary_cross_entropy(
    a.sigmoid(), b, (pyddp if F is PF else torch).tensor(_W)), [f(3, 4), PROB]))
CASES.append(("smooth_l1_bcast", lambda F, a, b: F.smooth_l1_loss(a, b), [f(3, 4), f(4)]))


@pytest.mark.parametrize("name,fn,arrays", CASES, ids=[c[0] for c in CASES])
def test_functional(name, fn, arrays):
    compare(lambda *a: fn(PF, *a), lambda *a: fn(TF, *a), arrays)


def test_bce_edges_clamped_logs():
    x, t = np.array([0.0, 1.0, 0.5], np.float32), np.array([1.0, 0.0, 1.0], np.float32)
    p = PF.binary_cross_entropy(pyddp.tensor(x), pyddp.tensor(t), reduction="none")
    np.testing.assert_allclose(p.numpy(), TF.binary_cross_entropy(
        torch.tensor(x), torch.tensor(t), reduction="none").numpy())


ERRORS = [
    ("kl_div_reduction", lambda F, m: F.kl_div(m.zeros(2), m.zeros(2), reduction="foo")),
    ("bce_range", lambda F, m: F.binary_cross_entropy(m.tensor([0.5, 2.0]), m.tensor([1.0, 0]))),
    ("bce_size", lambda F, m: F.binary_cross_entropy(m.tensor([0.5, 0.2]),
                                                     m.tensor([1.0, 0, 1]))),
    ("smooth_l1_beta", lambda F, m: F.smooth_l1_loss(m.zeros(2), m.zeros(2), beta=-1)),
    ("huber_delta", lambda F, m: F.huber_loss(m.zeros(2), m.zeros(2), delta=0)),
    ("rms_norm_shape", lambda F, m: F.rms_norm(m.ones(2, 3), (2,))),
    ("rms_norm_int", lambda F, m: F.rms_norm(m.ones(2, 3), 3)),
]


@pytest.mark.parametrize("name,fn", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors(name, fn):
    both_raise(lambda: fn(PF, pyddp), lambda: fn(TF, torch))


def test_warnings_as_torch():
    with pytest.warns(UserWarning, match="'mean' divides the total loss"):
        PF.kl_div(pyddp.zeros(2), pyddp.zeros(2))
    with pytest.warns(UserWarning, match="different to the input size"):
        PF.smooth_l1_loss(pyddp.zeros(2), pyddp.zeros(1))


MODULES = [
    ("RMSNorm", lambda nn: nn.RMSNorm(4), [f(3, 4)]),
    ("RMSNorm_eps", lambda nn: nn.RMSNorm([2, 4], eps=1e-3, elementwise_affine=False),
     [f(3, 2, 4)]),
    ("SmoothL1Loss", lambda nn: nn.SmoothL1Loss(beta=0.5), [f(3, 4), f(3, 4)]),
    ("HuberLoss", lambda nn: nn.HuberLoss(reduction="sum", delta=0.5), [f(3, 4), f(3, 4)]),
    ("KLDivLoss", lambda nn: nn.KLDivLoss(reduction="batchmean", log_target=True),
     [f(3, 4), f(3, 4)]),
    ("Unflatten", lambda nn: nn.Unflatten(1, (2, 3)), [f(4, 6)]),
]


@pytest.mark.parametrize("name,make,arrays", MODULES, ids=[m[0] for m in MODULES])
def test_modules(name, make, arrays):
    mp, mt = make(pnn), make(tnn)
    assert repr(mp) == repr(mt)
    compare(lambda *a: mp(*a), lambda *a: mt(*a), arrays)
    if hasattr(mt, "weight") and mt.weight is not None:
        assert np.array_equal(mp.weight.detach().numpy(), mt.weight.detach().numpy())


def test_bce_loss_module():
    w = np.abs(f(4))
    mp, mt = pnn.BCELoss(weight=pyddp.tensor(w)), tnn.BCELoss(weight=torch.tensor(w))
    compare(lambda a, b: mp(a.sigmoid(), b), lambda a, b: mt(a.sigmoid(), b), [f(3, 4), PROB])
    assert repr(mp) == repr(mt)


def test_unflatten_errors():
    both_raise(lambda: pnn.Unflatten(1, (2, 3))(pyddp.zeros(2, 4)),
               lambda: tnn.Unflatten(1, (2, 3))(torch.zeros(2, 4)))
    with pytest.raises(TypeError):
        pnn.Unflatten(1, 6)


@pytest.mark.parametrize("name,args", [("relu_", ()), ("elu_", (0.5,)),
                                       ("leaky_relu_", (0.2,)), ("hardtanh_", (-0.5, 0.5)),
                                       ("selu_", ()), ("celu_", (0.7,)),
                                       ("threshold_", (0.1, -3.0))])
def test_inplace_activations(name, args):
    a = f(3, 4)
    p, t = pyddp.tensor(a.copy()), torch.tensor(a.copy())
    assert getattr(PF, name)(p, *args) is p
    getattr(TF, name)(t, *args)
    np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-6, atol=1e-6)
    # through a graph: the gradient of the in-place result, as torch's
    xp, xt = pyddp.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    yp, yt = xp * 2, xt * 2
    getattr(PF, name)(yp, *args).sum().backward()
    getattr(TF, name)(yt, *args).sum().backward()
    np.testing.assert_allclose(xp.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        getattr(PF, name)(pyddp.tensor(a, requires_grad=True), *args)
