"""ZeroRedundancyOptimizer, the generic Join context (Join / Joinable / JoinHook) and
DistributedDataParallel as a Joinable, on pyddp.nn models, against torch 2.13's own on gloo.

Each case runs twice on real rank processes (tests/_mp.py): once with pyddp (pyddp.nn model,
pyddp's DDP, ZeRO and Join on pyddp's "cpu" backend) and once with torch (torch.nn model, torch's
DDP, ZeRO and Join on gloo), from the same weights and data; the parameters, the consolidated
optimizer state and what the user joinable counted must agree. Uneven inputs run on 2 and 3 ranks.
"""
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # no OpenMP pool in the parent of forked ranks

from _mp import run  # noqa: E402

SIZES = [(8, 16), (16, 16), (16, 2)]


def _weights():
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((o, i)) * 0.3, rng.standard_normal(o) * 0.1) for i, o in SIZES]


def _batches(rank, steps):
    rng = np.random.default_rng(100 + rank)
    return [(rng.standard_normal((5, 8)), rng.standard_normal((5, 2))) for _ in range(steps)]


def _steps(rank, uneven):
    return 3 + (2 * rank if uneven else 0)


def _pyddp_train(rank, world_size, optim, uneven, bucket_view, divide):
    import pyddp
    import pyddp.nn as nn
    import pyddp.nn.functional as F
    from pyddp.distributed.algorithms.join import Join
    from pyddp.distributed.optim import ZeroRedundancyOptimizer
    from pyddp.nn.parallel import DistributedDataParallel as DDP

    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 2)).double()
    lin = [m for m in model if isinstance(m, nn.Linear)]
    for m, (w, b) in zip(lin, _weights()):
        m.weight.numpy()[...] = w + rank * 0.1  # ranks start apart: DDP's broadcast aligns them
        m.bias.numpy()[...] = b
    ddp = DDP(model, bucket_cap_mb=0.001)
    cls, kw = (pyddp.optim.SGD, dict(lr=0.1, momentum=0.9)) if optim == "sgd" else \
        (pyddp.optim.Adam, dict(lr=0.01))
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls,
                                  parameters_as_bucket_view=bucket_view, **kw)
    local = sum(len(g["params"]) for g in opt.optim.param_groups)
    with Join([ddp, opt], divide_by_initial_world_size=divide):
        for x, y in _batches(rank, _steps(rank, uneven)):
            opt.zero_grad()
            F.mse_loss(ddp(pyddp.tensor(x)), pyddp.tensor(y)).backward()
            opt.step()
    opt.consolidate_state_dict(to=0)
    state = None
    if rank == 0:
        sd = opt.state_dict()
        state = {k: {n: np.asarray(v).copy() for n, v in s.items()} for k, s in sd["state"].items()}
        state["groups"] = [{k: v for k, v in g.items() if k != "params"} | {"params": g["params"]}
                           for g in sd["param_groups"]]
    else:
        try:
            opt.state_dict()
        except RuntimeError as e:
            state = str(e)
    return [p.numpy().copy() for p in model.parameters()], state, local


def _torch_train(rank, world_size, optim, uneven, bucket_view, divide):
    import datetime

    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                torch.nn.Tanh(), torch.nn.Linear(16, 2)).double()
    lin = [m for m in model if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for m, (w, b) in zip(lin, _weights()):
            m.weight.copy_(torch.from_numpy(w + rank * 0.1))
            m.bias.copy_(torch.from_numpy(b))
    ddp = DDP(model, bucket_cap_mb=0.001)
    cls, kw = (torch.optim.SGD, dict(lr=0.1, momentum=0.9)) if optim == "sgd" else \
        (torch.optim.Adam, dict(lr=0.01))
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls,
                                  parameters_as_bucket_view=bucket_view, **kw)
    local = sum(len(g["params"]) for g in opt.optim.param_groups)
    with Join([ddp, opt], divide_by_initial_world_size=divide):
        for x, y in _batches(rank, _steps(rank, uneven)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            opt.step()
    opt.consolidate_state_dict(to=0)
    state = None
    if rank == 0:
        sd = opt.state_dict()
        state = {k: {n: v.numpy().copy() for n, v in s.items()} for k, s in sd["state"].items()}
    params = [p.detach().numpy().copy() for p in model.parameters()]
    del opt, ddp
    gc.collect()
    dist.destroy_process_group()
    return params, state, local


@pytest.mark.parametrize("world,optim,uneven,bucket_view,divide", [
    (2, "adam", True, True, True), (3, "sgd", True, False, False)])
def test_zero_join_same_as_torch(world, optim, uneven, bucket_view, divide):
    mine = run(_pyddp_train, world, optim, uneven, bucket_view, divide, timeout=150)
    ref = run(_torch_train, world, optim, uneven, bucket_view, divide, init=False, timeout=150)
    for r in range(world):
        for a, b in zip(mine[r][0], ref[r][0]):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        assert mine[r][2] == ref[r][2]  # the same partition of the parameters over the ranks
    assert sum(m[2] for m in mine) == 6 and max(m[2] for m in mine) < 6  # sharded
    st, rst = mine[0][1], ref[0][1]
    groups = st.pop("groups")
    assert groups[0]["params"] == list(range(6))
    assert sorted(st) == sorted(rst) == list(range(6))
    for k in rst:
        assert sorted(st[k]) == sorted(rst[k])
        for n in rst[k]:
            np.testing.assert_allclose(st[k][n], rst[k][n], rtol=1e-10, atol=1e-12)
    for r in range(1, world):
        assert "consolidate_state_dict(to=" in mine[r][1]


def _zero_resume(rank, world_size):
    """ZeRO's consolidated state dict loads into a fresh ZeRO and into the unsharded optimizer;
    training then goes on exactly as the unsharded optimizer does."""
    import pyddp
    import pyddp.distributed as dist
    import pyddp.nn as nn
    from pyddp.distributed.optim import ZeroRedundancyOptimizer

    def make():
        pyddp.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))

    def grads(model, step):
        for i, p in enumerate(model.parameters()):
            rng = np.random.default_rng(1000 * step + i)
            p.grad = pyddp.tensor(rng.standard_normal(p.shape).astype(np.float32))

    model, ref = make(), make()
    zero = ZeroRedundancyOptimizer(model.parameters(), pyddp.optim.Adam, lr=0.05,
                                   weight_decay=0.01)
    plain = pyddp.optim.Adam(ref.parameters(), lr=0.05, weight_decay=0.01)
    for step in range(2):
        grads(model, step)
        grads(ref, step)
        zero.step()
        plain.step()
    zero.consolidate_state_dict(to=world_size - 1)
    sd = [zero.state_dict() if rank == world_size - 1 else None]
    dist.broadcast_object_list(sd, src=world_size - 1)
    sd = sd[0]
    want = plain.state_dict()
    same_state = sorted(sd["state"]) == sorted(want["state"]) and all(
        np.allclose(np.asarray(sd["state"][k][n]), np.asarray(want["state"][k][n]), rtol=1e-6)
        for k in want["state"] for n in want["state"][k])
    model2 = make()
    for p, q in zip(model2.parameters(), model.parameters()):
        p.numpy()[...] = q.numpy()
    zero2 = ZeroRedundancyOptimizer(model2.parameters(), pyddp.optim.Adam, lr=0.5)
    zero2.load_state_dict(sd)
    plain2 = pyddp.optim.Adam(ref.parameters(), lr=0.5)
    plain2.load_state_dict(sd)
    lr_loaded = zero2.param_groups[0]["lr"] == 0.05 and zero2.optim.param_groups[0]["lr"] == 0.05
    for step in range(2, 4):
        grads(model2, step)
        grads(ref, step)
        zero2.step()
        plain2.step()
    err = max(float(np.max(np.abs(p.numpy() - q.numpy())))
              for p, q in zip(model2.parameters(), ref.parameters()))
    return same_state, lr_loaded, err, len(zero2.optim.state)


def test_zero_state_dict_roundtrip():
    for same_state, lr_loaded, err, nstate in run(_zero_resume, 2, timeout=120):
        assert same_state and lr_loaded
        assert err <= 1e-6
        assert 0 < nstate < 4  # each rank holds only its shard's state


def test_zero_argument_errors():
    import pyddp
    from pyddp.distributed.optim import ZeroRedundancyOptimizer
    p = pyddp.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ZeroRedundancyOptimizer(p.parameters(), pyddp.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="overlap_with_ddp"):
        ZeroRedundancyOptimizer(p.parameters(), pyddp.optim.SGD, overlap_with_ddp=True, lr=0.1)
    with pytest.raises(TypeError, match="optimizer_class"):
        ZeroRedundancyOptimizer(p.parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        ZeroRedundancyOptimizer([], pyddp.optim.SGD, lr=0.1)


# ---- torch's generic join tutorial: a user Joinable (Counter), with and without sync_max_count

def _counter_run(rank, world_size, flavour):
    if flavour == "torch":
        import datetime

        import torch.distributed as dist
        from torch.distributed.algorithms.join import Join, Joinable, JoinHook
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))

        def zeros():
            return torch.zeros(1)

        def ones():
            return torch.ones(1)

        def val(t):
            return float(t.item())
    else:
        import pyddp.distributed as dist
        from pyddp.distributed.algorithms.join import Join, Joinable, JoinHook

        def zeros():
            return np.zeros(1, dtype=np.float32)

        def ones():
            return np.ones(1, dtype=np.float32)

        def val(t):
            return float(t[0])

    class CounterJoinHook(JoinHook):
        def __init__(self, counter, sync_max_count):
            self.counter = counter
            self.sync_max_count = sync_max_count

        def main_hook(self):
            dist.all_reduce(zeros())

        def post_hook(self, is_last_joiner):
            if not self.sync_max_count:
                return
            common = self.counter.find_common_rank(rank, is_last_joiner)
            if rank == common:
                self.counter.max_count = self.counter.count + 0
            dist.broadcast(self.counter.max_count, src=common)

    class Counter(Joinable):
        def __init__(self):
            super().__init__()
            self.count = zeros()
            self.max_count = zeros()

        def __call__(self):
            Join.notify_join_context(self)
            t = ones()
            dist.all_reduce(t)
            self.count += t

        def join_hook(self, **kwargs):
            return CounterJoinHook(self, kwargs.get("sync_max_count", False))

        @property
        def join_device(self):
            return "cpu" if flavour != "torch" else torch.device("cpu")

        @property
        def join_process_group(self):
            return None

        def find_common_rank(self, rank, to_consider):
            c = np.array([rank if to_consider else -1]) if flavour != "torch" else \
                torch.tensor([rank if to_consider else -1])
            dist.all_reduce(c, op=dist.ReduceOp.MAX)
            return int(c[0])

    counter = Counter()
    with Join([counter], sync_max_count=True):
        for _ in range(5 + rank):
            counter()
    out = [val(counter.count), val(counter.max_count)]
    thrown = None
    c2 = Counter()
    try:
        with Join([c2], throw_on_early_termination=True):
            for _ in range(2 + rank):
                c2()
    except RuntimeError as e:
        thrown = "exhausted" in str(e)
    out.append(thrown)
    if flavour == "torch":
        dist.destroy_process_group()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_user_joinable_as_torch_tutorial(world):
    mine = run(_counter_run, world, "pyddp", timeout=120)
    ref = run(_counter_run, world, "torch", init=False, timeout=120)
    assert mine == ref
    # the last rank counted every rank's iterations; every rank learnt that maximum
    assert mine[0][1] == sum(5 + r for r in range(world)) and mine[0][2] is True


def test_join_argument_errors():
    from pyddp.distributed.algorithms.join import Join, Joinable
    with pytest.raises(ValueError, match="at least one joinable"):
        Join([])
    with pytest.raises(TypeError, match="not a Joinable"):
        Join([object()])
    with pytest.raises(TypeError):
        Joinable()  # abstract
