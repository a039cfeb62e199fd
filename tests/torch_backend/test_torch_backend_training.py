"""Training through torch's own API on the "pyddp" backend, against gloo in the same job.

torch's DistributedDataParallel with comm hooks, static_graph and the Join context manager (uneven
inputs), and ZeroRedundancyOptimizer end with the same parameters on "pyddp" as on "gloo"; the
group starts from every init_method (env://, tcp://, file://, store=); a torchrun-launched script
trains on "pyddp".  Real rank processes (tests/_mp.py), a timeout on every wait.
"""
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # no OpenMP pool in the parent of forked ranks

import _paths
from _mp import free_port, run  # noqa: E402

ROOT = _paths.ROOT


def _model(rank):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                                torch.nn.Tanh(), torch.nn.Linear(32, 2)).double()
    with torch.no_grad():  # ranks start different: DDP's broadcast must align them
        for p in model.parameters():
            p.add_(rank * 0.1)
    return model


def _batches(rank, steps):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(5, 8, generator=g, dtype=torch.float64),
             torch.randn(5, 2, generator=g, dtype=torch.float64)) for _ in range(steps)]


def _train(rank, world_size, backend, mode):
    """torch DDP (or ZeRO) for a few steps in ``mode``; the parameters as NumPy arrays."""
    import datetime

    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pyddp.torch_backend  # noqa: F401

    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    model = _model(rank)
    ddp = DDP(model, bucket_cap_mb=0.001, static_graph=(mode == "static_graph"))
    if mode == "allreduce_hook":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif mode == "fp16_hook":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if mode == "zero":
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.1,
                                      momentum=0.9)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    steps = 4 + (2 * rank if mode == "join" else 0)  # uneven inputs: the last rank runs longest
    joinables = [ddp] + ([opt] if mode == "zero" else [])

    def step(x, y):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    if mode == "join":
        with Join(joinables):
            for x, y in _batches(rank, steps):
                step(x, y)
    else:
        for x, y in _batches(rank, steps):
            step(x, y)
    if mode == "zero":
        opt.consolidate_state_dict(to=0)
        state = opt.state_dict() if rank == 0 else None
        momenta = None if state is None else [v["momentum_buffer"].numpy().copy()
                                              for _, v in sorted(state["state"].items())]
    else:
        momenta = None
    params = [p.detach().numpy().copy() for p in model.parameters()]  # no torch shared memory
    # DDP's reducer is freed while its group lives: freed after destroy_process_group (when
    # this frame is left), it now and then hangs in torch's C++ (seen with gloo and with pyddp)
    del opt, ddp, joinables
    gc.collect()
    dist.destroy_process_group()
    return params, momenta


@pytest.mark.parametrize("mode", ["allreduce_hook", "fp16_hook", "static_graph", "join", "zero"])
def test_training_same_as_gloo(mode):
    mine = run(_train, 2, "pyddp", mode, init=False, timeout=120)
    ref = run(_train, 2, "gloo", mode, init=False, timeout=120)
    for r in range(2):
        for a, b in zip(mine[r][0], ref[r][0]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(mine[0][0], mine[1][0]):
        np.testing.assert_array_equal(a, b)
    if mode == "zero":
        assert len(mine[0][1]) == len(ref[0][1]) == 6
        for a, b in zip(mine[0][1], ref[0][1]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def _init_method(rank, world_size, how, where):
    import datetime

    import torch.distributed as dist

    import pyddp.torch_backend  # noqa: F401

    timeout = datetime.timedelta(seconds=60)
    if how == "store":
        host, port = where.split(":")
        store = dist.TCPStore(host, int(port), world_size, rank == 0, timeout=timeout)
        dist.init_process_group("pyddp", store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
    else:
        dist.init_process_group("pyddp", init_method=where, rank=rank, world_size=world_size,
                                timeout=timeout)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    out = (dist.get_backend(), dist.get_rank(), dist.get_world_size(), t.item())
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("how", ["tcp", "file", "store"])
def test_init_methods(how, tmp_path):
    port = free_port()
    where = {"tcp": f"tcp://127.0.0.1:{port}", "file": f"file://{tmp_path}/rendezvous",
             "store": f"127.0.0.1:{port}"}[how]
    res = run(_init_method, 3, how, where, init=False, timeout=90)
    assert res == [("pyddp", r, 3, 6.0) for r in range(3)]


TORCHRUN_SCRIPT = textwrap.dedent("""
    import json, os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import pyddp.torch_backend  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("pyddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert int(os.environ["LOCAL_RANK"]) == rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = model.double()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(7 + rank)
    for _ in range(3):
        x = torch.randn(6, 4, generator=g, dtype=torch.float64)
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print("RESULT " + json.dumps({"rank": rank, "world": world, "backend": dist.get_backend(),
                                  "params": flat.tolist()}), flush=True)
    del opt, ddp  # torch DDP freed before its group (see _train)
    dist.destroy_process_group()
""")


def _plain_reference():
    """The same training without DDP: one model, the gradients averaged over both ranks' batches."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gens = [torch.Generator().manual_seed(7 + r) for r in range(2)]
    for _ in range(3):
        opt.zero_grad()
        for g in gens:
            (model(torch.randn(6, 4, generator=g, dtype=torch.float64)).pow(2).mean() / 2).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def test_torchrun_script(tmp_path):
    import json

    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={free_port()}", "--master_addr=127.0.0.1", str(script)]
    try:
        proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                              timeout=150)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in 150 s:\n{e.stdout}\n{e.stderr}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # the ranks share one stdout: a line's text and its newline may be written apart, so the
    # results are read by position, not by line
    dec, found, pos = json.JSONDecoder(), [], proc.stdout.find('{"rank": ')
    while pos >= 0:
        obj, end = dec.raw_decode(proc.stdout, pos)
        found.append(obj)
        pos = proc.stdout.find('{"rank": ', end)
    results = sorted(found, key=lambda r: r["rank"])
    assert [(r["rank"], r["world"], r["backend"]) for r in results] == \
        [(0, 2, "pyddp"), (1, 2, "pyddp")], out
    want = _plain_reference()
    for r in results:
        np.testing.assert_allclose(r["params"], want, rtol=1e-10, atol=1e-12)
