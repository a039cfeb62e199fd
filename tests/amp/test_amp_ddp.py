"""pyddp.amp under DistributedDataParallel (2 real rank processes, a timeout on every wait).

An inf injected into one rank's (already allreduced) gradient must make every rank skip the same
step and lower the loss scale in lockstep (pyddp MAX-allreduces the found-inf flag), and the
overflow message is printed once, by rank 0.  O2 masters follow the parameters DDP broadcasts
from rank 0.
"""
import contextlib
import io

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp import amp
from pyddp.nn.parallel import DistributedDataParallel as DDP

from _mp import run

STEPS = 6
INF_STEP = {2: 1, 4: 0}  # step -> the rank whose gradient gets an inf


def _train(rank, world_size, opt_level, opt_name):
    # different seeds per rank: DDP's broadcast (and, O2, the masters' resync) must even them out
    pyddp.manual_seed(10 + rank)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    if opt_name == "sgd":
        opt = pyddp.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = pyddp.optimizers.FusedAdam(model.parameters(), lr=1e-2)
    sched = pyddp.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model, opt = amp.initialize(model, opt, opt_level=opt_level, verbosity=1)
    model = DDP(model)
    rng = np.random.default_rng(100 + rank)
    scales, skipped, out = [], [], io.StringIO()
    with contextlib.redirect_stdout(out):
        for step in range(STEPS):
            x = pyddp.tensor(rng.standard_normal((8, 8)).astype(np.float32))
            y = pyddp.tensor(rng.integers(0, 4, 8))
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
                if INF_STEP.get(step) == rank:
                    p = model.module[0].weight
                    p.grad._data[0, 0] = np.inf
            before = [np.array(p._data) for p in model.parameters()]
            opt.step()
            sched.step()
            skipped.append(all(np.array_equal(b, p._data)
                               for b, p in zip(before, model.parameters())))
            scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
    masters = [np.array(p._data) for p in amp.master_params(opt)]
    model_params = [np.array(p._data) for p in model.parameters()]
    return dict(scales=scales, skipped=skipped, printed=out.getvalue(),
                masters=masters, params=model_params, lr=sched.get_last_lr())


@pytest.mark.parametrize("opt_level,opt_name", [("O1", "sgd"), ("O2", "fused_adam")])
def test_amp_ddp_overflow_lockstep(opt_level, opt_name):
    res = run(_train, 2, opt_level, opt_name, timeout=60)
    expect_skipped = [s in INF_STEP for s in range(STEPS)]
    want_scales, s = [], 2.0 ** 16
    for step in range(STEPS):
        if step in INF_STEP:
            s /= 2
        want_scales.append(s)
    for r in res:
        assert r["skipped"] == expect_skipped
        assert r["scales"] == want_scales
    assert res[0]["printed"].count("Gradient overflow.  Skipping step, loss scaler 0 reducing "
                                   "loss scale to 32768.0") == 1
    assert res[0]["printed"].count("Gradient overflow.") == 2
    assert "Gradient overflow" not in res[1]["printed"]
    for a, b in zip(res[0]["params"], res[1]["params"]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(res[0]["masters"], res[1]["masters"]):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.float32
    if opt_level == "O2":
        # every float16 model parameter is its master rounded to nearest even
        halves = [p for p in res[0]["params"] if p.dtype == np.float16]
        assert halves
        f32 = [m for m in res[0]["masters"] if m.shape in {h.shape for h in halves}]
        for h in halves:
            assert any(np.array_equal(h, m.astype(np.float16)) for m in f32)
    # lr scheduler stepped normally through the skipped steps (4 optimizer calls, 2 skipped)
    assert res[0]["lr"] == res[1]["lr"]


def _train_torch(rank, world_size):
    import torch

    torch.manual_seed(rank)  # DDP broadcasts rank 0's weights; the O2 masters must follow
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    model = DDP(model)
    g = torch.Generator().manual_seed(rank)
    skipped = []
    for step in range(4):
        loss = model(torch.randn(4, 6, generator=g)).pow(2).mean()
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled_loss:
            scaled_loss.backward()
            if step == 1 and rank == 1:
                model.module[0].weight.grad[0, 0] = float("inf")
        before = [p.detach().clone() for p in amp.master_params(opt)]
        opt.step()
        skipped.append(all(torch.equal(b, p) for b, p in zip(before, amp.master_params(opt))))
    return ([p.detach().numpy().copy() for p in amp.master_params(opt)],
            [p.detach().numpy().copy() for p in model.parameters()], skipped,
            amp.state_dict()["loss_scaler0"])


def test_amp_ddp_torch_model_o2():
    pytest.importorskip("torch")
    res = run(_train_torch, 2, timeout=60)
    for masters, params, skipped, scaler in res:
        assert skipped == [False, True, False, False]
        assert scaler == {"loss_scale": 32768.0, "unskipped": 2}
        for p, m in zip(params, masters):
            np.testing.assert_array_equal(p, m.astype(np.float16))
    for a, b in zip(res[0][0], res[1][0]):
        np.testing.assert_array_equal(a, b)
