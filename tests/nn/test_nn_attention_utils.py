"""nn.MultiheadAttention, Dropout1d/2d/3d, tril/triu, nn.utils (clip_grad_norm_, clip_grad_value_,
parameters_to_vector, vector_to_parameters) and nn.DataParallel against torch 2.13 (single process).

MultiheadAttention gets torch's weights through state_dict and must give torch's outputs,
attention weights and gradients (input and parameters) in every mode.
"""
import warnings

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn

torch = pytest.importorskip("torch")


def _copy(pm, tm):
    sd = {k: v.detach().numpy().copy() for k, v in tm.state_dict().items()}
    assert list(sd) == list(pm.state_dict())
    pm.load_state_dict({k: pyddp.tensor(v) for k, v in sd.items()})


MHA_CASES = [
    ("plain", {}, {}),
    ("batch_first", {"batch_first": True}, {}),
    ("kdim_vdim", {"kdim": 5, "vdim": 3}, {}),
    ("bias_kv_zero_attn", {"add_bias_kv": True, "add_zero_attn": True}, {}),
    ("no_bias_no_weights", {"bias": False}, {"need_weights": False}),
    ("per_head", {"batch_first": True}, {"average_attn_weights": False}),
    ("bool_mask", {}, {"mask": "bool"}),
    ("mask3d", {}, {"mask": "3d"}),
    ("causal", {"batch_first": True}, {"mask": "causal", "is_causal": True}),
    ("causal_no_weights", {"batch_first": True},
     {"mask": "causal", "is_causal": True, "need_weights": False, "no_kpm": True}),
    ("unbatched", {}, {"unbatched": True}),
]


@pytest.mark.parametrize("name,kw,call", MHA_CASES, ids=[c[0] for c in MHA_CASES])
def test_multihead_attention_matches_torch(name, kw, call):
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    E, H, L, S, N = 8, 2, 4, 4 if call.get("mask") == "causal" else 6, 3
    tm = torch.nn.MultiheadAttention(E, H, **kw)
    pm = nn.MultiheadAttention(E, H, **kw)
    _copy(pm, tm)
    assert repr(pm) == repr(tm)
    bf = kw.get("batch_first", False)
    kd, vd = kw.get("kdim", E), kw.get("vdim", E)
    if call.get("unbatched"):
        shapes = [(L, E), (S, kd), (S, vd)]
    elif bf:
        shapes = [(N, L, E), (N, S, kd), (N, S, vd)]
    else:
        shapes = [(L, N, E), (S, N, kd), (S, N, vd)]
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    kpm = None
    if not call.get("no_kpm"):
        kpm = np.zeros((S,) if call.get("unbatched") else (N, S), bool)
        kpm[..., -1] = True
    mask = call.get("mask")
    if mask == "bool":
        am = rng.random((L, S)) < 0.2
        am[:, 0] = False
    elif mask == "3d":
        am = rng.standard_normal((N * H, L, S)).astype(np.float32)
    elif mask == "causal":
        am = np.triu(np.ones((L, S), bool), 1)
    else:
        am = rng.standard_normal((L, S)).astype(np.float32)
    extra = {k2: call[k2] for k2 in ("need_weights", "average_attn_weights", "is_causal")
             if k2 in call}
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    pq, pk, pv = (pyddp.tensor(a, requires_grad=True) for a in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to, tw = tm(tq, tk, tv, key_padding_mask=None if kpm is None else torch.tensor(kpm),
                    attn_mask=torch.tensor(am), **extra)
    po, pw = pm(pq, pk, pv, key_padding_mask=None if kpm is None else pyddp.tensor(kpm),
                attn_mask=pyddp.tensor(am), **extra)
    assert tuple(po.shape) == tuple(to.shape)
    np.testing.assert_allclose(po.numpy(), to.detach().numpy(), rtol=1e-5, atol=1e-6)
    if tw is None:
        assert pw is None
    else:
        assert tuple(pw.shape) == tuple(tw.shape)
        np.testing.assert_allclose(pw.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(to.shape).astype(np.float32)
    to.backward(torch.tensor(g))
    po.backward(pyddp.tensor(g))
    for a, b in ((pq, tq), (pk, tk), (pv, tv)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-6)
    for (n1, p1), (n2, p2) in zip(pm.named_parameters(), tm.named_parameters()):
        assert n1 == n2
        np.testing.assert_allclose(p1.grad.numpy(), p2.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=n1)


def test_multihead_attention_init_dropout_and_errors():
    pyddp.manual_seed(0)
    m = nn.MultiheadAttention(8, 4, dropout=0.5, batch_first=True)
    w = m.in_proj_weight.numpy()
    bound = np.sqrt(6.0 / (8 + 24))  # xavier_uniform on (3E, E)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.5 * bound
    assert not m.in_proj_bias.numpy().any() and not m.out_proj.bias.numpy().any()
    x = pyddp.randn(2, 5, 8)
    m.eval()
    a1, w1 = m(x, x, x)
    a2, _ = m(x, x, x)
    np.testing.assert_array_equal(a1.numpy(), a2.numpy())  # no dropout in eval
    np.testing.assert_allclose(w1.numpy().sum(-1), 1.0, rtol=1e-5)
    m.train()
    _, wt = m(x, x, x)
    assert (wt.numpy() == 0).any() or not np.allclose(wt.numpy(), w1.numpy())
    with pytest.raises(AssertionError, match="divisible"):
        nn.MultiheadAttention(6, 4)
    with pytest.raises(ValueError, match="greater than 0"):
        nn.MultiheadAttention(0, 1)
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        m(x, x, x, is_causal=True)
    with pytest.raises(RuntimeError, match="The shape of the 2D attn_mask"):
        m(x, x, x, attn_mask=pyddp.zeros(3, 3))
    with pytest.raises(TypeError, match="pyddp Tensor"):
        nn.functional.multi_head_attention_forward(
            np.zeros((2, 1, 8)), x, x, 8, 4, m.in_proj_weight, None, None, None, False, 0.0,
            m.out_proj.weight, None)


def test_scaled_dot_product_attention_matches_torch():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 3, 5, 4)).astype(np.float32) for _ in range(3))
    bm = rng.random((5, 5)) < 0.7
    bm[:, 0] = True
    for kw in ({}, {"is_causal": True}, {"attn_mask": "bool"}, {"scale": 0.3}):
        tkw, pkw = dict(kw), dict(kw)
        if kw.get("attn_mask") == "bool":
            tkw["attn_mask"], pkw["attn_mask"] = torch.tensor(bm), pyddp.tensor(bm)
        want = torch.nn.functional.scaled_dot_product_attention(
            *(torch.tensor(a) for a in (q, k, v)), **tkw)
        got = nn.functional.scaled_dot_product_attention(*(pyddp.tensor(a) for a in (q, k, v)),
                                                         **pkw)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", ["tril", "triu"])
def test_tril_triu_match_torch(fn):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 4, 5)).astype(np.float32)
    g = rng.standard_normal(a.shape).astype(np.float32)
    for d in (-2, 0, 1, 7):
        t = torch.tensor(a, requires_grad=True)
        p = pyddp.tensor(a, requires_grad=True)
        tout = getattr(torch, fn)(t, d)
        pout = getattr(pyddp, fn)(p, d)
        np.testing.assert_array_equal(pout.numpy(), tout.detach().numpy())
        np.testing.assert_array_equal(getattr(p, fn)(d).numpy(), tout.detach().numpy())
        tout.backward(torch.tensor(g))
        pout.backward(pyddp.tensor(g))
        np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())
        x = pyddp.tensor(a)
        assert getattr(x, fn + "_")(d) is x
        np.testing.assert_array_equal(x.numpy(), tout.detach().numpy())
    ints = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(getattr(pyddp, fn)(pyddp.tensor(ints)).numpy(),
                                  getattr(torch, fn)(torch.tensor(ints)).numpy())
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        getattr(pyddp, fn)(pyddp.ones(3))
    with pytest.raises(TypeError, match="diagonal"):
        getattr(pyddp, fn)(pyddp.ones(3, 3), 1.5)


def _grad_models(seed=0):
    torch.manual_seed(seed)
    tm = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    pm = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    _copy(pm, tm)
    x = np.random.default_rng(seed).standard_normal((6, 5)).astype(np.float32) * 3
    tm(torch.tensor(x)).pow(2).sum().backward()
    (pm(pyddp.tensor(x)) ** 2).sum().backward()
    return tm, pm


@pytest.mark.parametrize("norm_type", [2.0, float("inf"), 1.0, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    tm, pm = _grad_models()
    tn = torch.nn.utils.clip_grad_norm_(tm.parameters(), max_norm, norm_type)
    pn = nn.utils.clip_grad_norm_(pm.parameters(), max_norm, norm_type)
    assert isinstance(pn, pyddp.Tensor) and pn.shape == () and pn.dtype == pyddp.float32
    np.testing.assert_allclose(pn.item(), tn.item(), rtol=1e-6)
    for a, b in zip(pm.parameters(), tm.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_clip_grad_value_and_edge_cases():
    tm, pm = _grad_models(1)
    torch.nn.utils.clip_grad_value_(tm.parameters(), 0.3)
    assert nn.utils.clip_grad_value_(pm.parameters(), 0.3) is None
    for a, b in zip(pm.parameters(), tm.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-7)
        assert np.abs(a.grad.numpy()).max() <= np.float32(0.3)
    # one tensor, no gradients, non-finite norms
    w = nn.Parameter(pyddp.ones(3))
    assert nn.utils.clip_grad_norm_(w, 1.0).item() == 0.0
    w.grad = pyddp.tensor([3.0, 4.0, 0.0])
    assert nn.utils.clip_grad_norm_(w, 1.0).item() == pytest.approx(5.0)
    np.testing.assert_allclose(w.grad.numpy(), [0.6, 0.8, 0.0], rtol=1e-5)
    w.grad = pyddp.tensor([np.inf, 1.0, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)
    with pytest.raises(TypeError, match="NumPy array"):
        nn.utils.clip_grad_norm_(np.ones(3), 1.0)


def test_parameters_vector_roundtrip_matches_torch():
    tm, pm = _grad_models(2)
    tv = torch.nn.utils.parameters_to_vector(tm.parameters())
    pv = nn.utils.parameters_to_vector(pm.parameters())
    np.testing.assert_array_equal(pv.numpy(), tv.detach().numpy())
    new = np.arange(pv.numel(), dtype=np.float32) / 100
    torch.nn.utils.vector_to_parameters(torch.tensor(new), tm.parameters())
    nn.utils.vector_to_parameters(pyddp.tensor(new), pm.parameters())
    for a, b in zip(pm.parameters(), tm.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.detach().numpy())
    # differentiable, like torch's
    p = nn.Parameter(pyddp.ones(2, 2))
    (nn.utils.parameters_to_vector([p]) * pyddp.tensor([1.0, 2, 3, 4])).sum().backward()
    np.testing.assert_array_equal(p.grad.numpy(), [[1, 2], [3, 4]])
    with pytest.raises(TypeError, match="expected pyddp.Tensor"):
        nn.utils.vector_to_parameters(np.zeros(3), pm.parameters())
    with pytest.raises(RuntimeError, match="elements"):
        nn.utils.vector_to_parameters(pyddp.zeros(3), pm.parameters())


@pytest.mark.parametrize("cls,shape", [("Dropout1d", (8, 16, 5)), ("Dropout1d", (16, 5)),
                                       ("Dropout2d", (8, 16, 3, 3)),
                                       ("Dropout3d", (4, 16, 2, 2, 2)),
                                       ("Dropout3d", (16, 2, 2, 2))])
def test_channel_dropout(cls, shape):
    pyddp.manual_seed(0)
    m = getattr(nn, cls)(p=0.25)
    assert repr(m) == repr(getattr(torch.nn, cls)(p=0.25))
    x = pyddp.tensor(np.random.default_rng(0).uniform(1, 2, shape).astype(np.float32),
                     requires_grad=True)
    y = m(x)
    batched = len(shape) == {"Dropout1d": 3, "Dropout2d": 4, "Dropout3d": 5}[cls]
    lead = 2 if batched else 1
    yv = y.numpy().reshape(shape[:lead] + (-1,))
    xv = x.numpy().reshape(shape[:lead] + (-1,))
    zero = (yv == 0).all(-1)
    kept = np.isclose(yv, xv / 0.75, rtol=1e-6).all(-1)
    assert (zero | kept).all()  # whole channels: dropped, or kept and scaled by 1/(1-p)
    assert 0.05 < zero.mean() < 0.5
    y.sum().backward()
    gv = x.grad.numpy().reshape(shape[:lead] + (-1,))
    assert ((gv == 0).all(-1) == zero).all()
    m.eval()
    assert m(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        getattr(nn, cls)(p=1.5)


def test_channel_dropout_input_checks_as_torch():
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input"):
        nn.Dropout1d()(pyddp.ones(2, 3, 4, 5))
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        nn.Dropout2d()(pyddp.ones(2, 3, 4))
    with pytest.warns(UserWarning, match="Received a 3-D input to dropout3d"):
        nn.Dropout3d()(pyddp.ones(2, 3, 4))
    with pytest.raises(TypeError, match="must be Tensor"):
        nn.Dropout2d()(np.ones((2, 3, 4, 4)))


def test_data_parallel_as_torch_on_a_cpu_machine(tmp_path):
    torch.manual_seed(0)
    tdp = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU()))
    pdp = nn.DataParallel(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), device_ids=[0, 1])
    assert pdp.device_ids == tdp.device_ids == []
    assert isinstance(pdp.module, nn.Sequential)
    assert list(pdp.state_dict()) == list(tdp.state_dict()) == ["module.0.weight", "module.0.bias"]
    # a checkpoint of torch's DataParallel loads, and the forward is the module's
    pdp.load_state_dict({k: pyddp.tensor(v.numpy()) for k, v in tdp.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(pdp(pyddp.tensor(x)).numpy(),
                               tdp(torch.tensor(x)).detach().numpy(), rtol=1e-6)
    path = tmp_path / "dp.pt"
    pyddp.save(pdp.state_dict(), str(path))
    again = nn.DataParallel(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))
    again.load_state_dict(pyddp.load(str(path)))
    np.testing.assert_array_equal(again.module[0].weight.numpy(), pdp.module[0].weight.numpy())
    assert isinstance(nn.DataParallel(torch.nn.Linear(2, 2)), torch.nn.DataParallel)
    assert nn.parallel.data_parallel(pdp.module, pyddp.tensor(x)).shape == (5, 4)
    with pytest.raises(TypeError, match="pyddp.nn.Module"):
        nn.DataParallel(np.zeros(3))
