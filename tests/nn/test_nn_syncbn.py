"""nn.SyncBatchNorm on real rank processes against single-process BatchNorm on the whole batch.

Every rank builds the same full batch (same seed), keeps its own slice (the slices differ in size),
and runs SyncBatchNorm on it; the reference is nn.BatchNorm2d on the concatenated batch in the same
process (BatchNorm itself is checked against torch in test_nn_modules.py).  Output slices, input
gradient slices, running statistics and the all-reduced weight/bias gradients must agree.
"""
import numpy as np
import pytest

import pyddp
import pyddp.distributed as dist
import pyddp.nn as nn
from _mp import run

RTOL = 1e-5


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _syncbn_rank(rank, world_size, sizes, momentum):
    rng = np.random.default_rng(0)
    total = sum(sizes)
    x = (rng.standard_normal((total, 3, 4, 5)) * 2 + 1).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    w0 = rng.uniform(0.5, 1.5, 3).astype(np.float32)
    b0 = rng.uniform(-0.5, 0.5, 3).astype(np.float32)
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]

    ref = nn.BatchNorm2d(3, momentum=momentum)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.BatchNorm2d(3, momentum=momentum)))
    sbn = model[0]
    assert type(sbn) is nn.SyncBatchNorm
    for m in (ref, sbn):
        m.weight.numpy()[:] = w0
        m.bias.numpy()[:] = b0
    errs = {}
    for step in range(2):  # two steps: running statistics and the batch counter move
        xr = pyddp.tensor(x * (step + 1), requires_grad=True)
        out_ref = ref(xr)
        out_ref.backward(pyddp.tensor(g))
        xs = pyddp.tensor(x[lo:hi] * (step + 1), requires_grad=True)
        out = model(xs)
        out.backward(pyddp.tensor(g[lo:hi]))
        errs[f"out{step}"] = _rel(out.numpy(), out_ref.numpy()[lo:hi])
        errs[f"dx{step}"] = _rel(xs.grad.numpy(), xr.grad.numpy()[lo:hi])
    gw = sbn.weight.grad.numpy().copy()
    gb = sbn.bias.grad.numpy().copy()
    dist.all_reduce(gw)  # what DDP's gradient averaging does (times world_size)
    dist.all_reduce(gb)
    errs["dw"] = _rel(gw, ref.weight.grad.numpy())
    errs["db"] = _rel(gb, ref.bias.grad.numpy())
    errs["running_mean"] = _rel(sbn.running_mean.numpy(), ref.running_mean.numpy())
    errs["running_var"] = _rel(sbn.running_var.numpy(), ref.running_var.numpy())
    errs["batches"] = int(sbn.num_batches_tracked.numpy()) - 2
    # eval mode uses the running statistics, no communication
    sbn.eval()
    ref.eval()
    errs["eval"] = _rel(sbn(pyddp.tensor(x[lo:hi])).numpy(), ref(pyddp.tensor(x)).numpy()[lo:hi])
    return errs


@pytest.mark.parametrize("momentum", [0.1, None])
def test_sync_batchnorm_matches_full_batch(momentum):
    results = run(_syncbn_rank, 3, [2, 3, 1], momentum, timeout=120)
    for rank, errs in enumerate(results):
        assert errs.pop("batches") == 0, rank
        for k, e in errs.items():
            assert e <= RTOL, f"rank {rank}: {k} relative error {e:.3g}"


def test_sync_batchnorm_without_process_group_is_batchnorm():
    """No process group: SyncBatchNorm is BatchNorm (and converts back and forth by state_dict)."""
    pyddp.manual_seed(0)
    bn = nn.BatchNorm1d(4)
    sbn = nn.SyncBatchNorm(4)
    sbn.load_state_dict(bn.state_dict())
    x = pyddp.randn(6, 4, 3)
    np.testing.assert_allclose(sbn(x).numpy(), bn(x).numpy(), rtol=1e-6)
    np.testing.assert_allclose(sbn.running_var.numpy(), bn.running_var.numpy(), rtol=1e-6)
    assert list(sbn.state_dict()) == list(bn.state_dict())
    with pytest.raises(ValueError, match="expected at least 2D input"):
        sbn(pyddp.randn(4))


def test_convert_sync_batchnorm_shares_state():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                          nn.Sequential(nn.BatchNorm1d(2, affine=False), nn.ReLU()))
    params = {id(p) for p in model.parameters()}
    rm = model[1].running_mean
    model.eval()
    out = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert out is model
    assert type(model[1]) is nn.SyncBatchNorm and type(model[2][0]) is nn.SyncBatchNorm
    assert {id(p) for p in model.parameters()} == params
    assert model[1].running_mean is rm and not model[1].training
    assert model[2][0].weight is None
    single = nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(3))
    assert type(single) is nn.SyncBatchNorm


def test_sync_batchnorm_repr_vs_torch():
    torch = pytest.importorskip("torch")
    assert repr(nn.SyncBatchNorm(5, momentum=None, bias=False)) == \
        repr(torch.nn.SyncBatchNorm(5, momentum=None, bias=False))
