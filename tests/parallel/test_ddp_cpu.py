"""DistributedDataParallel around pyddp.nn models (no torch needed).

Real rank processes (tests/_mp.py, a timeout on every wait); the ranks' parameters are checked
against single-process pyddp training on the concatenated batches.
"""
from datetime import timedelta

import numpy as np
import pytest

import pyddp
import pyddp.distributed as dist
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp.distributed.algorithms.ddp_comm_hooks import default_hooks
from pyddp.nn.parallel import DistributedDataParallel as DDP

from _mp import run, run_outcomes

B = 4


class _Net(nn.Module):
    def __init__(self, bn=False, extra=False):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.bn = nn.BatchNorm1d(16) if bn else nn.Identity()
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 3)
        if extra:
            self.unused = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc3(F.tanh(self.fc2(F.tanh(self.bn(self.fc1(x))))))


def _model(seed=0, **kw):
    pyddp.manual_seed(seed)
    return _Net(**kw).double()


def _data(ws, steps, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((steps, ws * B, 6)), rng.standard_normal((steps, ws * B, 3))


def _params(m):
    return [p.numpy().copy() for p in m.parameters()]


def _sgd(params, lr=0.1):
    with pyddp.no_grad():
        for p in params:
            if p.grad is not None:
                p.numpy()[...] -= lr * p.grad.numpy()


def _zero(params):
    for p in params:
        p.grad = None


def _reference(ws, steps, **mk):
    m = _model(**mk)
    X, Y = _data(ws, steps)
    for s in range(steps):
        _zero(m.parameters())
        F.mse_loss(m(pyddp.tensor(X[s])), pyddp.tensor(Y[s])).backward()
        _sgd(m.parameters())
    return _params(m)


def _close(got, want, rtol=1e-9):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-12)


def _train(rank, ws, steps, kw):
    m = _model(seed=rank)            # DDP's construction broadcast makes every rank rank 0's
    ddp = DDP(m, **kw)
    X, Y = _data(ws, steps)
    for s in range(steps):
        _zero(ddp.parameters())
        x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
        F.mse_loss(ddp(pyddp.tensor(x)), pyddp.tensor(y)).backward()
        _sgd(ddp.parameters())
    return _params(m)


@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("kw", [{}, {"bucket_cap_mb": 0.0005},
                                {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.001}])
def test_ddp_steps_equal_single_process_training_on_the_full_batch(ws, kw):
    want = _reference(ws, 4)
    for got in run(_train, ws, 4, kw):
        _close(got, want)


def test_ddp_over_tcp_equals_shared_memory():
    want = _reference(2, 3)
    for got in run(_train, 2, 3, {"bucket_cap_mb": 0.001}, env={"PYDDP_TRANSPORT": "tcp"}):
        _close(got, want)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("kw", [{"bucket_cap_mb": 0.001},
                                {"bucket_cap_mb": 0.001, "gradient_as_bucket_view": True}])
def test_buckets_reduced_on_the_progress_thread_give_the_same_result(transport, kw):
    # PYDDP_DDP_OVERLAP=1: the path taken on hosts with a spare core per rank (async allreduce
    # while backward goes on), forced here on the 2-core machine
    want = _reference(2, 4)
    for got in run(_train, 2, 4, kw, env={"PYDDP_DDP_OVERLAP": "1", "PYDDP_TRANSPORT": transport}):
        _close(got, want)


def _where(rank, ws):
    ddp = DDP(_model(), bucket_cap_mb=0.001)
    return ddp._overlap, [b.shared for b in ddp._buckets]


def test_buckets_live_in_shared_memory_on_one_host_and_not_over_tcp():
    for overlap, shared in run(_where, 2, env={"PYDDP_DDP_OVERLAP": None}):
        assert shared and all(shared)
    for overlap, shared in run(_where, 2, env={"PYDDP_TRANSPORT": "tcp"}):
        assert not any(shared)


def _module_api(rank, ws):
    m = _model()
    ddp = DDP(m)
    ddp.eval()
    ev = m.training
    ddp.train()
    return (list(ddp.state_dict()), ddp.module is m, isinstance(ddp, DDP), isinstance(ddp, nn.Module),
            ev, m.training, len(list(ddp.parameters())))


def test_state_dict_prefix_train_eval_and_isinstance():
    for keys, same, is_ddp, is_mod, ev, tr, n in run(_module_api, 2):
        assert keys == ["module." + k for k in _model().state_dict()]
        assert same and is_ddp and is_mod and ev is False and tr is True and n == 6


def _no_sync(rank, ws, micro):
    m = _model()
    ddp = DDP(m, bucket_cap_mb=0.001)
    X, Y = _data(ws * micro, 1)
    for k in range(micro):
        sl = slice((rank * micro + k) * B, (rank * micro + k + 1) * B)
        if k < micro - 1:
            with ddp.no_sync():
                F.mse_loss(ddp(pyddp.tensor(X[0, sl])), pyddp.tensor(Y[0, sl]), reduction="sum").backward()
        else:
            F.mse_loss(ddp(pyddp.tensor(X[0, sl])), pyddp.tensor(Y[0, sl]), reduction="sum").backward()
    return [p.grad.numpy().copy() for p in m.parameters()]


def test_no_sync_accumulates_locally_and_the_next_backward_reduces_the_sum():
    ws, micro = 2, 3
    m = _model()
    X, Y = _data(ws * micro, 1)
    F.mse_loss(m(pyddp.tensor(X[0])), pyddp.tensor(Y[0]), reduction="sum").backward()
    want = [p.grad.numpy() / ws for p in m.parameters()]
    for got in run(_no_sync, ws, micro):
        _close(got, want)


class _Extra(nn.Module):
    """_Net, then its ``unused`` layer on the ranks in ``used_on`` (rank-dependent control flow
    inside forward: an unused parameter elsewhere)."""

    def __init__(self, net, use):
        super().__init__()
        self.net = net
        self.use = use

    def forward(self, x):
        z = self.net(x)
        return self.net.unused(z) if self.use else z


def _unused(rank, ws, find_unused, used_on, outside=False):
    m = _model(extra=True)
    ddp = DDP(m if outside else _Extra(m, rank in used_on), find_unused_parameters=find_unused)
    X, Y = _data(ws, 2)
    out = []
    for s in range(2):
        x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
        z = ddp(pyddp.tensor(x))
        if outside and rank in used_on:
            z = m.unused(z)   # a parameter used outside DDP's forward
        F.mse_loss(z, pyddp.tensor(y)).backward()
        out.append(None if m.unused.weight.grad is None else m.unused.weight.grad.numpy().copy())
    return out


def test_a_parameter_used_outside_forward_with_find_unused_parameters_raises_torch_error():
    # torch 2.13 (gloo, 2 ranks): "Expected to mark a variable ready only once. This error is
    # caused by one of the following reasons: 1) Use of a module parameter outside the `forward`
    # function. ..." on the rank that used it; its peer then fails on the group
    outs = run_outcomes(_unused, 2, True, (1,), True, timeout=60,
                        init_kwargs={"timeout": timedelta(seconds=10)})
    assert not outs[1].ok and outs[1].exc_type.endswith("RuntimeError"), outs[1].describe()
    assert outs[1].message.startswith("Expected to mark a variable ready only once. This error is "
                                      "caused by one of the following reasons: 1) Use of a module "
                                      "parameter outside the `forward` function."), outs[1].message
    assert "'unused.weight'" in outs[1].message or "'unused.bias'" in outs[1].message


def test_an_unused_parameter_without_find_unused_parameters_raises_torch_error_naming_it():
    for o in run_outcomes(_unused, 2, False, ()):
        assert not o.ok and o.exc_type.endswith("RuntimeError"), o.describe()
        assert "Expected to have finished reduction in the prior iteration" in o.message
        assert "unused.weight" in o.message and "unused.bias" in o.message


class _Boom(pyddp.autograd.Function):
    """Identity whose backward raises when armed: a backward that fails mid-way, after the buckets
    of the layers above it were reduced."""
    armed = False

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        if _Boom.armed:
            raise ValueError("boom in backward")
        return g


class _BoomNet(_Net):
    def forward(self, x):
        return self.fc3(_Boom.apply(F.tanh(self.fc2(F.tanh(self.fc1(x))))))


def _backward_raised(rank, ws, fails_on):
    pyddp.manual_seed(0)
    m = _BoomNet().double()
    ddp = DDP(m, bucket_cap_mb=0.0001)          # a bucket per parameter: fc3's reduce first
    X, Y = _data(ws, 3)
    out = {}
    for s in range(3):
        _Boom.armed = s == 1 and rank == fails_on
        x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
        try:
            F.mse_loss(ddp(pyddp.tensor(x)), pyddp.tensor(y)).backward()
        except ValueError as e:       # the rank carries on, as the did
            out["backward"] = str(e)
            continue
        except Exception as e:
            out[f"step{s}"] = f"{type(e).__name__}: {e}"
            return out
    out["finished"] = True
    return out


def test_a_rank_whose_backward_raised_mid_way_gets_torch_error_at_the_next_forward():
    # it once got a collective mismatch like every other rank; the docstring promises torch's error
    outs = run_outcomes(_backward_raised, 2, 1, timeout=90, init_kwargs={"timeout": timedelta(seconds=10)})
    assert all(o.ok for o in outs), [o.describe() for o in outs]
    failed = outs[1].value
    assert failed.get("backward") == "boom in backward", failed
    msg = failed.get("step2", "")
    assert msg.startswith("RuntimeError: Expected to have finished reduction in the prior iteration"), failed
    # the parameters below the failure never got their gradients; fc3's did
    assert "fc1.weight" in msg and "fc2.bias" in msg and "fc3" not in msg.split("Parameters which")[1], msg
    other = outs[0].value
    assert "finished" not in other, f"rank 0 went on as if nothing happened: {other}"


def test_find_unused_parameters_leaves_globally_unused_grads_untouched():
    for ug in run(_unused, 2, True, ()):
        assert ug == [None, None]


def test_find_unused_parameters_averages_a_parameter_used_on_one_rank_only():
    m = _model(extra=True)
    X, Y = _data(2, 2)
    x, y = X[0, B:2 * B], Y[0, B:2 * B]
    F.mse_loss(m.unused(m(pyddp.tensor(x))), pyddp.tensor(y)).backward()
    want = m.unused.weight.grad.numpy() / 2      # rank 0 contributes zeros
    for ug in run(_unused, 2, True, (1,)):
        np.testing.assert_allclose(ug[0], want, rtol=1e-9)


def _uneven(rank, ws, counts):
    m = _model()
    ddp = DDP(m, bucket_cap_mb=0.001)
    X, Y = _data(ws, max(counts))
    with ddp.join():
        for s in range(counts[rank]):
            _zero(ddp.parameters())
            x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
            F.mse_loss(ddp(pyddp.tensor(x)), pyddp.tensor(y)).backward()
            _sgd(ddp.parameters())
    return _params(m)


def test_join_with_uneven_inputs_divides_by_the_initial_world_size():
    ws, counts = 3, (1, 3, 2)
    m = _model()
    X, Y = _data(ws, max(counts))
    for s in range(max(counts)):
        total = None
        for r in [r for r in range(ws) if s < counts[r]]:
            _zero(m.parameters())
            x, y = X[s, r * B:(r + 1) * B], Y[s, r * B:(r + 1) * B]
            F.mse_loss(m(pyddp.tensor(x)), pyddp.tensor(y)).backward()
            g = [p.grad.numpy().copy() for p in m.parameters()]
            total = g if total is None else [a + b for a, b in zip(total, g)]
        with pyddp.no_grad():
            for p, g in zip(m.parameters(), total):
                p.numpy()[...] -= 0.1 * g / ws
    want = _params(m)
    for got in run(_uneven, ws, counts):
        _close(got, want)


def _buffers(rank, ws):
    m = _model(bn=True)
    ddp = DDP(m)
    if rank != 0:
        m.bn.running_mean.numpy()[...] = 100.0
    X, _ = _data(ws, 1)
    x = pyddp.tensor(X[0, rank * B:(rank + 1) * B])
    ddp(x)
    with pyddp.no_grad():
        h = m.fc1(x).numpy().mean(0)
    return m.bn.running_mean.numpy().copy(), h


def test_buffers_are_broadcast_from_rank_0_before_each_forward():
    for rm, batch_mean in run(_buffers, 2):
        np.testing.assert_allclose(rm, 0.1 * batch_mean, rtol=1e-10)


def _hooked(rank, ws, which):
    m = _model().float()
    ddp = DDP(m, bucket_cap_mb=0.001)
    ddp.register_comm_hook(None, {"allreduce": default_hooks.allreduce_hook,
                                  "fp16": default_hooks.fp16_compress_hook,
                                  "bf16": default_hooks.bf16_compress_hook}[which])
    X, Y = _data(ws, 1)
    x = pyddp.tensor(X[0, rank * B:(rank + 1) * B].astype(np.float32))
    y = pyddp.tensor(Y[0, rank * B:(rank + 1) * B].astype(np.float32))
    F.mse_loss(ddp(x), y).backward()
    return [p.grad.numpy().copy() for p in m.parameters()]


@pytest.mark.parametrize("which,rtol", [("allreduce", 1e-6), ("fp16", 2e-3), ("bf16", 1.6e-2)])
def test_builtin_comm_hooks(which, rtol):
    m = _model().float()
    X, Y = _data(2, 1)
    F.mse_loss(m(pyddp.tensor(X[0].astype(np.float32))), pyddp.tensor(Y[0].astype(np.float32))).backward()
    want = [p.grad.numpy() for p in m.parameters()]
    for grads in run(_hooked, 2, which):
        for g, w in zip(grads, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.abs(w).max())


def _mismatch(rank, ws):
    m = _model()
    if rank == 1:
        m.fc2 = nn.Linear(16, 17).double()
        m.fc3 = nn.Linear(17, 3).double()
    DDP(m)


def test_different_models_across_ranks_raise_on_every_rank_naming_the_parameter():
    for o in run_outcomes(_mismatch, 2):
        assert not o.ok and o.exc_type.endswith("RuntimeError"), o.describe()
        assert "'fc2.weight'" in o.message and "[17, 16]" in o.message


def _no_group(rank, ws):
    DDP(_model())


def test_ddp_without_a_process_group_is_a_clear_error():
    for o in run_outcomes(_no_group, 1, init=False):
        assert not o.ok and "Default process group has not been initialized" in o.message


class _Shuffled(nn.Module):
    """Registered fc_c, fc_a, fc_b; used a -> b -> c: gradients become ready c, b, a."""

    def __init__(self):
        super().__init__()
        self.fc_c = nn.Linear(16, 3)
        self.fc_a = nn.Linear(6, 16)
        self.fc_b = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc_c(F.tanh(self.fc_b(F.tanh(self.fc_a(x)))))


def _rebuild(rank, ws):
    pyddp.manual_seed(0)
    m = _Shuffled().double()
    ddp = DDP(m, bucket_cap_mb=0.0001)
    names = [n for n, _ in m.named_parameters()]
    before = [[names[i] for i in b.params] for b in ddp._buckets]
    X, Y = _data(ws, 3)
    for s in range(3):
        _zero(ddp.parameters())
        x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
        F.mse_loss(ddp(pyddp.tensor(x)), pyddp.tensor(y)).backward()
        _sgd(ddp.parameters())
    after = [[names[i] for i in b.params] for b in ddp._buckets]
    return before, after, _params(m)


def test_buckets_are_rebuilt_once_in_the_order_gradients_became_ready():
    pyddp.manual_seed(0)
    m = _Shuffled().double()
    X, Y = _data(2, 3)
    for s in range(3):
        _zero(m.parameters())
        F.mse_loss(m(pyddp.tensor(X[s])), pyddp.tensor(Y[s])).backward()
        _sgd(m.parameters())
    want = _params(m)
    for before, after, got in run(_rebuild, 2):
        flat_before = [n for b in before for n in b]
        flat_after = [n for b in after for n in b]
        # reverse registration order at first, then the order backward produced them
        assert flat_before == ["fc_b.bias", "fc_b.weight", "fc_a.bias", "fc_a.weight",
                               "fc_c.bias", "fc_c.weight"]
        assert flat_after[:2] == ["fc_c.bias", "fc_c.weight"] or flat_after[:2] == ["fc_c.weight", "fc_c.bias"]
        assert set(flat_after[-2:]) == {"fc_a.weight", "fc_a.bias"}
        _close(got, want)


# ------------------------------------------------------------------------------------------------
# linear computes its weight's gradient straight into the bucket (no copy in)


class _Tied(nn.Module):
    """One Linear used twice: the second use's gradient must be added to the first, not overwrite it."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(F.tanh(self.mid(F.tanh(self.mid(F.tanh(self.inp(x)))))))


def _direct_child(rank, ws, gv, set_to_none):
    steps = 3
    pyddp.manual_seed(0)
    ref = _Tied().double()
    pyddp.manual_seed(0)
    m = _Tied().double()
    ddp = DDP(m, gradient_as_bucket_view=gv, bucket_cap_mb=0.001)
    X, Y = _data(ws, steps)
    aliases, claims = [], []
    import pyddp._tensor._core as T  # where nn.functional finds _claim_grad_dest
    real_claim = T._claim_grad_dest

    def counting_claim(*a):
        d = real_claim(*a)
        claims[-1] += d is not None
        return d
    T._claim_grad_dest = counting_claim
    for s in range(steps):
        claims.append(0)
        for model in (ref, ddp):
            for p in model.parameters():
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.numpy()[...] = 0
        x, y = X[s], Y[s]
        F.mse_loss(ref(pyddp.tensor(x)), pyddp.tensor(y)).backward()
        mine = slice(rank * B, (rank + 1) * B)
        F.mse_loss(ddp(pyddp.tensor(x[mine])), pyddp.tensor(y[mine])).backward()
        bufs = [b.buffer for b in ddp._buckets]
        aliases.append([any(np.shares_memory(p.grad.numpy(), b) for b in bufs) for p in m.parameters()])
        for a, b in zip(ref.parameters(), m.parameters()):
            # the mean over ranks of per-rank mean losses = the full-batch mean loss
            np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), rtol=1e-10, atol=1e-12)
        _sgd(ref.parameters())
        _sgd(ddp.parameters())
    owned_after = [getattr(p, "_grad_adopt", None) is None for p in m.parameters()]
    T._claim_grad_dest = real_claim
    return aliases, owned_after, claims


@pytest.mark.parametrize("gv", [False, True])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_computed_into_the_buckets_equal_full_batch_training(gv, set_to_none):
    for aliases, owned, claims in run(_direct_child, 2, gv, set_to_none):
        assert all(owned)
        # the three weights and biases are computed into the buckets (the tied layer's once: its
        # second use adds in) while they have no .grad: every step with set_to_none, else the first
        assert claims == ([6, 6, 6] if set_to_none else [6, 0, 0]), claims
        for step in aliases:
            # with or without gradient_as_bucket_view, every .grad is a view of its bucket
            assert all(step), aliases


def _kept_grads_child(rank, ws):
    """Every .grad is a view of its bucket, yet gradients a caller keeps from one step (across
    zero_grad's set_to_none) are never overwritten by the next: they get memory of their own."""
    pyddp.manual_seed(0)
    m = _Net().double()
    ddp = DDP(m)
    X, Y = _data(ws, 5)
    kept, snap, reused = None, None, []
    for s in range(5):
        _zero(ddp.parameters())
        mine = slice(rank * B, (rank + 1) * B)
        F.mse_loss(ddp(pyddp.tensor(X[s, mine])), pyddp.tensor(Y[s, mine])).backward()
        bufs = [b.buffer for b in ddp._buckets]
        assert len(bufs) == 1 and all(np.shares_memory(p.grad.numpy(), bufs[0]) for p in m.parameters())
        reused.append(id(bufs[0]))
        del bufs
        if s == 2:
            kept = [p.grad for p in m.parameters()]           # the caller keeps step 2's gradients
            snap = [g.numpy().copy() for g in kept]
        elif s > 2:
            for g, c in zip(kept, snap):
                np.testing.assert_array_equal(g.numpy(), c)  # untouched by later steps
        _sgd(ddp.parameters())
    return reused


def test_gradients_kept_by_the_caller_are_never_overwritten_by_the_next_step():
    for ids in run(_kept_grads_child, 2):
        # one bucket, rebuilt once (second step), then the same shared array for every step
        assert ids[1] == ids[2] == ids[3] == ids[4], ids


class _BnHeadNet(nn.Module):
    """fc1 -> SyncBatchNorm -> fc2, then a head that only some ranks use (rank-dependent control
    flow: an unused parameter on the others)."""

    def __init__(self, use_head):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.bn = nn.SyncBatchNorm(8)
        self.fc2 = nn.Linear(8, 400)
        self.head = nn.Linear(400, 400)   # over torch's 1 MiB first bucket: a bucket of its own
        self.use_head = use_head

    def forward(self, x):
        z = self.fc2(F.tanh(self.bn(self.fc1(x))))
        return (self.head(z) if self.use_head else z)[:, :3]


def _bn_head(rank, ws, steps):
    pyddp.manual_seed(0)
    m = _BnHeadNet(rank == 1).double()
    # the head's bucket (the last layer's) is reduced first where it is used, then one bucket
    # per parameter
    ddp = DDP(m, find_unused_parameters=True, bucket_cap_mb=0.0001)
    X, Y = _data(ws, steps)
    grads = []
    for s in range(steps):
        x, y = X[s, rank * B:(rank + 1) * B], Y[s, rank * B:(rank + 1) * B]
        for p in m.parameters():
            p.grad = None
        F.mse_loss(ddp(pyddp.tensor(x)), pyddp.tensor(y)).backward()
        grads.append({n: (None if p.grad is None else p.grad.numpy().copy())
                      for n, p in m.named_parameters()})
    return grads


def test_find_unused_parameters_with_sync_batchnorm_keeps_every_rank_s_collectives_in_order():
    """SyncBatchNorm all-reduces in backward; the bucket of a parameter one rank does not use must
    not go at the end of that rank's backward while the others reduce it before SyncBatchNorm's
    (torch marks the unused parameters ready when backward starts).  Gradients against one process
    running the whole batch (BatchNorm over both ranks' rows, the head on rank 1's rows)."""
    ws, steps = 2, 2
    outs = run(_bn_head, ws, steps, timeout=90, init_kwargs={"timeout": timedelta(seconds=20)})
    X, Y = _data(ws, steps)
    for s in range(steps):
        pyddp.manual_seed(0)
        m = _BnHeadNet(False).double()
        m.bn = nn.BatchNorm1d(8).double()
        z = m.fc2(F.tanh(m.bn(m.fc1(pyddp.tensor(X[s, :ws * B])))))
        z0, z1 = z[:B, :3], m.head(z[B:])[:, :3]
        loss = (F.mse_loss(z0, pyddp.tensor(Y[s, :B])) + F.mse_loss(z1, pyddp.tensor(Y[s, B:2 * B]))) / 2
        loss.backward()
        for name, p in m.named_parameters():
            for rank in range(ws):
                got = outs[rank][s][name]
                assert got is not None, f"rank {rank} step {s}: {name} has no gradient"
                np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-9, atol=1e-12,
                                           err_msg=f"rank {rank} step {s}: {name}")
