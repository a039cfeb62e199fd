"""pyddp has one random generator: pyddp.default_generator.

manual_seed / seed / initial_seed talk to it, and every random draw uses it:
the torch-compatible mt19937 draws (randperm, samplers) and the float samples
(randn, rand, randint, dropout, nn.init) from the NumPy engine it owns.
"""
import pickle

import numpy as np
import pytest

import pyddp
import pyddp._tensor as T
from pyddp import _random
from pyddp.nn import functional as F
from pyddp.nn import init


def _draws():
    """One draw of every kind that uses the default generator."""
    w = pyddp.empty(3, 4)
    init.kaiming_uniform_(w)
    return {
        "randn": pyddp.randn(5).numpy().copy(),
        "rand": pyddp.rand(2, 3, dtype=pyddp.float64).numpy().copy(),
        "randint": pyddp.randint(0, 100, (6,)).numpy().copy(),
        "randperm": pyddp.randperm(20),
        "tensor_randperm": T.randperm(20).numpy().copy(),
        "dropout": F.dropout(pyddp.ones(8), 0.5).numpy().copy(),
        "init": w.numpy().copy(),
        "normal_": pyddp.empty(4).normal_().numpy().copy(),
    }


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_one_generator_behind_the_public_names():
    assert pyddp.default_generator is _random.default_generator
    assert T.default_generator is pyddp.default_generator
    assert pyddp.seed is _random.seed and T.seed is _random.seed
    assert pyddp.initial_seed is _random.initial_seed
    assert T.manual_seed is _random.manual_seed


def test_seed_initial_seed_manual_seed_agree():
    s = pyddp.seed()
    assert pyddp.initial_seed() == s
    assert pyddp.default_generator.initial_seed() == s
    g = pyddp.manual_seed(1234)
    assert g is pyddp.default_generator
    assert pyddp.initial_seed() == 1234
    pyddp.manual_seed(-1)  # two's complement, as torch
    assert pyddp.initial_seed() == 2**64 - 1
    pyddp.default_generator.manual_seed(77)
    assert pyddp.initial_seed() == 77


def test_manual_seed_reproduces_every_draw():
    pyddp.manual_seed(7)
    a = _draws()
    pyddp.manual_seed(7)
    b = _draws()
    _same(a, b)
    pyddp.manual_seed(8)
    c = _draws()
    assert not np.array_equal(a["randn"], c["randn"])
    assert not np.array_equal(a["randperm"], c["randperm"])


def test_seed_reproduces_after_manual_seed_of_its_value():
    s = pyddp.seed()
    a = _draws()
    pyddp.manual_seed(s)
    _same(a, _draws())


def test_randperm_matches_torch_after_manual_seed():
    torch = pytest.importorskip("torch")
    pyddp.manual_seed(3)
    torch.manual_seed(3)
    np.testing.assert_array_equal(pyddp.randperm(50), torch.randperm(50).numpy())
    np.testing.assert_array_equal(T.randperm(50).numpy(), torch.randperm(50).numpy())


def test_get_state_set_state_repeat_every_draw():
    pyddp.manual_seed(11)
    _draws()
    state = pyddp.default_generator.get_state()
    a = _draws()
    pyddp.default_generator.set_state(state)
    _same(a, _draws())


def test_own_generator_leaves_the_default_alone():
    pyddp.manual_seed(5)
    ref = pyddp.randn(4).numpy().copy()
    pyddp.manual_seed(5)
    g = pyddp.Generator().manual_seed(9)
    x = pyddp.randn(4, generator=g).numpy().copy()
    p = T.randperm(10, generator=g).numpy().copy()
    np.testing.assert_array_equal(pyddp.randn(4).numpy(), ref)
    g2 = pyddp.Generator().manual_seed(9)
    np.testing.assert_array_equal(pyddp.randn(4, generator=g2).numpy(), x)
    np.testing.assert_array_equal(T.randperm(10, generator=g2).numpy(), p)
    w1, w2 = pyddp.empty(6), pyddp.empty(6)
    init.normal_(w1, generator=pyddp.Generator().manual_seed(4))
    init.normal_(w2, generator=pyddp.Generator().manual_seed(4))
    np.testing.assert_array_equal(w1.numpy(), w2.numpy())


def test_numpy_generator_argument_still_works():
    a = pyddp.randn(5, generator=np.random.default_rng(2)).numpy()
    b = pyddp.randn(5, generator=np.random.default_rng(2)).numpy()
    np.testing.assert_array_equal(a, b)
    p = T.randperm(9, generator=np.random.default_rng(2)).numpy()
    np.testing.assert_array_equal(p, np.random.default_rng(2).permutation(9))


def test_pickled_generator_continues_both_streams():
    g = pyddp.Generator().manual_seed(21)
    pyddp.randn(3, generator=g)
    pyddp.randperm(5, generator=g)
    h = pickle.loads(pickle.dumps(g))
    np.testing.assert_array_equal(pyddp.randn(4, generator=g).numpy(),
                                  pyddp.randn(4, generator=h).numpy())
    np.testing.assert_array_equal(pyddp.randperm(7, generator=g),
                                  pyddp.randperm(7, generator=h))
    assert h.initial_seed() == 21
