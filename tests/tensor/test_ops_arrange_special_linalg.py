"""Issue 55's next rows of the torch API table against torch 2.13 on the same inputs: values,
dtypes and gradients of the new ops (joining/arranging, special functions, order statistics,
searching/counting, index writes and scatter_reduce, matrix functions), torch's errors for bad
input, the process-wide switches (threads, RNG state, deterministic algorithms) and torch.*'s
in-place and neural-network spellings."""
import warnings

import numpy as np
import pytest

import pyddp

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(300)

RNG = np.random.default_rng(5555)


def f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


_M = f(3, 3, dtype=np.float64)
SPD = (_M @ _M.T + np.eye(3)).astype(np.float32)


def compare(fp, ft, arrays, grad=True, tol=1e-5, gtol=1e-4, out=0):
    """fp(*pyddp tensors) against ft(*torch tensors): values, shape, dtype, and (float inputs,
    grad=True) the gradients of a random upstream gradient."""
    P = [pyddp.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    T = [torch.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rp, rt = fp(*P), ft(*T)
    if isinstance(rt, tuple):
        rp, rt = rp[out], rt[out]
    assert tuple(rp.shape) == tuple(rt.shape), (rp.shape, rt.shape)
    assert str(rp.dtype) == str(rt.dtype).replace("torch.", ""), (rp.dtype, rt.dtype)
    np.testing.assert_allclose(rp.detach().numpy().astype(np.float64),
                               rt.detach().numpy().astype(np.float64), rtol=tol, atol=tol)
    if grad and rt.requires_grad:
        g = RNG.standard_normal(tuple(rt.shape)).astype(str(rt.dtype).replace("torch.", ""))
        rp.backward(pyddp.tensor(g))
        rt.backward(torch.tensor(g))
        for p, t in zip(P, T):
            if t.grad is not None:
                assert p.grad is not None
                np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=gtol, atol=gtol)


def both_raise(fp, ft, match_text=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as et:
            ft()
        with pytest.raises(Exception) as ep:
            fp()
    assert isinstance(ep.value, type(et.value).__mro__[0] if type(et.value).__module__ ==
                      "builtins" else RuntimeError), (type(ep.value), type(et.value))
    if match_text:
        assert str(ep.value) == str(et.value), (str(ep.value), str(et.value))


# --- joining and arranging -------------------------------------------------------------------

JOIN = [
    ("hstack", lambda m, a, b: m.hstack([a, b]), [f(2, 3), f(2, 2)]),
    ("hstack1d", lambda m, a, b: m.hstack((a, b)), [f(3), f(2)]),
    ("vstack", lambda m, a, b: m.vstack([a, b]), [f(3), f(2, 3)]),
    ("row_stack", lambda m, a, b: m.row_stack([a, b]), [f(3), f(3)]),
    ("dstack", lambda m, a, b: m.dstack([a, b]), [f(3), f(1, 3, 2)]),
    ("column_stack", lambda m, a, b: m.column_stack([a, b]), [f(3), f(3, 2)]),
    ("concatenate", lambda m, a, b: m.concatenate([a, b], dim=-1), [f(2, 3), f(2, 1)]),
    ("atleast_2d", lambda m, a: m.atleast_2d(a), [f(3)]),
    ("atleast_3d", lambda m, a: m.atleast_3d(a), [f(2, 3)]),
    ("atleast_1d", lambda m, a: m.atleast_1d(a.sum()), [f(3)]),
    ("broadcast_tensors", lambda m, a, b: m.broadcast_tensors(a, b)[0] * 2, [f(3, 1), f(4)]),
    ("meshgrid_ij", lambda m, a, b: m.meshgrid(a, b, indexing="ij")[1] * 3, [f(3), f(4)]),
    ("meshgrid_xy", lambda m, a, b, c: m.meshgrid(a, b, c, indexing="xy")[0] * 3,
     [f(3), f(4), f(2)]),
    ("rot90", lambda m, a: m.rot90(a, 3, (1, 2)), [f(2, 3, 4)]),
    ("rot90_neg", lambda m, a: m.rot90(a, -1), [f(2, 3)]),
    ("rot90_2", lambda m, a: a.rot90(2, [0, 1]), [f(2, 3)]),
    ("fliplr", lambda m, a: m.fliplr(a), [f(2, 3)]),
    ("flipud", lambda m, a: a.flipud(), [f(2, 3)]),
    ("diag_embed", lambda m, a: m.diag_embed(a), [f(2, 3)]),
    ("diag_embed_off", lambda m, a: a.diag_embed(1, 0, 2), [f(2, 3)]),
    ("diag_embed_neg", lambda m, a: m.diag_embed(a, -2, -1, 1), [f(2, 2, 3)]),
    ("kron", lambda m, a, b: m.kron(a, b), [f(2, 3), f(4)]),
    ("kron_3d", lambda m, a, b: a.kron(b), [f(2, 1, 3), f(2, 2)]),
    ("tensordot_int", lambda m, a, b: m.tensordot(a, b, 1), [f(2, 3), f(3, 4)]),
    ("tensordot_lists", lambda m, a, b: m.tensordot(a, b, ([1, 0], [0, 2])),
     [f(2, 3, 4), f(3, 5, 2)]),
    ("tensordot_0", lambda m, a, b: m.tensordot(a, b, 0), [f(2), f(3)]),
    ("cross", lambda m, a, b: m.cross(a, b, dim=1), [f(4, 3), f(1, 3)]),
    ("cross_default", lambda m, a, b: a.cross(b), [f(3, 2), f(3, 2)]),
    ("clone", lambda m, a: m.clone(a) * 2, [f(3)]),
    ("t", lambda m, a: m.t(a), [f(2, 3)]),
    ("ravel", lambda m, a: m.ravel(a.transpose(0, 1)), [f(2, 3)]),
    ("swapdims", lambda m, a: m.swapdims(a, 0, 2), [f(2, 3, 4)]),
    ("outer_method", lambda m, a, b: a.outer(b), [f(3), f(4)]),
]


@pytest.mark.parametrize("name,fn,arrays", JOIN, ids=[j[0] for j in JOIN])
def test_join_and_arrange(name, fn, arrays):
    compare(lambda *a: fn(pyddp, *a), lambda *a: fn(torch, *a), arrays)


def test_join_shapes_of_small_inputs():
    for fn in ("atleast_1d", "atleast_2d", "atleast_3d"):
        for a in (np.float32(2.0), f(3), f(2, 3), f(1, 2, 3)):
            p = getattr(pyddp, fn)(pyddp.tensor(a))
            t = getattr(torch, fn)(torch.tensor(a))
            assert tuple(p.shape) == tuple(t.shape)
    assert tuple(pyddp.broadcast_shapes((2, 1), (3,), 1)) == tuple(
        torch.broadcast_shapes((2, 1), (3,), 1))
    p = pyddp.detach(pyddp.tensor(f(2), requires_grad=True) * 2)
    assert not p.requires_grad and p.grad_fn is None


@pytest.mark.parametrize("row,col,off", [(3, 4, 1), (4, 3, -1), (3, 3, 0), (0, 3, 0),
                                         (3, 5, -5)])
def test_tri_indices(row, col, off):
    for fn in ("tril_indices", "triu_indices"):
        p, t = getattr(pyddp, fn)(row, col, off), getattr(torch, fn)(row, col, off)
        assert p.dtype == np.int64 and p.tolist() == t.tolist()
    assert pyddp.tril_indices(3, 3, dtype=pyddp.int32).dtype == np.int32


def test_unravel_index():
    idx = np.array([0, 5, 11, -1, 7], np.int64)
    for shape in ((3, 4), (2, 2, 3), 12):
        p = pyddp.unravel_index(pyddp.tensor(idx), shape)
        t = torch.unravel_index(torch.tensor(idx), shape)
        assert [x.tolist() for x in p] == [x.tolist() for x in t]


JOIN_ERRORS = [
    ("hstack_empty", lambda m: m.hstack([])),
    ("hstack_dims", lambda m: m.hstack([m.zeros(2, 1), m.zeros(2, 1, 1)])),
    ("vstack_sizes", lambda m: m.vstack([m.zeros(2), m.zeros(3)])),
    ("broadcast_tensors", lambda m: m.broadcast_tensors(m.zeros(2), m.zeros(3))),
    ("broadcast_shapes", lambda m: m.broadcast_shapes((2,), (3,))),
    ("meshgrid_indexing", lambda m: m.meshgrid(m.zeros(2), indexing="foo")),
    ("t_3d", lambda m: m.t(m.zeros(2, 3, 4))),
    ("rot90_1d", lambda m: m.rot90(m.zeros(2), 1)),
    ("rot90_same", lambda m: m.rot90(m.zeros(2, 2), 1, [0, 0])),
    ("fliplr_1d", lambda m: m.fliplr(m.zeros(2))),
    ("flipud_0d", lambda m: m.flipud(m.tensor(1.0))),
    ("tril_indices_neg", lambda m: m.tril_indices(-1, 4)),
    ("tril_indices_float", lambda m: m.tril_indices(3, 3, dtype=m.float32)),
    ("bincount_float", lambda m: m.bincount(m.tensor([1.0]))),
    ("normal_int", lambda m: m.normal(m.tensor([1, 2]), m.tensor([1, 2]))),
    ("unravel_float", lambda m: m.unravel_index(m.tensor(3.0), (2, 2))),
    ("diag_embed_same", lambda m: m.diag_embed(m.zeros(3), 0, 0, 0)),
    ("tensordot_sizes", lambda m: m.tensordot(m.zeros(2, 3), m.zeros(4, 4), dims=1)),
    ("cross_no3", lambda m: m.cross(m.zeros(2, 4), m.zeros(2, 4))),
    ("cross_dim", lambda m: m.cross(m.zeros(3, 2), m.zeros(3, 2), dim=1)),
]


@pytest.mark.parametrize("name,fn", JOIN_ERRORS, ids=[e[0] for e in JOIN_ERRORS])
def test_join_errors(name, fn):
    both_raise(lambda: fn(pyddp), lambda: fn(torch))


def test_meshgrid_and_cross_warn_as_torch():
    with pytest.warns(UserWarning, match="indexing argument"):
        pyddp.meshgrid(pyddp.zeros(2), pyddp.zeros(3))
    with pytest.warns(UserWarning, match="without specifying the dim"):
        pyddp.cross(pyddp.zeros(3), pyddp.zeros(3))


# --- special functions and elementwise math -------------------------------------------------

POS = np.abs(f(20)) * 5 + 0.1
SPECIAL = [
    ("lgamma", lambda m, a: m.lgamma(a), [POS]),
    ("lgamma_neg", lambda m, a: a.lgamma(), [f(20) * 3]),
    ("digamma", lambda m, a: m.digamma(a), [f(40) * 5]),
    ("digamma_pos", lambda m, a: a.digamma(), [POS]),
    ("erfc", lambda m, a: m.erfc(a), [f(20) * 3]),
    ("sinc", lambda m, a: m.sinc(a), [np.array([0, 0.5, 1.5, -2.3, 0.1], np.float32)]),
    ("deg2rad", lambda m, a: m.deg2rad(a), [f(5) * 100]),
    ("rad2deg", lambda m, a: a.rad2deg(), [f(5)]),
    ("acosh", lambda m, a: m.acosh(a), [np.abs(f(5)) + 1.1]),
    ("arcsinh", lambda m, a: m.arcsinh(a), [f(5)]),
    ("atanh", lambda m, a: a.arctanh(), [f(5) * 0.3]),
    ("arccos", lambda m, a: m.arccos(a), [f(5) * 0.3]),
    ("arcsin", lambda m, a: a.arcsin(), [f(5) * 0.3]),
    ("arctan", lambda m, a: m.arctan(a), [f(5)]),
    ("arctan2", lambda m, a, b: m.arctan2(a, b), [f(5), f(5)]),
    ("absolute", lambda m, a: m.absolute(a), [f(5)]),
    ("multiply", lambda m, a, b: m.multiply(a, b), [f(2, 3), f(3)]),
    ("subtract", lambda m, a, b: m.subtract(a, b, alpha=2), [f(2, 3), f(3)]),
    ("divide", lambda m, a, b: m.divide(a, b), [f(2, 3), np.abs(f(3)) + 1]),
    ("xlogy", lambda m, a, b: m.xlogy(a, b), [np.array([0, 1, 2, 0.5, 0], np.float32),
                                                np.array([0.3, 2, 0.1, 3, 0], np.float32)]),
    ("xlogy_scalar", lambda m, a: m.xlogy(2, a), [np.abs(f(4)) + 0.1]),
    ("xlogy_bcast", lambda m, a, b: a.xlogy(b), [f(3, 1), np.abs(f(4))]),
    ("hypot", lambda m, a, b: m.hypot(a, b), [f(5), f(2, 5)]),
    ("copysign", lambda m, a, b: m.copysign(a, b), [f(5), f(5)]),
    ("copysign_scalar", lambda m, a: a.copysign(-1.0), [f(5)]),
    ("logaddexp2", lambda m, a, b: m.logaddexp2(a, b), [f(5), f(3, 5)]),
    ("fmax", lambda m, a, b: m.fmax(a, b), [np.array([1, np.nan, 2, 3], np.float32),
                                             np.array([np.nan, 1, 2, 1], np.float32)]),
    ("fmin", lambda m, a, b: a.fmin(b), [np.array([1, np.nan, 2, 3], np.float32),
                                          np.array([np.nan, 1, 2, 4], np.float32)]),
    ("heaviside", lambda m, a, b: m.heaviside(a, b),
     [np.array([-1, 0, 2, 0], np.float32), np.array([0.5], np.float32)]),
]


@pytest.mark.parametrize("name,fn,arrays", SPECIAL, ids=[s[0] for s in SPECIAL])
def test_special(name, fn, arrays):
    compare(lambda *a: fn(pyddp, *a), lambda *a: fn(torch, *a), arrays,
            grad=name != "heaviside", tol=1e-4 if "digamma" in name or "lgamma" in name else 1e-5)


def test_special_edges_and_dtypes():
    edge = np.array([0.0, -0.0, -1.0, -1.5, 1e-8, 30.0, np.inf, np.nan], np.float64)
    for fn in ("digamma", "lgamma", "erfc", "sinc", "signbit", "sgn"):
        p = getattr(pyddp, fn)(pyddp.tensor(edge))
        t = getattr(torch, fn)(torch.tensor(edge))
        np.testing.assert_allclose(p.numpy().astype(np.float64), t.numpy().astype(np.float64),
                                   rtol=1e-9, atol=1e-12)
    ints = np.array([1, 2, 3], np.int64)
    for fn in ("lgamma", "digamma", "erfc", "deg2rad", "rad2deg", "sinc", "acosh"):
        p, t = getattr(pyddp, fn)(pyddp.tensor(ints)), getattr(torch, fn)(torch.tensor(ints))
        assert str(p.dtype) == str(t.dtype).replace("torch.", "")
        np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-5, atol=1e-6)
    for fn in ("copysign", "xlogy"):
        p = getattr(pyddp, fn)(pyddp.tensor(ints), pyddp.tensor(-ints))
        t = getattr(torch, fn)(torch.tensor(ints), torch.tensor(-ints))
        assert str(p.dtype) == str(t.dtype).replace("torch.", "")
        np.testing.assert_allclose(p.numpy(), t.numpy(), equal_nan=True)
    assert pyddp.signbit(pyddp.tensor([-1, 1])).tolist() == [True, False]
    assert pyddp.fmax(pyddp.tensor([1]), pyddp.tensor([2])).dtype == np.int64


def test_special_inplace():
    a = np.abs(f(5)) + 0.5
    for name in ("lgamma_", "digamma_", "erfc_", "sinc_", "deg2rad_", "rad2deg_", "arccos_",
                 "asinh_", "sgn_", "nan_to_num_", "fix_"):
        x = (a / 3) if name == "arccos_" else a
        p, t = pyddp.tensor(x.copy()), torch.tensor(x.copy())
        assert getattr(p, name)() is p
        getattr(t, name)()
        np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-5, atol=1e-6)
    p, t = pyddp.tensor(a.copy()), torch.tensor(a.copy())
    p.xlogy_(pyddp.tensor(a)), t.xlogy_(torch.tensor(a))
    np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-6)
    p, t = pyddp.tensor(a.copy()), torch.tensor(a.copy())
    p.hypot_(pyddp.tensor(a)), t.hypot_(torch.tensor(a))
    np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-6)


SPECIAL_ERRORS = [
    ("hypot_int", lambda m: m.hypot(m.tensor([3]), m.tensor([4]))),
    ("hypot_scalar", lambda m: m.hypot(m.tensor([3.0]), 4.0)),
    ("fmax_scalar", lambda m: m.fmax(m.tensor([1.0]), 2.0)),
    ("logaddexp2_scalar", lambda m: m.logaddexp2(m.tensor([1.0]), 2.0)),
    ("heaviside_dtypes", lambda m: m.heaviside(m.tensor([1.0]), m.tensor([1]))),
    ("heaviside_scalar", lambda m: m.heaviside(m.tensor([1.0]), 0.5)),
    ("heaviside_grad", lambda m: m.heaviside(m.tensor([0.0], requires_grad=True),
                                             m.tensor([1.0])).sum().backward()),
]


@pytest.mark.parametrize("name,fn", SPECIAL_ERRORS, ids=[e[0] for e in SPECIAL_ERRORS])
def test_special_errors(name, fn):
    both_raise(lambda: fn(pyddp), lambda: fn(torch))


# --- order statistics --------------------------------------------------------------------------

NANS = np.array([[1, np.nan, 3, 2, 0.5], [np.nan, 4, 1, 1, np.nan]], np.float32)
STATS = [
    ("cummax", lambda m, a: m.cummax(a, 1), [f(3, 5)]),
    ("cummin", lambda m, a: a.cummin(0), [f(4, 3)]),
    ("cummax_ties", lambda m, a: m.cummax(a, 0),
     [np.array([1, 3, 3, 2, 5, 5], np.float32)]),
    ("logcumsumexp", lambda m, a: m.logcumsumexp(a, 1), [f(3, 5)]),
    ("logcumsumexp_big", lambda m, a: a.logcumsumexp(0), [f(6) * 40]),
    ("kthvalue", lambda m, a: m.kthvalue(a, 2, 0, True), [f(4, 3)]),
    ("kthvalue_last", lambda m, a: a.kthvalue(3), [f(2, 3)]),
    ("nanmedian_all", lambda m, a: m.nanmedian(a), [NANS]),
    ("nanmedian_dim", lambda m, a: a.nanmedian(1), [NANS]),
    ("nanmedian_keep", lambda m, a: m.nanmedian(a, 0, keepdim=True), [f(4, 3)]),
    ("quantile", lambda m, a: m.quantile(a, 0.3), [f(3, 7)]),
    ("quantile_q", lambda m, a: m.quantile(a, m.tensor([0.1, 0.5, 0.9]), dim=1, keepdim=True),
     [f(3, 7)]),
    ("quantile_q0", lambda m, a: a.quantile(m.tensor([0.0, 1.0]), dim=0), [f(3, 4)]),
    ("quantile_keep", lambda m, a: m.quantile(a, 0.5, keepdim=True), [f(3, 4)]),
    ("quantile_lower", lambda m, a: m.quantile(a, 0.35, interpolation="lower"), [f(3, 7)]),
    ("quantile_higher", lambda m, a: m.quantile(a, 0.35, 1, interpolation="higher"),
     [f(3, 7)]),
    ("quantile_midpoint", lambda m, a: m.quantile(a, 0.35, interpolation="midpoint"),
     [f(3, 7)]),
    ("quantile_nearest", lambda m, a: m.quantile(a, 0.25, 1, interpolation="nearest"),
     [f(3, 9)]),
    ("quantile_nan", lambda m, a: m.quantile(a, 0.4, dim=1), [NANS]),
    ("nanquantile", lambda m, a: m.nanquantile(a, 0.4, dim=1), [NANS]),
    ("nanquantile_all_nan", lambda m, a: a.nanquantile(0.3, dim=0),
     [np.array([[1, np.nan], [2, np.nan], [5, np.nan]], np.float32)]),
    ("var_mean", lambda m, a: m.var_mean(a, 1, correction=0), [f(3, 4)]),
    ("var_mean_mean", lambda m, a: m.var_mean(a, (0, 1), keepdim=True)[1], [f(3, 4)]),
    ("std_mean", lambda m, a: m.std_mean(a), [f(3, 4)]),
    ("std_mean_mean", lambda m, a: m.std_mean(a, 0)[1], [f(3, 4)]),
    ("aminmax", lambda m, a: m.aminmax(a), [f(3, 4)]),
    ("aminmax_dim", lambda m, a: a.aminmax(dim=0)[1], [f(3, 4)]),
    ("aminmax_keep", lambda m, a: m.aminmax(a, dim=1, keepdim=True)[0], [f(3, 4)]),
]


@pytest.mark.parametrize("name,fn,arrays", STATS, ids=[s[0] for s in STATS])
def test_order_statistics(name, fn, arrays):
    compare(lambda *a: fn(pyddp, *a), lambda *a: fn(torch, *a), arrays, tol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rp = fn(pyddp, *[pyddp.tensor(a) for a in arrays])
        rt = fn(torch, *[torch.tensor(a) for a in arrays])
    if isinstance(rt, tuple) and hasattr(rt, "indices"):
        assert rp.indices.tolist() == rt.indices.tolist()
        assert rp.indices.dtype == np.int64


STATS_ERRORS = [
    ("cummax_dim", lambda m: m.cummax(m.zeros(2, 3), 2)),
    ("kthvalue_k", lambda m: m.kthvalue(m.zeros(2, 3), 4, 1)),
    ("kthvalue_0", lambda m: m.kthvalue(m.zeros(2, 3), 0)),
    ("quantile_q", lambda m: m.quantile(m.zeros(2, 3), 1.5)),
    ("quantile_int", lambda m: m.quantile(m.tensor([1, 2]), 0.5)),
    ("quantile_interp", lambda m: m.quantile(m.zeros(3), 0.5, interpolation="foo")),
    ("quantile_qdtype", lambda m: m.quantile(m.zeros(3), m.tensor([0.5], dtype=m.float64))),
    ("aminmax_empty", lambda m: m.aminmax(m.zeros(0))),
    ("logcumsumexp_int", lambda m: m.logcumsumexp(m.tensor([1, 2]), 0)),
]


@pytest.mark.parametrize("name,fn", STATS_ERRORS, ids=[e[0] for e in STATS_ERRORS])
def test_order_statistics_errors(name, fn):
    both_raise(lambda: fn(pyddp), lambda: fn(torch))


# --- searching and counting ------------------------------------------------------------------

def test_searchsorted_bucketize():
    seq = np.array([1, 3, 3, 5, 7], np.int64)
    vals = np.array([[0, 3, 6], [7, 8, 3]], np.int64)
    for kw in ({}, {"right": True}, {"side": "right"}, {"out_int32": True}):
        p = pyddp.searchsorted(pyddp.tensor(seq), pyddp.tensor(vals), **kw)
        t = torch.searchsorted(torch.tensor(seq), torch.tensor(vals), **kw)
        assert p.tolist() == t.tolist() and str(p.dtype) == str(t.dtype).replace("torch.", "")
        p = pyddp.bucketize(pyddp.tensor(vals), pyddp.tensor(seq), **{k: v for k, v in kw.items()
                                                                      if k != "side"})
        t = torch.bucketize(torch.tensor(vals), torch.tensor(seq), **{k: v for k, v in kw.items()
                                                                      if k != "side"})
        assert p.tolist() == t.tolist()
    s2 = np.sort(f(2, 5), axis=1)
    v2 = f(2, 3)
    assert pyddp.searchsorted(pyddp.tensor(s2), pyddp.tensor(v2)).tolist() == \
        torch.searchsorted(torch.tensor(s2), torch.tensor(v2)).tolist()
    assert pyddp.searchsorted(pyddp.tensor(seq), 3).tolist() == \
        torch.searchsorted(torch.tensor(seq), 3).tolist()
    assert pyddp.bucketize(3, pyddp.tensor(seq)).tolist() == \
        torch.bucketize(3, torch.tensor(seq)).tolist()
    order = np.array([2, 0, 1], np.int64)
    assert pyddp.searchsorted(pyddp.tensor([5.0, 1.0, 3.0]), pyddp.tensor([2.0]),
                              sorter=pyddp.tensor(order)).tolist() == \
        torch.searchsorted(torch.tensor([5.0, 1.0, 3.0]), torch.tensor([2.0]),
                           sorter=torch.tensor(order)).tolist()


def test_bincount_isin_argwhere():
    x = np.array([0, 1, 1, 3, 1], np.int64)
    for kw in ({}, {"minlength": 7}):
        same = pyddp.bincount(pyddp.tensor(x), **kw), torch.bincount(torch.tensor(x), **kw)
        assert same[0].tolist() == same[1].tolist() and same[0].dtype == np.int64
    for w in (f(5), np.arange(5, dtype=np.int64), f(5, dtype=np.float64)):
        p = pyddp.tensor(x).bincount(pyddp.tensor(w), minlength=5)
        t = torch.tensor(x).bincount(torch.tensor(w), minlength=5)
        assert str(p.dtype) == str(t.dtype).replace("torch.", "")
        np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-6)
    assert pyddp.bincount(pyddp.tensor(np.zeros(0, np.int64))).tolist() == []
    e, te = np.array([[1, 2], [3, 4]], np.int64), np.array([2, 5, 4], np.int64)
    for kw in ({}, {"invert": True}):
        assert pyddp.isin(pyddp.tensor(e), pyddp.tensor(te), **kw).tolist() == \
            torch.isin(torch.tensor(e), torch.tensor(te), **kw).tolist()
    assert pyddp.isin(pyddp.tensor(e), 2).tolist() == torch.isin(torch.tensor(e), 2).tolist()
    assert pyddp.isin(2, pyddp.tensor(te)).tolist() == torch.isin(2, torch.tensor(te)).tolist()
    a = np.array([[0, 1], [1, 0], [2, 0]], np.int64)
    assert pyddp.argwhere(pyddp.tensor(a)).tolist() == torch.argwhere(torch.tensor(a)).tolist()
    assert pyddp.tensor(a).argwhere().dtype == np.int64


SEARCH_ERRORS = [
    ("searchsorted_shapes", lambda m: m.searchsorted(m.tensor([[1, 3], [2, 4]]), m.tensor([2]))),
    ("searchsorted_side", lambda m: m.searchsorted(m.tensor([1, 3]), m.tensor([2]), side="left",
                                                   right=True)),
    ("bucketize_2d", lambda m: m.bucketize(m.tensor([3]), m.tensor([[1, 3]]))),
    ("bincount_neg", lambda m: m.bincount(m.tensor([-1]))),
    ("bincount_float", lambda m: m.bincount(m.tensor([1.0]))),
    ("bincount_2d", lambda m: m.bincount(m.tensor([[1]]))),
]


@pytest.mark.parametrize("name,fn", SEARCH_ERRORS, ids=[e[0] for e in SEARCH_ERRORS])
def test_search_errors(name, fn):
    both_raise(lambda: fn(pyddp), lambda: fn(torch))


# --- index writes and scatter_reduce -------------------------------------------------------------

INDEX = [
    ("index_add", lambda m, a, b: m.index_add(a, 0, m.tensor([1, 0, 1]), b, alpha=2),
     [f(3, 2), f(3, 2)]),
    ("index_add_method", lambda m, a, b: a.index_add(1, m.tensor([2, 2]), b), [f(3, 4), f(3, 2)]),
    ("index_copy", lambda m, a, b: m.index_copy(a, 1, m.tensor([2, 0]), b), [f(3, 4), f(3, 2)]),
    ("index_fill", lambda m, a: m.index_fill(a, 1, m.tensor([2, 0]), -1.0), [f(3, 4)]),
    ("index_fill_t", lambda m, a, v: a.index_fill(0, m.tensor([1]), v.sum()), [f(3, 4), f(2)]),
]
for _red in ("sum", "prod", "mean", "amax", "amin"):
    for _inc in (True, False):
        INDEX.append((f"scatter_reduce_{_red}_{_inc}",
                      lambda m, a, b, r=_red, i=_inc: m.scatter_reduce(
                          a, 0, m.tensor([0, 0, 2, 2, 2]), b, r, include_self=i),
                      [np.array([1, 2, 3, 0], np.float32), np.array([2, 2, 0, 3, 3], np.float32)]))
INDEX.append(("scatter_reduce_2d", lambda m, a, b: a.scatter_reduce(
    1, m.tensor([[0, 1, 0], [2, 2, 1]]), b, "amax"), [f(2, 3), f(2, 3)]))
INDEX.append(("scatter_reduce_prod_zeros", lambda m, a, b: m.scatter_reduce(
    a, 0, m.tensor([0, 0, 1, 1, 2]), b, "prod"),
    [np.array([0, 2, 3], np.float32), np.array([2, 0, 0, 0, 4], np.float32)]))


@pytest.mark.parametrize("name,fn,arrays", INDEX, ids=[i[0] for i in INDEX])
def test_index_writes(name, fn, arrays):
    compare(lambda *a: fn(pyddp, *a), lambda *a: fn(torch, *a), arrays)


def test_index_writes_inplace():
    a, b = f(3, 4), f(3, 2)
    for name, args in (("index_add_", (1, [2, 0], b)), ("index_copy_", (1, [2, 0], b)),
                       ("index_fill_", (1, [2, 0], 5.0))):
        p, t = pyddp.tensor(a.copy()), torch.tensor(a.copy())
        src_p = pyddp.tensor(args[2]) if isinstance(args[2], np.ndarray) else args[2]
        src_t = torch.tensor(args[2]) if isinstance(args[2], np.ndarray) else args[2]
        assert getattr(p, name)(args[0], pyddp.tensor(args[1]), src_p) is p
        getattr(t, name)(args[0], torch.tensor(args[1]), src_t)
        np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-6)
    p, t = pyddp.tensor(a.copy()), torch.tensor(a.copy())
    idx = np.array([[0, 0], [1, 3], [2, 2]], np.int64)
    p.scatter_reduce_(1, pyddp.tensor(idx), pyddp.tensor(b), "amin", include_self=False)
    t.scatter_reduce_(1, torch.tensor(idx), torch.tensor(b), "amin", include_self=False)
    np.testing.assert_allclose(p.numpy(), t.numpy())
    # a graph through the in-place write, as torch's
    w = pyddp.tensor(b, requires_grad=True)
    x = pyddp.zeros(3, 4).index_add_(1, pyddp.tensor([1, 3]), w * 2)
    x.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full((3, 2), 2.0))


INDEX_ERRORS = [
    ("index_add_oob", lambda m: m.zeros(3, 2).index_add(0, m.tensor([3]), m.zeros(1, 2))),
    ("scatter_reduce_op", lambda m: m.scatter_reduce(m.zeros(3), 0, m.tensor([0]), m.zeros(1),
                                                     "foo")),
    ("scatter_reduce_oob", lambda m: m.scatter_reduce(m.zeros(3), 0, m.tensor([5]), m.zeros(1),
                                                      "sum")),
    ("index_fill_value", lambda m: m.zeros(3).index_fill(0, m.tensor([0]), m.zeros(2))),
]


@pytest.mark.parametrize("name,fn", INDEX_ERRORS, ids=[e[0] for e in INDEX_ERRORS])
def test_index_errors(name, fn):
    both_raise(lambda: fn(pyddp), lambda: fn(torch))


# --- matrix functions ------------------------------------------------------------------------------

MATRIX = [
    ("inverse", lambda m, a: m.inverse(a), [f(2, 3, 3)]),
    ("inverse_method", lambda m, a: a.inverse(), [f(4, 4, dtype=np.float64)]),
    ("det", lambda m, a: m.det(a), [f(2, 3, 3)]),
    ("det_method", lambda m, a: a.det(), [f(4, 4, dtype=np.float64)]),
    ("slogdet", lambda m, a: m.slogdet(a), [f(2, 3, 3)]),
    ("slogdet_sign", lambda m, a: m.slogdet(a)[0] * 1, [f(2, 3, 3)]),
    ("logdet", lambda m, a: m.logdet(a), [SPD]),
    ("cholesky", lambda m, a: m.cholesky(a), [SPD]),
    ("cholesky_upper", lambda m, a: a.cholesky(upper=True), [SPD]),
    ("pinverse_wide", lambda m, a: m.pinverse(a), [f(3, 5)]),
    ("pinverse_tall", lambda m, a: a.pinverse(), [f(2, 5, 3)]),
    ("matrix_power", lambda m, a: m.matrix_power(a, 3), [f(3, 3)]),
    ("matrix_power_neg", lambda m, a: a.matrix_power(-2), [f(3, 3) + 3 * np.eye(3, dtype=np.float32)]),
    ("matrix_power_0", lambda m, a: m.matrix_power(a, 0), [f(2, 3, 3)]),
    ("matrix_power_1", lambda m, a: m.matrix_power(a, 1), [f(3, 3)]),
]


@pytest.mark.parametrize("name,fn,arrays", MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix_functions(name, fn, arrays):
    compare(lambda *a: fn(pyddp, *a), lambda *a: fn(torch, *a), arrays, tol=1e-4, gtol=2e-3)


def test_det_of_singular_matrix_gradient_as_torch():
    a = np.array([[1.0, 2.0], [2.0, 4.0]], np.float64)
    compare(lambda x: pyddp.det(x), lambda x: torch.det(x), [a])
    p = pyddp.slogdet(pyddp.tensor(a))
    assert p.sign.item() == 0 and p.logabsdet.item() == -np.inf


MATRIX_ERRORS = [
    ("inv_nonsquare", lambda m: m.inverse(m.zeros(2, 3))),
    ("inv_1d", lambda m: m.inverse(m.zeros(3))),
    ("inv_singular", lambda m: m.inverse(m.tensor([[1.0, 2.0], [2.0, 4.0]]))),
    ("inv_singular3", lambda m: m.inverse(m.tensor([[1.0, 2, 3], [2, 4, 6], [1, 0, 1]]))),
    ("inv_int", lambda m: m.inverse(m.tensor([[1, 2], [3, 4]]))),
    ("det_nonsquare", lambda m: m.det(m.zeros(2, 3))),
    ("det_int", lambda m: m.det(m.tensor([[1, 2], [3, 4]]))),
    ("cholesky_not_pd", lambda m: m.cholesky(m.tensor([[1.0, 2], [2, 1]]))),
    ("matrix_power_nonsquare", lambda m: m.matrix_power(m.zeros(2, 3), 2)),
    ("matrix_power_int_neg", lambda m: m.matrix_power(m.tensor([[1, 1], [0, 1]]), -1)),
    ("pinverse_int", lambda m: m.pinverse(m.tensor([[1, 2]]))),
]


@pytest.mark.parametrize("name,fn", MATRIX_ERRORS, ids=[e[0] for e in MATRIX_ERRORS])
def test_matrix_errors(name, fn):
    both_raise(lambda: fn(pyddp), lambda: fn(torch))


def test_matrix_power_of_integers():
    a = np.array([[1, 1], [0, 1]], np.int64)
    assert pyddp.matrix_power(pyddp.tensor(a), 3).tolist() == \
        torch.matrix_power(torch.tensor(a), 3).tolist()


# --- process-wide switches -----------------------------------------------------------------------

def test_num_threads():
    n = pyddp.get_num_threads()
    assert isinstance(n, int) and n >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # without threadpoolctl
        pyddp.set_num_threads(1)
    assert pyddp.get_num_threads() == 1
    assert pyddp.get_num_interop_threads() >= 1
    for bad in (0, -1, 1.5, "2"):
        both_raise(lambda: pyddp.set_num_threads(bad), lambda: torch.set_num_threads(bad))
    both_raise(lambda: pyddp.set_num_interop_threads(0),
               lambda: torch.set_num_interop_threads(0))


def test_num_interop_threads_once(monkeypatch):
    from pyddp._tensor import _runtime
    monkeypatch.setitem(_runtime._threads, "interop", None)
    pyddp.set_num_interop_threads(2)
    assert pyddp.get_num_interop_threads() == 2
    with pytest.raises(RuntimeError, match="cannot set number of interop threads"):
        pyddp.set_num_interop_threads(3)


def test_rng_state_round_trip_and_torch_layout():
    pyddp.manual_seed(7)
    s = pyddp.get_rng_state()
    assert s.dtype == np.uint8 and tuple(s.shape) == tuple(torch.get_rng_state().shape)
    a = pyddp.randperm(10).tolist()
    pyddp.set_rng_state(s)
    assert pyddp.randperm(10).tolist() == a
    torch.manual_seed(7)
    assert np.array_equal(s.numpy(), torch.get_rng_state().numpy())
    pyddp.set_rng_state(torch.get_rng_state())
    assert pyddp.randperm(10).tolist() == torch.randperm(10).tolist()
    both_raise(lambda: pyddp.set_rng_state(pyddp.zeros(3)), lambda: torch.set_rng_state(
        torch.zeros(3)))
    both_raise(lambda: pyddp.set_rng_state(pyddp.zeros(3, dtype=pyddp.uint8)),
               lambda: torch.set_rng_state(torch.zeros(3, dtype=torch.uint8)))
    both_raise(lambda: pyddp.set_rng_state([1, 2]), lambda: torch.set_rng_state([1, 2]))


def test_deterministic_algorithms(monkeypatch):
    from pyddp._tensor import _runtime
    monkeypatch.setattr(_runtime, "_det", {"mode": False, "warn_only": False})
    assert pyddp.are_deterministic_algorithms_enabled() is False
    pyddp.use_deterministic_algorithms(True, warn_only=True)
    assert pyddp.are_deterministic_algorithms_enabled() is True
    assert pyddp.is_deterministic_algorithms_warn_only_enabled() is True
    assert pyddp.get_deterministic_debug_mode() == 1
    pyddp.set_deterministic_debug_mode("error")
    assert pyddp.get_deterministic_debug_mode() == 2
    pyddp.use_deterministic_algorithms(False)
    assert pyddp.get_deterministic_debug_mode() == 0
    both_raise(lambda: pyddp.use_deterministic_algorithms(1),
               lambda: torch.use_deterministic_algorithms(1))


def test_normal_and_randint_like():
    pyddp.manual_seed(0)
    x = pyddp.normal(2.0, 3.0, (20000,))
    assert x.dtype == np.float32 and abs(x.mean().item() - 2) < 0.1 and \
        abs(x.std().item() - 3) < 0.1
    m = pyddp.normal(pyddp.zeros(2, 3, dtype=pyddp.float64), 1.0)
    assert m.dtype == np.float64 and tuple(m.shape) == (2, 3)
    m = pyddp.normal(pyddp.zeros(4, 1), pyddp.ones(3))
    assert tuple(m.shape) == (4, 3)
    for fn in (lambda m: m.normal(0.0, -1.0, (2,)), lambda m: m.normal(m.zeros(2), m.ones(3)),
               lambda m: m.normal(0.0, m.tensor([-1.0])),
               lambda m: m.normal(m.zeros(2, dtype=m.int64), 1.0)):
        both_raise(lambda: fn(pyddp), lambda: fn(torch))
    r = pyddp.randint_like(pyddp.zeros(200, 3), 5)
    assert r.dtype == np.float32 and tuple(r.shape) == (200, 3) and r.min() >= 0 and r.max() < 5
    r = pyddp.randint_like(pyddp.zeros(200, dtype=pyddp.int64), 2, 5)
    assert r.dtype == np.int64 and set(r.tolist()) == {2, 3, 4}
    both_raise(lambda: pyddp.randint_like(pyddp.zeros(2), 3, 1),
               lambda: torch.randint_like(torch.zeros(2), 3, 1))


@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
def test_windows(n):
    for periodic in (True, False):
        for fn in ("hann_window", "hamming_window"):
            p = getattr(pyddp, fn)(n, periodic)
            t = getattr(torch, fn)(n, periodic)
            assert p.dtype == np.float32
            np.testing.assert_allclose(p.numpy(), t.numpy(), atol=1e-6)
    p = pyddp.hann_window(n, dtype=pyddp.float64)
    np.testing.assert_allclose(p.numpy(), torch.hann_window(n, dtype=torch.float64).numpy())


def test_window_errors():
    both_raise(lambda: pyddp.hann_window(-1), lambda: torch.hann_window(-1))
    both_raise(lambda: pyddp.hann_window(4, dtype=pyddp.int64),
               lambda: torch.hann_window(4, dtype=torch.int64))


# --- torch.*'s in-place and neural-network spellings -----------------------------------------------

@pytest.mark.parametrize("name,args", [
    ("relu_", ()), ("sigmoid_", ()), ("exp_", ()), ("square_", ()), ("rsqrt_", ()),
    ("sqrt_", ()), ("tanh_", ()), ("clamp_", (-0.5, 0.5)), ("clamp_min_", (0.1,)),
    ("clamp_max_", (0.2,)), ("fill_", (3.0,)), ("zero_", ()), ("nan_to_num_", ()),
    ("neg_", ()), ("abs_", ()), ("log_", ()), ("selu_", ()), ("celu_", ()),
    ("threshold_", (0.5, -2.0)), ("erfc_", ()), ("deg2rad_", ()), ("fix_", ())])
def test_torch_inplace_functions(name, args):
    a = np.abs(f(3, 4)) + 0.1
    a[0, 0] = -0.3 if name not in ("rsqrt_", "sqrt_", "log_") else 0.2
    p, t = pyddp.tensor(a.copy()), torch.tensor(a.copy())
    assert getattr(pyddp, name)(p, *args) is p
    getattr(torch, name)(t, *args)
    np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-6, atol=1e-6)


NN = [
    ("layer_norm", lambda m, a, w, b: m.layer_norm(a, (4,), w, b, 1e-5), [f(3, 4), f(4), f(4)]),
    ("group_norm", lambda m, a, w, b: m.group_norm(a, 2, w, b), [f(2, 4, 3), f(4), f(4)]),
    ("batch_norm", lambda m, a, w, b: m.batch_norm(a, w, b, None, None, True, 0.1, 1e-5, True),
     [f(5, 4), f(4), f(4)]),
    ("embedding", lambda m, w: m.embedding(w, m.tensor([[1, 2], [0, 1]])), [f(3, 4)]),
    ("embedding_pad", lambda m, w: m.embedding(w, m.tensor([1, 2, 1]), 1), [f(3, 4)]),
    ("dropout_eval", lambda m, a: m.dropout(a, 0.5, False), [f(3, 4)]),
    ("conv2d", lambda m, a, w, b: m.conv2d(a, w, b, 1, 1), [f(1, 2, 5, 5), f(3, 2, 3, 3), f(3)]),
    ("max_pool2d", lambda m, a: m.max_pool2d(a, 2), [f(1, 2, 4, 4)]),
    ("rms_norm", lambda m, a, w: m.rms_norm(a, (4,), w), [f(3, 4), f(4)]),
    ("rms_norm_eps", lambda m, a: m.rms_norm(a, [2, 4], eps=1e-3), [f(3, 2, 4)]),
    ("pairwise_distance", lambda m, a, b: m.pairwise_distance(a, b), [f(3, 4), f(3, 4)]),
    ("kl_div", lambda m, a, b: m.kl_div(a, b, 2), [f(3, 4), np.abs(f(3, 4))]),
    ("kl_div_none", lambda m, a, b: m.kl_div(a, b), [f(3, 4), np.abs(f(3, 4))]),
    ("kl_div_mean", lambda m, a, b: m.kl_div(a, b, 1, log_target=True), [f(3, 4), f(3, 4)]),
    ("bce_logits_default", lambda m, a, b: m.binary_cross_entropy_with_logits(a, b),
     [f(3, 4), np.abs(f(3, 4)) % 1]),
    ("bce_logits", lambda m, a, b: m.binary_cross_entropy_with_logits(a, b, None, None, 0),
     [f(3, 4), np.abs(f(3, 4)) % 1]),
    ("pixel_shuffle", lambda m, a: m.pixel_shuffle(a, 2), [f(1, 8, 2, 3)]),
    ("pixel_unshuffle", lambda m, a: m.pixel_unshuffle(a, 2), [f(1, 2, 4, 6)]),
    ("prelu", lambda m, a, w: m.prelu(a, w), [f(2, 3, 4), np.array([0.25], np.float32)]),
    ("selu", lambda m, a: m.selu(a), [f(3, 4)]),
    ("celu", lambda m, a: m.celu(a, 0.7), [f(3, 4)]),
    ("threshold", lambda m, a: m.threshold(a, 0.1, -1.0), [f(3, 4)]),
    ("hardshrink", lambda m, a: m.hardshrink(a, 0.3), [f(3, 4)]),
]


@pytest.mark.parametrize("name,fn,arrays", NN, ids=[n[0] for n in NN])
def test_torch_nn_spellings(name, fn, arrays):
    compare(lambda *a: fn(pyddp, *a), lambda *a: fn(torch, *a), arrays, tol=1e-4, gtol=1e-3)


def test_torch_dropout_trains():
    pyddp.manual_seed(0)
    x = pyddp.dropout(pyddp.ones(1000), 0.5, True)
    kept = x.numpy() != 0
    assert 350 < kept.sum() < 650 and np.allclose(x.numpy()[kept], 2.0)


def test_every_torch_inplace_function():
    from pyddp._tensor import _inplace
    args = {"clamp_": (0.2, 0.6), "clip_": (0.2, 0.6), "clamp_min_": (0.3,),
            "clamp_max_": (0.3,), "fill_": (2.0,), "xlogy_": (0.5,)}
    a = np.linspace(0.05, 0.95, 12, dtype=np.float32).reshape(3, 4)
    names = [n for n in _inplace.__all__ if n.endswith("_")]
    assert len(names) >= 50
    for name in names:
        p, t = pyddp.tensor(a.copy()), torch.tensor(a.copy())
        assert getattr(pyddp, name)(p, *args.get(name, ())) is p, name
        getattr(torch, name)(t, *args.get(name, ()))
        np.testing.assert_allclose(p.numpy(), t.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(pyddp.fix(pyddp.tensor([-1.5, 2.5])).numpy(),
                               torch.fix(torch.tensor([-1.5, 2.5])).numpy())
