"""str/repr of pyddp Tensors equal torch 2.13.0's (with pyddp.<dtype> for torch.<dtype>) over many
dtypes, shapes, values and print options; set_printoptions; Tensor.equal / pyddp.equal;
Tensor.set_; randint with a dtype."""
import itertools
import math

import numpy as np
import pytest

import pyddp

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "complex128"]
if pyddp.bfloat16 is not None:
    DTYPES.append("bfloat16")

OPTIONS = [
    {}, {"precision": 2}, {"precision": 7}, {"sci_mode": True}, {"sci_mode": False},
    {"threshold": 10}, {"threshold": 10, "edgeitems": 1}, {"threshold": 5, "edgeitems": 0},
    {"linewidth": 40}, {"linewidth": 150}, {"profile": "short"}, {"profile": "full"},
    {"precision": 3, "sci_mode": True, "linewidth": 50},
]


def _values(rng, kind, n):
    if kind == "small_ints":
        return rng.integers(-9, 10, n).astype(np.float64)
    if kind == "mixed":
        return rng.standard_normal(n) * 10.0 ** rng.integers(-6, 9, n)
    if kind == "normal":
        return rng.standard_normal(n)
    if kind == "big":
        return rng.standard_normal(n) * 1e9
    if kind == "tiny":
        return rng.standard_normal(n) * 1e-6
    if kind == "special":
        base = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.0, 1e-5, 3.0])
        return np.resize(base, n)
    if kind == "zeros":
        return np.zeros(n)
    raise AssertionError(kind)


def _pair(a, dtype):
    """The same values as a pyddp Tensor and a torch tensor."""
    tdt = getattr(torch, dtype)
    if dtype == "bool":
        a = a > 0
    elif dtype.startswith("complex"):
        with np.errstate(invalid="ignore"):
            a = a + 1j * a.reshape(-1)[::-1].reshape(a.shape)
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        a = np.nan_to_num(a, nan=0, posinf=info.max, neginf=info.min)
        a = np.clip(np.round(a), info.min, info.max)
    t = torch.from_numpy(np.ascontiguousarray(a)).to(tdt)
    if dtype == "bfloat16":
        p = pyddp.from_numpy(t.float().numpy().astype(pyddp.bfloat16))
    else:
        p = pyddp.from_numpy(t.numpy().copy())
    return p, t


def _same(p, t):
    want = repr(t).replace("torch.", "pyddp.")
    assert repr(p) == want, f"\npyddp:\n{repr(p)}\ntorch:\n{want}"
    assert str(p) == str(t).replace("torch.", "pyddp.")


@pytest.fixture
def restore():
    yield
    pyddp.set_printoptions(profile="default")
    torch.set_printoptions(profile="default")


SHAPES = [(), (1,), (5,), (7,), (30,), (3, 4), (2, 3, 4), (12, 1), (40, 30), (0,), (2, 0),
          (0, 3, 1)]
KINDS = ["small_ints", "mixed", "normal", "big", "tiny", "special", "zeros"]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
                         or "default")
def test_repr_equals_torch(opts, restore):
    pyddp.set_printoptions(**opts)
    torch.set_printoptions(**opts)
    rng = np.random.default_rng(len(str(opts)))
    n = 0
    for dtype, shape, kind in itertools.product(DTYPES, SHAPES, KINDS):
        if kind in ("big", "tiny", "special") and not dtype.startswith(("float", "complex",
                                                                        "bfloat")):
            continue
        if shape == (40, 30) and kind not in ("normal", "special", "small_ints"):
            continue   # the summarised case, 1200 elements: fewer kinds keep the test fast
        size = math.prod(shape)
        p, t = _pair(_values(rng, kind, size).reshape(shape), dtype)
        _same(p, t)
        n += 1
    assert n > 400


def test_repr_suffixes_and_default_dtype(restore):
    p, t = pyddp.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    _same(p, t)
    _same(pyddp.zeros(2, 3, dtype=pyddp.float64, requires_grad=True),
          torch.zeros(2, 3, dtype=torch.float64, requires_grad=True))
    _same(pyddp.arange(12).reshape(3, 4) * 1000003, torch.arange(12).reshape(3, 4) * 1000003)
    # a long dtype suffix wraps onto its own line as in torch
    pyddp.set_printoptions(linewidth=30)
    torch.set_printoptions(linewidth=30)
    _same(pyddp.from_numpy(np.arange(6, dtype=np.int16)), torch.arange(6, dtype=torch.int16))
    _same(pyddp.ones(4, dtype=pyddp.float16, requires_grad=True),
          torch.ones(4, dtype=torch.float16, requires_grad=True))
    pyddp.set_printoptions(profile="default")
    torch.set_printoptions(profile="default")
    old = pyddp.get_default_dtype()
    try:
        pyddp.set_default_dtype(pyddp.float64)
        torch.set_default_dtype(torch.float64)
        for dt in ("float32", "float64", "complex64", "complex128"):
            _same(*_pair(np.arange(3.0), dt))
        _same(pyddp.zeros(0, dtype=pyddp.float64), torch.zeros(0, dtype=torch.float64))
    finally:
        pyddp.set_default_dtype(old)
        torch.set_default_dtype(torch.float32)
    # format() of 0-d tensors and of others
    assert f"{pyddp.tensor(2.5):.2f}" == f"{torch.tensor(2.5):.2f}"
    assert f"{pyddp.tensor([1, 2])}" == f"{torch.tensor([1, 2])}"


def test_set_printoptions_arguments(restore):
    pyddp.set_printoptions(precision=1, sci_mode=True)
    assert repr(pyddp.tensor([1.25])) == "tensor([1.2e+00])"
    pyddp.set_printoptions(precision=1)          # sci_mode goes back to None, as in torch
    assert repr(pyddp.tensor([1.25])) == "tensor([1.2])"
    from pyddp._tensor._str import get_printoptions, printoptions
    assert get_printoptions() == {"precision": 1, "threshold": 1000, "edgeitems": 3,
                                  "linewidth": 80, "sci_mode": None}
    with printoptions(precision=6):
        assert repr(pyddp.tensor([0.5])) == "tensor([0.500000])"
    assert get_printoptions()["precision"] == 1
    for bad in ({"precision": 2.5}, {"threshold": "x"}, {"sci_mode": 1}, {"linewidth": None or "80"}):
        with pytest.raises(TypeError, match="set_printoptions"):
            pyddp.set_printoptions(**bad)


def test_equal_matches_torch():
    T = torch.tensor
    P = pyddp.tensor
    cases = [([1, 2], [1.0, 2.0]), ([1, 2], [[1, 2]]), ([float("nan")], [float("nan")]),
             ([1], [True]), ([], []), (1.0, [1.0]), ([1, 2], [1, 3]), ([[1.5]], [[1.5]])]
    for a, b in cases:
        want = torch.equal(T(a), T(b))
        assert pyddp.equal(P(a), P(b)) is want and P(a).equal(P(b)) is want
    for other in (np.array([1, 2]), [1, 2], 3):
        with pytest.raises(TypeError) as pe:
            pyddp.equal(P([1, 2]), other)
        with pytest.raises(TypeError) as te:
            torch.equal(T([1, 2]), other)
        assert str(pe.value) == str(te.value)


def test_set_matches_torch():
    for args in ((), ("src",), ("src", 1, (2, 2), (2, 1)), ("src", 0, (3,), None),
                 ("src", 2, (2, 3), (1, 2))):
        p, t = pyddp.zeros(3), torch.zeros(3)
        ps, ts = pyddp.arange(8.0), torch.arange(8.0)
        pa = [ps if a == "src" else a for a in args]
        ta = [ts if a == "src" else a for a in args]
        if len(args) == 4 and args[3] is None:
            pa, ta = pa[:3], ta[:3]
        assert p.set_(*pa) is p and t.set_(*ta) is t
        assert p.shape == tuple(t.shape) and np.array_equal(p.numpy(), t.numpy())
        if args:
            ps[0:8] = 5.0   # shares the source's memory
            ts[0:8] = 5.0
            assert np.array_equal(p.numpy(), t.numpy())
    leaf = pyddp.zeros(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        leaf.set_(pyddp.zeros(2))
    with pyddp.no_grad():
        leaf.set_(pyddp.arange(3.0))
    assert leaf.requires_grad and leaf.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(RuntimeError, match="Could not set tensor"):
        pyddp.zeros(2).set_(pyddp.zeros(2, dtype=pyddp.int64))
    with pytest.raises(TypeError, match="source"):
        pyddp.zeros(2).set_(np.zeros(2))
    with pytest.raises(RuntimeError, match="out of bounds"):
        pyddp.zeros(2).set_(pyddp.zeros(4), 2, (3,), (1,))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "int32", "int64",
                                   "uint8", "bool"])
def test_randint_dtype_like_torch(dtype):
    pd, td = getattr(pyddp, dtype), getattr(torch, dtype)
    high = 2 if dtype == "bool" else 50
    p = pyddp.randint(0, high, (200,), dtype=pd)
    t = torch.randint(0, high, (200,), dtype=td)
    assert p.dtype == np.dtype(dtype) and str(t.dtype) == f"torch.{dtype}"
    v = p.numpy().astype(np.float64)
    assert np.all(v == np.floor(v)) and v.min() >= 0 and v.max() < high
    if dtype == "bool":
        assert v.min() == 0 and v.max() == 1
    assert pyddp.randint(3, 9, (2, 3), dtype=pd).shape == (2, 3)
    assert pyddp.randint(5, (4,), dtype=pd).shape == (4,)


def test_randint_errors_like_torch():
    P, T = pyddp.randint, torch.randint
    for args, kw in [((5, 3), {}), ((5, 5, (3,)), {}), ((0, 300, (3,)), {"dtype": "uint8"}),
                     ((0, 10, (2,)), {"dtype": "complex64"})]:
        pkw = {k: getattr(pyddp, v) for k, v in kw.items()}
        tkw = {k: getattr(torch, v) for k, v in kw.items()}
        with pytest.raises(Exception) as te:
            T(*args, **tkw)
        with pytest.raises(Exception) as pe:
            P(*args, **pkw)
        assert type(pe.value) is type(te.value), args
    assert pyddp.randint(0, 10, (3,), dtype=float).dtype == np.float32
    assert torch.randint(0, 10, (3,), dtype=torch.float).dtype == torch.float32
