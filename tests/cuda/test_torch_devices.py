"""Device and backend housekeeping as torch 2.13.0's CPU build answers on a machine without a GPU:
pyddp.accelerator, pyddp.cuda's memory statistics, pyddp.backends.cudnn,
distributed.get_default_backend_for_device and reduce_op, and the errors for CUDA tensors."""
import warnings

import numpy as np
import pytest

import pyddp
import pyddp.distributed as dist

import _paths

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(torch.cuda.is_available() or pyddp.cuda.is_available(),
                                reason="compares with torch's answers on a machine without a GPU")


def _outcome(fn):
    """(kind, value): ('ok', result) or ('raise', exception type names that match torch's)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "ok", fn()
    except Exception as e:  # noqa: BLE001
        return "raise", e


def _same(pd_fn, t_fn):
    kp, vp = _outcome(pd_fn)
    kt, vt = _outcome(t_fn)
    assert kp == kt, (vp, vt)
    if kp == "raise":
        assert isinstance(vp, type(vt)), (vp, vt)
        return vp, vt
    return vp, vt


def test_accelerator_matches_torch():
    pa, ta = pyddp.accelerator, torch.accelerator
    assert pa.is_available() is ta.is_available() is False
    assert pa.current_accelerator() is None and ta.current_accelerator() is None
    assert pa.current_accelerator(check_available=True) is None
    assert pa.device_count() == ta.device_count() == 0
    for name in ("current_device_index", "current_device_idx", "synchronize"):
        vp, vt = _same(getattr(pa, name), getattr(ta, name))
        assert str(vp) == str(vt)
    for arg in (0, 1, -1, "cpu", "cuda:0", pyddp.device("cuda", 0)):
        targ = torch.device(str(arg)) if isinstance(arg, pyddp.device) else arg
        vp, vt = _same(lambda: pa.set_device_index(arg), lambda: ta.set_device_index(targ))
        assert str(vp) == str(vt) or vp is vt is None
    with pytest.raises(TypeError, match="device"):
        pa.set_device_index(1.5)


def test_cuda_answers_as_torch_cpu_build():
    pc, tc = pyddp.cuda, torch.cuda
    assert pc.is_available() is tc.is_available() is False
    assert pc.device_count() == tc.device_count() == 0
    assert pc.is_initialized() is tc.is_initialized() is False
    for name in ("manual_seed", "manual_seed_all"):
        assert getattr(pc, name)(7) is None and getattr(tc, name)(7) is None
    for name in ("seed", "seed_all", "empty_cache"):
        assert getattr(pc, name)() is None and getattr(tc, name)() is None
    assert pc.is_bf16_supported() is tc.is_bf16_supported() is False
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_stats"):
        for args in ((), (0,), ("cuda:0",)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                got, want = getattr(pc, name)(*args), getattr(tc, name)(*args)
            assert got == want and type(got) is type(want), (name, args, got, want)
    with pytest.warns(FutureWarning, match="memory_reserved"):
        pc.memory_cached()
    # torch's CPU build fails inside its internals here (AttributeError); pyddp's do nothing, so
    # that scripts printing peak memory run
    for name in ("reset_peak_memory_stats", "reset_max_memory_allocated",
                 "reset_accumulated_memory_stats"):
        assert getattr(pc, name)() is None
        assert pc.max_memory_allocated() == 0
    for name in ("current_device", "synchronize", "init"):
        vp, vt = _same(getattr(pc, name), getattr(tc, name))
        assert "CUDA" in str(vp)
    with pytest.raises(AssertionError):
        pc.set_device(0)


def test_cudnn_switches():
    from pyddp.backends import cudnn
    import torch.backends.cudnn as tcudnn
    assert pyddp.backends.cudnn is cudnn
    for name in ("benchmark", "deterministic", "enabled", "allow_tf32", "benchmark_limit"):
        assert getattr(cudnn, name) == getattr(tcudnn, name), name
    assert cudnn.is_available() is tcudnn.is_available() is False
    assert cudnn.version() is tcudnn.version() is None
    assert cudnn.is_acceptable(pyddp.zeros(1)) is tcudnn.is_acceptable(torch.zeros(1)) is False
    saved = {n: getattr(tcudnn, n) for n in ("benchmark", "deterministic", "enabled", "allow_tf32")}
    try:
        for name in saved:
            for value in (not saved[name], saved[name]):
                setattr(cudnn, name, value)
                setattr(tcudnn, name, value)
                assert getattr(cudnn, name) is getattr(tcudnn, name) is value
            for bad in (1, "yes", None):
                vp, vt = _same(lambda: setattr(cudnn, name, bad), lambda: setattr(tcudnn, name, bad))
                assert str(vp) == str(vt)
            assert getattr(cudnn, name) is saved[name]
        with cudnn.flags(enabled=False, benchmark=True, deterministic=True, allow_tf32=False), \
                tcudnn.flags(enabled=False, benchmark=True, deterministic=True, allow_tf32=False):
            for name in saved:
                assert getattr(cudnn, name) is getattr(tcudnn, name)
            assert cudnn.enabled is False and cudnn.benchmark is True
        for name in saved:
            assert getattr(cudnn, name) is getattr(tcudnn, name) is saved[name]
    finally:
        for name, value in saved.items():
            setattr(tcudnn, name, value)
            setattr(cudnn, name, value)
    assert "benchmark" in dir(cudnn)


def test_default_backend_for_device():
    cases = ["cpu", "cuda", "cuda:1", "cpu:0", "meta", "mps", "xpu", "foo", "", 0, 3]
    for dev in cases:
        vp, vt = _same(lambda: dist.get_default_backend_for_device(dev),
                       lambda: torch.distributed.get_default_backend_for_device(dev))
        assert str(vp) == str(vt), dev
    for kind, index in (("cpu", None), ("cuda", 0), ("cuda", 2)):
        got = dist.get_default_backend_for_device(pyddp.device(kind, index))
        assert got == torch.distributed.get_default_backend_for_device(torch.device(kind, index))
    with pytest.raises(TypeError, match="device"):
        dist.get_default_backend_for_device(1.0)


def test_reduce_op_alias():
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
        with pytest.warns(DeprecationWarning, match="reduce_op"):
            assert getattr(dist.reduce_op, name) == getattr(dist.ReduceOp, name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert hasattr(torch.distributed.reduce_op, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert set(dist.reduce_op.__members__) <= set(torch.distributed.reduce_op.__members__)


@pytest.mark.parametrize("call", [
    lambda m: m.randn(2, 3, device="cuda"),
    lambda m: m.zeros(2, device="cuda:0"),
    lambda m: m.ones(2, device=m.device("cuda", 1)),
    lambda m: m.tensor([1.0], device="cuda"),
    lambda m: m.arange(3, device="cuda"),
    lambda m: m.randint(0, 5, (2,), device="cuda"),
    lambda m: m.randperm(4, device="cuda"),
    lambda m: m.zeros_like(m.zeros(2), device="cuda"),
    lambda m: m.randn_like(m.zeros(2), device="cuda"),
    lambda m: m.zeros(2).cuda(),
    lambda m: m.zeros(2).cuda(0),
    lambda m: m.zeros(2).to("cuda:0"),
    lambda m: m.zeros(2).to("cuda"),
    lambda m: m.zeros(2).to(device="cuda"),
    lambda m: m.zeros(2).to(m.device("cuda")),
    lambda m: m.zeros(2).to("cuda", m.float64),
    lambda m: m.zeros(2).to(0),
])
def test_cuda_tensors_raise_as_torch(call):
    vp, vt = _same(lambda: call(pyddp), lambda: call(torch))
    assert type(vt) in (AssertionError, RuntimeError)
    assert "CUDA" in str(vt) or "accelerator" in str(vt)
    assert "CUDA" in str(vp) or "accelerator" in str(vp)


def test_cpu_devices_accepted():
    t = pyddp.randn(2, device="cpu")
    assert t.to("cpu") is t and t.to(pyddp.device("cpu")) is t and t.to(torch.device("cpu")) is t
    assert t.to("cpu", pyddp.float64).dtype == np.float64
    assert pyddp.zeros(2, device=torch.device("cpu")).device == "cpu"
    with pytest.raises(TypeError, match="device"):
        pyddp.zeros(2, device=1.5)


_WITH_GPUS = r"""
import json, warnings
import pyddp, pyddp.accelerator as acc, pyddp.distributed as dist
out = {}
def err(f):
    try:
        return ["ok", repr(f())]
    except Exception as e:
        return [type(e).__name__, isinstance(e, AssertionError), str(e)]
out["avail"] = [acc.is_available(), repr(acc.current_accelerator()), acc.device_count(),
                repr(acc.current_accelerator(check_available=True))]
acc.set_device_index(1)
out["idx1"] = [acc.current_device_index(), pyddp.cuda.current_device()]
acc.set_device_index("cuda:0")
out["idx0"] = acc.current_device_index()
acc.set_device_index(-1)
out["neg"] = acc.current_device_index()
out["cpu"] = err(lambda: acc.set_device_index("cpu"))
out["noidx"] = err(lambda: acc.set_device_index("cuda"))
out["sync"] = err(acc.synchronize)
out["backend0"] = dist.get_default_backend_for_device(0)
out["to0"] = err(lambda: pyddp.zeros(2).to(0))
out["cuda"] = err(lambda: pyddp.zeros(2).cuda())
print(json.dumps(out))
"""


def test_accelerator_with_gpus_answers_as_torch_cuda_build():
    """With (fake) GPUs: CUDA is the accelerator, device indices go through pyddp.cuda, and pyddp's
    own tensors still refuse to move there."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler for the CUDA stand-in")
    import fakecuda
    root = _paths.ROOT
    env = dict(os.environ, PYTHONPATH=root)
    env.update(fakecuda.env(devices=2))
    r = subprocess.run([sys.executable, "-c", _WITH_GPUS], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["avail"] == [True, "device(type='cuda')", 2, "device(type='cuda')"]
    assert out["idx1"] == [1, 1] and out["idx0"] == 0 and out["neg"] == 0
    assert out["cpu"] == ["ValueError", False, "cpu doesn't match the current accelerator cuda."]
    assert out["noidx"][0] == "ValueError" and "specified index" in out["noidx"][2]
    assert out["sync"] == ["ok", "None"] and out["backend0"] == "nccl"
    for key in ("to0", "cuda"):
        assert out[key][:2] == ["CudaUnavailableError", True] and "CUDA" in out[key][2]


def test_cuda_matmul_switches():
    import pyddp.backends.cuda as pcuda
    tm, pm = torch.backends.cuda.matmul, pcuda.matmul
    assert pcuda.is_built() is torch.backends.cuda.is_built() is False
    names = ("allow_tf32", "allow_fp16_reduced_precision_reduction",
             "allow_bf16_reduced_precision_reduction")
    saved = {n: getattr(tm, n) for n in names}
    try:
        for n in names:
            assert getattr(pm, n) == getattr(tm, n), n
            for value in (not saved[n], saved[n]):
                setattr(pm, n, value)
                setattr(tm, n, value)
                assert getattr(pm, n) == getattr(tm, n) == value
            for bad in (1, "x"):
                vp, vt = _same(lambda: setattr(pm, n, bad), lambda: setattr(tm, n, bad))
                assert str(vp) == str(vt)
        vp, vt = _same(lambda: pm.nope, lambda: tm.nope)
        assert str(vp) == str(vt)
    finally:
        for n, v in saved.items():
            setattr(tm, n, v)
            setattr(pm, n, v)
