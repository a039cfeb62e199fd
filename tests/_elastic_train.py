"""A small elastic job for tests/launch/test_elastic.py: a linear model on integer data, a fixed global
batch dealt by ElasticSampler, one all_reduce per step.  Gradient sums of integers are exact, so
any membership gives the same bits as a fault-free run with the same sample order.

ELASTIC_KILL="8:1,20:2": at step 8 the first worker of local rank 1 kills itself (SIGKILL), at step
20 that of local rank 2."""
import json
import os
import signal
import sys
import time

import numpy as np

import pyddp.distributed as dist
import pyddp.elastic as elastic

N, B, EPOCHS, DIM = 120, 12, 3, 5
data = (np.arange(N * DIM, dtype=np.float64).reshape(N, DIM) % 7) - 3
# step -> the id of the worker that kills itself there: "<local rank>" for the first worker of that
# local rank on node 0 ("0.<local rank>.<local rank>"), or a whole id ("0.1.4": a replacement)
kills = dict((int(s), i if "." in i else f"0.{i}.{i}")
             for s, i in (x.split(":") for x in os.environ.get("ELASTIC_KILL", "").split(",") if x))
me = os.environ.get("PYDDP_ELASTIC_ID")
OUT = os.environ.get("ELASTIC_OUT")  # a directory: one JSON file per record (not the shared stdout)


def emit(obj):
    with open(os.path.join(OUT, f"{os.getpid()}-{time.time_ns()}.json"), "w") as f:
        json.dump(obj, f)


pause = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))  # seconds per step: time for a joiner


class Model:
    def __init__(self):
        self.w = np.zeros(DIM)

    def state_dict(self):
        return {"w": self.w.copy()}

    def load_state_dict(self, sd):
        self.w = sd["w"].copy()


state = elastic.State(model=Model(), epoch=0, batch=0, steps=0, seen=np.zeros(N, dtype=np.int64))
entries = []


@elastic.run(timeout=60)
def train(state):
    entries.append((elastic.current_generation(), state.steps, time.time()))
    assert (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) == (dist.get_rank(),
                                                                       dist.get_world_size())
    sampler = elastic.ElasticSampler(N, state, batch_size=B, seed=3)
    while state.epoch < EPOCHS:
        for idx in sampler:
            g = data[idx].sum(axis=0)
            c = np.bincount(idx, minlength=N).astype(np.int64)
            dist.all_reduce(g)
            dist.all_reduce(c)
            state.model.w -= g / 64.0  # exact: integer sums over a power of two
            state.seen += c
            state.batch += 1
            state.steps += 1
            time.sleep(pause)
            if kills.get(state.steps) == me:
                emit({"killed": me, "at": time.time()})
                os.kill(os.getpid(), signal.SIGKILL)
            state.commit()
        state.epoch += 1
        state.batch = 0
        state.commit()
    return state.model.w


w = train(state)
emit({"id": me, "w": w.tolist(), "steps": state.steps, "seen": state.seen.tolist(),
      "entries": [[e[0], e[1], e[2]] for e in entries]})
sys.exit(0)
