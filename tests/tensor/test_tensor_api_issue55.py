"""Issue 55's tensor API against torch 2.13 on the same inputs: unique_consecutive, histc, erfinv
(values and gradients), set/get_float32_matmul_precision, pyddp.version, pyddp._dynamo /
pyddp._inductor's switches and pyddp.compile, cat skipping 1-D empty tensors (values and
gradients), and writes into expanded tensors (torch's RuntimeError, or the write reaching the
expanded tensor's memory where torch allows it)."""
import warnings

import numpy as np
import pytest

import pyddp

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)


def same(p, t, tol=1e-6):
    pa = np.asarray(p.numpy() if isinstance(p, pyddp.Tensor) else p)
    ta = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    assert pa.shape == ta.shape, (pa.shape, ta.shape)
    assert str(pa.dtype) == str(ta.dtype).replace("torch.", ""), (pa.dtype, ta.dtype)
    np.testing.assert_allclose(pa.astype(np.float64), ta.astype(np.float64), rtol=tol, atol=tol)


def both_raise(fp, ft):
    with pytest.raises(Exception) as et:
        ft()
    with pytest.raises(type(et.value)) as ep:
        fp()
    assert str(ep.value) == str(et.value), (str(ep.value), str(et.value))


RNG = np.random.default_rng(55)


# --- unique_consecutive ---------------------------------------------------------------------------

@pytest.mark.parametrize("a,dim", [
    (np.array([1, 1, 2, 2, 3, 1, 1, 2], np.int64), None),
    (np.array([[1, 1], [2, 2], [2, 3]], np.int64), None),
    (np.array([[1, 1], [1, 1], [2, 3], [1, 1]], np.int64), 0),
    (np.array([[1, 1, 2], [1, 1, 3]], np.int64), 1),
    (np.array([[1, 1, 2], [1, 1, 3]], np.int64), -1),
    (np.array([0.5, 0.5, np.nan, np.nan, 1.0], np.float32), None),
    (np.zeros((0,), np.float32), None),
])
def test_unique_consecutive(a, dim):
    for inv in (False, True):
        for cnt in (False, True):
            p = pyddp.unique_consecutive(pyddp.tensor(a), return_inverse=inv, return_counts=cnt,
                                         dim=dim)
            t = torch.unique_consecutive(torch.tensor(a), return_inverse=inv,
                                         return_counts=cnt, dim=dim)
            p, t = (p, t) if isinstance(t, tuple) else ((p,), (t,))
            assert len(p) == len(t)
            for x, y in zip(p, t):
                same(x, y)
    same(pyddp.tensor(a).unique_consecutive(), torch.tensor(a).unique_consecutive())


def test_unique_consecutive_errors():
    both_raise(lambda: pyddp.unique_consecutive(pyddp.zeros(2, 3), dim=2),
               lambda: torch.unique_consecutive(torch.zeros(2, 3), dim=2))


# --- histc ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("a,kw", [
    (RNG.standard_normal(200).astype(np.float32), dict()),
    (RNG.standard_normal(200).astype(np.float32), dict(bins=7)),
    (RNG.standard_normal((5, 40)).astype(np.float64), dict(bins=10, min=-1, max=1)),
    (np.array([1, 2, 3, 4, 5], np.float32), dict(bins=4, min=3, max=3)),
    (np.array([2, 2], np.float32), dict(bins=4)),
    (np.array([1, 2, 3, 4], np.float32), dict(bins=4, min=1, max=4)),
    (np.zeros((0,), np.float32), dict(bins=3)),
    (np.array([1, 2, 3, 4, 5], np.float16), dict(bins=3)),
])
def test_histc(a, kw):
    same(pyddp.histc(pyddp.tensor(a), **kw), torch.histc(torch.tensor(a), **kw))
    same(pyddp.tensor(a).histc(**kw), torch.tensor(a).histc(**kw))


@pytest.mark.parametrize("a,kw", [
    (np.arange(4), dict(bins=4)),
    (np.arange(4.0, dtype=np.float32), dict(bins=0)),
    (np.arange(4.0, dtype=np.float32), dict(bins=4, min=3, max=1)),
    (np.array([1.0, np.inf], np.float32), dict(bins=4)),
])
def test_histc_errors(a, kw):
    both_raise(lambda: pyddp.histc(pyddp.tensor(a), **kw), lambda: torch.histc(torch.tensor(a),
                                                                                **kw))


# --- erfinv ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erfinv_values_and_grad(dtype):
    a = np.concatenate([np.linspace(-0.999, 0.999, 101), [0.0, 1e-6, -0.9999, 0.99999]]) \
        .astype(dtype)
    p = pyddp.tensor(a, requires_grad=True)
    t = torch.tensor(a, requires_grad=True)
    yp, yt = pyddp.erfinv(p), torch.erfinv(t)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(yp.detach().numpy(), yt.detach().numpy(), rtol=tol, atol=tol)
    g = RNG.standard_normal(a.shape).astype(dtype)
    yp.backward(pyddp.tensor(g))
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=10 * tol, atol=tol)


def test_erfinv_edges_dtypes_and_inplace():
    a = np.array([1.0, -1.0, 2.0, -3.0, np.nan, 0.0], np.float32)
    same(pyddp.tensor(a).erfinv(), torch.tensor(a).erfinv())
    same(pyddp.tensor([1, 0]).erfinv(), torch.tensor([1, 0]).erfinv())
    h = np.array([0.3, -0.7], np.float16)
    same(pyddp.tensor(h).erfinv(), torch.tensor(h).erfinv(), tol=1e-3)
    p, t = pyddp.tensor(a[3:]), torch.tensor(a[3:])
    assert p.erfinv_() is p
    t.erfinv_()
    same(p, t)
    both_raise(lambda: pyddp.tensor([1, 2]).erfinv_(), lambda: torch.tensor([1, 2]).erfinv_())


# --- float32 matmul precision, version, dynamo / inductor switches, compile -----------------------

def test_float32_matmul_precision():
    old = pyddp.get_float32_matmul_precision()
    assert old == torch.get_float32_matmul_precision() == "highest"
    try:
        for v in ("high", "medium", "highest"):
            pyddp.set_float32_matmul_precision(v)
            assert pyddp.get_float32_matmul_precision() == v
        pyddp.set_float32_matmul_precision("high")
        with pytest.warns(UserWarning, match="low is not one of 'highest', 'high', or 'medium'"):
            pyddp.set_float32_matmul_precision("low")
        assert pyddp.get_float32_matmul_precision() == "high"
        both_raise(lambda: pyddp.set_float32_matmul_precision(3),
                   lambda: torch.set_float32_matmul_precision(3))
    finally:
        pyddp.set_float32_matmul_precision(old)


def test_version_module():
    import pyddp.version as v
    assert v.__version__ == pyddp.__version__
    assert v.cuda is None and v.hip is None and torch.version.cuda is None   # a CPU build's
    assert isinstance(v.git_version, str) and v.git_version
    assert v.git_version == "Unknown" or len(v.git_version) == 40
    assert pyddp.version is v
    assert set(v.__all__) <= set(dir(torch.version)) | {"__version__"}


def test_dynamo_inductor_switches_are_recorded():
    dc, ic = pyddp._dynamo.config, pyddp._inductor.config
    for name in ("suppress_errors", "cache_size_limit", "optimize_ddp", "verbose",
                 "automatic_dynamic_shapes"):
        assert getattr(dc, name) == getattr(torch._dynamo.config, name), name
    for name in ("coordinate_descent_tuning", "max_autotune", "epilogue_fusion", "freezing",
                 "fx_graph_cache"):
        assert getattr(ic, name) == getattr(torch._inductor.config, name), name
    assert ic.triton.cudagraphs == torch._inductor.config.triton.cudagraphs
    saved_d, saved_i = dc.save_config(), ic.save_config()
    try:
        dc.suppress_errors = True
        ic.coordinate_descent_tuning = True
        ic.triton.cudagraphs = True
        assert dc.suppress_errors and ic.coordinate_descent_tuning and ic.triton.cudagraphs
        with dc.patch(cache_size_limit=64):
            assert dc.cache_size_limit == 64
        assert dc.cache_size_limit == 8
        with ic.patch({"triton.cudagraphs": False}):
            assert ic.triton.cudagraphs is False
        assert ic.triton.cudagraphs is True
        assert ic.get_config_copy()["triton.cudagraphs"] is True
        with pytest.raises(AttributeError, match=r"pyddp._dynamo.config.nope does not exist"):
            dc.nope = 1
        with pytest.raises(AttributeError) as et:
            torch._dynamo.config.nope = 1
        assert str(et.value) == "torch._dynamo.config.nope does not exist"
        with pytest.raises(AttributeError, match="does not exist"):
            ic.triton.nope
    finally:
        dc.load_config(saved_d)
        ic.load_config(saved_i)
    assert dc.suppress_errors is False and ic.triton.cudagraphs is False
    assert pyddp._dynamo.reset() is None
    assert pyddp._dynamo.is_compiling() is False


def test_compile_returns_the_model():
    import pyddp.nn as nn
    m = nn.Linear(3, 2)
    assert pyddp.compile(m) is m
    assert pyddp.compile(m, mode="max-autotune", fullgraph=True) is m
    f = pyddp.compile(fullgraph=True)(len)
    assert f is len
    with pytest.raises(RuntimeError, match="Unrecognized mode=fast"):
        pyddp.compile(m, mode="fast")
    assert pyddp._dynamo.disable(len) is len


# --- cat's skipped 1-D empty tensors --------------------------------------------------------------

@pytest.mark.parametrize("shapes,dim", [
    ([(0,), (2, 3)], 0), ([(0,), (2, 3)], 1), ([(2, 3), (0,), (2, 2)], 1), ([(0,), (0,)], 0),
    ([(0,), (4,)], 0), ([(0, 3), (2, 3)], 0), ([(2, 3, 4), (0,)], -1),
])
def test_cat_skips_1d_empty_tensors(shapes, dim):
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    ps = [pyddp.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    yp, yt = pyddp.cat(ps, dim), torch.cat(ts, dim)
    same(yp, yt)
    if yt.numel():
        g = RNG.standard_normal(tuple(yt.shape)).astype(np.float32)
        yp.backward(pyddp.tensor(g))
        yt.backward(torch.tensor(g))
        for p, t in zip(ps, ts):
            same(p.grad, t.grad)


def test_cat_dim_out_of_range():
    both_raise(lambda: pyddp.cat((pyddp.ones(2, 3), pyddp.empty(0)), dim=5),
               lambda: torch.cat((torch.ones(2, 3), torch.empty(0)), dim=5))


# --- writing into expanded tensors ----------------------------------------------------------------

_WRITES = {
    "add_": lambda y, m: y.add_(1),
    "mul_": lambda y, m: y.mul_(2),
    "exp_": lambda y, m: y.exp_(),
    "sin_": lambda y, m: y.sin_(),
    "clamp_": lambda y, m: y.clamp_(1, 2),
    "uniform_": lambda y, m: y.uniform_(),
    "copy_": lambda y, m: y.copy_(m.ones(3, 4)),
    "iadd": lambda y, m: y.__iadd__(1),
    "setitem all": lambda y, m: y.__setitem__(slice(None), 1),
    "setitem column": lambda y, m: y.__setitem__((slice(None), 0), 1),
    "setitem tensor": lambda y, m: y.__setitem__(slice(None), m.ones(3, 4)),
    "setitem element": lambda y, m: y.__setitem__((0, 0), 1),
    "setitem row": lambda y, m: y.__setitem__(0, m.ones(4)),
    "fill_": lambda y, m: y.fill_(2),
    "zero_": lambda y, m: y.zero_(),
    "row add_": lambda y, m: y[1].add_(1),
}


@pytest.mark.parametrize("name", list(_WRITES))
def test_write_into_expanded_tensor(name):
    """torch's RuntimeError where torch raises; elsewhere the write reaches the memory the
    expanded tensor shares with its source, as in torch."""
    f = _WRITES[name]
    xt, xp = torch.zeros(4), pyddp.zeros(4)
    try:
        f(xt.expand(3, 4), torch)
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as ep:
            f(xp.expand(3, 4), pyddp)
        assert str(ep.value) == str(e)
        return
    f(xp.expand(3, 4), pyddp)
    same(xp, xt)


def test_write_into_expanded_tensor_with_grad_and_advanced_index():
    x = pyddp.zeros(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        x.clone().expand(3, 4).add_(1)
    xp = pyddp.zeros(4)
    with pytest.warns(UserWarning, match="Use of index_put_ on expanded tensors is deprecated"):
        xp.expand(3, 4)[[0, 1]] = 1.0
    # expand keeps torch's errors for impossible sizes
    both_raise(lambda: pyddp.zeros(4).expand(3, 5), lambda: torch.zeros(4).expand(3, 5))
    both_raise(lambda: pyddp.zeros(3, 4).expand(4), lambda: torch.zeros(3, 4).expand(4))
    # an expanded view of a read-only array stays read-only
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = pyddp.from_numpy(ro).expand(2, 4)
    assert not v.numpy().flags.writeable
