"""DDP with a parameter used twice in one backward: tied weights (GPT-2's token embedding shared
with the output layer) and a contrastive run (one encoder applied to two views).  The gradients
are exact, and DDP used to warn that "an array or view sharing memory with an earlier .grad ... is
still referenced" although nothing outside held one: the autograd engine's own locals (the first
contribution, computed into DDP's bucket slot, and the claimed slot) were still alive while DDP's
hook counted references.  Now it warns only when a holder exists (tests/parallel/
test_ddp_grad_views.py keeps that case).  pyddp.nn models and torch models, on 2 real ranks,
against torch on the whole batch."""
import warnings

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp.nn.parallel import DistributedDataParallel as DDP

from _mp import run

V, D, B, T, STEPS = 11, 8, 2, 5, 4


def _weights():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((V, D)) * 0.3, rng.standard_normal((D, D)) * 0.3,
            rng.standard_normal(D) * 0.1)


def _tokens(world):
    rng = np.random.default_rng(9)
    return rng.integers(0, V, (STEPS, B * world, T))


class _GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.h = nn.Linear(D, D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.wte.weight          # tied, as GPT-2

    def forward(self, idx):
        return self.lm_head(pyddp.tanh(self.h(self.wte(idx))))


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Linear(D, D)
        self.g = nn.Linear(D, V)

    def forward(self, x):
        return self.g(pyddp.tanh(self.f(x)))


def _contrastive_loss(enc, x1, x2):
    z1, z2 = enc(x1), enc(x2)                          # the same parameters, twice
    return ((z1 - z2) ** 2).mean() + (z1 * z2).mean()


def _pyddp_child(rank, world, set_to_none, kind):
    wte, hw, hb = _weights()
    toks = _tokens(world)[:, rank * B:(rank + 1) * B]
    m = _GPT() if kind == "tied" else _Encoder()
    m = m.double()
    with pyddp.no_grad():
        if kind == "tied":
            m.wte.weight.copy_(pyddp.tensor(wte))
            m.h.weight.copy_(pyddp.tensor(hw))
            m.h.bias.copy_(pyddp.tensor(hb))
        else:
            m.f.weight.copy_(pyddp.tensor(hw))
            m.f.bias.copy_(pyddp.tensor(hb))
            m.g.weight.copy_(pyddp.tensor(wte))
            m.g.bias.zero_()
    ddp = DDP(m)
    opt = pyddp.optim.SGD(ddp.parameters(), lr=0.5)
    grads = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(STEPS):
            opt.zero_grad(set_to_none=set_to_none)
            idx = pyddp.tensor(toks[s])
            if kind == "tied":
                loss = F.cross_entropy(ddp(idx).reshape(-1, V), idx.reshape(-1))
            else:
                x = pyddp.tensor(wte[toks[s]])
                loss = _contrastive_loss(ddp, x, x.flip(-1) * 0.5)
            loss.backward()
            grads.append([p.grad.numpy().copy() for p in ddp.parameters()])
            opt.step()
    held = [str(w.message) for w in caught if "still referenced" in str(w.message)]
    return held, grads


def _torch_reference(world, kind):
    torch = pytest.importorskip("torch")
    wte, hw, hb = _weights()
    toks = torch.from_numpy(_tokens(world))
    emb = torch.nn.Embedding(V, D).double()
    h = torch.nn.Linear(D, D).double()
    g = torch.nn.Linear(D, V).double()
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(wte))
        h.weight.copy_(torch.from_numpy(hw))
        h.bias.copy_(torch.from_numpy(hb))
        g.weight.copy_(torch.from_numpy(wte))
        g.bias.zero_()
    params = [emb.weight, h.weight, h.bias] if kind == "tied" else \
        [h.weight, h.bias, g.weight, g.bias]
    opt = torch.optim.SGD(params, lr=0.5)
    out = []
    for s in range(STEPS):
        opt.zero_grad()
        idx = toks[s]
        if kind == "tied":
            logits = torch.tanh(h(emb(idx))) @ emb.weight.T
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), idx.reshape(-1))
        else:
            def enc(x):
                return g(torch.tanh(h(x)))
            x = emb.weight.detach()[idx]
            z1, z2 = enc(x), enc(x.flip(-1) * 0.5)
            # the mean over the whole batch equals the average of the ranks' means
            loss = ((z1 - z2) ** 2).mean() + (z1 * z2).mean()
        loss.backward()
        out.append([p.grad.numpy().copy() for p in params])
        opt.step()
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["tied", "contrastive"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_pyddp_model_used_twice_no_false_warning_exact_grads(kind, set_to_none):
    ref = _torch_reference(2, kind)
    for held, grads in run(_pyddp_child, 2, set_to_none, kind, timeout=120):
        assert held == []
        for s in range(STEPS):
            assert len(grads[s]) == len(ref[s])
            for a, b in zip(grads[s], ref[s]):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _torch_child(rank, world, set_to_none):
    import torch
    torch.set_num_threads(1)
    wte, hw, hb = _weights()
    toks = torch.from_numpy(_tokens(world)[:, rank * B:(rank + 1) * B])

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(V, D)
            self.h = torch.nn.Linear(D, D)
            self.lm_head = torch.nn.Linear(D, V, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx):
            return self.lm_head(torch.tanh(self.h(self.wte(idx))))

    m = GPT().double()
    with torch.no_grad():
        m.wte.weight.copy_(torch.from_numpy(wte))
        m.h.weight.copy_(torch.from_numpy(hw))
        m.h.bias.copy_(torch.from_numpy(hb))
    ddp = DDP(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    grads = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(STEPS):
            opt.zero_grad(set_to_none=set_to_none)
            idx = toks[s]
            loss = torch.nn.functional.cross_entropy(ddp(idx).reshape(-1, V), idx.reshape(-1))
            loss.backward()
            grads.append([p.grad.numpy().copy() for p in ddp.parameters()])
            opt.step()
    return [str(w.message) for w in caught if "still referenced" in str(w.message)], grads


@pytest.mark.timeout(240)
@pytest.mark.parametrize("set_to_none", [True, False])
def test_torch_tied_model_under_pyddp_ddp(set_to_none):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    ref = _torch_reference(2, "tied")
    for held, grads in run(_torch_child, 2, set_to_none, timeout=120):
        assert held == []
        for s in range(STEPS):
            for a, b in zip(grads[s], ref[s]):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
