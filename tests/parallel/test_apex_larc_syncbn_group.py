"""apex.parallel.LARC and apex.parallel.create_syncbn_process_group on pyddp (apex is not
installed: the references are computed by hand from apex's formulas).

* LARC wraps an optimizer: gradients become (g + wd * p) * adaptive_lr, adaptive_lr =
  tc * |p| / (|g| + |p| * wd + eps), clipped to min(adaptive_lr / lr, 1) (clip=True), the groups'
  weight decay is absorbed for the step and given back; zero norms leave the gradient alone; the
  optimizer's groups, state, state_dict and zero_grad pass through; the import paths of apex
  (``apex.parallel.LARC.LARC``, ``from pyddp.parallel.LARC import LARC``) and amp.initialize
  accepting a LARC-wrapped optimizer, as apex's does; on torch tensors too.
* create_syncbn_process_group(group_size) on 4 real ranks: consecutive groups, 0 -> None, a size
  that does not divide the world raises.
"""
import numpy as np
import pytest

import pyddp
import pyddp.nn as nn

from _mp import run


def _ref_step(p, g, lr, wd, tc=0.02, clip=True, eps=1e-8, momentum=0.0):
    """apex LARC then plain SGD, by hand, float64."""
    pn, gn = np.linalg.norm(p), np.linalg.norm(g)
    g = g.copy()
    if pn != 0 and gn != 0:
        a = tc * pn / (gn + pn * wd + eps)
        if clip:
            a = min(a / lr, 1)
        g = (g + wd * p) * a
    return p - lr * g


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_larc_step_matches_apex_formula(clip, wd):
    from pyddp.parallel.LARC import LARC
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4))
    g0 = rng.standard_normal((3, 4)) * 50    # a big gradient: the clip matters
    z0 = np.zeros(2)                          # a zero parameter: left alone
    w = nn.Parameter(pyddp.tensor(w0))
    z = nn.Parameter(pyddp.tensor(z0))
    w.grad = pyddp.tensor(g0)
    z.grad = pyddp.tensor(np.ones(2))
    lr = 0.1
    opt = LARC(pyddp.optim.SGD([w, z], lr=lr, weight_decay=wd), trust_coefficient=0.02,
               clip=clip)
    opt.step()
    np.testing.assert_allclose(w.detach().numpy(), _ref_step(w0, g0, lr, wd, clip=clip),
                               rtol=1e-12, atol=1e-14)
    # the zero parameter: no LARC scaling; SGD applies its own weight decay (0 here: absorbed)
    np.testing.assert_allclose(z.detach().numpy(), z0 - lr * np.ones(2))
    assert opt.param_groups[0]["weight_decay"] == wd     # given back after the step
    assert opt.param_groups is opt.optim.param_groups and opt.state is opt.optim.state
    opt.zero_grad()
    assert w.grad is None or not w.grad.numpy().any()
    sd = opt.state_dict()
    opt.load_state_dict(sd)
    assert repr(opt) == repr(opt.optim)


def test_larc_on_torch_tensors():
    torch = pytest.importorskip("torch")
    from pyddp.nn.parallel.LARC import LARC
    rng = np.random.default_rng(1)
    w0, g0 = rng.standard_normal(5), rng.standard_normal(5) * 10
    w = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    w.grad = torch.from_numpy(g0.copy())
    opt = LARC(torch.optim.SGD([w], lr=0.5, weight_decay=1e-3), trust_coefficient=0.01)
    opt.step()
    np.testing.assert_allclose(w.detach().numpy(),
                               _ref_step(w0, g0, 0.5, 1e-3, tc=0.01), rtol=1e-12)


@pytest.fixture
def _amp_reset():
    from pyddp.amp._amp_state import _amp_state
    yield
    _amp_state.reset()   # O1 switches pyddp's autocast on process-wide: later tests must not see it


def test_larc_import_paths_and_amp_initialize(_amp_reset):
    import pyddp as apex
    from pyddp import amp
    from pyddp.parallel.LARC import LARC
    assert apex.parallel.LARC.LARC is LARC
    assert pyddp.parallel.LARC.LARC is pyddp.nn.parallel.LARC.LARC
    assert pyddp.parallel.SyncBatchNorm is pyddp.nn.parallel.SyncBatchNorm
    assert set(pyddp.nn.parallel.__all__) <= set(dir(pyddp.parallel))
    model = nn.Linear(4, 2)
    opt = LARC(pyddp.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    # a static loss scale: the dynamic one's first step may overflow in float16 and be skipped
    model, opt2 = amp.initialize(model, opt, opt_level="O1", loss_scale=128.0, verbosity=0)
    assert opt2 is opt
    x = pyddp.randn(8, 4)
    loss = model(x).pow(2).mean()
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    before = [p.detach().numpy().copy() for p in model.parameters()]
    opt.step()
    after = [p.detach().numpy() for p in model.parameters()]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))


def _syncbn_groups(rank, world):
    import pyddp.distributed as dist
    from pyddp.parallel import create_syncbn_process_group
    assert create_syncbn_process_group(0) is None
    g = create_syncbn_process_group(2)
    t = np.array([float(rank)])
    dist.all_reduce(t, group=g)
    g1 = create_syncbn_process_group(1)
    one = np.array([float(rank)])
    dist.all_reduce(one, group=g1)
    try:
        create_syncbn_process_group(3)
    except AssertionError as e:
        err = str(e)
    return t[0], dist.get_world_size(g), one[0], err


def test_create_syncbn_process_group_four_ranks():
    out = run(_syncbn_groups, 4, timeout=120)
    # groups {0, 1} and {2, 3}
    assert [o[0] for o in out] == [1.0, 1.0, 5.0, 5.0]
    assert all(o[1] == 2 for o in out)
    assert [o[2] for o in out] == [0.0, 1.0, 2.0, 3.0]
    assert all("does not divide" in o[3] for o in out)
