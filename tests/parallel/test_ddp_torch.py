"""DistributedDataParallel around torch models: pyddp as the distributed runtime under torch.

Every test starts real rank processes (tests/_mp.py, a timeout on every wait) and checks the ranks'
parameters against single-process torch training on the concatenated batches (the reference).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
# The ranks are forked from this process: an OpenMP pool started here by a multi-threaded torch op
# would deadlock the children's first parallel region (GNU libgomp is not fork-safe).
torch.set_num_threads(1)

import pyddp.distributed as dist  # noqa: E402
from pyddp.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from pyddp.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import _paths
from _mp import free_port, run, run_outcomes  # noqa: E402

B = 4  # samples per rank per step
# PYDDP_DDP_IN_PLACE: the default (1 MiB) reduces none of these small models' gradients in place;
# 256 bytes reduces every weight in place (a bucket of its own, autograd's gradient itself) and
# keeps the biases in shared buckets, so one model runs both paths at once.
IN_PLACE = pytest.mark.parametrize("in_place", [None, {"PYDDP_DDP_IN_PLACE": "256"}],
                                   ids=["buckets", "in_place"])


def _model(seed=0, bn=False, extra=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(6, 16)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(16))
    layers += [torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)]
    m = torch.nn.Sequential(*layers).double()
    if extra:
        m = _WithExtra(m)
    return m


class _WithExtra(torch.nn.Module):
    """A Sequential plus a layer its forward calls only when ``use`` is set (rank-dependent control
    flow: an unused parameter on the other ranks)."""

    def __init__(self, seq):
        super().__init__()
        self.seq = seq
        self.unused = torch.nn.Linear(3, 3).double()
        self.use = False

    def forward(self, x):
        z = self.seq(x)
        return self.unused(z) if self.use else z

    def __getitem__(self, i):
        return self.seq[i]


def _data(ws, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(steps, ws * B, 6, generator=g, dtype=torch.float64)
    Y = torch.randn(steps, ws * B, 3, generator=g, dtype=torch.float64)
    return X, Y


def _params(m):
    return [p.detach().numpy().copy() for p in m.parameters()]


def _reference(ws, steps, lr=0.1, momentum=0.9, **mk):
    m = _model(**mk)
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    X, Y = _data(ws, steps)
    for s in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(X[s]), Y[s]).backward()
        opt.step()
    return _params(m)


def _close(got, want, rtol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-9)


def _train(rank, ws, steps, ddp_kwargs, zero_grad_none=True, seed_per_rank=True):
    # different initial weights per rank: DDP's construction broadcast must make them rank 0's
    m = _model(seed=rank if seed_per_rank else 0)
    if rank == 0:
        m = _model(seed=0)
    ddp = DDP(m, **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    X, Y = _data(ws, steps)
    for s in range(steps):
        opt.zero_grad(set_to_none=zero_grad_none)
        x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return _params(m)


@IN_PLACE
@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("kw", [
    {},
    {"bucket_cap_mb": 0.0005},                                   # one bucket per parameter or so
    {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.001},
])
def test_ddp_steps_equal_single_process_training_on_the_full_batch(ws, kw, in_place):
    steps = 4
    want = _reference(ws, steps)
    for got in run(_train, ws, steps, kw, env=in_place):
        _close(got, want)


def _in_place_grads(rank, ws, keep):
    """Which buckets are single gradients reduced in place, and whether each .grad after a step is
    the tensor autograd made (not a view of a bucket) holding the average."""
    m = _model()
    ddp = DDP(m)
    made = {}
    for i, p in enumerate(m.parameters()):  # registered after DDP's hook: sees what DDP left
        p.register_post_accumulate_grad_hook(lambda p, i=i: made.__setitem__(i, p.grad.data_ptr()))
    X, Y = _data(ws, 2)
    out = []
    for s in range(2):
        if not keep:
            ddp.zero_grad(set_to_none=True)
        else:
            ddp.zero_grad(set_to_none=False)
        x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        out.append([p.grad.data_ptr() == made[i] for i, p in enumerate(m.parameters())])
    solo = sorted(i for b in ddp._buckets if b.solo for i in b.params)
    shared = [int(b.buffer.data_ptr()) for b in ddp._buckets if not b.solo]
    return solo, out, [p.grad.numpy().copy() for p in m.parameters()], len(shared)


@pytest.mark.parametrize("keep", [False, True], ids=["set_to_none", "zero_to_zero"])
def test_large_gradients_are_reduced_where_autograd_put_them(keep):
    ws = 2
    m = _model()
    X, Y = _data(ws, 2)
    for s in range(2):
        if not keep:
            m.zero_grad(set_to_none=True)
        else:
            m.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(m(X[s]), Y[s]).backward()
    want = [p.grad.numpy() for p in m.parameters()]
    for solo, same, grads, nshared in run(_in_place_grads, ws, keep, env={"PYDDP_DDP_IN_PLACE": "256"}):
        assert solo == [0, 2, 4], solo  # the three weights (768, 2048, 384 bytes); the biases share
        assert nshared >= 1
        # a weight's .grad stays the tensor autograd accumulated into (no copy into a bucket)
        assert all(same[-1][i] for i in solo), same
        _close(grads, want)


def _rank_in_place(rank, ws):
    import os

    os.environ["PYDDP_DDP_IN_PLACE"] = "256" if rank == 0 else "0"
    m = _model()
    ddp = DDP(m)
    X, Y = _data(ws, 1)
    x, y = X[0, rank * B:(rank + 1) * B], Y[0, rank * B:(rank + 1) * B]
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    return "finished"


def test_ranks_with_different_in_place_thresholds_fail_clearly():
    outs = run_outcomes(_rank_in_place, 2, timeout=60)
    for o in outs:
        assert not o.ok, o.describe()
        assert "mismatch" in o.describe().lower() or "differ" in o.describe().lower(), o.describe()


def test_ddp_over_tcp_equals_shared_memory():
    steps = 3
    want = _reference(2, steps)
    for got in run(_train, 2, steps, {"bucket_cap_mb": 0.001}, env={"PYDDP_TRANSPORT": "tcp"}):
        _close(got, want)


@IN_PLACE
def test_gradient_as_bucket_view_with_zero_grad_to_zero_keeps_grads_as_views(in_place):
    steps = 4
    want = _reference(2, steps)
    for got in run(_train, 2, steps, {"gradient_as_bucket_view": True}, False, env=in_place):
        _close(got, want)


def _state_and_module(rank, ws):
    m = _model()
    ddp = DDP(m)
    keys = list(ddp.state_dict())
    return keys, ddp.module is m, isinstance(ddp, DDP), isinstance(ddp, torch.nn.Module)


def test_state_dict_keys_carry_the_module_prefix_and_isinstance_holds():
    for keys, same, is_ddp, is_mod in run(_state_and_module, 2):
        assert keys == ["module." + k for k in _model().state_dict()]
        assert same and is_ddp and is_mod


def _no_sync(rank, ws, micro):
    m = _model()
    ddp = DDP(m, bucket_cap_mb=0.001)
    X, Y = _data(ws * micro, 1)
    per = B
    chunks = [(X[0, (rank * micro + k) * per:(rank * micro + k + 1) * per],
               Y[0, (rank * micro + k) * per:(rank * micro + k + 1) * per]) for k in range(micro)]
    for k, (x, y) in enumerate(chunks):
        ctx = ddp.no_sync() if k < micro - 1 else torch.enable_grad()
        with ctx:
            torch.nn.functional.mse_loss(ddp(x), y, reduction="sum").backward()
    return [p.grad.numpy().copy() for p in m.parameters()]


@IN_PLACE
def test_no_sync_accumulates_locally_and_the_next_backward_reduces_the_sum(in_place):
    ws, micro = 2, 3
    m = _model()
    X, Y = _data(ws * micro, 1)
    torch.nn.functional.mse_loss(m(X[0]), Y[0], reduction="sum").backward()
    want = [p.grad.numpy() / ws for p in m.parameters()]
    for got in run(_no_sync, ws, micro, env=in_place):
        _close(got, want)


def _unused(rank, ws, find_unused, used_on):
    m = _model(extra=True)
    m.use = rank in used_on
    ddp = DDP(m, find_unused_parameters=find_unused)
    X, Y = _data(ws, 2)
    out = []
    for s in range(2):
        x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
        z = ddp(x)
        torch.nn.functional.mse_loss(z, y).backward()
        out.append(None if m.unused.weight.grad is None else m.unused.weight.grad.numpy().copy())
    return out, m[0].weight.grad.numpy().copy()


def test_an_unused_parameter_without_find_unused_parameters_raises_torch_error_naming_it():
    outs = run_outcomes(_unused, 2, False, ())
    for o in outs:
        assert not o.ok and o.exc_type.endswith("RuntimeError"), o.describe()
        assert "Expected to have finished reduction in the prior iteration" in o.message
        assert "unused.weight" in o.message and "unused.bias" in o.message


def test_find_unused_parameters_leaves_globally_unused_grads_untouched():
    for (ug, g0) in run(_unused, 2, True, ()):
        assert ug == [None, None]


def _grads_reference(used_on, ws):
    m = _model(extra=True)
    X, Y = _data(ws, 2)  # as _unused draws them; step 0 is compared
    total = None
    for r in range(ws):
        m.zero_grad()
        x, y = X[0, r * B:(r + 1) * B], Y[0, r * B:(r + 1) * B]
        z = m(x)
        if r in used_on:
            z = m.unused(z)
        torch.nn.functional.mse_loss(z, y).backward()
        g = m.unused.weight.grad
        g = np.zeros((3, 3)) if g is None else g.numpy().copy()
        total = g if total is None else total + g
    return total / ws


def test_find_unused_parameters_averages_a_parameter_used_on_one_rank_only():
    want = _grads_reference((1,), 2)
    for rank, (ug, _) in enumerate(run(_unused, 2, True, (1,))):
        # step 0's averaged gradient (rank 0 contributed zeros)
        np.testing.assert_allclose(ug[0], want, rtol=1e-6)


def _uneven(rank, ws, counts, divide):
    m = _model()
    ddp = DDP(m, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    X, Y = _data(ws, max(counts))
    with ddp.join(divide_by_initial_world_size=divide):
        for s in range(counts[rank]):
            opt.zero_grad()
            x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    return _params(m)


@IN_PLACE
@pytest.mark.parametrize("divide", [True, False])
def test_join_with_uneven_inputs_finishes_and_matches_torch_semantics(divide, in_place):
    ws, counts = 2, (2, 4)
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    X, Y = _data(ws, max(counts))
    for s in range(max(counts)):
        active = [r for r in range(ws) if s < counts[r]]
        grads = None
        for r in active:
            m.zero_grad()
            x, y = X[s, r * B:(r + 1) * B], Y[s, r * B:(r + 1) * B]
            torch.nn.functional.mse_loss(m(x), y).backward()
            g = [p.grad.clone() for p in m.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        div = ws if divide else len(active)
        for p, g in zip(m.parameters(), grads):
            p.grad = g / div
        opt.step()
    want = _params(m)
    for got in run(_uneven, ws, counts, divide, env=in_place):
        _close(got, want)


def _buffers(rank, ws):
    m = _model(bn=True)
    ddp = DDP(m)
    bn = m[1]
    if rank != 0:
        bn.running_mean.fill_(100.0)   # diverged: the forward's broadcast from rank 0 must fix it
    X, _ = _data(ws, 1)
    x = X[0, rank * B:(rank + 1) * B]
    ddp(x)
    return bn.running_mean.numpy().copy(), m[0](x).detach().mean(0).numpy()


def test_buffers_are_broadcast_from_rank_0_before_each_forward():
    for rm, batch_mean in run(_buffers, 2):
        np.testing.assert_allclose(rm, 0.9 * 0.0 + 0.1 * batch_mean, rtol=1e-10)


def _hooked(rank, ws, which):
    m = _model()
    m.float()
    ddp = DDP(m, bucket_cap_mb=0.001)
    if which == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif which == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif which == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif which == "custom":
        calls = []

        def hook(state, bucket):
            state.append((bucket.index(), bucket.is_last(), len(bucket.parameters())))
            t = bucket.buffer()
            t.mul_(2.0 / ws)   # sum of doubled means
            return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])
        ddp.register_comm_hook(calls, hook)
    X, Y = _data(ws, 1)
    x, y = X[0, rank * B:(rank + 1) * B].float(), Y[0, rank * B:(rank + 1) * B].float()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    try:
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        twice = None
    except RuntimeError as e:
        twice = str(e)
    return [p.grad.numpy().copy() for p in m.parameters()], twice, calls if which == "custom" else None


@IN_PLACE
@pytest.mark.parametrize("which,rtol", [("allreduce", 1e-6), ("fp16", 2e-3), ("bf16", 1.6e-2),
                                        ("custom", 1e-6)])
def test_comm_hooks(which, rtol, in_place):
    ws = 2
    m = _model().float()
    X, Y = _data(ws, 1)
    torch.nn.functional.mse_loss(m(X[0].float()), Y[0].float()).backward()
    want = [p.grad.numpy() for p in m.parameters()]
    if which == "custom":
        want = [2 * w for w in want]
    for grads, twice, calls in run(_hooked, ws, which, env=in_place):
        for g, w in zip(grads, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.abs(w).max())
        assert twice and "can only be called once" in twice
        if calls is not None:
            assert [c[0] for c in calls] == list(range(len(calls))) and calls[-1][1]
            assert sum(c[2] for c in calls) == 6
            if in_place:  # two float32 weights (384 and 1024 bytes) are buckets of their own
                assert [c[2] for c in calls].count(1) >= 2, calls


def _mismatch(rank, ws):
    m = _model() if rank == 0 else torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                                       torch.nn.Linear(16, 17), torch.nn.Tanh(),
                                                       torch.nn.Linear(17, 3)).double()
    DDP(m)


def test_different_models_across_ranks_raise_on_every_rank_naming_the_parameter():
    for o in run_outcomes(_mismatch, 2):
        assert not o.ok and o.exc_type.endswith("RuntimeError"), o.describe()
        assert "'2.weight'" in o.message and "[17, 16]" in o.message


def _no_params(rank, ws):
    DDP(torch.nn.ReLU())


def test_a_module_without_parameters_is_refused():
    for o in run_outcomes(_no_params, 2):
        assert not o.ok and "doesn't have any parameter that requires a gradient" in o.message


_VERSUS = r"""
import datetime, os, sys
import numpy as np
import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as TorchDDP
sys.path[:0] = [{here!r}, {tests!r}]   # this file's folder, and the helpers it imports
import pyddp.distributed as dist
from pyddp.nn.parallel import DistributedDataParallel as DDP
import test_ddp_torch as T

rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("cpu")
tdist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=ws,
                         timeout=datetime.timedelta(seconds=60))
res = {{}}
for name, impl in (("pyddp", DDP), ("torch", TorchDDP)):
    m = T._model(seed=rank)
    ddp = impl(m, bucket_cap_mb=0.001)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    X, Y = T._data(ws, {steps})
    for s in range({steps}):
        opt.zero_grad()
        x, y = X[s, rank * T.B:(rank + 1) * T.B], Y[s, rank * T.B:(rank + 1) * T.B]
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    for k, a in enumerate(T._params(m)):
        res[f"{{name}}{{k}}"] = a
np.savez(os.path.join({out!r}, f"rank{{rank}}.npz"), **res)
tdist.destroy_process_group()
dist.destroy_process_group()
"""


def test_pyddp_ddp_and_torch_ddp_on_gloo_end_with_equal_parameters(tmp_path):
    # fresh interpreters (pyddp.run), not forks of this process: torch's gloo and optimizer
    # machinery are not fork-safe once this process has used them
    import os

    import _launch

    steps = 4
    script = _launch.write_script(tmp_path, "versus.py", _VERSUS.format(
        here=os.path.dirname(os.path.abspath(__file__)), tests=_paths.TESTS, port=free_port(),
        steps=steps,
        out=str(tmp_path)))
    rc, out, err = _launch.run(["--standalone", "--nproc-per-node", "2", script], timeout=120)
    assert rc == 0, err[-3000:]
    for r in range(2):
        z = np.load(tmp_path / f"rank{r}.npz")
        n = len([k for k in z.files if k.startswith("pyddp")])
        assert n == 6
        _close([z[f"pyddp{k}"] for k in range(n)], [z[f"torch{k}"] for k in range(n)], rtol=1e-10)
