"""apex.parallel's names on pyddp.nn.parallel, on real rank processes, against torch 2.13.

* DistributedDataParallel with apex's keyword arguments: gradient_average / gradient_predivide_factor
  give apex's arithmetic (sum(g / f) * f / world, or sum(g / f) without averaging), delay_allreduce
  starts no allreduce before the end of backward, allreduce_always_fp32 reduces float16 gradients
  in float32, retain_allreduce_buffers keeps the reduced flat buffers (gradients are views of
  them), message_size sets the bucket size, num_allreduce_streams spreads buckets over groups;
  apex's refusals raise its errors. The reference gradients come from torch on the whole batch.
* SyncBatchNorm / convert_syncbn_model (channel_last, fuse_relu and the residual z) equal
  torch's BatchNorm over the concatenated batch, with different batch sizes on 3 ranks.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # no OpenMP pool in the parent of forked ranks

from _mp import run  # noqa: E402


def _data(rank, world):
    rng = np.random.default_rng(3)
    w1, b1 = rng.standard_normal((6, 4)) * 0.5, rng.standard_normal(6) * 0.1
    w2, b2 = rng.standard_normal((3, 6)) * 0.5, rng.standard_normal(3) * 0.1
    x = rng.standard_normal((4 * world, 4))
    y = rng.standard_normal((4 * world, 3))
    return (w1, b1, w2, b2), x, y


def _torch_grads(weights, x, y, dtype=torch.float64):
    m = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).to(dtype)
    with torch.no_grad():
        for p, w in zip(m.parameters(), weights):
            p.copy_(torch.from_numpy(w))
    torch.nn.functional.mse_loss(m(torch.from_numpy(x).to(dtype)),
                                 torch.from_numpy(y).to(dtype)).backward()
    return [p.grad.double().numpy() for p in m.parameters()]


def _apex_rank(rank, world, kwargs):
    import pyddp
    import pyddp.distributed as dist
    import pyddp.nn as nn
    import pyddp.nn.functional as F
    from pyddp.nn.parallel import DistributedDataParallel as DDP

    weights, x, y = _data(rank, world)
    dt = np.float64
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    for p, w in zip(model.parameters(), weights):
        p.numpy()[...] = w
    if kwargs.get("allreduce_trigger_params") == "2.weight":
        kwargs = dict(kwargs, allreduce_trigger_params=[model[2].weight])
    ddp = DDP(model, **kwargs)
    calls = []
    real = dist.all_reduce

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    early = []
    model[0].weight.register_post_accumulate_grad_hook(lambda p: early.append(len(calls)))
    import pyddp.distributed.distributed_c10d as c10d
    c10d.all_reduce, dist.all_reduce = counting, counting
    try:
        lo, hi = 4 * rank, 4 * rank + 4
        F.mse_loss(ddp(pyddp.tensor(x[lo:hi].astype(dt))), pyddp.tensor(y[lo:hi])).backward()
    finally:
        c10d.all_reduce, dist.all_reduce = real, real
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    retained = None
    if kwargs.get("retain_allreduce_buffers"):
        bufs = [b.numpy() for b in ddp.allreduce_buffers]
        retained = all(any(np.shares_memory(p.grad.numpy(), b) for b in bufs)
                       for p in model.parameters())
    buckets = [list(b.params) for b in ddp._buckets]
    return grads, early[0], len(calls), ddp.bucket_bytes_cap, retained, buckets


CASES = {
    "default": ({}, 1.0),
    "sum": ({"gradient_average": False, "message_size": 8}, None),
    "predivide": ({"gradient_predivide_factor": 4.0}, 1.0),
    "predivide_sum": ({"gradient_predivide_factor": 4.0, "gradient_average": False}, 0.25),
    "delay": ({"delay_allreduce": True, "message_size": 8}, 1.0),
    "retain_streams": ({"retain_allreduce_buffers": True, "num_allreduce_streams": 2,
                        "message_size": 8, "prof": False}, 1.0),
    "triggers": ({"allreduce_trigger_params": "2.weight", "gradient_average": False}, None),
}


def _apex_cases(rank, world):
    return {name: _apex_rank(rank, world, kw) for name, (kw, _) in CASES.items()}


@pytest.mark.parametrize("world", [2, 3])
def test_apex_ddp_arguments(world):
    weights, x, y = _data(0, world)
    mean = _torch_grads(weights, x, y)  # mean loss over the whole batch = DDP's average
    outs = run(_apex_cases, world, timeout=120)
    for name, (kw, scale) in CASES.items():
        out = [o[name] for o in outs]
        want_scale = world if scale is None else (scale if name != "predivide_sum" else
                                                  world * scale)
        for r, (grads, early, total, cap, retained, buckets) in enumerate(out):
            for g, m in zip(grads, mean):
                np.testing.assert_allclose(g, m * want_scale, rtol=1e-12, atol=1e-14,
                                           err_msg=f"{name} rank {r}")
            if name == "delay":
                assert early == 0 and total >= 2, (early, total)  # all at the end of backward
                assert cap == 8 * 4
            if name == "retain_streams":
                assert retained is True
            if name == "triggers":  # reverse order: 2.bias, 2.weight | 0.bias, 0.weight
                assert buckets == [[3, 2], [1, 0]], buckets
        if name == "sum":
            assert out[0][1] >= 1  # without delay, buckets were reduced during backward


def _fp32_rank(rank, world):
    import pyddp
    import pyddp.distributed as dist
    import pyddp.nn as nn
    from pyddp.nn.parallel import DistributedDataParallel as DDP

    rng = np.random.default_rng(rank)
    w = (np.random.default_rng(9).standard_normal((5, 3)) * 0.3).astype(np.float16)
    x = (rng.standard_normal((7, 3)) * 30).astype(np.float16)
    res = {}
    for fp32 in (True, False):
        m = nn.Linear(3, 5, bias=False).half()
        m.weight.numpy()[...] = w
        ddp = DDP(m, allreduce_always_fp32=fp32, gradient_predivide_factor=2.0)
        ddp(pyddp.tensor(x)).sum().backward()
        res[fp32] = m.weight.grad.numpy().copy()
    local = (np.ones((7, 5), np.float16).T @ x).astype(np.float16)  # this rank's gradient
    every = [None] * world
    dist.all_gather_object(every, local)
    return res, every


def test_apex_allreduce_always_fp32():
    out = run(_fp32_rank, 2, timeout=120)
    every = out[0][1]
    # apex: (sum of g / 2 in float32) * 2 / world, back to float16
    want = (sum(g.astype(np.float32) / np.float32(2.0) for g in every) * np.float32(2.0 / 2))
    for res, _ in out:
        np.testing.assert_array_equal(res[True], want.astype(np.float16))
        assert res[False].dtype == np.float16
        np.testing.assert_allclose(res[False].astype(np.float32), want, rtol=2e-3)


def _errors_rank(rank, world):
    import pyddp.nn as nn
    from pyddp.nn.parallel import DistributedDataParallel as DDP

    msgs = {}
    m = nn.Linear(2, 2)
    for name, kw in {
        "shared": {"shared_param": True},
        "trigger_delay": {"delay_allreduce": True, "allreduce_trigger_params": [m.weight]},
        "streams_delay": {"delay_allreduce": True, "num_allreduce_streams": 2},
        "both_sizes": {"message_size": 100, "bucket_cap_mb": 1},
        "communicators": {"num_allreduce_streams": 2, "allreduce_communicators": ([None], [None])},
        "unknown": {"bogus": 1},
    }.items():
        try:
            DDP(m, **kw)
            msgs[name] = None
        except (ValueError, TypeError) as e:
            msgs[name] = f"{type(e).__name__}: {e}"
    ddp = DDP(m, allreduce_trigger_params=[m.weight], gradient_average=False)
    try:
        ddp.register_comm_hook(None, lambda s, b: None)
    except RuntimeError as e:
        msgs["hook"] = str(e)
    ddp.disable_allreduce()
    msgs["disabled"] = ddp.require_backward_grad_sync
    ddp.enable_allreduce()
    return msgs


def test_apex_ddp_refusals():
    msgs = run(_errors_rank, 2, timeout=120)[0]
    assert msgs["shared"].startswith("ValueError: shared_param is no longer supported")
    assert "allreduce_trigger_params is only valid if delay_allreduce=False" in msgs["trigger_delay"]
    assert "may only be used if delay_allreduce=False" in msgs["streams_delay"]
    assert "not both" in msgs["both_sizes"]
    assert "allreduce_communicators" in msgs["communicators"]
    assert msgs["unknown"].startswith("TypeError") and "bogus" in msgs["unknown"]
    assert "cannot be combined with apex" in msgs["hook"]
    assert msgs["disabled"] is False


# ------------------------------------------------------------------------------- SyncBatchNorm

def _syncbn_rank(rank, world, sizes, channel_last, fuse_relu):
    import pyddp
    import pyddp.nn as nn
    from pyddp.nn.parallel import SyncBatchNorm, convert_syncbn_model

    rng = np.random.default_rng(0)
    total = sum(sizes)
    x = (rng.standard_normal((total, 3, 4, 5)) * 2 + 1).astype(np.float64)
    z = rng.standard_normal(x.shape)
    g = rng.standard_normal(x.shape)
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    model = convert_syncbn_model(nn.Sequential(nn.BatchNorm2d(3).double()),
                                 channel_last=channel_last)
    bn = model[0]
    assert type(bn) is SyncBatchNorm and bn.channel_last == channel_last
    bn.fuse_relu = fuse_relu
    bn.weight.numpy()[:] = [0.5, 1.0, 1.5]
    bn.bias.numpy()[:] = [0.1, -0.2, 0.3]
    xs, zs, gs = x[lo:hi], z[lo:hi], g[lo:hi]
    if channel_last:
        xs, zs, gs = (a.transpose(0, 2, 3, 1).copy() for a in (xs, zs, gs))
    xt = pyddp.tensor(xs, requires_grad=True)
    out = bn(xt, pyddp.tensor(zs) if fuse_relu else None)
    out.backward(pyddp.tensor(gs))
    o, dx = out.numpy(), xt.grad.numpy()
    if channel_last:
        o, dx = o.transpose(0, 3, 1, 2), dx.transpose(0, 3, 1, 2)
    return o, dx, bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()


@pytest.mark.parametrize("channel_last,fuse_relu", [(False, False), (True, True)])
def test_apex_syncbn_matches_torch_full_batch(channel_last, fuse_relu):
    sizes = [2, 3, 1]
    out = run(_syncbn_rank, 3, sizes, channel_last, fuse_relu, timeout=120)
    rng = np.random.default_rng(0)
    x = torch.from_numpy((rng.standard_normal((6, 3, 4, 5)) * 2 + 1)).requires_grad_()
    z = torch.from_numpy(rng.standard_normal(x.shape))
    g = torch.from_numpy(rng.standard_normal(x.shape))
    bn = torch.nn.BatchNorm2d(3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 1.0, 1.5]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    y = bn(x)
    if fuse_relu:
        y = torch.relu(y + z)
    y.backward(g)
    lo = 0
    for r, (o, dx, rm, rv) in enumerate(out):
        hi = lo + sizes[r]
        np.testing.assert_allclose(o, y.detach().numpy()[lo:hi], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dx, x.grad.numpy()[lo:hi], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(rm, bn.running_mean.numpy(), rtol=1e-10)
        np.testing.assert_allclose(rv, bn.running_var.numpy(), rtol=1e-10)
        lo = hi


def test_convert_syncbn_model_as_apex():
    import pyddp.nn as nn
    from pyddp.nn.parallel import SyncBatchNorm, convert_syncbn_model
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(2)))
    m[1].weight.numpy()[:] = 2.0
    rm = m[1].running_mean
    out = convert_syncbn_model(m)
    assert out is m and type(m[1]) is SyncBatchNorm and type(m[2][0]) is SyncBatchNorm
    assert m[1].running_mean is rm  # apex shares the running statistics ...
    np.testing.assert_array_equal(m[1].weight.numpy(), 2.0)  # ... and copies weight and bias
    with pytest.raises(TypeError, match="pyddp.nn.Module or a torch.nn.Module"):
        convert_syncbn_model(object())
    # a torch model gets torch layers (torch's SyncBatchNorm algorithm on pyddp's collectives:
    # tests/parallel/test_torch_path.py), apex's copy of weight and bias, shared running statistics
    bn = torch.nn.BatchNorm1d(2)
    conv = convert_syncbn_model(bn)
    assert isinstance(conv, torch.nn.modules.batchnorm._BatchNorm) and conv.weight is not bn.weight
    assert conv.running_mean is bn.running_mean


def _reducer_rank(rank, world):
    import pyddp
    import pyddp.nn as nn
    from pyddp.nn.parallel import Reducer

    pyddp.manual_seed(rank)  # different weights per rank: the module Reducer broadcasts rank 0's
    m = nn.Linear(3, 2)
    red = Reducer(m)
    m(pyddp.full((4, 3), float(rank + 1))).sum().backward()
    red.reduce()
    g = pyddp.tensor(np.full(5, float(rank), dtype=np.float64))
    Reducer([g]).reduce()
    return m.weight.numpy().copy(), m.weight.grad.numpy().copy(), g.numpy().copy()


def test_apex_reducer():
    out = run(_reducer_rank, 3, timeout=120)
    for w, gw, g in out:
        np.testing.assert_array_equal(w, out[0][0])
        np.testing.assert_allclose(gw, np.full((2, 3), 4.0 * (1 + 2 + 3) / 3), rtol=1e-6)
        np.testing.assert_array_equal(g, np.full(5, 1.0))
