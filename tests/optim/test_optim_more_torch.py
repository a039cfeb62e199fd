"""RMSprop, Adagrad, Adadelta, Adamax, NAdam, RAdam and Rprop against torch 2.13: the same
parameters and gradients for several steps give the same parameters and state."""
import numpy as np
import pytest

import pyddp
import pyddp.optim as poptim

torch = pytest.importorskip("torch")

CASES = [
    ("RMSprop", {}), ("RMSprop", dict(momentum=0.9, centered=True, weight_decay=0.1)),
    ("RMSprop", dict(maximize=True, alpha=0.9)),
    ("Adagrad", {}), ("Adagrad", dict(lr_decay=0.1, weight_decay=0.01,
                                      initial_accumulator_value=0.5)),
    ("Adadelta", {}), ("Adadelta", dict(rho=0.5, weight_decay=0.1, lr=0.5)),
    ("Adamax", {}), ("Adamax", dict(weight_decay=0.1, betas=(0.8, 0.9))),
    ("NAdam", {}), ("NAdam", dict(weight_decay=0.1, decoupled_weight_decay=True)),
    ("NAdam", dict(weight_decay=0.1, momentum_decay=0.01)),
    ("RAdam", {}), ("RAdam", dict(weight_decay=0.1, decoupled_weight_decay=True,
                                  betas=(0.9, 0.9))),
    ("Rprop", {}), ("Rprop", dict(etas=(0.3, 1.5), step_sizes=(1e-3, 0.05), maximize=True)),
]


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_matches_torch(name, kw):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    b0 = rng.standard_normal(4).astype(np.float32)
    pw, pb = pyddp.nn.Parameter(pyddp.tensor(w0)), pyddp.nn.Parameter(pyddp.tensor(b0))
    tw, tb = torch.nn.Parameter(torch.tensor(w0)), torch.nn.Parameter(torch.tensor(b0))
    po = getattr(poptim, name)([pw, pb], **kw)
    to = getattr(torch.optim, name)([tw, tb], **kw)
    for step in range(12):
        gw = rng.standard_normal(w0.shape).astype(np.float32)
        gb = rng.standard_normal(b0.shape).astype(np.float32) if step % 3 else np.zeros(4, np.float32)
        pw.grad, pb.grad = pyddp.tensor(gw), pyddp.tensor(gb)
        tw.grad, tb.grad = torch.tensor(gw), torch.tensor(gb)
        po.step()
        to.step()
    np.testing.assert_allclose(pw.detach().numpy(), tw.detach().numpy(), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(pb.detach().numpy(), tb.detach().numpy(), rtol=2e-5, atol=2e-6)
    ps, ts = po.state[pw], to.state[tw]
    assert set(ps) == set(ts)
    for k in ts:
        np.testing.assert_allclose(np.asarray(ps[k]).reshape(-1),
                                   ts[k].detach().numpy().reshape(-1), rtol=2e-5, atol=2e-6)


def test_bad_arguments_name_themselves():
    p = [pyddp.nn.Parameter(pyddp.zeros(2))]
    for name, kw in (("RMSprop", dict(lr=-1)), ("Adagrad", dict(eps=-1)),
                     ("Adadelta", dict(rho=1.5)), ("Adamax", dict(betas=(1.0, 0.9))),
                     ("Rprop", dict(etas=(1.5, 1.2)))):
        with pytest.raises(ValueError, match="Invalid"):
            getattr(poptim, name)(p, **kw)


def test_state_dict_round_trip_and_scheduler():
    p = pyddp.nn.Parameter(pyddp.ones(3))
    opt = poptim.RMSprop([p], lr=0.1, momentum=0.5)
    sched = poptim.lr_scheduler.StepLR(opt, 1, 0.5)
    p.grad = pyddp.ones(3)
    opt.step()
    sched.step()
    sd = opt.state_dict()
    opt2 = poptim.RMSprop([pyddp.nn.Parameter(pyddp.ones(3))], lr=0.1, momentum=0.5)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == 0.05
    np.testing.assert_array_equal(opt2.state[opt2.param_groups[0]["params"][0]]["square_avg"],
                                  opt.state[p]["square_avg"])
