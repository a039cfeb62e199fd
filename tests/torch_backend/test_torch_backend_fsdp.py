"""torch FSDP2 (``fully_shard``), ReduceOp.PREMUL_SUM and ``dist.monitored_barrier`` on the "pyddp"
torch backend, against gloo in the same job (where gloo refuses, against torch computed locally).

Real rank processes (tests/_mp.py), a timeout on every wait.
"""
import datetime
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # no OpenMP pool in the parent of forked ranks

from _mp import run  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _init(rank, world_size, timeout=60):
    import datetime

    import torch.distributed as dist

    import pyddp.torch_backend  # noqa: F401

    dist.init_process_group("pyddp", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    return dist


# ------------------------------------------------------------------------------------ FSDP2

# name -> (parameter dtype, fully_shard keyword arguments)
_FSDP_CONFIGS = {
    "float32": (torch.float32, {}),  # reduce-scatter with ReduceOp.AVG
    "float64": (torch.float64, {}),  # ReduceOp.SUM, then FSDP divides
    "bf16_params": (torch.float32, {"mp": (torch.bfloat16, torch.float32)}),
    "no_reshard": (torch.float32, {"reshard_after_forward": False}),
}


def _fsdp_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 33), torch.nn.Tanh(), torch.nn.Linear(33, 17),
                               torch.nn.Tanh(), torch.nn.Linear(17, 3)).to(dtype)


def _shard(model, mesh, kw):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = dict(kw)
    mp = kw.pop("mp", None)
    if mp is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mp[0], reduce_dtype=mp[1])
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, **kw)
    return fully_shard(model, mesh=mesh, **kw)


def _fsdp_train(rank, mesh, dtype, kw, steps=3):
    """Train a sharded MLP for a few steps; (losses, full parameters as NumPy)."""
    model = _shard(_fsdp_model(dtype), mesh, kw)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8, generator=g, dtype=dtype)
        y = torch.randn(4, 3, generator=g, dtype=dtype)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = [p.full_tensor().detach().double().numpy().copy() for p in model.parameters()]
    return losses, params


def _fsdp_child(rank, world_size, configs):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    dist = _init(rank, world_size)
    gloo = dist.new_group(backend="gloo")
    sub = dist.new_group(backend="pyddp")  # a mesh on a pyddp subgroup, too
    meshes = {"gloo": DeviceMesh.from_group(gloo, "cpu"),
              "pyddp": init_device_mesh("cpu", (world_size,)),  # the default (pyddp) group
              "pyddp_sub": DeviceMesh.from_group(sub, "cpu")}
    out = {"mesh_backend": dist.get_backend(meshes["pyddp"].get_group())}
    for name in configs:
        dtype, kw = _FSDP_CONFIGS[name]
        out[name] = {m: _fsdp_train(rank, mesh, dtype, kw) for m, mesh in meshes.items()}
    return out


def _close(a, b, dtype):
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    return np.allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("world_size,configs", [(2, tuple(_FSDP_CONFIGS)), (3, ("float32",))],
                         ids=["2ranks", "3ranks"])
def test_fsdp2_fully_shard_trains_as_on_gloo(world_size, configs):
    outs = run(_fsdp_child, world_size, configs, init=False, timeout=180)
    assert outs[0]["mesh_backend"] == "pyddp"
    for name in configs:
        dtype = _FSDP_CONFIGS[name][0]
        ref_params = outs[0][name]["gloo"][1]
        for rank, out in enumerate(outs):
            gl_losses, gl_params = out[name]["gloo"]
            for mesh in ("pyddp", "pyddp_sub"):
                losses, params = out[name][mesh]
                assert _close(losses, gl_losses, dtype), \
                    f"{name} rank {rank} {mesh}: losses {losses} on pyddp, {gl_losses} on gloo"
                for i, (p, q) in enumerate(zip(params, gl_params)):
                    assert _close(p, q, dtype), \
                        f"{name} rank {rank} {mesh}: parameter {i} differs from gloo's " \
                        f"(max |diff| {np.abs(p - q).max():.3g})"
            for i, (p, q) in enumerate(zip(gl_params, ref_params)):  # every rank: one model
                assert np.array_equal(p, q), f"{name}: gloo's parameter {i} differs by rank"
        # training moved the parameters (the comparison is not between two untrained models)
        start = [p.detach().double().numpy() for p in _fsdp_model(dtype).parameters()]
        assert any(not np.allclose(p, s) for p, s in zip(ref_params, start))


def _divide_factor_child(rank, world_size):
    """Gradients with set_gradient_divide_factor(4.0): FSDP2 reduce-scatters them with
    ReduceOp.PREMUL_SUM(0.25), which gloo refuses; pyddp's must equal gloo's default (AVG over
    2 ranks) times 2 / 4."""
    from torch.distributed.device_mesh import DeviceMesh

    dist = _init(rank, world_size)
    gloo = dist.new_group(backend="gloo")
    grads = {}
    model = _shard(_fsdp_model(torch.float32), DeviceMesh.from_group(gloo, "cpu"), {})
    model[0].set_gradient_divide_factor(4.0)
    try:  # gloo refuses the PREMUL_SUM that FSDP2 then uses
        model(torch.ones(1, 8)).sum().backward()
        grads["gloo refused"] = None
    except RuntimeError as e:
        grads["gloo refused"] = str(e)
    for name, group in (("gloo", gloo), ("pyddp", dist.group.WORLD)):
        model = _shard(_fsdp_model(torch.float32), DeviceMesh.from_group(group, "cpu"), {})
        if name == "pyddp":
            for m in model.modules():  # per module: not recursive
                if hasattr(m, "set_gradient_divide_factor"):
                    m.set_gradient_divide_factor(4.0)
        g = torch.Generator().manual_seed(10 + rank)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 3, generator=g)
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads[name] = [p.grad.full_tensor().double().numpy().copy() for p in model.parameters()]
    return grads


def test_fsdp2_gradient_divide_factor_uses_premul_sum():
    for rank, grads in enumerate(run(_divide_factor_child, 2, init=False, timeout=120)):
        refused = grads["gloo refused"]
        assert refused and "PREMUL_SUM" in refused, refused
        for i, (mine, ref) in enumerate(zip(grads["pyddp"], grads["gloo"])):
            assert np.abs(ref).max() > 0
            assert np.allclose(mine, ref * 2 / 4, rtol=1e-5, atol=1e-7), \
                f"rank {rank} gradient {i}: pyddp {mine.ravel()[:4]} gloo/2 {ref.ravel()[:4] / 2}"


# ----------------------------------------------------------------------- ReduceOp.PREMUL_SUM

def _premul_child(rank, world_size):
    dist = _init(rank, world_size)
    gloo = dist.new_group(backend="gloo")
    n = world_size
    out = {"gloo": None, "results": {}, "errors": {}}
    try:  # torch lets the op reach a custom backend; gloo itself refuses it
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(0.5), group=gloo)
    except RuntimeError as e:
        out["gloo"] = str(e)
    res = out["results"]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for fname, factor in (("float", 0.25), ("tensor", torch.tensor(0.25, dtype=dtype))):
            op = dist._make_nccl_premul_sum(factor)
            key = f"{dtype} {fname}"
            x = (torch.arange(6) + rank).to(dtype)
            dist.all_reduce(x, op=op)
            res[f"all_reduce {key}"] = x
            x = (torch.arange(6) + rank).to(dtype)
            dist.all_reduce(x, op=op, async_op=True).wait(datetime.timedelta(seconds=60))
            res[f"all_reduce async {key}"] = x
            x = (torch.arange(6) + rank).to(dtype)
            dist.reduce(x, dst=n - 1, op=op)
            if rank == n - 1:
                res[f"reduce {key}"] = x
            else:  # NCCL leaves the other ranks' tensors as they were
                same = torch.equal(x, (torch.arange(6) + rank).to(dtype))
                res[f"reduce input {key}"] = bool(same)
            inp = (torch.arange(2 * n) + rank).to(dtype)
            before = inp.clone()
            o = torch.zeros(2, dtype=dtype)
            dist.reduce_scatter_tensor(o, inp, op=op)
            res[f"reduce_scatter_tensor {key}"] = o
            res[f"reduce_scatter_tensor input {key}"] = bool(torch.equal(inp, before))
            o = torch.zeros(2, dtype=dtype)
            dist.reduce_scatter(o, list((torch.arange(2 * n) + rank).to(dtype).chunk(n)), op=op)
            res[f"reduce_scatter {key}"] = o
    for what, call in (
            ("int64", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64),
                                              op=dist._make_nccl_premul_sum(2.0))),
            ("int32 reduce_scatter", lambda: dist.reduce_scatter_tensor(
                torch.zeros(1, dtype=torch.int32), torch.ones(n, dtype=torch.int32),
                op=dist._make_nccl_premul_sum(2.0)))):
        try:
            call()
            out["errors"][what] = None
        except TypeError as e:
            out["errors"][what] = str(e)
    dist.barrier()
    # plain values for the queue (a tensor would travel as a shared-memory handle)
    out["results"] = {k: v if isinstance(v, bool) else (str(v.dtype), v.double().tolist())
                      for k, v in res.items()}
    return out


def test_premul_sum_reaches_pyddp_and_matches_torch():
    n = 3
    outs = run(_premul_child, n, init=False, timeout=120)
    for rank, out in enumerate(outs):
        assert out["gloo"] and "PREMUL_SUM" in out["gloo"], out["gloo"]
        res = out["results"]
        for key, got in res.items():
            dtype = getattr(torch, key.split()[-2].split(".")[1])
            if key.startswith(("reduce_scatter_tensor input", "reduce input")):
                assert got is True, f"rank {rank} {key}: input changed"
                continue
            got_dtype, got = got
            assert got_dtype == str(dtype), f"rank {rank} {key}: result dtype {got_dtype}"
            got = torch.tensor(got, dtype=torch.float64)
            ins = [(torch.arange(6 if "all_reduce" in key or key.startswith("reduce ")
                                 else 2 * n) + r).to(dtype) for r in range(n)]
            want = sum(t.double() * 0.25 for t in ins)
            if key.startswith("reduce_scatter"):
                want = want[2 * rank:2 * rank + 2]
            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
            assert torch.allclose(got, want, rtol=tol, atol=tol), \
                f"rank {rank} {key}: {got.tolist()} want {want.tolist()}"
        assert len(res) == 4 * 2 * 6
        for what, msg in out["errors"].items():
            assert msg and "PREMUL_SUM" in msg and "floating-point" in msg, f"{what}: {msg}"


# ---------------------------------------------------------------------- monitored_barrier

def _monitored_child(rank, world_size, backend, missing, wait_all):
    import datetime

    import torch.distributed as dist

    import pyddp.torch_backend  # noqa: F401

    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))  # every rank: passes
    out = {"passed": True}
    if rank in missing:
        time.sleep(4)  # never calls the second monitored_barrier
        return out
    t0 = time.monotonic()
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=wait_all)
        out["second"] = "returned"
    except RuntimeError as e:
        out["second"] = (type(e).__name__, isinstance(e, dist.DistBackendError), str(e))
    out["elapsed"] = time.monotonic() - t0
    return out


@pytest.mark.parametrize("wait_all", [False, True], ids=["first", "wait_all_ranks"])
def test_torch_monitored_barrier_names_missing_ranks_like_gloo(wait_all):
    n, missing = 3, (1, 2) if wait_all else (2,)
    pyddp = run(_monitored_child, n, "pyddp", missing, wait_all, init=False, timeout=120)
    gloo = run(_monitored_child, n, "gloo", missing, wait_all, init=False, timeout=120)
    for outs in (pyddp, gloo):
        assert all(o["passed"] for o in outs)
    r0, g0 = pyddp[0], gloo[0]
    assert g0["second"] != "returned" and r0["second"] != "returned", (r0, g0)
    assert r0["second"][1], f"pyddp raised {r0['second'][0]}, not DistBackendError"
    assert 1.5 <= r0["elapsed"] < 10, r0
    named = missing if wait_all else missing[:1]
    for m in named:  # gloo names these ranks too
        assert str(m) in g0["second"][2], g0
        assert str(m) in r0["second"][2], f"rank 0's error does not name rank {m}: {r0}"


def _monitored_other_backend(rank, world_size):
    """torch's own behaviour stays for other groups: a gloo subgroup passes, and torch's own
    check still refuses a backend without monitored_barrier."""
    import datetime
    import importlib

    import pyddp.torch_backend as tb

    importlib.reload(tb)  # a second import keeps the one wrapper around torch's function
    dist = _init(rank, world_size)
    gloo = dist.new_group(backend="gloo")
    dist.monitored_barrier(group=gloo, timeout=datetime.timedelta(seconds=20))
    dist.monitored_barrier(timeout=1.5 + rank)  # a float, as torch accepts (seconds)
    import torch.distributed.distributed_c10d as c10d

    return (dist.monitored_barrier is c10d.monitored_barrier,
            c10d.monitored_barrier._pyddp_torch_fn.__module__)


def test_torch_monitored_barrier_other_groups_keep_torchs():
    for same, module in run(_monitored_other_backend, 2, init=False, timeout=90):
        assert same and module == "torch.distributed.distributed_c10d"
