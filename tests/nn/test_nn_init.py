"""pyddp.nn.init: torch's fan/gain arithmetic, the distributions' parameters, in-place writes.

The distributions are checked with seeded draws against their closed-form moments and bounds
(computed here from the textbook formulas, independently of pyddp), and the fan/gain numbers and
error messages against torch 2.13 where it is installed.
"""
import math

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
from pyddp.nn import init

SHAPES = [(30, 20), (16, 8, 3, 3), (5, 7, 2), (4, 6, 1, 1)]


def _fans(shape):
    rf = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * rf, shape[0] * rf


def test_calculate_gain_table():
    assert init.calculate_gain("linear") == 1
    assert init.calculate_gain("conv2d") == 1
    assert init.calculate_gain("sigmoid") == 1
    assert init.calculate_gain("tanh") == 5.0 / 3
    assert init.calculate_gain("relu") == math.sqrt(2.0)
    assert init.calculate_gain("leaky_relu") == math.sqrt(2.0 / (1 + 0.01 ** 2))
    assert init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2.0 / 1.04)
    assert init.calculate_gain("leaky_relu", math.sqrt(5)) == math.sqrt(2.0 / 6)
    assert init.calculate_gain("selu") == 0.75
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("swish")
    with pytest.raises(ValueError, match="not a valid number"):
        init.calculate_gain("leaky_relu", True)


def test_calculate_gain_and_fans_vs_torch():
    torch = pytest.importorskip("torch")
    for nl, p in [("linear", None), ("tanh", None), ("relu", None), ("leaky_relu", None),
                  ("leaky_relu", 0.3), ("selu", None), ("conv_transpose2d", None)]:
        assert init.calculate_gain(nl, p) == torch.nn.init.calculate_gain(nl, p)
    for shape in SHAPES:
        assert init._calculate_fan_in_and_fan_out(pyddp.zeros(*shape)) == \
            torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(shape))
    for fn in ("xavier_uniform_", "kaiming_normal_"):
        with pytest.raises(ValueError) as et:
            getattr(torch.nn.init, fn)(torch.zeros(3))
        with pytest.raises(ValueError) as ep:
            getattr(init, fn)(pyddp.zeros(3))
        assert str(ep.value) == str(et.value)
    with pytest.raises(ValueError) as et:
        torch.nn.init.kaiming_uniform_(torch.zeros(3, 3), mode="fan_avg")
    with pytest.raises(ValueError) as ep:
        init.kaiming_uniform_(pyddp.zeros(3, 3), mode="fan_avg")
    assert str(ep.value) == str(et.value)


def _check_uniform(a, lo, hi):
    a = np.asarray(a, dtype=np.float64).ravel()
    n = a.size
    assert a.min() >= lo and a.max() <= hi
    width = hi - lo
    # the extremes of n uniform draws lie within ~10 width/n of the bounds
    assert a.min() < lo + 10 * width / n and a.max() > hi - 10 * width / n
    assert abs(a.mean() - (lo + hi) / 2) < 5 * width / math.sqrt(12 * n)
    assert abs(a.std() - width / math.sqrt(12)) < 0.03 * width / math.sqrt(12)


def _check_normal(a, mean, std):
    a = np.asarray(a, dtype=np.float64).ravel()
    n = a.size
    assert abs(a.mean() - mean) < 5 * std / math.sqrt(n)
    assert abs(a.std() - std) < 0.03 * std


@pytest.mark.parametrize("shape", SHAPES)
def test_kaiming_and_xavier_distributions(shape):
    pyddp.manual_seed(0)
    big = (shape[0] * 40,) + shape[1:]  # enough draws for tight moments, same fans per row
    fan_in, fan_out = _fans(big)
    t = pyddp.empty(*big)
    arr = t.numpy()
    assert init.kaiming_uniform_(t, a=math.sqrt(5)) is t and t.numpy() is arr
    bound = math.sqrt(3.0) * math.sqrt(2.0 / 6) / math.sqrt(fan_in)  # = 1/sqrt(fan_in)
    assert abs(bound - 1 / math.sqrt(fan_in)) < 1e-12
    _check_uniform(arr, -bound, bound)
    init.kaiming_uniform_(t, mode="fan_out", nonlinearity="relu")
    b = math.sqrt(3.0) * math.sqrt(2.0) / math.sqrt(fan_out)
    _check_uniform(arr, -b, b)
    init.kaiming_normal_(t, nonlinearity="relu")
    _check_normal(arr, 0.0, math.sqrt(2.0) / math.sqrt(fan_in))
    init.xavier_uniform_(t, gain=2.0)
    a = 2.0 * math.sqrt(6.0 / (fan_in + fan_out))
    _check_uniform(arr, -a, a)
    init.xavier_normal_(t)
    _check_normal(arr, 0.0, math.sqrt(2.0 / (fan_in + fan_out)))


def test_basic_fills_and_dtypes():
    pyddp.manual_seed(1)
    t = pyddp.empty(200, 100, dtype=pyddp.float16)
    init.uniform_(t, -2.0, 3.0)
    assert t.dtype == np.float16
    _check_uniform(t.numpy(), -2.0, 3.0)
    init.normal_(t, 1.0, 0.5)
    _check_normal(t.numpy(), 1.0, 0.5)
    init.constant_(t, 0.25)
    assert (t.numpy() == np.float16(0.25)).all()
    init.ones_(t)
    assert (t.numpy() == 1).all()
    init.zeros_(t)
    assert not t.numpy().any()
    e = pyddp.empty(3, 5)
    init.eye_(e)
    np.testing.assert_array_equal(e.numpy(), np.eye(3, 5))
    d = pyddp.empty(4, 2, 3, 3)
    init.dirac_(d, groups=2)
    ref = np.zeros((4, 2, 3, 3), np.float32)
    for g in range(2):
        for k in range(2):
            ref[g * 2 + k, k, 1, 1] = 1
    np.testing.assert_array_equal(d.numpy(), ref)
    # bare ndarrays and explicit generators are accepted
    a = np.empty((1000,), np.float32)
    init.uniform_(a, 0, 1, generator=np.random.default_rng(3))
    b = np.empty((1000,), np.float32)
    init.uniform_(b, 0, 1, generator=np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="Tensor or numpy.ndarray"):
        init.zeros_([1, 2])
    # pyddp.manual_seed makes the default initialisation reproducible
    pyddp.manual_seed(5)
    w1 = nn.Linear(4, 3).weight.numpy().copy()
    pyddp.manual_seed(5)
    np.testing.assert_array_equal(nn.Linear(4, 3).weight.numpy(), w1)


def test_trunc_normal_exact_truncation():
    pyddp.manual_seed(2)
    t = pyddp.empty(200000)
    init.trunc_normal_(t, mean=0.5, std=2.0, a=-1.0, b=3.0)
    x = t.numpy().astype(np.float64)
    assert x.min() >= -1.0 and x.max() <= 3.0
    # closed-form truncated-normal moments
    al, be = (-1.0 - 0.5) / 2.0, (3.0 - 0.5) / 2.0
    phi = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    Phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    Z = Phi(be) - Phi(al)
    mean = 0.5 + 2.0 * (phi(al) - phi(be)) / Z
    var = 4.0 * (1 + (al * phi(al) - be * phi(be)) / Z - ((phi(al) - phi(be)) / Z) ** 2)
    assert abs(x.mean() - mean) < 5 * math.sqrt(var / x.size)
    assert abs(x.var() - var) < 0.02 * var
    # windows far in a tail (uniform and exponential proposals): conditional means from the
    # closed form E[Z | lo < Z < hi] = (phi(lo) - phi(hi)) / (Phi(hi) - Phi(lo)), via erfc
    def tail_mean(lo, hi):
        Q = lambda z: 0.5 * math.erfc(z / math.sqrt(2))  # noqa: E731
        return (phi(lo) - phi(hi)) / (Q(lo) - Q(hi))

    with pytest.warns(UserWarning, match="more than 2 std"):
        for lo, hi in [(5.0, 5.5), (6.0, 9.0), (-9.0, -6.0), (4.0, 4.001)]:
            init.trunc_normal_(t, mean=0.0, std=1.0, a=lo, b=hi)
            y = t.numpy().astype(np.float64)
            assert y.min() >= lo and y.max() <= hi
            sd = (hi - lo) / math.sqrt(12)  # an upper bound of the conditional std
            m = tail_mean(lo, hi) if lo > 0 else -tail_mean(-hi, -lo)
            assert abs(y.mean() - m) < 5 * sd / math.sqrt(y.size) + 1e-9, (lo, hi)


def test_orthogonal():
    pyddp.manual_seed(3)
    for shape in [(6, 4), (4, 6), (3, 2, 2, 2)]:
        t = pyddp.empty(*shape)
        init.orthogonal_(t, gain=1.5)
        m = t.numpy().reshape(shape[0], -1).astype(np.float64)
        if m.shape[0] <= m.shape[1]:
            np.testing.assert_allclose(m @ m.T, 2.25 * np.eye(m.shape[0]), atol=1e-5)
        else:
            np.testing.assert_allclose(m.T @ m, 2.25 * np.eye(m.shape[1]), atol=1e-5)


def test_zero_element_tensors_warn():
    with pytest.warns(UserWarning, match="no-op"):
        init.kaiming_uniform_(pyddp.empty(0, 3))


def test_default_layer_init_matches_torch_bounds():
    """Linear/Conv2d defaults: the observed range is the same as torch's for the same shapes."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    pyddp.manual_seed(0)
    for make in (lambda m: m.Linear(300, 200), lambda m: m.Conv2d(16, 64, 5)):
        tm, pm = make(torch.nn), make(nn)
        for name in ("weight", "bias"):
            tw = getattr(tm, name).detach().numpy()
            pw = getattr(pm, name).numpy()
            assert pw.shape == tw.shape and pw.dtype == tw.dtype
            t_max, p_max = np.abs(tw).max(), np.abs(pw).max()
            assert abs(p_max - t_max) < 0.05 * t_max
            assert abs(pw.std() - tw.std()) < 0.1 * tw.std()
