"""The activation and similarity modules (and their functional forms) against torch 2.13:
values and input gradients on the same inputs."""
import numpy as np
import pytest

import pyddp
import pyddp.nn as pnn

torch = pytest.importorskip("torch")
tnn = torch.nn

X = np.random.default_rng(1).standard_normal((3, 4, 2)).astype(np.float32) * 3

CASES = [("LeakyReLU", (0.2,)), ("ELU", (0.7,)), ("CELU", (1.3,)), ("SELU", ()), ("SiLU", ()),
         ("Mish", ()), ("ReLU6", ()), ("Hardtanh", (-0.5, 2.0)), ("Softplus", (2.0, 5.0)),
         ("Softsign", ()), ("Hardswish", ()), ("Hardsigmoid", ()), ("LogSigmoid", ()),
         ("Tanhshrink", ()), ("Softshrink", (0.7,)), ("Hardshrink", (0.7,)),
         ("Threshold", (0.1, -2.0)), ("GLU", (1,)), ("Softmin", (1,)), ("PReLU", ()),
         ("PReLU", (4, 0.1))]


@pytest.mark.parametrize("name,args", CASES, ids=[f"{n}{a}" for n, a in CASES])
def test_activation_module_matches_torch(name, args):
    pm, tm = getattr(pnn, name)(*args), getattr(tnn, name)(*args)
    px = pyddp.tensor(X, requires_grad=True)
    tx = torch.tensor(X, requires_grad=True)
    po, to = pm(px), tm(tx)
    np.testing.assert_allclose(po.detach().numpy(), to.detach().numpy(), rtol=1e-5, atol=1e-6)
    w = np.random.default_rng(2).standard_normal(tuple(to.shape)).astype(np.float32)
    (po * pyddp.tensor(w)).sum().backward()
    (to * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(px.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    if name == "PReLU":
        np.testing.assert_allclose(pm.weight.grad.numpy(), tm.weight.grad.numpy(), rtol=1e-4,
                                   atol=1e-5)
    assert repr(pm) == repr(tm)


def test_similarity_modules_match_torch():
    a = np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32)
    b = np.random.default_rng(4).standard_normal((5, 6)).astype(np.float32)
    for pm, tm in ((pnn.CosineSimilarity(), tnn.CosineSimilarity()),
                   (pnn.CosineSimilarity(dim=0), tnn.CosineSimilarity(dim=0)),
                   (pnn.PairwiseDistance(), tnn.PairwiseDistance()),
                   (pnn.PairwiseDistance(1.0, keepdim=True), tnn.PairwiseDistance(1.0, keepdim=True)),
                   (pnn.PairwiseDistance(3.0), tnn.PairwiseDistance(3.0))):
        pa, pb = pyddp.tensor(a, requires_grad=True), pyddp.tensor(b)
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b)
        po, to = pm(pa, pb), tm(ta, tb)
        np.testing.assert_allclose(po.detach().numpy(), to.detach().numpy(), rtol=1e-5, atol=1e-6)
        po.sum().backward()
        to.sum().backward()
        np.testing.assert_allclose(pa.grad.numpy(), ta.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pyddp.cosine_similarity(pyddp.tensor(a), pyddp.tensor(b)).numpy(),
                               torch.cosine_similarity(torch.tensor(a), torch.tensor(b)).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_glu_odd_dimension_raises_as_torch():
    with pytest.raises(RuntimeError, match="Halving dimension must be even"):
        pnn.GLU(0)(pyddp.tensor(X))
    with pytest.raises(RuntimeError, match="Halving dimension must be even"):
        tnn.GLU(0)(torch.tensor(X))
