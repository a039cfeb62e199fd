"""Child script of tests/amp/test_amp_checkpoint.py: the seed notes' amp checkpoint recipe.

    python _amp_ckpt_script.py LEVEL OPTIMIZER first|resume CKPT OUT

first: train the full run (N steps) and write its final parameters to OUT.full.npz, then train a
fresh run for N/2 steps and save {'model', 'optimizer', 'amp', 'sched'} to CKPT.
resume (a new process): build the model and optimizer, amp.initialize, load the three (and the
scheduler), train the remaining steps and write the parameters to OUT.resumed.npz.
An inf is injected into a gradient at steps 1 and 5, so loss-scale state crosses the checkpoint.
"""
import sys

import numpy as np

import pyddp
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp import amp

N = 8
INF_STEPS = (1, 5)


def build(opt_name):
    pyddp.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 4))
    if opt_name == "sgd":
        opt = pyddp.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = pyddp.optimizers.FusedAdam(model.parameters(), lr=3e-3, weight_decay=0.01)
    return model, opt


def batch(step):
    rng = np.random.default_rng(1000 + step)
    return (pyddp.tensor(rng.standard_normal((16, 12)).astype(np.float32)),
            pyddp.tensor(rng.integers(0, 4, 16)))


def train(model, opt, sched, start, stop):
    for step in range(start, stop):
        x, y = batch(step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled_loss:
            scaled_loss.backward()
            if step in INF_STEPS:
                model[0].weight.grad._data[0, 0] = np.inf
        opt.step()
        sched.step()


def snapshot(model, opt):
    out = {f"model.{k}": np.array(v._data) for k, v in model.state_dict().items()}
    out.update({f"param{i}": np.array(p._data) for i, p in enumerate(model.parameters())})
    out.update({f"master{i}": np.array(p._data) for i, p in enumerate(amp.master_params(opt))})
    out["loss_scale"] = np.array(amp.state_dict()["loss_scaler0"]["loss_scale"])
    out["unskipped"] = np.array(amp.state_dict()["loss_scaler0"]["unskipped"])
    return out


def main():
    level, opt_name, phase, ckpt, out = sys.argv[1:6]
    if phase == "first":
        model, opt = build(opt_name)
        sched = pyddp.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        model, opt = amp.initialize(model, opt, opt_level=level, verbosity=0)
        train(model, opt, sched, 0, N)
        np.savez(out + ".full.npz", **snapshot(model, opt))

        model, opt = build(opt_name)
        sched = pyddp.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        model, opt = amp.initialize(model, opt, opt_level=level, verbosity=0)
        train(model, opt, sched, 0, N // 2)
        checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "amp": amp.state_dict(), "sched": sched.state_dict()}
        pyddp.save(checkpoint, ckpt)
    else:
        model, opt = build(opt_name)
        pyddp.manual_seed(123)  # a different initialisation must not matter after loading
        model = nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 4))
        opt = type(opt)(model.parameters(), **{k: v for k, v in opt.defaults.items()
                                               if k in ("lr", "momentum", "weight_decay")})
        sched = pyddp.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        checkpoint = pyddp.load(ckpt, weights_only=False)
        model, opt = amp.initialize(model, opt, opt_level=level, verbosity=0)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        amp.load_state_dict(checkpoint["amp"])
        sched.load_state_dict(checkpoint["sched"])
        train(model, opt, sched, N // 2, N)
        np.savez(out + ".resumed.npz", **snapshot(model, opt))


if __name__ == "__main__":
    main()
