"""pyddp.nn losses against torch 2.13: values and gradients (input, and target where torch has one).

Every case runs the loss in torch and in pyddp on the same float32 arrays, back-propagates the same
upstream gradient and compares to a relative error of 1e-5 (max|pyddp - torch| / max|torch|).
Module and functional forms are both covered.  Error cases compare the exception type and message.
"""
import warnings

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
import pyddp.nn.functional as F

RTOL = 1e-5
torch = None  # imported by the fixture below, so that collecting this file never imports torch


@pytest.fixture(autouse=True)
def _import_torch():
    global torch
    torch = pytest.importorskip("torch")


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = np.max(np.abs(b)) if b.size else 0.0
    if b.size and np.all(np.isnan(b)):
        assert np.all(np.isnan(a))
        return 0.0
    if scale == 0.0:
        return float(np.max(np.abs(a))) if a.size else 0.0
    return float(np.max(np.abs(a - b)) / scale)


def assert_close(a, b, what="", rtol=RTOL):
    e = rel_err(a, b)
    assert e <= rtol, f"{what}: relative error {e:.3g} > {rtol}"


def _rng(seed):
    return np.random.default_rng(seed)


def compare(tfn, pfn, x, target, *, target_grad=False, seed=7, rtol=RTOL):
    """Run loss(x, target) in both libraries, backward with a random upstream gradient."""
    xt = torch.tensor(x, requires_grad=True)
    xp = pyddp.tensor(x, requires_grad=True)
    tt = torch.tensor(target, requires_grad=target_grad)
    tp = pyddp.tensor(target, requires_grad=target_grad)
    lt = tfn(xt, tt)
    lp = pfn(xp, tp)
    assert tuple(lp.shape) == tuple(lt.shape)
    assert lp.dtype == lt.detach().numpy().dtype
    assert_close(lp.numpy(), lt.detach().numpy(), "loss", rtol)
    g = _rng(seed).uniform(0.5, 1.5, tuple(lt.shape)).astype(x.dtype)
    lt.backward(torch.tensor(g))
    lp.backward(pyddp.tensor(g))
    assert_close(xp.grad.numpy(), xt.grad.numpy(), "input grad", rtol)
    if target_grad:
        assert_close(tp.grad.numpy(), tt.grad.numpy(), "target grad", rtol)
    return lp, lt


def _logits(*shape, seed=0, scale=2.0):
    return (_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _labels(n_classes, shape, seed=1, ignore=None, frac=0.3):
    y = _rng(seed).integers(0, n_classes, size=shape).astype(np.int64)
    if ignore is not None:
        mask = _rng(seed + 1).random(shape) < frac
        y = np.where(mask, ignore, y)
    return y


REDUCTIONS = ["mean", "sum", "none"]


# ----------------------------------------------------------------------------------------------
# cross entropy

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("shape", [(8, 5), (3, 5, 4, 2), (5,)], ids=["NC", "NCHW", "C"])
def test_cross_entropy_index_targets_vs_torch(shape, smoothing, weighted, reduction):
    C = shape[0] if len(shape) == 1 else shape[1]
    x = _logits(*shape)
    tshape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    y = _labels(C, tshape, ignore=-100 if len(shape) > 1 else None)
    w = _rng(3).uniform(0.2, 2.0, C).astype(np.float32) if weighted else None
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    tmod = torch.nn.CrossEntropyLoss(weight=None if w is None else torch.tensor(w), **kw)
    pmod = nn.CrossEntropyLoss(weight=None if w is None else pyddp.tensor(w), **kw)
    compare(tmod, pmod, x, y)
    # the functional form with a custom ignore_index
    if len(shape) > 1:
        y2 = _labels(C, tshape, seed=4, ignore=2, frac=0.0)
        compare(lambda a, b: torch.nn.functional.cross_entropy(
                    a, b, weight=None if w is None else torch.tensor(w), ignore_index=2, **kw),
                lambda a, b: F.cross_entropy(a, b, weight=w, ignore_index=2, **kw), x, y2)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
@pytest.mark.parametrize("shape", [(6, 4), (2, 4, 3, 3)], ids=["NC", "NCHW"])
def test_cross_entropy_probability_targets_vs_torch(shape, smoothing, weighted, reduction):
    C = shape[1]
    x = _logits(*shape)
    p = _rng(5).random(shape).astype(np.float32)
    p /= p.sum(axis=1, keepdims=True)
    w = _rng(3).uniform(0.2, 2.0, C).astype(np.float32) if weighted else None
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    compare(lambda a, b: torch.nn.functional.cross_entropy(
                a, b, weight=None if w is None else torch.tensor(w), **kw),
            lambda a, b: F.cross_entropy(a, b, weight=None if w is None else pyddp.tensor(w), **kw),
            x, p, target_grad=True)


def test_cross_entropy_extreme_logits_and_all_ignored_vs_torch():
    x = np.array([[1000.0, -1000.0, 0.0], [-50.0, 80.0, 79.0]], dtype=np.float32)
    y = np.array([1, 2], dtype=np.int64)
    compare(torch.nn.CrossEntropyLoss(), nn.CrossEntropyLoss(), x, y)
    # every target ignored: the mean is 0/0 = nan in both
    y = np.array([-100, -100], dtype=np.int64)
    lp = F.cross_entropy(pyddp.tensor(x), pyddp.tensor(y))
    lt = torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor(y))
    assert np.isnan(lp.numpy()) and torch.isnan(lt)
    assert float(F.cross_entropy(pyddp.tensor(x), pyddp.tensor(y), reduction="sum").numpy()) == 0


def test_cross_entropy_float64_tight_vs_torch():
    x = _logits(16, 7).astype(np.float64)
    y = _labels(7, (16,), ignore=-100)
    w = _rng(3).uniform(0.2, 2.0, 7)
    compare(torch.nn.CrossEntropyLoss(weight=torch.tensor(w), label_smoothing=0.1),
            nn.CrossEntropyLoss(weight=pyddp.tensor(w), label_smoothing=0.1), x, y, rtol=1e-12)


def test_cross_entropy_errors_match_torch():
    x = _logits(4, 3)
    cases = [
        (np.array([0, 1, 3, 0]), dict()),                 # target out of bounds
        (np.array([0, 1, 2]), dict()),                    # batch size mismatch
        (np.array([[0, 1, 2, 0]]), dict()),               # batch size mismatch (2-D target)
        (np.array([[0, 1], [1, 2], [2, 0], [0, 0]]), dict()),  # multi-target
        (np.array([0, 1, 2, 0]), dict(reduction="avg")),  # bad reduction
        (np.array([0, 1, 2, 0]), dict(label_smoothing=1.5)),
        (np.array([0.0, 1, 2, 0], dtype=np.float32), dict()),  # float target of the wrong shape
        (np.array([0.0, 1, 2, 0]), dict()),
    ]
    for y, kw in cases:
        for tf, pf in [(torch.nn.functional.cross_entropy, F.cross_entropy),
                       (torch.nn.functional.nll_loss, F.nll_loss)]:
            if "label_smoothing" in kw and pf is F.nll_loss:
                continue
            with pytest.raises(Exception) as et:
                tf(torch.tensor(x), torch.tensor(y), **kw)
            with pytest.raises(Exception) as ep:
                pf(pyddp.tensor(x), pyddp.tensor(y), **kw)
            assert type(ep.value) is type(et.value), (y, kw, ep.value, et.value)
            assert str(ep.value) == str(et.value), (y, kw)
    with pytest.raises(RuntimeError, match="weight tensor should be defined"):
        F.cross_entropy(pyddp.tensor(x), pyddp.tensor(np.array([0, 1, 2, 0])),
                        weight=np.ones(4, np.float32))


def test_cross_entropy_half_and_autocast_vs_torch():
    x = _logits(8, 5).astype(np.float16)
    y = _labels(5, (8,))
    xp = pyddp.tensor(x, requires_grad=True)
    loss = F.cross_entropy(xp, pyddp.tensor(y))
    assert loss.dtype == np.float16
    ref = torch.nn.functional.cross_entropy(torch.tensor(x.astype(np.float32)), torch.tensor(y))
    assert abs(float(loss.numpy()) - float(ref)) < 2e-3 * abs(float(ref))
    loss.backward()
    assert xp.grad.dtype == np.float16
    with pyddp.autocast(dtype=pyddp.float16):
        loss32 = F.cross_entropy(pyddp.tensor(x), pyddp.tensor(y))
    assert loss32.dtype == np.float32
    assert_close(loss32.numpy(), ref.numpy(), "autocast loss")


# ----------------------------------------------------------------------------------------------
# nll

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(9, 4), (2, 4, 3, 5), (4,)], ids=["NC", "NCHW", "C"])
def test_nll_loss_vs_torch(shape, weighted, reduction):
    C = shape[0] if len(shape) == 1 else shape[1]
    x = _logits(*shape)
    tshape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    y = _labels(C, tshape, ignore=-100 if len(shape) > 1 else None)
    w = _rng(3).uniform(0.2, 2.0, C).astype(np.float32) if weighted else None
    tmod = torch.nn.NLLLoss(weight=None if w is None else torch.tensor(w), reduction=reduction)
    pmod = nn.NLLLoss(weight=None if w is None else pyddp.tensor(w), reduction=reduction)
    compare(tmod, pmod, x, y)


def test_log_softmax_then_nll_equals_cross_entropy_vs_torch():
    x = _logits(10, 6)
    y = _labels(6, (10,))
    a = F.nll_loss(F.log_softmax(pyddp.tensor(x), dim=1), pyddp.tensor(y))
    b = F.cross_entropy(pyddp.tensor(x), pyddp.tensor(y))
    assert_close(a.numpy(), b.numpy(), "nll(log_softmax) vs cross_entropy")
    compare(lambda a, b: torch.nn.functional.nll_loss(torch.log_softmax(a, 1), b),
            lambda a, b: F.nll_loss(F.log_softmax(a, dim=1), b), x, y)


# ----------------------------------------------------------------------------------------------
# regression and binary losses

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", ["MSELoss", "L1Loss"])
def test_mse_l1_vs_torch(name, reduction):
    x = _logits(4, 3, 5)
    t = _logits(4, 3, 5, seed=9)
    t[0, 0, 0] = x[0, 0, 0]  # a zero difference: L1's gradient is 0 there, as torch's sign
    compare(getattr(torch.nn, name)(reduction=reduction), getattr(nn, name)(reduction=reduction),
            x, t, target_grad=True)


def test_mse_broadcast_warns_like_torch():
    x = _logits(4, 3)
    t = _logits(3, seed=2)
    with warnings.catch_warnings(record=True) as wt:
        warnings.simplefilter("always")
        torch.nn.functional.mse_loss(torch.tensor(x), torch.tensor(t))
    with pytest.warns(UserWarning) as wp:
        F.mse_loss(pyddp.tensor(x), pyddp.tensor(t))
    torch_msg = str(wt[0].message).replace("torch.Size([", "(").replace("])", ")")
    assert str(wp[0].message) == torch_msg.replace("(3)", "(3,)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compare(torch.nn.MSELoss(), nn.MSELoss(), x, t, target_grad=True)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weight,pos_weight", [(False, False), (True, False), (False, True),
                                               (True, True)])
def test_bce_with_logits_vs_torch(weight, pos_weight, reduction):
    x = _logits(6, 4, scale=4.0)
    x[0, 0], x[0, 1] = 60.0, -60.0  # saturated logits stay finite
    t = _rng(4).random((6, 4)).astype(np.float32)
    t[1] = (t[1] > 0.5)
    w = _rng(5).uniform(0.5, 2, (6, 4)).astype(np.float32) if weight else None
    pw = _rng(6).uniform(0.5, 3, 4).astype(np.float32) if pos_weight else None
    tmod = torch.nn.BCEWithLogitsLoss(weight=None if w is None else torch.tensor(w),
                                      pos_weight=None if pw is None else torch.tensor(pw),
                                      reduction=reduction)
    pmod = nn.BCEWithLogitsLoss(weight=None if w is None else pyddp.tensor(w),
                                pos_weight=None if pw is None else pyddp.tensor(pw),
                                reduction=reduction)
    compare(tmod, pmod, x, t, target_grad=True)


def test_bce_shape_mismatch_and_bad_reduction_vs_torch():
    with pytest.raises(ValueError, match=r"Target size \(\(3,\)\) must be the same as input size"):
        F.binary_cross_entropy_with_logits(pyddp.zeros(2), pyddp.zeros(3))
    with pytest.raises(ValueError, match="avg is not a valid value for reduction"):
        F.mse_loss(pyddp.zeros(2), pyddp.zeros(2), reduction="avg")
