"""The torch-model path on CUDA tensors: tests/_torch_path_script.py (the script tests/parallel/test_torch_path.py runs
on CPU tensors) with --device cuda, and the seed notes' GPU scripts (tests/gpu/seeds/, only their import lines
changed) run to the end on the GPU with their checkpoints reloaded.

Two ranks share one GPU through pyddp's staged ``cpu`` backend (torch's reference: its DDP on gloo, which takes
CUDA tensors); one rank runs on the ``nccl`` backend. On the GPU the results are compared with a tolerance
(rtol 1e-5 float64 / 1e-4 float32): cuBLAS may pick different kernels in two runs of one shape; the loss
scale sequence of amp must be equal.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from _gpu import machine
from _mp import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
SEEDS = os.path.join(HERE, "seeds")


def _run(args, tmp, timeout=240, module="pyddp.run"):
    import _launch

    rc, out, err = _launch.run(args, module=module, timeout=timeout, cwd=str(tmp))
    assert rc == 0, (out[-3000:], err[-5000:])
    return out


def _script(tmp, nproc, backend, only=""):
    args = ["--standalone", "--nproc-per-node", str(nproc), os.path.join(TESTS, "_torch_path_script.py"),
            "--device", "cuda", "--backend", backend, "--tport", str(free_port()), "--out", str(tmp)]
    if only:
        args += ["--only", only]
    _run(args, tmp)
    return [dict(np.load(os.path.join(tmp, f"rank{r}.npz"))) for r in range(nproc)]


def _close(res, name):
    keys = sorted(k for k in res if k.startswith(name + "/pyddp/") and not k.endswith("/optimizer"))
    assert keys, name
    for k in keys:
        a, b = res[k], res[k.replace("/pyddp/", "/torch/")]
        rtol = 1e-5 if a.dtype == np.float64 else 1e-4
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * 1e-2, err_msg=k)


CASES = ["ddp_default", "ddp_small_buckets", "ddp_bucket_view", "ddp_static_graph", "ddp_buffers",
         "ddp_unused", "ddp_float32", "no_sync", "join", "hook_allreduce_hook", "hook_fp16_compress_hook",
         "fused_adam", "fused_adam_l2", "fused_sgd", "amp_o1"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _script(tmp_path_factory.mktemp("gpu_torch_path2"), 2, "cpu")


@pytest.mark.parametrize("name", CASES)
def test_two_ranks_on_one_gpu_match_torch(two_ranks, name):
    for res in two_ranks:
        _close(res, name)


def test_two_ranks_amp_skips_together_and_syncbn_matches_whole_batch(two_ranks):
    for res in two_ranks:
        np.testing.assert_array_equal(res["amp_o1/pyddp/x0"], res["amp_o1/torch/x0"])
        np.testing.assert_array_equal(res["amp_o1/pyddp/x0"], [2.0 ** 16, 2.0 ** 16, 2.0 ** 15, 2.0 ** 15])
        for k in ("out", "gx", "gw", "rm", "rv"):
            np.testing.assert_allclose(res[f"syncbn/pyddp/{k}"], res[f"syncbn/torch/{k}"], rtol=1e-9,
                                       atol=1e-11, err_msg=k)


@pytest.mark.skipif(not isinstance(machine().get("nccl"), list), reason="pyddp found no libnccl")
def test_one_rank_on_nccl_matches_torch(tmp_path):
    (res,) = _script(tmp_path, 1, "nccl", only="ddp,no_sync,hooks,fused,amp_o1,syncbn")
    for name in ["ddp_default", "ddp_bucket_view", "ddp_buffers", "no_sync", "hook_fp16_compress_hook",
                 "fused_adam", "fused_sgd", "amp_o1"]:
        _close(res, name)


def _child_device_ids(rank, ws):
    import torch

    from pyddp.nn.parallel import DistributedDataParallel as DDP

    m = torch.nn.Linear(4, 2).cuda(0)
    ddp = DDP(m, device_ids=[0])
    out = ddp(torch.randn(3, 4))  # a CPU input moves to the module's device, as in torch
    bufs = [(b.buffer.device.type, str(b.buffer.dtype)) for b in ddp._buckets]
    out.sum().backward()
    grads_are_views = all(p.grad.is_cuda for p in m.parameters())
    errors = []
    for bad in ([1], [0, 0], ["cpu"]):
        try:
            DDP(torch.nn.Linear(4, 2).cuda(0), device_ids=bad)
        except ValueError as e:
            errors.append(str(e)[:40])
    return str(out.device), ddp.device_ids, ddp.output_device, bufs, grads_are_views, len(errors)


def test_device_ids_as_torch(tmp_path):
    from _mp import run

    got = run(_child_device_ids, 1, backend="cpu", start_method="spawn")[0]
    assert got[0] == "cuda:0" and got[1] == [0] and got[2] == 0
    assert got[3] and all(d == "cuda" for d, _ in got[3]) and got[4] and got[5] == 3


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_seed000_launch_apex_on_the_gpu(tmp_path, opt_level):
    import _launch

    env = _launch.launcher_env(OPT_LEVEL=opt_level, CKPT=str(tmp_path / "amp_checkpoint.pt"))
    p = subprocess.run([sys.executable, "-m", "pyddp.launch", "--nproc_per_node", str(machine()["devices"]),
                        "--master_port", str(free_port()), os.path.join(SEEDS, "seed000_launch_apex_gpu.py")], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-5000:]
    assert "restored: True, on the GPU: True" in p.stdout


def test_seed001_apex_parallel_on_the_gpu(tmp_path):
    import _launch

    env = _launch.launcher_env(CKPT=str(tmp_path / "ck.pt"))
    p = subprocess.run([sys.executable, "-m", "pyddp.launch", f"--nproc_per_node={machine()['devices']}",
                        "--master_port", str(free_port()), os.path.join(SEEDS, "seed001_apex_parallel_gpu.py")], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-5000:]
    assert "restored: True, pinned batches: True" in p.stdout


def test_seed002_torchrun_on_the_gpu(tmp_path):
    import _launch

    env = _launch.launcher_env(CHECKPOINT_PATH=str(tmp_path / "ck.pt"))
    p = subprocess.run([sys.executable, "-m", "pyddp.run", "--standalone",
                        f"--nproc_per_node={machine()['devices']}",
                        os.path.join(SEEDS, "seed002_torchrun_gpu.py"), "--epochs", "3"], cwd=str(tmp_path),
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-5000:]
    assert "batch norm layer TorchSyncBatchNorm" in p.stdout and "on cuda:0" in p.stdout
