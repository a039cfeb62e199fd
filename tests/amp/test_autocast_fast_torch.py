"""The fast low-precision paths against torch 2.13 (skipped without torch): exact GELU through
pyddp._C (float32 and widened float16/bfloat16, forward and gradient), linear and matmul under
autocast(bfloat16 / float16) rounded once from float32 (values and gradients), float16/bfloat16
elementwise arithmetic computed in float32 giving NumPy's own bits, the one-pass casts, and a small
transformer block's loss and gradients under autocast."""
import numpy as np
import pytest

import pyddp
import pyddp.nn.functional as PF
from pyddp import _C
from pyddp._tensor._core import _to

torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

LOW = [("bfloat16", 1e-2), ("float16", 2e-3)]


def _pair(a, requires_grad=True):
    return (pyddp.tensor(a, requires_grad=requires_grad),
            torch.tensor(a, requires_grad=requires_grad))


def _np(t):
    if isinstance(t, torch.Tensor):
        t = t.detach()
        return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()
    return np.asarray(t.detach()._data, dtype=np.float64 if t.dtype == pyddp.float64
                      else np.float32)


def test_gelu_kernel_float32_matches_torch():
    x = np.concatenate([np.linspace(-10, 10, 20001, dtype=np.float32),
                        np.random.default_rng(0).standard_normal(5000).astype(np.float32) * 3,
                        np.array([0.0, -0.0, 1e-30, -1e-30, 1e-42], np.float32)])
    g = np.random.default_rng(1).standard_normal(x.size).astype(np.float32)
    px, tx = _pair(x)
    py, ty = PF.gelu(px), TF.gelu(tx)
    assert py.dtype == pyddp.float32
    np.testing.assert_allclose(_np(py), _np(ty), rtol=2e-6, atol=2e-6)
    py.backward(pyddp.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(_np(px.grad), _np(tx.grad), rtol=2e-5, atol=2e-6)


def test_gelu_kernel_nan_and_sizes():
    for n in (0, 1, 7, 16, 33):
        x = np.linspace(-3, 3, n, dtype=np.float32)
        out = np.empty_like(x)
        _C.gelu(out, x)
        np.testing.assert_allclose(out, TF.gelu(torch.tensor(x)).numpy(), rtol=2e-6, atol=2e-6)
    out = np.empty(3, np.float32)
    _C.gelu(out, np.array([np.nan, 1.0, -np.nan], np.float32))
    assert np.isnan(out[0]) and np.isnan(out[2])
    with pytest.raises(TypeError):
        _C.gelu(np.empty(3, np.float64), np.ones(3, np.float64))
    with pytest.raises(ValueError):
        _C.gelu(np.empty(3, np.float32), np.ones(4, np.float32))


@pytest.mark.parametrize("dt,tol", LOW)
def test_gelu_half_matches_torch(dt, tol):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((64, 96)) * 2).astype(np.float32)
    g = rng.standard_normal((64, 96)).astype(np.float32)
    px = pyddp.tensor(x).to(getattr(pyddp, dt)).requires_grad_()
    tx = torch.tensor(x).to(getattr(torch, dt)).requires_grad_()
    py, ty = PF.gelu(px), TF.gelu(tx)
    assert str(py.dtype).endswith(dt)
    np.testing.assert_allclose(_np(py), _np(ty), rtol=tol, atol=tol)
    py.backward(pyddp.tensor(g).to(getattr(pyddp, dt)))
    ty.backward(torch.tensor(g).to(getattr(torch, dt)))
    np.testing.assert_allclose(_np(px.grad), _np(tx.grad), rtol=tol, atol=tol)


@pytest.mark.parametrize("dt,tol", LOW)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_under_autocast_matches_torch(dt, tol, bias):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16, 48)).astype(np.float32)
    w = (rng.standard_normal((40, 48)) / 7).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    g = rng.standard_normal((4, 16, 40)).astype(np.float32)
    px, tx = _pair(x)
    pw, tw = _pair(w)
    pb, tb = _pair(b) if bias else (None, None)
    with pyddp.autocast(device_type="cpu", dtype=getattr(pyddp, dt)):
        py = PF.linear(px, pw, pb)
    with torch.autocast(device_type="cpu", dtype=getattr(torch, dt)):
        ty = TF.linear(tx, tw, tb)
    assert str(py.dtype).endswith(dt) and str(ty.dtype).endswith(dt)
    np.testing.assert_allclose(_np(py), _np(ty), rtol=tol, atol=tol)
    py.float().backward(pyddp.tensor(g))
    ty.float().backward(torch.tensor(g))
    for p, t in ((px, tx), (pw, tw)) + (((pb, tb),) if bias else ()):
        assert p.grad.dtype == pyddp.float32
        np.testing.assert_allclose(_np(p.grad), _np(t.grad), rtol=4 * tol, atol=4 * tol)


@pytest.mark.parametrize("dt,tol", LOW)
def test_matmul_under_autocast_matches_torch(dt, tol):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 3, 20, 16)).astype(np.float32)
    b = rng.standard_normal((2, 3, 16, 24)).astype(np.float32)
    g = rng.standard_normal((2, 3, 20, 24)).astype(np.float32)
    pa, ta = _pair(a)
    pb, tb = _pair(b)
    with pyddp.autocast(device_type="cpu", dtype=getattr(pyddp, dt)):
        py = pa @ pb
    with torch.autocast(device_type="cpu", dtype=getattr(torch, dt)):
        ty = ta @ tb
    np.testing.assert_allclose(_np(py), _np(ty), rtol=tol, atol=4 * tol)
    py.float().backward(pyddp.tensor(g))
    ty.float().backward(torch.tensor(g))
    np.testing.assert_allclose(_np(pa.grad), _np(ta.grad), rtol=4 * tol, atol=8 * tol)
    np.testing.assert_allclose(_np(pb.grad), _np(tb.grad), rtol=4 * tol, atol=8 * tol)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_arithmetic_same_bits_as_numpy(dt):
    """+ - * / on large half arrays go through float32 (one rounding): NumPy's own bits, with
    a Python scalar first rounded to the half type as NumPy does."""
    ndt = getattr(pyddp, dt)
    rng = np.random.default_rng(5)
    a = (rng.standard_normal(5000) * 300).astype(np.float32).astype(ndt)
    b = (rng.standard_normal(5000) * 3).astype(np.float32).astype(ndt)
    pa, pb = pyddp.tensor(a), pyddp.tensor(b)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for got, want in ((pa + pb, a + b), (pa - pb, a - b), (pa * pb, a * b), (pa / pb, a / b),
                          (pa * 0.1, a * ndt.type(0.1)), (pa + 3, a + ndt.type(3)),
                          (pa * 1e6, a * ndt.type(1e6))):
            assert got.dtype == ndt
            np.testing.assert_array_equal(got._data.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_fast_casts_same_bits_as_astype(dt):
    ndt = getattr(pyddp, dt)
    rng = np.random.default_rng(6)
    x = np.concatenate([(rng.standard_normal(10000) * 1e3).astype(np.float32),
                        np.array([np.inf, -np.inf, 7e4, -7e4, 1e-8, 0.0, -0.0], np.float32)])
    with np.errstate(over="ignore"):
        want = x.astype(ndt)
    got = _to(x, ndt)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(_to(got, np.dtype(np.float32)), want.astype(np.float32))
    strided = x[::2]
    np.testing.assert_array_equal(_to(strided, ndt).view(np.uint16),
                                  want[::2].view(np.uint16))


@pytest.mark.parametrize("dt,tol", LOW)
def test_transformer_block_under_autocast_matches_torch(dt, tol):
    """One pre-norm block (LayerNorm, attention through scaled_dot_product_attention, GELU MLP)
    with pyddp's modules and torch's, the same weights: the loss and every parameter's gradient
    under autocast agree to bf16/fp16 tolerances."""
    def build(lib):
        nn = lib.nn
        lib.manual_seed(0)
        return nn.ModuleDict({"ln": nn.LayerNorm(32), "qkv": nn.Linear(32, 96),
                              "proj": nn.Linear(32, 32), "fc": nn.Linear(32, 128),
                              "out": nn.Linear(128, 32), "act": nn.GELU()})

    def run(lib, m, x):
        F = lib.nn.functional
        B, T, C = x.shape
        q, k, v = m["qkv"](m["ln"](x)).split(C, dim=2)
        q, k, v = (t.view(B, T, 4, C // 4).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + m["proj"](y.transpose(1, 2).contiguous().view(B, T, C))
        x = x + m["out"](m["act"](m["fc"](x)))
        return (x.float() ** 2).mean()

    pm, tm = build(pyddp), build(torch)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            dict(tm.named_parameters())[name].copy_(torch.tensor(np.asarray(p.detach()._data)))
    x = np.random.default_rng(7).standard_normal((2, 24, 32)).astype(np.float32)
    with pyddp.autocast(device_type="cpu", dtype=getattr(pyddp, dt)):
        pl = run(pyddp, pm, pyddp.tensor(x))
    with torch.autocast(device_type="cpu", dtype=getattr(torch, dt)):
        tl = run(torch, tm, torch.tensor(x))
    np.testing.assert_allclose(pl.item(), tl.item(), rtol=2 * tol)
    pl.backward()
    tl.backward()
    tp = dict(tm.named_parameters())
    for name, p in pm.named_parameters():
        a, b = _np(p.grad), _np(tp[name].grad)
        scale = max(np.abs(b).max(), 1e-6)
        assert np.abs(a - b).max() <= 4 * tol * scale, name


def _gemm_calls(monkeypatch):
    """Count pyddp._C.gemm_bf16 calls (the native bfloat16 product); skip where the CPU has no
    AVX512-BF16 (pyddp then multiplies bfloat16 on float32 BLAS, tested above)."""
    from pyddp._tensor import _core

    if not _core._GEMM_BF16:
        pytest.skip("no AVX512-BF16: bfloat16 products go through float32 BLAS")
    calls = []
    real = _C.gemm_bf16

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)
    monkeypatch.setattr(_C, "gemm_bf16", counted)
    return calls


@pytest.mark.parametrize("bias", [True, False])
def test_linear_bfloat16_native_product_matches_torch(monkeypatch, bias):
    """linear under autocast(bfloat16) on the native bfloat16 kernel (forward, g @ W and g^T @ x):
    values and gradients against torch's CPU bfloat16 addmm, at a size with ragged tiles."""
    calls = _gemm_calls(monkeypatch)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 50, 200)).astype(np.float32)
    w = (rng.standard_normal((130, 200)) / 14).astype(np.float32)
    b = rng.standard_normal(130).astype(np.float32)
    g = rng.standard_normal((3, 50, 130)).astype(np.float32)
    px, tx = _pair(x)
    pw, tw = _pair(w)
    pb, tb = _pair(b) if bias else (None, None)
    with pyddp.autocast(device_type="cpu", dtype=pyddp.bfloat16):
        py = PF.linear(px, pw, pb)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        ty = TF.linear(tx, tw, tb)
    assert py.dtype == pyddp.bfloat16
    np.testing.assert_allclose(_np(py), _np(ty), rtol=1e-2, atol=1e-2)
    py.float().backward(pyddp.tensor(g))
    ty.float().backward(torch.tensor(g))
    assert len(calls) == 3, calls
    for p, t in ((px, tx), (pw, tw)) + (((pb, tb),) if bias else ()):
        np.testing.assert_allclose(_np(p.grad), _np(t.grad), rtol=4e-2, atol=4e-2)


@pytest.mark.parametrize("shapes", [((2, 3, 40, 72), (3, 72, 56)), ((5, 40, 72), (72, 56)),
                                    ((96, 72), (72, 56)), ((6, 64, 64), "kT")])
def test_matmul_bfloat16_native_product_matches_torch(monkeypatch, shapes):
    """matmul under autocast(bfloat16) on the native kernel: broadcast batches, a 2-D right operand
    against a batch, plain 2-D, and q @ k^T (a transposed view); values and both gradients."""
    calls = _gemm_calls(monkeypatch)
    rng = np.random.default_rng(12)
    sa, sb = shapes
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sa if sb == "kT" else sb).astype(np.float32)
    pa, ta = _pair(a)
    pb, tb = _pair(b)
    with pyddp.autocast(device_type="cpu", dtype=pyddp.bfloat16):
        py = pa @ (pb.transpose(-2, -1) if sb == "kT" else pb)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        ty = ta @ (tb.transpose(-2, -1) if sb == "kT" else tb)
    assert py.dtype == pyddp.bfloat16 and tuple(py.shape) == tuple(ty.shape)
    np.testing.assert_allclose(_np(py), _np(ty), rtol=1e-2, atol=4e-2)
    g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    py.float().backward(pyddp.tensor(g))
    ty.float().backward(torch.tensor(g))
    assert len(calls) == 3, calls
    np.testing.assert_allclose(_np(pa.grad), _np(ta.grad), rtol=4e-2, atol=1e-1)
    np.testing.assert_allclose(_np(pb.grad), _np(tb.grad), rtol=4e-2, atol=1e-1)


def test_bfloat16_native_and_blas_paths_agree(monkeypatch):
    """The native kernel and the float32-BLAS path round the same float32 sums (up to summation
    order) once: outputs within one bfloat16 ulp."""
    from pyddp._tensor import _core

    _gemm_calls(monkeypatch)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((64, 300)).astype(np.float32)
    w = (rng.standard_normal((100, 300)) / 17).astype(np.float32)
    outs = []
    for native in (True, False):
        monkeypatch.setattr(_core, "_GEMM_BF16", native)
        with pyddp.autocast(device_type="cpu", dtype=pyddp.bfloat16):
            outs.append(_np(PF.linear(pyddp.tensor(x), pyddp.tensor(w))))
    np.testing.assert_allclose(outs[0], outs[1], rtol=2 ** -7, atol=1e-6)
