"""The tensor API real training loops use, against torch 2.13 on the same inputs: topk / sort,
pyddp.eq and the comparison functions, gather / scatter, diagonal, einsum, reductions, views
(a view is a view, or raises torch's error: aliasing checked op by op), memory formats, device
strings, int() of one-element tensors, randperm's type."""
import numpy as np
import pytest

import pyddp

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)


def P(a, **kw):
    return pyddp.tensor(np.asarray(a), **kw)


def T(a, **kw):
    return torch.tensor(np.asarray(a), **kw)


def same(p, t, tol=1e-6):
    pa = np.asarray(p.numpy() if isinstance(p, pyddp.Tensor) else p)
    ta = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    assert pa.shape == ta.shape, (pa.shape, ta.shape)
    assert str(pa.dtype) == str(ta.dtype).replace("torch.", "") or pa.dtype == ta.dtype, \
        (pa.dtype, ta.dtype)
    np.testing.assert_allclose(pa.astype(np.float64), ta.astype(np.float64), rtol=tol, atol=tol)


def both_raise(fp, ft, exc=RuntimeError, match=None):
    with pytest.raises(exc) as et:
        ft()
    with pytest.raises(type(et.value)) as ep:
        fp()
    if match is None:
        assert str(ep.value).split("(")[0].strip() == str(et.value).split("(")[0].strip() or \
            str(et.value).split("\n")[0] in str(ep.value), (str(ep.value), str(et.value))


RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 6)).astype(np.float32)
TIES = np.array([[1, 5, 3, 5], [2, 2, 2, 0]], dtype=np.int64)


@pytest.mark.parametrize("a", [X, TIES, X[0], np.array([1.0, np.nan, 3.0, np.nan], np.float32)])
@pytest.mark.parametrize("k,dim,largest", [(1, -1, True), (2, -1, True), (2, -1, False),
                                           (1, 0, True), (2, 0, False)])
def test_topk_sort_argsort(a, k, dim, largest):
    if a.ndim == 1 and dim == 0 and k > a.shape[0]:
        return
    pv, pi = P(a).topk(k, dim, largest, True)
    tv, ti = T(a).topk(k, dim, largest, True)
    same(pv, tv)
    if len(np.unique(a)) == a.size or np.isnan(a).any():
        same(pi, ti)
    else:   # torch leaves the order of tied indices unspecified: they must select the values
        same(P(a).gather(dim, pi) if a.ndim else pv, tv)
    r = pyddp.topk(P(a), k, dim=dim, largest=largest)
    assert r.values.shape == tuple(tv.shape) and type(r).__name__ == "topk"
    for desc in (False, True):
        ps, pidx = pyddp.sort(P(a), dim, descending=desc)
        ts, tidx = torch.sort(T(a), dim=dim, descending=desc, stable=True)
        same(ps, ts)
        same(pidx, tidx)
        same(P(a).argsort(dim, descending=desc), T(a).argsort(dim=dim, descending=desc, stable=True))


def test_topk_errors_and_grad():
    both_raise(lambda: P(X[0]).topk(7), lambda: T(X[0]).topk(7))
    p = P(X, requires_grad=True)
    t = T(X, requires_grad=True)
    (p.topk(2, 1).values * P(np.arange(8.0, dtype=np.float32).reshape(4, 2))).sum().backward()
    (t.topk(2, 1).values * T(np.arange(8.0, dtype=np.float32).reshape(4, 2))).sum().backward()
    same(p.grad, t.grad)


def test_imagenet_accuracy_helper():
    out, target = X, np.array([1, 2, 3, 0])

    def accuracy(lib, output, target, topk=(1, 5)):
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / 4)
                for k in topk]
    for p, t in zip(accuracy(pyddp, P(out), P(target)), accuracy(torch, T(out), T(target))):
        same(p, t)
    # the old example's view(-1) after pred.t() raises on both
    _, pp = P(out).topk(5, 1)
    _, tp = T(out).topk(5, 1)
    both_raise(lambda: pp.t()[:2].view(-1), lambda: tp.t()[:2].view(-1))


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge", "greater", "less_equal",
                                  "not_equal", "logical_and", "logical_or", "logical_xor"])
def test_comparison_functions(name):
    a, b = np.array([1, 2, 3]), np.array([3.0, 2.0, 1.0], np.float32)
    same(getattr(pyddp, name)(P(a), P(b)), getattr(torch, name)(T(a), T(b)))
    if not name.startswith("logical"):
        same(getattr(pyddp, name)(P(a), 2), getattr(torch, name)(T(a), 2))
    same(getattr(P(a), name)(P(b)), getattr(T(a), name)(T(b)))


def test_gather_scatter_index_select():
    idx = np.array([[0, 2], [1, 0], [5, 5], [3, 4]])
    same(pyddp.gather(P(X), 1, P(idx)), torch.gather(T(X), 1, T(idx)))
    p, t = P(X, requires_grad=True), T(X, requires_grad=True)
    (p.gather(1, P(idx)) ** 2).sum().backward()
    (t.gather(1, T(idx)) ** 2).sum().backward()
    same(p.grad, t.grad)
    src = np.ones((4, 2), np.float32)
    same(P(X).scatter(1, P(idx), P(src)), T(X).scatter(1, T(idx), T(src)))
    same(P(X).scatter(1, P(idx), 0.5), T(X).scatter(1, T(idx), 0.5))
    same(P(X).scatter_add(1, P(idx), P(src)), T(X).scatter_add(1, T(idx), T(src)))
    pz, tz = pyddp.zeros(3, 5), torch.zeros(3, 5)
    lab = np.array([[1], [4], [0]])
    assert pz.scatter_(1, P(lab), 1.0) is pz
    tz.scatter_(1, T(lab), 1.0)
    same(pz, tz)
    pz.scatter_add_(1, P(lab), pyddp.ones(3, 1))
    tz.scatter_add_(1, T(lab), torch.ones(3, 1))
    same(pz, tz)
    both_raise(lambda: P(X).gather(1, P(np.array([[6]]))), lambda: T(X).gather(1, T([[6]])))
    same(P(X).index_select(0, P([3, 1])), T(X).index_select(0, T([3, 1])))
    same(pyddp.masked_select(P(X), P(X > 0)), torch.masked_select(T(X), T(X > 0)))
    same(P(X).nonzero(), T(X).nonzero())


def test_diagonal_is_a_view_diag_fill_diagonal():
    a = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    for off in (-2, -1, 0, 1, 3, 5):
        same(P(a).diagonal(off), T(a).diagonal(off))
        same(pyddp.diag(P(a), off), torch.diag(T(a), off))
    b = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    same(pyddp.diagonal(P(b), 1, 1, 2), torch.diagonal(T(b), 1, 1, 2))
    same(pyddp.diagonal(P(b), 0, -1, 0), torch.diagonal(T(b), 0, -1, 0))
    same(pyddp.diag(P([1.0, 2.0]), 1), torch.diag(T([1.0, 2.0]), 1))
    pa, ta = P(a), T(a)
    pa.diagonal().fill_(-1)
    ta.diagonal().fill_(-1)
    same(pa, ta)
    same(P(a).fill_diagonal_(7), T(a).fill_diagonal_(7))
    same(pyddp.trace(P(a)), torch.trace(T(a)))
    p, t = P(a, requires_grad=True), T(a, requires_grad=True)
    (p.diagonal(1) * 3).sum().backward()
    (t.diagonal(1) * 3).sum().backward()
    same(p.grad, t.grad)


@pytest.mark.parametrize("eq,shapes", [("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik",
                                       [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(3, 3)]),
                                       ("ij->", [(2, 3)]), ("i,j->ij", [(3,), (4,)]),
                                       ("...ij,...jk", [(2, 3, 4), (4, 2)]), ("ij->j", [(2, 3)]),
                                       ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)])])
def test_einsum_values_and_grads(eq, shapes):
    arrs = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    ps = [P(a, requires_grad=True) for a in arrs]
    ts = [T(a, requires_grad=True) for a in arrs]
    pr, tr = pyddp.einsum(eq, *ps), torch.einsum(eq, *ts)
    same(pr, tr, 1e-5)
    w = RNG.standard_normal(tuple(tr.shape)).astype(np.float32)
    (pr * P(w)).sum().backward()
    (tr * T(w)).sum().backward()
    for p, t in zip(ps, ts):
        same(p.grad, t.grad, 1e-5)


def test_reductions_and_norms():
    same(P(X).cumsum(1), T(X).cumsum(1))
    same(P(TIES).cumsum(0), T(TIES).cumsum(0))
    same(P(X).prod(1), T(X).prod(1), 1e-5)
    same(pyddp.prod(P(TIES)), torch.prod(T(TIES)))
    for p in (1, 2, 3, float("inf"), "fro"):
        same(pyddp.norm(P(X), p), torch.norm(T(X), p), 1e-5)
    same(P(X).norm(dim=1), T(X).norm(dim=1), 1e-5)
    same(P(X).norm(2, 1, True), T(X).norm(2, 1, True), 1e-5)
    a = np.array([[1.0, 0.0, 2.0], [3.0, 4.0, 5.0]], np.float32)
    p, t = P(a, requires_grad=True), T(a, requires_grad=True)
    p.prod(1).sum().backward()
    t.prod(1).sum().backward()
    same(p.grad, t.grad)
    p, t = P(a, requires_grad=True), T(a, requires_grad=True)
    p.cumsum(1).sum().backward()
    t.cumsum(1).sum().backward()
    same(p.grad, t.grad)


def test_multinomial():
    pyddp.manual_seed(0)
    w = P(np.array([[0.0, 1.0, 3.0], [1.0, 0.0, 2.0]], np.float32))
    s = pyddp.multinomial(w, 2)
    assert s.dtype == np.int64 and s.shape == (2, 2)
    assert sorted(s[0].tolist()) == [1, 2] and sorted(s[1].tolist()) == [0, 2]
    r = w.multinomial(50, replacement=True)
    assert set(r[1].tolist()) <= {0, 2} and set(r[0].tolist()) <= {1, 2}
    assert sorted(pyddp.multinomial(w, 3)[0].tolist()) == [0, 1, 2]
    assert pyddp.multinomial(w, 3)[0, 2].item() == 0   # the zero weight comes last, as torch's
    both_raise(lambda: pyddp.multinomial(w, 4), lambda: torch.multinomial(T(w.numpy()), 4))
    for bad in ([[0.0, 0.0]], [[-1.0, 1.0]], [[np.nan, 1.0]]):
        both_raise(lambda: pyddp.multinomial(P(np.float32(bad)), 1),
                   lambda: torch.multinomial(T(np.float32(bad)), 1))


# ---------------------------------------------------------------- views: aliasing as torch

def _views(lib, x):
    return {
        "view": lambda: x.view(4, 3), "transpose": lambda: x.transpose(0, 1),
        "t": lambda: x.t(), "permute": lambda: x.permute(1, 0), "narrow": lambda: x.narrow(1, 1, 2),
        "select": lambda: x.select(0, 1), "slice": lambda: x[1:, ::2],
        "expand": lambda: x[:1].expand(3, 4), "unsqueeze": lambda: x.unsqueeze(0),
        "squeeze": lambda: x[:1].squeeze(0), "flatten": lambda: x.flatten(),
        "unflatten": lambda: x.unflatten(1, (2, 2)), "reshape": lambda: x.reshape(2, 6),
        "as_strided": lambda: x.as_strided((2, 2), (1, 4), 1),
        "diagonal": lambda: x.diagonal(), "view_as": lambda: x.view_as(lib.zeros(12)),
        "T": lambda: x.T, "unbind": lambda: x.unbind(0)[1], "split": lambda: x.split(1)[2],
        "chunk": lambda: x.chunk(2, 1)[1], "mT": lambda: x.mT, "movedim_like": lambda: x.swapaxes(0, 1),
        "detach": lambda: x.detach(), "contiguous": lambda: x.contiguous(),
    }


@pytest.mark.parametrize("name", list(_views(np, np.zeros((3, 4)))))
def test_view_ops_alias_their_base_as_torch(name):
    a = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    px, tx = P(a), T(a)
    pv, tv = _views(pyddp, px)[name](), _views(torch, tx)[name]()
    same(pv, tv)
    t_alias = tv.untyped_storage().data_ptr() == tx.untyped_storage().data_ptr()
    p_alias = np.shares_memory(pv.numpy(), px.numpy())
    assert p_alias == t_alias
    if t_alias:   # (fill_ writes through an expanded view too, as torch's)
        pv.fill_(-5.0)
        tv.fill_(-5.0)
        same(px, tx)   # the write reached the base


def test_view_on_non_contiguous_raises_reshape_copies():
    a = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    both_raise(lambda: P(a).t().view(-1), lambda: T(a).t().view(-1))
    both_raise(lambda: P(a).view(5, -1), lambda: T(a).view(5, -1))
    r = P(a).t().reshape(-1)
    same(r, T(a).t().reshape(-1))
    assert not np.shares_memory(r.numpy(), P(a).numpy())
    # a non-contiguous tensor whose strides allow the view
    same(P(a)[:, :2].view(3, 2, 1), T(a)[:, :2].view(3, 2, 1))


def test_memory_formats():
    a = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for mf in ("channels_last", "contiguous_format", "preserve_format"):
        p = P(a).contiguous(memory_format=getattr(pyddp, mf))
        t = T(a).contiguous(memory_format=getattr(torch, mf))
        assert p.stride() == t.stride() and p.is_contiguous() == t.is_contiguous()
        assert p.is_contiguous(memory_format=pyddp.channels_last) == \
            t.is_contiguous(memory_format=torch.channels_last)
    p = P(a).to(memory_format=pyddp.channels_last)
    t = T(a).to(memory_format=torch.channels_last)
    assert p.stride() == t.stride() and (p + 1).stride() == (t + 1).stride()
    assert p.clone().stride() == t.clone().stride()
    assert pyddp.empty_like(p).stride() == torch.empty_like(t).stride()
    assert pyddp.empty(2, 3, 4, 5, memory_format=pyddp.channels_last).stride() == \
        torch.empty(2, 3, 4, 5, memory_format=torch.channels_last).stride()
    both_raise(lambda: pyddp.zeros(2, 3).contiguous(memory_format=pyddp.channels_last),
               lambda: torch.zeros(2, 3).contiguous(memory_format=torch.channels_last))
    both_raise(lambda: pyddp.zeros(2, 3).contiguous(memory_format="channels_last"),
               lambda: torch.zeros(2, 3).contiguous(memory_format="channels_last"), TypeError)
    m = pyddp.nn.Conv2d(3, 4, 3).to(memory_format=pyddp.channels_last)
    assert m(P(a)).shape == (2, 4, 2, 3)


@pytest.mark.parametrize("s", ["None:1", "cuda:-1", "cuda:01", "cuda:1x", "cuda: 1", "CUDA", "",
                               ":1", "cuda:1:2", " cuda", "cuda:"])
def test_device_strings_rejected_as_torch(s):
    with pytest.raises(RuntimeError) as et:
        torch.device(s)
    with pytest.raises(RuntimeError) as ep:
        pyddp.device(s)
    assert str(ep.value) == str(et.value)


@pytest.mark.parametrize("args", [("cpu",), ("cpu:0",), ("cuda",), ("cuda:3",), ("cuda", 2),
                                  ("meta",), ("mps:0",), ("cpu", None)])
def test_device_strings_accepted_as_torch(args):
    p, t = pyddp.device(*args), torch.device(*args)
    assert (p.type, p.index, str(p), repr(p)) == (t.type, t.index, str(t), repr(t))
    for bad in (("cuda", -1), ("cuda:1", 2)):
        with pytest.raises(RuntimeError):
            pyddp.device(*bad)
    with pytest.raises(TypeError):
        pyddp.device("cuda", "1")


def test_scalar_conversions():
    for v in ([3.7], [[2]], [0], [True]):
        for f in (int, float, bool):
            assert f(P(v)) == f(T(v))
    for f in (int, float):
        both_raise(lambda: f(P([1.0, 2.0])), lambda: f(T([1.0, 2.0])), ValueError)
    both_raise(lambda: bool(P([1.0, 2.0])), lambda: bool(T([1.0, 2.0])))
    assert [10, 20, 30][P([1])] == 20
    both_raise(lambda: [1, 2][P([1.0])], lambda: [1, 2][T([1.0])], TypeError)


def test_randperm_is_a_tensor():
    r = pyddp.randperm(5)
    assert isinstance(r, pyddp.Tensor) and r.dtype == np.int64
    g, tg = pyddp.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    same(pyddp.randperm(20, generator=g), torch.randperm(20, generator=tg))


def test_inplace_variants():
    a = np.array([0.5, -1.5, 2.0], np.float32)
    for name in ("sigmoid_", "tanh_", "relu_", "floor_", "ceil_", "round_", "sign_", "sin_",
                 "reciprocal_", "square_", "trunc_", "frac_", "erf_"):
        p, t = P(a), T(a)
        base_p, base_t = p[1:], t[1:]
        assert getattr(base_p, name)() is base_p
        getattr(base_t, name)()
        same(p, t, 1e-6)
    p, t = P(a), T(a)
    p.clamp_min_(0).pow_(2).lerp_(pyddp.ones(3), 0.5)
    t.clamp_min_(0).pow_(2).lerp_(torch.ones(3), 0.5)
    same(p, t)
    p, t = P(a), T(a)
    p.t_(); t.t_()
    p, t = P(a.reshape(1, 3)), T(a.reshape(1, 3))
    p.unsqueeze_(0).squeeze_(1)
    t.unsqueeze_(0).squeeze_(1)
    same(p, t)
    for name in ("eq_", "gt_", "le_"):
        p, t = P(a), T(a)
        getattr(p, name)(0.5)
        getattr(t, name)(0.5)
        same(p, t)


def test_more_training_ops():
    a = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, -np.inf]], np.float32)
    same(P(a).nan_to_num(), T(a).nan_to_num())
    same(pyddp.nansum(P(a[:, :2])), torch.nansum(T(a[:, :2])))
    same(P(a[:, :2]).nanmean(1), T(a[:, :2]).nanmean(1))
    v = np.array([3.0, 1.0, 2.0, 5.0], np.float32)
    same(pyddp.median(P(v)), torch.median(T(v)))
    pm, tm = P(X).median(1), T(X).median(1)
    same(pm.values, tm.values)
    same(pm.indices, tm.indices)
    same(pyddp.dot(P(v), P(v)), torch.dot(T(v), T(v)))
    same(pyddp.mv(P(X), P(np.ones(6, np.float32))), torch.mv(T(X), T(np.ones(6, np.float32))))
    same(P([1, 2, 3]).repeat_interleave(2), T([1, 2, 3]).repeat_interleave(2))
    same(P(X).repeat_interleave(2, dim=0), T(X).repeat_interleave(2, dim=0))
    same(pyddp.tile(P([1, 2]), (2, 2)), torch.tile(T([1, 2]), (2, 2)))
    pu, pinv, pc = pyddp.unique(P([3, 1, 3, 2]), return_inverse=True, return_counts=True)
    tu, tinv, tc = torch.unique(T([3, 1, 3, 2]), return_inverse=True, return_counts=True)
    same(pu, tu), same(pinv, tinv), same(pc, tc)
    same(pyddp.logaddexp(P(v), P(v[::-1].copy())), torch.logaddexp(T(v), T(v[::-1].copy())))
    p = np.array([0.2, 0.5, 0.9], np.float32)
    same(pyddp.logit(P(p)), torch.logit(T(p)))
    same(P(X).take(P([0, 5, 23])), T(X).take(T([0, 5, 23])))
    for pp, tt in zip(pyddp.tensor_split(P(np.arange(7)), 3),
                      torch.tensor_split(T(np.arange(7)), 3)):
        same(pp, tt)
    same(P(X).addcmul(P(X), P(X), value=0.5), T(X).addcmul(T(X), T(X), value=0.5))
    same(P(X).addcdiv(P(X), P(X + 10), value=2), T(X).addcdiv(T(X), T(X + 10), value=2))
    idx = np.array([0, 2, 0])
    src = np.ones((3, 6), np.float32)
    same(P(X).index_add(0, P(idx), P(src)), T(X).index_add(0, T(idx), T(src)))
    same(P(X).index_fill(1, P([1, 3]), -1.0), T(X).index_fill(1, T([1, 3]), -1.0))
    same(P(X).index_copy(0, P([3, 1, 2]), P(src)), T(X).index_copy(0, T([3, 1, 2]), T(src)))
    px, tx = P(X), T(X)
    px.index_add_(0, P(idx), P(src))
    tx.index_add_(0, T(idx), T(src))
    same(px, tx)
    c = X > 0
    same(P(X).where(P(c), 0.0), T(X).where(T(c), 0.0))
    assert P(X).is_cpu and P(X).ndimension() == 2 and P([1]).is_signed() == T([1]).is_signed()
    assert P(np.uint8([1])).is_signed() == T(np.uint8([1])).is_signed()
    b = pyddp.bernoulli(P(np.full((1000,), 0.3, np.float32)))
    assert b.dtype == np.float32 and 0.2 < b.mean().item() < 0.4


def test_unfold_is_a_view_with_torch_values_and_grads():
    a = np.arange(20.0, dtype=np.float32).reshape(2, 10)
    for dim, size, step in ((1, 3, 2), (1, 4, 4), (0, 1, 1), (1, 10, 1)):
        p, t = P(a, requires_grad=True), T(a, requires_grad=True)
        pu, tu = p.unfold(dim, size, step), t.unfold(dim, size, step)
        same(pu, tu)
        assert pu.stride() == tu.stride()
        w = np.random.default_rng(0).standard_normal(tuple(tu.shape)).astype(np.float32)
        (pu * P(w)).sum().backward()
        (tu * T(w)).sum().backward()
        same(p.grad, t.grad, 1e-5)
    x = P(a)
    assert np.shares_memory(x.unfold(1, 3, 2).numpy(), x.numpy())
    both_raise(lambda: P(a).unfold(1, 11, 1), lambda: T(a).unfold(1, 11, 1))


def test_nvtx_markers():
    with pytest.raises(RuntimeError, match="NVTX functions not installed"):
        pyddp.cuda.nvtx.range_push("x")
