"""pyddp.amp on torch.nn models (skipped without torch): O1 through torch's CPU autocast in
float16, O2/O3 by casting, float32 masters and state_dict, the checkpoint round trip."""
import copy

import pytest

from pyddp import amp
from pyddp.amp._amp_state import _amp_state

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _reset_amp():
    yield
    _amp_state.reset()


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.BatchNorm1d(32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 3))


def _data(n=256):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 10, generator=g)
    W = torch.randn(10, 3, generator=g)
    return X, (X @ W).argmax(1)


def _train(opt_level, steps=60):
    X, y = _data()
    m = _net()
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    if opt_level is not None:
        m, o = amp.initialize(m, o, opt_level=opt_level, verbosity=0)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, len(X), (64,), generator=g)
        loss = torch.nn.functional.cross_entropy(m(X[idx]), y[idx])
        o.zero_grad()
        if opt_level is None:
            loss.backward()
        else:
            with amp.scale_loss(loss, o) as sl:
                sl.backward()
        o.step()
    m.eval()
    with torch.no_grad(), amp.disable_casts():
        acc = (m(X).argmax(1) == y).float().mean().item()
    return acc, m, o


def test_torch_o1_uses_cpu_autocast_float16():
    m = _net()
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    m, o = amp.initialize(m, o, opt_level="O1", verbosity=0)
    assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
    out = m[0](torch.ones(4, 10))
    assert out.dtype == torch.float16 and m[0].weight.dtype == torch.float32
    with amp.disable_casts():
        assert m[0](torch.ones(4, 10)).dtype == torch.float32
    _amp_state.reset()
    assert not torch.is_autocast_enabled("cpu")


def test_torch_o2_masters_and_state_dict():
    m = _net()
    first = m[0].weight
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    m, o = amp.initialize(m, o, opt_level="O2", verbosity=0)
    assert m[0].weight.dtype == torch.float16 and m[1].weight.dtype == torch.float32
    masters = list(amp.master_params(o))
    assert all(p.dtype == torch.float32 for p in masters) and masters[0] is not first
    X, y = _data(32)
    out = m(X)
    assert out.dtype == torch.float32
    with amp.scale_loss(torch.nn.functional.cross_entropy(out, y), o) as sl:
        sl.backward()
    torch.testing.assert_close(masters[0].grad, first.grad.float() / 65536.0, rtol=0, atol=0)
    o.step()
    assert torch.equal(first.detach(), masters[0].detach().half())
    sd = m.state_dict()
    assert sd["0.weight"].dtype == torch.float32 and torch.equal(sd["0.weight"], masters[0])


def test_torch_o3_everything_half():
    m = _net()
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    m, o = amp.initialize(m, o, opt_level="O3", verbosity=0)
    assert all(p.dtype == torch.float16 for p in m.parameters())
    assert m(torch.ones(4, 10)).dtype == torch.float32


def test_torch_o1_o2_converge_like_float32():
    acc32 = _train(None)[0]
    _amp_state.reset()
    acc1 = _train("O1")[0]
    _amp_state.reset()
    acc2, _, o = _train("O2")
    assert acc32 > 0.9 and acc1 >= acc32 - 0.03 and acc2 >= acc32 - 0.03
    assert all(p.dtype == torch.float32 for p in amp.master_params(o))


def test_torch_ddp_model_refused():
    class FakeDDP(torch.nn.parallel.DistributedDataParallel):
        def __init__(self):  # no process group needed for the isinstance check
            torch.nn.Module.__init__(self)

    with pytest.raises(RuntimeError, match="Incoming model is an instance of "
                       "torch.nn.parallel.DistributedDataParallel"):
        amp.initialize(FakeDDP(), opt_level="O1", verbosity=0)


def test_torch_o2_checkpoint_roundtrip():
    """model/optimizer/amp state dicts into fresh objects: continuing gives identical params."""
    X, y = _data(64)

    def steps(m, o, n):
        for i in range(n):
            with amp.scale_loss(torch.nn.functional.cross_entropy(m(X[i::4]), y[i::4]), o) as sl:
                sl.backward()
            o.step()
            o.zero_grad()

    m = _net()
    o = torch.optim.Adam(m.parameters(), lr=1e-2)
    m, o = amp.initialize(m, o, opt_level="O2", verbosity=0)
    steps(m, o, 2)
    ck = {"model": m.state_dict(), "optimizer": o.state_dict(), "amp": amp.state_dict()}
    ck = copy.deepcopy(ck)  # what torch.save/torch.load would give: no shared memory
    steps(m, o, 2)
    want = [p.detach().clone() for p in amp.master_params(o)]
    m2 = _net(5)
    o2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    m2, o2 = amp.initialize(m2, o2, opt_level="O2", verbosity=0)
    m2.load_state_dict(ck["model"])
    o2.load_state_dict(ck["optimizer"])
    amp.load_state_dict(ck["amp"])
    steps(m2, o2, 2)
    for a, b in zip(want, amp.master_params(o2)):
        assert torch.equal(a, b.detach())
