"""An elastic job with DistributedDataParallel (tests/launch/test_elastic.py): a pyddp.nn model, or a torch
model with ELASTIC_TORCH=1, wrapped in pyddp's DDP inside the elastic function (re-wrapped at every
re-form), SGD; the worker with id 1 kills itself at step 9 when ELASTIC_KILL=1; the survivors then take
ELASTIC_STEP_SLEEP seconds a step until its replacement joined."""
import json
import os
import signal
import time

import numpy as np

import pyddp.distributed as dist
import pyddp.elastic as elastic
from pyddp.nn.parallel import DistributedDataParallel as DDP

if os.environ.get("ELASTIC_TORCH") == "1":
    import torch
    import torch.nn as nn
else:
    import pyddp as torch
    import pyddp.nn as nn

torch.manual_seed(0)
N, B, EPOCHS = 96, 12, 4
X = np.random.default_rng(0).standard_normal((N, 6)).astype(np.float32)
Y = (X @ np.arange(6, dtype=np.float32)).reshape(-1, 1)
model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
state = elastic.State(model=model, optimizer=opt, epoch=0, batch=0, steps=0)
me = os.environ.get("PYDDP_ELASTIC_ID")
kill = os.environ.get("ELASTIC_KILL") == "1"
pause = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))


@elastic.run(timeout=60)
def train(state):
    ddp = DDP(state.model)
    sampler = elastic.ElasticSampler(N, state, batch_size=B, seed=0)
    while state.epoch < EPOCHS:
        for idx in sampler:
            opt.zero_grad()
            out = ddp(torch.tensor(X[idx]))
            # the mean over the global batch: DDP averages over the ranks
            loss = ((out - torch.tensor(Y[idx])) ** 2).sum() * (dist.get_world_size() / B)
            loss.backward()
            opt.step()
            state.batch += 1
            state.steps += 1
            if kill and state.steps == 9 and me == "0.1.1":
                os.kill(os.getpid(), signal.SIGKILL)
            if dist.get_world_size() < 3:
                time.sleep(pause)  # slow until the replacement (a fresh interpreter) joins
            state.commit()
        state.epoch += 1
        state.batch = 0
        state.commit()


train(state)
params = np.concatenate([np.asarray(p.detach().numpy(), dtype=np.float64).ravel()
                         for p in model.parameters()])
with open(os.path.join(os.environ["ELASTIC_OUT"], f"{me}.json"), "w") as f:
    json.dump({"id": me, "steps": state.steps, "params": params.tolist()}, f)
