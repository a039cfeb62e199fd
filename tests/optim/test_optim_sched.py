"""pyddp.optim.lr_scheduler against torch 2.13: the lr sequence over 30+ steps for every
scheduler (chainable forms), the closed forms of step(epoch), state dicts and resuming."""
import warnings

import numpy as np
import pytest

import pyddp.optim as O
from _optim_ref import FakeTensor

torch = pytest.importorskip("torch")


def _pair(opt_name="SGD", groups=2, **opt_kw):
    tparams = [torch.nn.Parameter(torch.zeros(3)) for _ in range(groups)]
    pparams = [FakeTensor(np.zeros(3, np.float32)) for _ in range(groups)]
    lrs = [0.1 * (i + 1) for i in range(groups)]
    topt = getattr(torch.optim, opt_name)([{"params": [p], "lr": lr} for p, lr in zip(tparams, lrs)], **opt_kw)
    popt = getattr(O, opt_name)([{"params": [p], "lr": lr} for p, lr in zip(pparams, lrs)], **opt_kw)
    return topt, popt, tparams, pparams


def _run(tsched, psched, topt, popt, tparams, pparams, steps, extra_keys=()):
    seq_t, seq_p = [], []
    for _ in range(steps):
        for tp, pp in zip(tparams, pparams):
            tp.grad = torch.ones(3)
            pp.grad = FakeTensor(np.ones(3, np.float32))
        topt.step()
        popt.step()
        tsched.step()
        psched.step()
        seq_t.append(tsched.get_last_lr() + [g[k] for g in topt.param_groups for k in extra_keys])
        seq_p.append(psched.get_last_lr() + [g[k] for g in popt.param_groups for k in extra_keys])
    return seq_t, seq_p


SCHEDULERS = [
    ("StepLR", dict(step_size=4, gamma=0.5)),
    ("MultiStepLR", dict(milestones=[3, 7, 7, 20], gamma=0.3)),
    ("ExponentialLR", dict(gamma=0.9)),
    ("CosineAnnealingLR", dict(T_max=10, eta_min=0.001)),  # 35 steps cross the restart branch
    ("LinearLR", dict(start_factor=0.2, end_factor=0.9, total_iters=12)),
    ("LambdaLR", dict(lr_lambda=lambda e: 1.0 / (1 + e) ** 0.5)),
    ("OneCycleLR", dict(max_lr=[0.5, 1.0], total_steps=36)),
    ("MultiplicativeLR", dict(lr_lambda=lambda e: 0.95)),
    ("ConstantLR", dict(factor=0.5, total_iters=6)),
    ("PolynomialLR", dict(total_iters=20, power=0.9)),
    ("OneCycleLR", dict(max_lr=0.5, total_steps=36, anneal_strategy="linear", three_phase=True)),
]


@pytest.mark.parametrize("name,kw", SCHEDULERS, ids=[f"{n}{i}" for i, (n, _) in enumerate(SCHEDULERS)])
def test_lr_sequence_matches_torch(name, kw):
    topt, popt, tp, pp = _pair("SGD", momentum=0.9)
    tsched = getattr(torch.optim.lr_scheduler, name)(topt, **kw)
    psched = getattr(O.lr_scheduler, name)(popt, **kw)
    assert psched.get_last_lr() == tsched.get_last_lr()
    extra = ("momentum",) if name == "OneCycleLR" else ()
    seq_t, seq_p = _run(tsched, psched, topt, popt, tp, pp, 35, extra)
    np.testing.assert_allclose(np.array(seq_p), np.array(seq_t), rtol=1e-12, atol=0)
    assert psched.last_epoch == tsched.last_epoch == 35


def test_one_cycle_cycles_adam_beta1():
    topt, popt, tp, pp = _pair("Adam")
    kw = dict(max_lr=0.01, epochs=3, steps_per_epoch=10)
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, **kw)
    psched = O.lr_scheduler.OneCycleLR(popt, **kw)
    for _ in range(30):
        for a, b in zip(tp, pp):
            a.grad = torch.ones(3)
            b.grad = FakeTensor(np.ones(3, np.float32))
        topt.step()
        popt.step()
        tsched.step() if tsched.last_epoch < 29 else None
        psched.step() if psched.last_epoch < 29 else None
        assert [g["betas"] for g in popt.param_groups] == [g["betas"] for g in topt.param_groups]
        assert psched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)
    for a, b in zip(tp, pp):
        np.testing.assert_allclose(b._data, a.detach().numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="Tried to step 31 times"):
        psched.step()
        psched.step()


@pytest.mark.parametrize("name,kw", [("StepLR", dict(step_size=3, gamma=0.5)),
                                     ("MultiStepLR", dict(milestones=[2, 5], gamma=0.1)),
                                     ("ExponentialLR", dict(gamma=0.8)),
                                     ("CosineAnnealingLR", dict(T_max=6)),
                                     ("LinearLR", dict(total_iters=4))])
def test_closed_form_step_epoch(name, kw):
    topt, popt, _, _ = _pair("SGD")
    tsched = getattr(torch.optim.lr_scheduler, name)(topt, **kw)
    psched = getattr(O.lr_scheduler, name)(popt, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in (3, 7, 1, 12):
            tsched.step(epoch)
            psched.step(epoch)
            assert psched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)


def test_state_dict_and_resume():
    topt, popt, tp, pp = _pair("SGD")
    psched = O.lr_scheduler.CosineAnnealingLR(popt, T_max=8)
    tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=8)
    _run(tsched, psched, topt, popt, tp, pp, 5)
    sd = psched.state_dict()
    assert "optimizer" not in sd and sd["last_epoch"] == 5
    assert set(sd) == set(tsched.state_dict())
    # resume: a new optimizer loaded from the old one's state, a scheduler from its state dict
    pp2 = [FakeTensor(np.zeros(3, np.float32)) for _ in pp]
    popt2 = O.SGD([{"params": [p], "lr": 0.0} for p in pp2])
    popt2.load_state_dict(popt.state_dict())
    psched2 = O.lr_scheduler.CosineAnnealingLR(popt2, T_max=8, last_epoch=4)
    psched2.load_state_dict(sd)
    seq_t, seq_p = _run(tsched, psched2, topt, popt2, tp, pp2, 10)
    np.testing.assert_allclose(seq_p, seq_t, rtol=1e-12)
    with pytest.raises(KeyError, match="initial_lr"):
        O.lr_scheduler.StepLR(O.SGD([FakeTensor(np.zeros(1, np.float32))]), 2, last_epoch=3)


def test_lambda_state_dict_keeps_callable_objects():
    class Warmup:
        def __init__(self, n):
            self.n = n

        def __call__(self, e):
            return min(1.0, (e + 1) / self.n)

    popt = O.SGD([FakeTensor(np.zeros(1, np.float32))], lr=1.0)
    s = O.lr_scheduler.LambdaLR(popt, Warmup(4))
    sd = s.state_dict()
    assert sd["lr_lambdas"] == [{"n": 4}]
    w = Warmup(10)
    s2 = O.lr_scheduler.LambdaLR(O.SGD([FakeTensor(np.zeros(1, np.float32))], lr=1.0), w)
    s2.load_state_dict(sd)
    assert w.n == 4
    with pytest.raises(ValueError, match="Expected 1 lr_lambdas, but got 2"):
        O.lr_scheduler.LambdaLR(popt, [Warmup(1), Warmup(2)])


def test_warns_when_scheduler_steps_first_and_drives_torch_optimizers():
    popt = O.SGD([FakeTensor(np.zeros(1, np.float32))], lr=1.0)
    s = O.lr_scheduler.StepLR(popt, 1)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        s.step()
    topt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = O.lr_scheduler.ExponentialLR(topt, 0.5)
    topt.step()
    s.step()
    assert topt.param_groups[0]["lr"] == 0.5
    with pytest.raises(TypeError, match="is not an Optimizer"):
        O.lr_scheduler.StepLR(object(), 1)


def _sub(mod, opt, which):
    if which == "seq":
        a = mod.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
        b = mod.lr_scheduler.CosineAnnealingLR(opt, T_max=12)
        c = mod.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return mod.lr_scheduler.SequentialLR(opt, [a, b, c], milestones=[5, 17])
    a = mod.lr_scheduler.ExponentialLR(opt, gamma=0.97)
    b = mod.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    return mod.lr_scheduler.ChainedScheduler([a, b])


@pytest.mark.parametrize("which", ["seq", "chain"])
def test_sequential_and_chained(which):
    topt, popt, tp, pp = _pair("SGD")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about the wrapped schedulers' first step
        tsched = _sub(torch.optim, topt, which)
        psched = _sub(O, popt, which)
        assert psched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)
        seq_t, seq_p = _run(tsched, psched, topt, popt, tp, pp, 30)
    np.testing.assert_allclose(np.array(seq_p), np.array(seq_t), rtol=1e-12, atol=0)
    sd = psched.state_dict()
    assert len(sd["_schedulers"]) == len(tsched.state_dict()["_schedulers"])


def test_reduce_lr_on_plateau():
    topt, popt, _, _ = _pair("SGD")
    kw = dict(mode="min", factor=0.5, patience=2, threshold=0.01, cooldown=1, min_lr=[0.01, 0.02])
    ts = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **kw)
    ps = O.lr_scheduler.ReduceLROnPlateau(popt, **kw)
    metrics = [1.0, 0.9, 0.95, 0.95, 0.95, 0.899, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.5, 0.6, 0.6,
               0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]
    for m in metrics:
        ts.step(m)
        ps.step(m)
        assert ps.get_last_lr() == ts.get_last_lr()
        assert ps.num_bad_epochs == ts.num_bad_epochs
    assert ps.get_last_lr()[0] < 0.1  # it did reduce
    sd = ps.state_dict()
    ps2 = O.lr_scheduler.ReduceLROnPlateau(popt)
    ps2.load_state_dict(sd)
    assert ps2.best == ps.best and ps2.patience == 2
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        O.lr_scheduler.ReduceLROnPlateau(popt, factor=1.0)
