"""The torch-model path on CPU tensors: pyddp's DistributedDataParallel, apex amp, fused optimizers and
SyncBatchNorm driving torch models, against torch's own DDP (gloo), torch.autocast + GradScaler and
torch.optim, through the code that runs on CUDA tensors on a GPU (tests/gpu/test_gpu_torch_path.py runs the
same script there).

tests/_torch_path_script.py runs as two real rank processes (``pyddp.run``, a deadline on the run); each
writes pyddp's and torch's results. Where torch is deterministic the results must be bit-equal: DDP with
two ranks (pyddp's AVG allreduce and torch's pre-division by 2 are both exact halvings), the comm hooks,
no_sync, join, amp O1 (the same float16 casts and torch's fused unscale kernel), the fused optimizers
(torch's own kernels). SyncBatchNorm is compared with batch norm over the whole batch in one process
(float64, rtol 1e-10: the sums run in another order). torch's bf16 hook needs NCCL, so pyddp's is compared
with float32 averaging at bfloat16's precision.
"""
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
# ranks are forked from this process for the in-process tests (tests/_mp.py): no OpenMP pool here
torch.set_num_threads(1)

import _paths
from _mp import free_port, run  # noqa: E402

HERE = _paths.TESTS


def run_script(tmp, device="cpu", backend="cpu", timeout=240, only=""):
    import _launch

    args = ["--standalone", "--nproc-per-node", "2", os.path.join(HERE, "_torch_path_script.py"),
            "--device", device, "--backend", backend, "--tport", str(free_port()), "--out", str(tmp)]
    if only:
        args += ["--only", only]
    rc, out, err = _launch.run(args, timeout=timeout)
    assert rc == 0, err[-4000:]
    return [dict(np.load(os.path.join(tmp, f"rank{r}.npz"))) for r in range(2)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_script(tmp_path_factory.mktemp("torch_path"))


def pairs(res, name):
    keys = sorted(k for k in res if k.startswith(name + "/pyddp/") and not k.endswith("/optimizer"))
    assert keys, name
    return [(k, res[k], res[k.replace("/pyddp/", "/torch/")]) for k in keys]


def assert_equal(res, name):
    for k, a, b in pairs(res, name):
        assert a.dtype == b.dtype and a.shape == b.shape, k
        np.testing.assert_array_equal(a, b, err_msg=k)


DDP_CASES = ["ddp_default", "ddp_small_buckets", "ddp_bucket_view", "ddp_static_graph", "ddp_buffers",
             "ddp_no_broadcast", "ddp_unused", "ddp_float32", "apex_predivide_delay",
             "apex_message_size_retain", "apex_fp32_allreduce", "reducer", "no_sync", "join",
             "hook_allreduce_hook", "hook_fp16_compress_hook"]


@pytest.mark.parametrize("name", DDP_CASES)
def test_ddp_on_torch_models_is_bit_equal_to_torch_ddp_on_gloo(results, name):
    for res in results:
        assert_equal(res, name)


def test_ranks_end_with_the_same_parameters(results):
    for name in DDP_CASES + ["amp_o1", "fused_adam", "fused_sgd"]:
        for k, a, _ in pairs(results[0], name):
            if "/b" in k:
                continue  # running statistics: each rank's last forward updates its own
            np.testing.assert_array_equal(a, results[1][k], err_msg=k)


def test_bf16_compress_hook_averages_at_bfloat16_precision(results):
    for res in results:
        got = [res[k] for k in sorted(res) if k.startswith("hook_bf16_compress_hook/pyddp/p")]
        want = [res[k] for k in sorted(res) if k.startswith("hook_allreduce_hook/torch/p")]
        assert len(got) == len(want) == 6
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-3)
            assert not np.array_equal(g, w)  # the gradients did travel as bfloat16


@pytest.mark.parametrize("name", ["fused_adam", "fused_adam_l2", "fused_sgd"])
def test_fused_optimizers_on_torch_params_are_torch_fused_kernels(results, name):
    res = results[0]
    assert str(res[f"{name}/pyddp/optimizer"]) in ("FusedAdam", "FusedSGD")
    assert_equal(res, name)


def test_amp_o1_with_ddp_equals_torch_autocast_and_grad_scaler(results):
    for res in results:
        assert_equal(res, "amp_o1")
        # rank 1's inf at step 2: both ranks skipped it and halved the scale
        np.testing.assert_array_equal(res["amp_o1/pyddp/x0"], [2.0 ** 16, 2.0 ** 16, 2.0 ** 15, 2.0 ** 15])
        np.testing.assert_array_equal(res["amp_o1/state"], [2.0 ** 15, 1])


def test_sync_batchnorm_apex_extras_equal_batch_norm_over_the_whole_batch(results):
    for res in results:
        for k in ("out", "gx", "rv"):
            np.testing.assert_allclose(res[f"syncbn_apex/pyddp/{k}"], res[f"syncbn_apex/torch/{k}"],
                                       rtol=1e-10, atol=1e-12, err_msg=k)


def test_sync_batchnorm_equals_batch_norm_over_the_whole_batch(results):
    for res in results:
        assert str(res["syncbn/type"]) == "TorchSyncBatchNorm"
        for k in ("out", "gx", "gw", "rm", "rv"):
            np.testing.assert_allclose(res[f"syncbn/pyddp/{k}"], res[f"syncbn/torch/{k}"], rtol=1e-10,
                                       atol=1e-12, err_msg=k)


# ------------------------------------------------------------------------------ in one process

def _device_ids_child(rank, ws):
    from pyddp.nn.parallel import DistributedDataParallel as DDP

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ddp = DDP(torch.nn.Linear(3, 2), device_ids=[0])
    warned = any("device_ids and output_device are ignored" in str(x.message) for x in w)
    ddp(torch.randn(4, 3)).sum().backward()
    # the buckets are torch tensors in the parameters' dtype, the gradients views of them
    tensors = all(isinstance(b.buffer, torch.Tensor) and b.buffer.dtype == torch.float32
                  for b in ddp._buckets)
    lo_hi = [(b.buffer.data_ptr(), b.buffer.data_ptr() + b.buffer.nbytes) for b in ddp._buckets]
    views = all(any(lo <= p.grad.data_ptr() < hi for lo, hi in lo_hi) for p in ddp.parameters())
    return warned, ddp.device_ids, ddp.device_type, ddp.join_device, tensors, views


def test_cpu_module_device_ids_warn_and_are_ignored():
    for got in run(_device_ids_child, 2):
        assert got == (True, None, "cpu", "cpu", True, True)


def test_fused_optimizer_names_dispatch_on_the_parameters():
    import pyddp.nn as pnn
    from pyddp.optimizers import FusedAdam, FusedSGD

    m = torch.nn.Linear(3, 2)
    a = FusedAdam(p for p in m.parameters())  # a generator is read once
    assert isinstance(a, FusedAdam) and isinstance(a, torch.optim.Adam)
    assert a.defaults["fused"] and a.defaults["decoupled_weight_decay"]
    assert isinstance(FusedSGD(m.parameters(), lr=0.1), torch.optim.SGD)
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam(m.parameters(), amsgrad=True)
    with pytest.raises(TypeError, match="lr is required"):
        FusedSGD(m.parameters())
    # what torch's kernels lack stays on pyddp's host kernels for CPU tensors
    half = torch.nn.Linear(3, 2).half()
    o = FusedAdam(half.parameters(), master_weights=True)
    assert not isinstance(o, torch.optim.Optimizer)
    assert type(FusedAdam(pnn.Linear(3, 2).parameters())).__module__ == "pyddp.optim.fused_adam"


def test_convert_sync_batchnorm_on_torch_models():
    from pyddp.nn import SyncBatchNorm
    from pyddp.nn.parallel import convert_syncbn_model

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    shared = SyncBatchNorm.convert_sync_batchnorm(m)
    assert shared[1].weight is m[1].weight  # torch's: the same Parameter objects
    copied = convert_syncbn_model(torch.nn.Sequential(torch.nn.BatchNorm1d(5)), channel_last=True)
    assert type(copied[0]).__name__ == "TorchSyncBatchNorm" and copied[0].channel_last
    assert isinstance(copied[0], torch.nn.SyncBatchNorm)
    # no process group: plain batch norm, as torch's SyncBatchNorm
    x = torch.randn(4, 3, 6, 6)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(shared(x), ref(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="z must have the shape"):
        copied[0](torch.randn(4, 5), z=torch.randn(3, 5))


def test_data_parallel_on_a_torch_model_is_torchs():
    from pyddp.nn.parallel import DataParallel

    dp = DataParallel(torch.nn.Linear(3, 2))
    assert isinstance(dp, torch.nn.DataParallel)
    assert list(dp.state_dict()) == ["module.weight", "module.bias"]


def test_loader_pin_memory_without_cuda_leaves_tensors_as_torch_does():
    from pyddp.utils.data import DataLoader

    ds = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.arange(8))
    x, y = next(iter(DataLoader(ds, batch_size=4, pin_memory=True)))
    assert isinstance(x, torch.Tensor) and x.shape == (4, 3)
    assert not x.is_pinned()  # no CUDA here: nothing pinned (torch's loader warns and does the same)
    assert x.to("cpu", non_blocking=True).equal(x)


SEEDS_GPU = os.path.join(HERE, "gpu", "seeds")


@pytest.mark.parametrize("name", sorted(os.listdir(SEEDS_GPU)) if os.path.isdir(SEEDS_GPU) else [])
def test_gpu_seed_scripts_change_only_imports_and_keep_their_gpu_lines(name):
    # tests/gpu runs them on a GPU; here: they compile, pyddp appears only in import lines or lines that
    # say why they changed ("# PORT:"), and the seed's GPU lines are there
    path = os.path.join(SEEDS_GPU, name)
    text = open(path, encoding="utf-8").read()
    compile(text, path, "exec")
    for line in text.splitlines():
        code = line.split("#", 1)[0]
        if "pyddp" in code:
            assert code.lstrip().startswith(("import pyddp", "from pyddp")) or "# PORT:" in line, line
        if "nn.SyncBatchNorm" in code:
            assert "# PORT:" in line, line
    assert "backend='nccl'" in text or 'backend="nccl"' in text
    assert ".cuda(" in text or 'torch.device("cuda"' in text
    assert "device_ids=[" in text


def test_ddp_gpu_benchmark_without_a_gpu_exits_0_saying_why():
    import subprocess
    import sys

    import _launch

    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "benchmarks", "ddp_gpu.py")],
                       capture_output=True, text=True, timeout=120, env=_launch.launcher_env())
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/gpu/verify.sh runs the benchmark")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "skipped:" in p.stdout and "CUDA" in p.stdout


def test_ddp_gpu_benchmark_steps_run_on_the_cpu():
    # the benchmark's code (amp.initialize over two models, pyddp DDP, torch DDP + autocast + GradScaler)
    # on the CPU: the GPU machine should not be the first to run it
    import subprocess
    import sys

    import _launch

    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "benchmarks", "ddp_gpu.py"),
                        "--cpu-smoke", "--models", "cnn", "--rounds", "1", "--steps", "1", "--warmup", "1"],
                       capture_output=True, text=True, timeout=240, env=_launch.launcher_env())
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| cnn (3 conv, 32x32, batch 64) |" in p.stdout and "not a measurement" in p.stdout


def test_ddp_gpu_benchmark_breakdown_and_operator_counts_run_on_the_cpu():
    # --breakdown (the mixed configurations) and --kernels (torch.profiler counts) on the CPU
    import subprocess
    import sys

    import _launch

    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "benchmarks", "ddp_gpu.py"),
                        "--cpu-smoke", "--models", "cnn", "--rounds", "1", "--steps", "1", "--warmup", "1",
                        "--breakdown", "--kernels", "1"],
                       capture_output=True, text=True, timeout=400, env=_launch.launcher_env())
    assert p.returncode == 0, p.stderr[-3000:]
    for name in ("pyddp DDP + torch.amp", "torch DDP + amp O1", "no DDP + amp O1", "no DDP + torch.amp",
                 "pyddp DDP + amp O1, casts off in backward"):
        assert f"| cnn (3 conv, 32x32, batch 64) | {name} |" in p.stdout, p.stdout[-3000:]
    counts = [line for line in p.stdout.splitlines() if line.startswith("# profiler: cnn")]
    assert len(counts) == 7 and all(" aten operators, " in line for line in counts), counts


@pytest.mark.parametrize("fused", [True, False])
def test_pyddp_grad_scaler_on_torch_params_equals_torchs(fused):
    # pyddp.amp.GradScaler on torch gradients: torch's fused unscale-and-check, a flag per device; with a
    # fused optimizer (pyddp's FusedAdam on torch params is torch's fused Adam) it hands over grad_scale and
    # found_inf; an inf step is skipped and the scale halves, as torch's GradScaler does
    from pyddp.amp import GradScaler
    from pyddp.optimizers import FusedAdam

    torch.manual_seed(0)
    m1, m2 = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    m2.load_state_dict(m1.state_dict())
    if fused:
        o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2, weight_decay=0.01, fused=True)
        o2 = FusedAdam(m2.parameters(), lr=1e-2, weight_decay=0.01)
    else:
        o1 = torch.optim.SGD(m1.parameters(), lr=1e-2, momentum=0.9)
        o2 = torch.optim.SGD(m2.parameters(), lr=1e-2, momentum=0.9)
    s1, s2 = torch.amp.GradScaler("cpu", init_scale=1024.0), GradScaler("cpu", init_scale=1024.0)
    for i in range(4):
        x = torch.randn(5, 6)
        if i == 2:
            x[0, 0] = float("inf")
        for m, o, s in ((m1, o1, s1), (m2, o2, s2)):
            o.zero_grad()
            s.scale(m(x).pow(2).mean()).backward()
            s.step(o)
            s.update()
        assert s1.get_scale() == s2.get_scale()
    assert s2.get_scale() == 512.0
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)


def test_grad_scaler_device_is_checked():
    from pyddp.amp import GradScaler

    GradScaler("cuda")  # accepted without a GPU, as torch's (the scale lives on the host)
    GradScaler(torch.device("cpu"))
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        GradScaler("tpu")


def _lamb_reference(params, grads_per_step, lr, betas, eps, wd, adam_w_mode, max_grad_norm,
                    grad_averaging=True):
    """apex's multi_tensor_lamb, written out in float64 NumPy (stage 1: clipped gradient, moments,
    update; stage 2: trust ratio lr * ||p|| / ||update||)."""
    ps = [np.asarray(p, np.float64).copy() for p in params]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    b1, b2 = betas
    b3 = 1 - b1 if grad_averaging else 1.0
    for step, grads in enumerate(grads_per_step, 1):
        gn = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
        clip = gn / max_grad_norm if gn > max_grad_norm else 1.0
        for i, g in enumerate(grads):
            sg = g.astype(np.float64) / clip
            if not adam_w_mode:
                sg = sg + wd * ps[i]
            m[i] = b1 * m[i] + b3 * sg
            v[i] = b2 * v[i] + (1 - b2) * sg * sg
            upd = (m[i] / (1 - b1 ** step)) / (np.sqrt(v[i] / (1 - b2 ** step)) + eps)
            if adam_w_mode:
                upd = upd + wd * ps[i]
            pn, un = np.linalg.norm(ps[i]), np.linalg.norm(upd)
            ratio = lr * pn / un if (pn != 0 and un != 0) else lr
            ps[i] = ps[i] - ratio * upd
    return ps


@pytest.mark.parametrize("adam_w_mode", [True, False])
@pytest.mark.parametrize("max_grad_norm", [1.0, 100.0])
def test_fused_lamb_on_torch_params_follows_apex_arithmetic(adam_w_mode, max_grad_norm):
    from pyddp.optimizers import FusedLAMB

    g = torch.Generator().manual_seed(3)
    params = [torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(4, generator=g,
                                                                               dtype=torch.float64)]
    steps = [[torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params] for _ in range(4)]
    want = _lamb_reference([p.numpy() for p in params], [[s.numpy() for s in st] for st in steps],
                           lr=0.01, betas=(0.9, 0.999), eps=1e-6, wd=0.01, adam_w_mode=adam_w_mode,
                           max_grad_norm=max_grad_norm)
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = FusedLAMB(ps, lr=0.01, adam_w_mode=adam_w_mode, max_grad_norm=max_grad_norm)
    assert isinstance(opt, FusedLAMB) and isinstance(opt, torch.optim.Optimizer)
    for st in steps:
        for p, s in zip(ps, st):
            p.grad = s.clone()
        opt.step()
    for p, w in zip(ps, want):
        # float64 parameters keep float64 moments and arithmetic
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-12, atol=1e-14)
    assert opt.param_groups[0]["step"] == 4
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedLAMB(ps, amsgrad=True)
    import pyddp.nn as pnn
    with pytest.raises(TypeError, match="torch tensors"):
        FusedLAMB(pnn.Linear(2, 2).parameters())


# The GPU seed scripts' GPU lines mapped mechanically onto the CPU (a test-only rewrite; tests/gpu runs the
# scripts as they are): what they do besides the device runs in CI, two ranks.
_CPU_REWRITE = [
    (r"torch\.cuda\.set_device\(.*\)", "pass"),
    (r"\.cuda\(non_blocking=True\)", ".to('cpu', non_blocking=True)"),
    (r"\.cuda\(\)", ".cpu()"),
    (r"backend=(['\"])nccl\1", r"backend=\1gloo\1"),
    (r'torch\.device\("cuda", local_rank\)', 'torch.device("cpu")'),
    (r"p\.is_cuda", "True"),
    (r"torch\.cuda\.device_count\(\)", "1"),
]
_SEED_RUNS = {
    "seed000_launch_apex_gpu.py": (["pyddp.launch", "--nproc_per_node", "2"], [],
                                   "parameters identical on all ranks: True, restored: True"),
    "seed001_apex_parallel_gpu.py": (["pyddp.launch", "--nproc_per_node=2"], [],
                                     "parameters identical on all ranks: True, restored: True"),
    "seed002_torchrun_gpu.py": (["pyddp.run", "--standalone", "--nproc_per_node=2"], ["--epochs", "2"],
                                "batch norm layer TorchSyncBatchNorm, checkpoint reloaded"),
}


@pytest.mark.parametrize("name", sorted(_SEED_RUNS))
def test_gpu_seed_scripts_run_to_the_end_with_their_gpu_lines_mapped_to_the_cpu(tmp_path, name):
    import re
    import subprocess
    import sys

    import _launch

    text = open(os.path.join(SEEDS_GPU, name), encoding="utf-8").read()
    for pat, rep in _CPU_REWRITE:
        text = re.sub(pat, rep, text)
    assert "cuda" not in "".join(line.split("#", 1)[0] for line in text.splitlines()), name
    script = tmp_path / name
    script.write_text(text, encoding="utf-8")
    launcher, extra, expect = _SEED_RUNS[name]
    if launcher[0] == "pyddp.launch":  # its default port is fixed: another test may hold it
        launcher = launcher + ["--master_port", str(free_port())]
    env = _launch.launcher_env(CKPT=str(tmp_path / "ck.pt"), CHECKPOINT_PATH=str(tmp_path / "ck2.pt"))
    p = subprocess.run([sys.executable, "-m", *launcher, str(script), *extra], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.count(expect) == 2, p.stdout[-2000:]


def test_fused_optimizers_read_param_group_generators_once():
    # seed 000 passes [{'params': enc1.parameters()}, {'params': enc2.parameters()}]: generators
    from pyddp.optimizers import FusedAdam, FusedLAMB, FusedSGD

    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)
    for make in (lambda g: FusedAdam(g, lr=1e-3), lambda g: FusedSGD(g, lr=0.1),
                 lambda g: FusedLAMB(g, lr=1e-3)):
        opt = make([{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.5}])
        assert [len(g["params"]) for g in opt.param_groups] == [2, 2]
        assert opt.param_groups[1]["lr"] == 0.5
