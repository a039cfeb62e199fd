"""DDP's .grad is a view of its bucket (no copy in or out of the buckets), with torch's semantics.

After the first reducing iteration every parameter's ``.grad`` shares memory with its bucket (the
group's shared memory on one host); the gradients and parameters equal torch's own DDP on gloo (torch
models) or full-batch training (pyddp.nn models) through zero_grad(set_to_none=True/False), no_sync
accumulation, a caller assigning its own ``.grad`` tensors and a caller keeping ``.grad`` across
zero_grad.
"""
import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp.nn.parallel import DistributedDataParallel as DDP

from _mp import free_port, run

B = 4
STEPS = ("none", "zero", "no_sync", "none", "kept", "assigned", "none")
KEPT, ASSIGNED = STEPS.index("kept"), STEPS.index("assigned")


# ------------------------------------------------------------------------------ pyddp.nn models

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(F.tanh(self.fc1(x)))


def _pdata(ws):
    rng = np.random.default_rng(3)
    return rng.standard_normal((len(STEPS) + 1, ws * B, 6)), rng.standard_normal((len(STEPS) + 1, ws * B, 3))


def _pyddp_scenario(model, ddp, X, Y, rows, on_step=None):
    """Runs STEPS on ``ddp`` (a DDP, or the bare model for the reference) with batches X[:, rows];
    returns the gradients after each step's backward."""
    params = list(model.parameters())
    grads, k = [], 0

    def fb():
        nonlocal k
        F.mse_loss(ddp(pyddp.tensor(X[k, rows])), pyddp.tensor(Y[k, rows])).backward()
        k += 1
    for kind in STEPS:
        kept = mine = None
        if kind in ("none", "kept"):
            if kind == "kept":
                kept = [(p.grad, p.grad.numpy().copy()) for p in params]
            for p in params:
                p.grad = None
        elif kind == "zero":
            for p in params:
                p.grad.numpy()[...] = 0
        elif kind == "assigned":
            mine = [pyddp.zeros(p.shape, dtype=p.dtype) for p in params]
            for p, g in zip(params, mine):
                p.grad = g
        if kind == "no_sync":
            for p in params:
                p.grad = None
            ctx = ddp.no_sync() if isinstance(ddp, DDP) else _null()
            with ctx:
                fb()
        fb()
        grads.append([p.grad.numpy().copy() for p in params])
        if on_step is not None:
            on_step(kind, params, kept, mine)
        with pyddp.no_grad():
            for p in params:
                p.numpy()[...] -= 0.1 * p.grad.numpy()
    return grads


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _pyddp_child(rank, ws, kw):
    pyddp.manual_seed(0)
    m = _Net().double()
    ddp = DDP(m, **kw)
    X, Y = _pdata(ws)
    views = []

    def check(kind, params, kept, mine):
        bufs = [b.buffer for b in ddp._buckets]
        views.append(all(any(np.shares_memory(p.grad.numpy(), b) for b in bufs) for p in params))
        if kept is not None:  # kept across zero_grad: untouched by this step, not in a bucket
            for g, snap in kept:
                np.testing.assert_array_equal(g.numpy(), snap)
                assert not any(np.shares_memory(g.numpy(), b) for b in bufs)
        if kind == "assigned":  # the caller's tensors are read, never aliased into a bucket
            assert not any(np.shares_memory(g.numpy(), b) for g in mine for b in bufs)
    grads = _pyddp_scenario(m, ddp, X, Y, slice(rank * B, (rank + 1) * B), check)
    return grads, views, [b.shared for b in ddp._buckets]


@pytest.mark.parametrize("kw", [{}, {"bucket_cap_mb": 0.0005}, {"gradient_as_bucket_view": True}])
def test_pyddp_nn_grads_are_bucket_views_and_equal_full_batch_training(kw):
    pyddp.manual_seed(0)
    ref = _Net().double()
    X, Y = _pdata(2)
    want = _pyddp_scenario(ref, ref, X, Y, slice(None))
    for grads, views, shared in run(_pyddp_child, 2, kw):
        assert all(shared)
        assert all(views), views   # every step, every parameter (rebuild included)
        for got, w in zip(grads, want):
            for a, b in zip(got, w):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _holder_child(rank, ws):
    """A NumPy array taken from a .grad and kept across zero_grad(set_to_none=True) cannot be moved
    out of the bucket: the next backward warns that it overwrites it."""
    import warnings

    pyddp.manual_seed(0)
    m = _Net().double()
    ddp = DDP(m)
    X, Y = _pdata(ws)
    held = None
    caught = []
    for s in range(3):
        for p in m.parameters():
            p.grad = None
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            F.mse_loss(ddp(pyddp.tensor(X[s])), pyddp.tensor(Y[s])).backward()
        caught.append([str(x.message) for x in w if issubclass(x.category, RuntimeWarning)])
        if s == 1:
            held = m.fc1.weight.grad.numpy()  # kept alive across the next step
    del held
    return caught


def test_an_array_kept_from_a_grad_view_draws_a_warning():
    for caught in run(_holder_child, 2):
        assert caught[0] == [] and caught[1] == []
        assert len(caught[2]) == 1 and "fc1.weight" in caught[2][0] and "clone" in caught[2][0]


# --------------------------------------------------------------------------------- torch models

_VERSUS = r"""
import datetime, os, sys
import numpy as np
import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as TorchDDP
import pyddp.distributed as dist
from pyddp.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("cpu")
tdist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=ws,
                         timeout=datetime.timedelta(seconds=60))
STEPS = {steps!r}
g = torch.Generator().manual_seed(1)
X = torch.randn(len(STEPS) + 1, ws * 4, 6, generator=g, dtype=torch.float64)
Y = torch.randn(len(STEPS) + 1, ws * 4, 3, generator=g, dtype=torch.float64)
mine = slice(rank * 4, (rank + 1) * 4)
res = {{}}
for name, impl in (("pyddp", DDP), ("torch", TorchDDP)):
    for kw in ({{}}, {{"bucket_cap_mb": 0.0005}}):
        tag = name + str(len(kw))
        torch.manual_seed(rank)
        m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
        ddp = impl(m, **kw)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        params = list(m.parameters())
        k = 0
        def fb():
            global k
            torch.nn.functional.mse_loss(ddp(X[k, mine]), Y[k, mine]).backward()
            k += 1
        for s, kind in enumerate(STEPS):
            kept = own = None
            if kind == "kept":
                kept = [(p.grad, p.grad.clone()) for p in params]
            if kind in ("none", "kept"):
                opt.zero_grad(set_to_none=True)
            elif kind == "zero":
                opt.zero_grad(set_to_none=False)
            elif kind == "assigned":
                own = [torch.zeros_like(p) for p in params]
                for p, t in zip(params, own):
                    p.grad = t
            elif kind == "no_sync":
                opt.zero_grad(set_to_none=True)
                with ddp.no_sync():
                    fb()
            fb()
            for j, p in enumerate(params):
                res[f"{{tag}}_g{{s}}_{{j}}"] = p.grad.numpy().copy()
            if name == "pyddp":
                # torch models: DDP's buckets are torch tensors (on the parameters' device)
                bufs = [b.buffer.numpy() for b in ddp._buckets]
                lo_hi = [(b.ctypes.data, b.ctypes.data + b.nbytes) for b in bufs]
                inside = [any(lo <= p.grad.data_ptr() < hi for lo, hi in lo_hi) and
                          any(np.shares_memory(p.grad.numpy(), b) for b in bufs) for p in params]
                res[f"{{tag}}_view{{s}}"] = np.array(inside)
                res[f"{{tag}}_shared{{s}}"] = np.array([b.shared for b in ddp._buckets])
                if kept is not None:
                    res[f"{{tag}}_kept{{s}}"] = np.array([torch.equal(a, c) and not any(
                        np.shares_memory(a.numpy(), b) for b in bufs) for a, c in kept])
                if own is not None:
                    res[f"{{tag}}_own{{s}}"] = np.array([not any(
                        np.shares_memory(t.numpy(), b) for b in bufs) for t in own])
            opt.step()
        for j, p in enumerate(params):
            res[f"{{tag}}_p{{j}}"] = p.detach().numpy().copy()
        del ddp, opt
# find_unused_parameters, gradients never zeroed: a layer used by every rank, by none, by rank 1 only
for name, impl in (("pyddp", DDP), ("torch", TorchDDP)):
    torch.manual_seed(0)
    m = torch.nn.ModuleDict(dict(a=torch.nn.Linear(6, 3), b=torch.nn.Linear(3, 3))).double()
    ddp = impl(m, find_unused_parameters=True)
    for s, users in enumerate(((0, 1), (), (1,), (0, 1), ())):
        def fwd(x):
            h = m["a"](x)
            return m["b"](h) if rank in users else h
        m.forward = fwd
        torch.nn.functional.mse_loss(ddp(X[s, mine]), Y[s, mine]).backward()
        for j, p in enumerate(m.parameters()):
            res[f"unused_{{name}}_g{{s}}_{{j}}"] = np.full(1, np.nan) if p.grad is None else p.grad.numpy().copy()
    del ddp
np.savez(os.path.join({out!r}, f"rank{{rank}}.npz"), **res)
tdist.destroy_process_group()
dist.destroy_process_group()
"""


def test_torch_grads_are_bucket_views_and_equal_torch_ddp_on_gloo(tmp_path):
    pytest.importorskip("torch")
    import _launch

    script = _launch.write_script(tmp_path, "views.py", _VERSUS.format(
        port=free_port(), steps=STEPS, out=str(tmp_path)))
    rc, out, err = _launch.run(["--standalone", "--nproc-per-node", "2", script], timeout=180)
    assert rc == 0, err[-3000:]
    for r in range(2):
        z = np.load(tmp_path / f"rank{r}.npz")
        for nk in ("0", "1"):
            mine, ref = "pyddp" + nk, "torch" + nk
            keys = [k[len(ref):] for k in z.files if k.startswith(ref + "_")]
            assert len(keys) == 4 * len(STEPS) + 4   # 4 parameters
            for k in keys:   # every step's gradients and the final parameters
                np.testing.assert_allclose(z[mine + k], z[ref + k], rtol=1e-10, atol=1e-12, err_msg=k)
            for s in range(len(STEPS)):
                assert z[f"{mine}_shared{s}"].all()
                assert z[f"{mine}_view{s}"].all(), (nk, s)   # .grad lies inside a bucket
            assert z[f"{mine}_kept{KEPT}"].all() and z[f"{mine}_own{ASSIGNED}"].all()
        keys = [k[len("unused_torch"):] for k in z.files if k.startswith("unused_torch")]
        assert len(keys) == 4 * 5
        for k in keys:
            np.testing.assert_allclose(z["unused_pyddp" + k], z["unused_torch" + k], rtol=1e-10,
                                       atol=1e-12, err_msg=k)
