"""PYDDP_CUDA_ON_CPU=1: a GPU script runs unchanged on a machine without a GPU (pyddp.cuda reports
one device per local rank, 'cuda' tensors live in host memory, streams and events are ordered
no-ops, "nccl" runs on the cpu backend, torch.cuda.amp works), said once at start; off by default;
refused where a real GPU is visible (the fakecuda stand-in plays one).  Every child process runs
under a timeout."""
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

import fakecuda
import pyddp

import _paths

ROOT = _paths.ROOT
SCRIPT = os.path.join(ROOT, "tests", "porting", "gpu000_cuda_on_cpu.py")
ANNOUNCE = "PYDDP_CUDA_ON_CPU=1: CUDA is emulated on the CPU"

pytestmark = pytest.mark.timeout(240)


def _env(**extra):
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "PYDDP_CUDA_ON_CPU", "PYDDP_CUDA_ON_CPU_DEVICES", "_PYDDP_CUDA_ON_CPU_SAID",
              "PYDDP_CUDART_LIBRARY", "PYDDP_NCCL_LIBRARY"):
        env.pop(k, None)
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args, cwd, timeout=180, **env):
    return subprocess.run([sys.executable] + args, cwd=str(cwd), env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def _py(code, tmp_path, ok=True, **env):
    p = _run(["-c", textwrap.dedent(code)], tmp_path, timeout=90, **env)
    if ok:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def test_gpu_style_ddp_script_runs_unchanged_on_two_ranks(tmp_path):
    p = _run([SCRIPT, str(_free_port())], tmp_path, PYDDP_CUDA_ON_CPU="1")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    # (the ranks share one pipe: their lines may interleave, so they are matched, not split)
    found = re.findall(r"rank (\d): backend (\S+) first loss (\S+) last loss (\S+) acc1 \S+ "
                       r"acc5 \S+ sum of losses (\d+\.\d{4}) weights (-?\d+\.\d{6})", p.stdout)
    keys = ("rank", "backend", "first_loss", "last_loss", "sum_of_losses", "weights")
    fields = sorted((dict(zip(keys, f)) for f in found), key=lambda f: f["rank"])
    assert [f["rank"] for f in fields] == ["0", "1"], out
    for f in fields:
        assert f["backend"] == "nccl"
        assert float(f["last_loss"]) < float(f["first_loss"])
    # DDP kept the replicas identical and the all_reduce of the "cuda" tensors agreed
    assert fields[0]["weights"] == fields[1]["weights"]
    assert fields[0]["sum_of_losses"] == fields[1]["sum_of_losses"]
    assert abs(float(fields[0]["last_loss"]) + float(fields[1]["last_loss"]) -
               float(fields[0]["sum_of_losses"])) < 2e-4
    # one line at start, once for the job (the spawned ranks stay quiet); no DDP device warning
    assert p.stderr.count(ANNOUNCE) == 1, p.stderr
    assert "device_ids and output_device are ignored" not in p.stderr


def test_off_by_default_the_cpu_build_answers_stay(tmp_path):
    p = _run([SCRIPT, str(_free_port())], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no GPU, exiting" in p.stdout
    assert ANNOUNCE not in p.stderr
    _py("""
        import pyddp as torch
        assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
        for f in (lambda: torch.zeros(1).cuda(), lambda: torch.zeros(1, device="cuda"),
                  lambda: torch.zeros(1).to("cuda:0"), lambda: torch.cuda.Stream(),
                  lambda: torch.cuda.FloatTensor(2), lambda: torch.cuda.cudart()):
            try:
                f()
            except AssertionError:   # torch's CPU build raises AssertionError
                pass
            else:
                raise SystemExit("no error")
        try:
            torch.zeros(1).to(0)
        except RuntimeError as e:
            assert "Cannot access accelerator device" in str(e)
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert not torch.cuda.amp.GradScaler().is_enabled()
        assert "CUDA is not available" in str(w[0].message)
        """, tmp_path)


def test_refused_where_a_real_gpu_is_visible(tmp_path):
    env = fakecuda.env(devices=1)
    p = _py("import pyddp", tmp_path, ok=False, PYDDP_CUDA_ON_CPU="1", **env)
    assert p.returncode != 0
    assert "PYDDP_CUDA_ON_CPU=1 is refused" in p.stderr and "1 real GPU" in p.stderr, p.stderr
    # without the variable the (fake) GPU is used as usual
    p = _py("import pyddp; assert pyddp.cuda.device_count() == 1; print('ok')", tmp_path, **env)
    assert "ok" in p.stdout


def test_bad_values_are_named(tmp_path):
    p = _py("import pyddp", tmp_path, ok=False, PYDDP_CUDA_ON_CPU="please")
    assert "PYDDP_CUDA_ON_CPU must be 0 or 1" in p.stderr and "'please'" in p.stderr
    p = _py("import pyddp; pyddp.cuda.device_count()", tmp_path, ok=False, PYDDP_CUDA_ON_CPU="1",
            PYDDP_CUDA_ON_CPU_DEVICES="0")
    assert "PYDDP_CUDA_ON_CPU_DEVICES='0'" in p.stderr
    p = _py("import pyddp; assert not pyddp.cuda.is_available()", tmp_path, PYDDP_CUDA_ON_CPU="0")


def test_device_count_one_per_local_rank(tmp_path):
    code = "import pyddp; print(pyddp.cuda.device_count(), pyddp.accelerator.device_count())"
    assert _py(code, tmp_path, PYDDP_CUDA_ON_CPU="1").stdout.split() == ["2", "2"]
    assert _py(code, tmp_path, PYDDP_CUDA_ON_CPU="1",
               PYDDP_CUDA_ON_CPU_DEVICES="4").stdout.split() == ["4", "4"]
    assert _py(code, tmp_path, PYDDP_CUDA_ON_CPU="1", LOCAL_WORLD_SIZE="3",
               PYDDP_CUDA_ON_CPU_DEVICES="4").stdout.split() == ["3", "3"]


def test_tensors_streams_events_amp(tmp_path):
    p = _py("""
        import numpy as np
        import pyddp as torch
        import pyddp.nn as nn
        assert torch.cuda.is_available() and torch.cuda.is_emulated()
        assert torch.cuda.current_device() == 0
        torch.cuda.set_device("cuda:1")
        assert torch.cuda.current_device() == 1
        x = torch.arange(6.0).reshape(2, 3)
        y = x.cuda()
        assert y.device == torch.device("cuda", 1) and y.is_cuda and y.get_device() == 1
        assert not x.is_cuda and x.device == "cpu"
        # .cuda() / .cpu() copy, as torch's between devices; same device: the tensor itself
        y[0, 0] = 7
        assert x[0, 0].item() == 0
        assert y.cuda() is y and y.to("cuda:1") is y and x.cpu() is x
        z = y.cpu()
        assert z.device == "cpu" and not z.is_cuda and z[0, 0].item() == 7
        # results stay on the device; int devices, factories, _like
        assert (y * 2).device == y.device and (y > 1).device == y.device
        assert y.sum().device == y.device and y[0].device == y.device
        assert x.to(0).device == "cuda:0"
        assert torch.zeros(2, device="cuda").device == "cuda:1"
        assert torch.ones_like(y).device == y.device
        assert y.new_zeros(2).device == y.device and y.new_tensor([1.0]).device == y.device
        assert x.new_ones(2).device == "cpu"
        assert torch.tensor([1, 2], device="cuda:0").device == "cuda:0"
        try:
            torch.zeros(1, device="cuda:2")
        except RuntimeError as e:
            assert "invalid device ordinal" in str(e)
        else:
            raise SystemExit("no error for cuda:2")
        try:
            torch.cuda.set_device(5)
        except RuntimeError as e:
            assert "invalid device ordinal" in str(e)
        # modules: .cuda() / .to(rank) place their parameters
        m = nn.Linear(3, 2).cuda(0)
        assert all(p.device == "cuda:0" for p in m.parameters())
        assert m(y).device == "cuda:0" or m(y).device == "cuda:1"
        m.cpu()
        assert all(p.device == "cpu" for p in m.parameters())
        # gradients flow through .cuda() / .cpu()
        w = torch.ones(3, requires_grad=True)
        (w.cuda() * 2).cpu().sum().backward()
        assert w.grad.tolist() == [2.0, 2.0, 2.0]
        # streams and events: ordered no-ops
        s = torch.cuda.Stream()
        assert s.query() and s.device == "cuda:1"
        with torch.cuda.stream(s):
            assert torch.cuda.current_stream() is s
            y.record_stream(s)
        assert torch.cuda.current_stream() is torch.cuda.default_stream()
        torch.cuda.current_stream().wait_stream(s)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); e1.record(); e1.synchronize()
        assert e0.elapsed_time(e1) >= 0 and e0.query()
        s.record_event().wait()
        torch.cuda.synchronize(); torch.cuda.synchronize(0)
        assert torch.cuda.cudart().cudaProfilerStart() == 0
        torch.cuda.nvtx.range_push("step"); torch.cuda.nvtx.range_pop()
        with torch.cuda.nvtx.range("forward"):
            pass
        ft = torch.cuda.FloatTensor([1.0, 2.0])
        assert ft.is_cuda and ft.dtype == torch.float32 and isinstance(ft, torch.cuda.FloatTensor)
        assert torch.cuda.LongTensor(3).dtype == torch.int64
        assert "no GPU" in torch.cuda.get_device_name(0)
        assert torch.cuda.get_device_capability() == (0, 0)
        # torch.cuda.amp
        m = nn.Linear(3, 2).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.cuda.amp.GradScaler()
        assert scaler.is_enabled()
        with torch.cuda.amp.autocast():
            out = m(y)
            assert out.dtype == torch.float16
        loss = nn.functional.cross_entropy(out.float(), torch.tensor([0, 1]).cuda())
        assert loss.device == "cuda:1"   # autograd Functions (the losses) keep the device
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        class Square(torch.autograd.Function):
            @staticmethod
            @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
            def forward(ctx, a):
                ctx.save_for_backward(a)
                assert a.dtype == torch.float32 and not torch.is_autocast_enabled()
                return a * a

            @staticmethod
            @torch.cuda.amp.custom_bwd
            def backward(ctx, g):
                (a,) = ctx.saved_tensors
                return 2 * a * g
        h = torch.ones(2, dtype=torch.float16, requires_grad=True)
        with torch.cuda.amp.autocast():
            Square.apply(h).sum().backward()
        assert h.grad.tolist() == [2.0, 2.0]
        assert torch.accelerator.current_accelerator() == torch.device("cuda")
        print("ok")
        """, tmp_path, PYDDP_CUDA_ON_CPU="1")
    assert p.stdout.strip().endswith("ok"), p.stdout + p.stderr


def test_nccl_through_a_variable_runs_on_cpu_backend(tmp_path):
    port = _free_port()
    p = _py(f"""
        import pyddp as torch
        import pyddp.distributed as dist
        backend = "cpu:gloo,cuda:nccl"
        assert dist.is_nccl_available()
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
        assert dist.get_backend() == "cpu:gloo,cuda:nccl"
        t = torch.ones(3, device="cuda")
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0] and t.is_cuda
        dist.destroy_process_group()
        dist.init_process_group("NCCL", init_method="tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, device_id=torch.device("cuda", 0))
        assert dist.get_backend() == "nccl"
        dist.barrier()
        dist.destroy_process_group()
        print("ok")
        """, tmp_path, PYDDP_CUDA_ON_CPU="1")
    assert "ok" in p.stdout


_LAUNCHED = """
import os
import pyddp as torch
import pyddp.distributed as dist
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group(backend="nccl")
t = torch.ones(2).cuda() * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} devices {torch.cuda.device_count()} sum {t.tolist()} "
      f"on {t.device}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("launcher", [["-m", "pyddp.run", "--standalone"],
                                      ["-m", "pyddp.launch", "--use-env"]])
def test_launcher_flag(tmp_path, launcher):
    script = tmp_path / "train.py"
    script.write_text(_LAUNCHED)
    extra = [] if "--standalone" in launcher else [f"--master_port={_free_port()}"]
    p = _run(launcher + ["--cuda-on-cpu", "--nproc_per_node=3"] + extra + [str(script)], tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(3):
        assert re.search(rf"rank {r} devices 3 sum \[6\.0, 6\.0\] on cuda:{r}", p.stdout), out
    assert p.stderr.count(ANNOUNCE) == 1, p.stderr
    # refused where a GPU is visible, by the launcher, before any worker starts
    p = _run(launcher + ["--cuda-on-cpu", "--nproc_per_node=2"] + extra + [str(script)], tmp_path,
             **fakecuda.env(devices=1))
    assert p.returncode != 0 and "refused" in p.stderr and "rank 0" not in p.stdout, p.stderr


def test_generator_of_an_emulated_cuda_device(tmp_path):
    """torch.Generator(device="cuda:N") as on a GPU: its own seed and state, the device it names
    (the current one for "cuda"), used by randn/rand(generator=...) on that device; torch's error
    for a generator of another device type; pickles with its device."""
    p = _py("""
        import pickle
        import numpy as np
        import pyddp as torch
        g = torch.Generator(device="cuda:1")
        assert g.device == torch.device("cuda", 1) and g.device.type == "cuda"
        assert g.initial_seed() == 67280421310721          # torch's default seed
        torch.cuda.set_device(1)
        assert torch.Generator(device="cuda").device == torch.device("cuda", 1)
        assert torch.Generator().device == torch.device("cpu")
        assert g.manual_seed(7) is g and g.initial_seed() == 7
        a = torch.randn(5, device="cuda:1", generator=g)
        assert a.device == torch.device("cuda", 1)
        g.manual_seed(7)
        b = torch.randn(5, device="cuda:1", generator=g)
        assert np.array_equal(a.cpu().numpy(), b.cpu().numpy())
        # its own state: the default generator and another CUDA generator are untouched
        torch.manual_seed(7)
        h = torch.Generator(device="cuda:0").manual_seed(8)
        c = torch.rand(3, device="cuda:0", generator=h)
        g.manual_seed(7)
        d = torch.rand(3, device="cuda:1", generator=g)
        assert not np.array_equal(c.cpu().numpy(), d.cpu().numpy())
        st = g.get_state()
        e1 = torch.randn(4, device="cuda:1", generator=g)
        g.set_state(st)
        e2 = torch.randn(4, device="cuda:1", generator=g)
        assert np.array_equal(e1.cpu().numpy(), e2.cpu().numpy())
        g2 = pickle.loads(pickle.dumps(g))
        assert g2.device == torch.device("cuda", 1)
        for call, want, found in (
                (lambda: torch.randn(2, generator=g), "cpu", "cuda"),
                (lambda: torch.rand(2, device="cuda", generator=torch.Generator()), "cuda", "cpu")):
            try:
                call()
            except RuntimeError as e:   # torch's words
                assert str(e) == (f"Expected a '{want}' device type for generator but found "
                                  f"'{found}'"), e
            else:
                raise AssertionError("no error")
        try:
            torch.Generator(device="cuda:5")
        except RuntimeError as e:
            assert "invalid device ordinal" in str(e)
        else:
            raise AssertionError("no error")
        print("ok")
    """, tmp_path, PYDDP_CUDA_ON_CPU="1")
    assert "ok" in p.stdout
    # without the emulation a CUDA generator is refused, naming the variable
    p = _py("""
        import pyddp
        try:
            pyddp.Generator(device="cuda:0")
        except RuntimeError as e:
            assert "PYDDP_CUDA_ON_CPU=1" in str(e), e
            print("refused")
    """, tmp_path)
    assert "refused" in p.stdout


def test_join_with_a_cuda_join_device(tmp_path):
    """torch's generic_join tutorial: a Joinable whose join_device is cuda:<rank> (a pyddp.device,
    backend "nccl") under pyddp's Join; it printed torch's own output (10/11 inputs before
    joining, 11 across all ranks) where it used to fail in torch.full with a pyddp.device."""
    script = os.path.join(ROOT, "tests", "porting", "gpu001_join_counter.py")
    p = _run([script], tmp_path, timeout=120, PYDDP_CUDA_ON_CPU="1", MASTER_PORT=str(_free_port()))
    assert p.returncode == 0, p.stdout + p.stderr
    # the two ranks' prints may interleave within a line
    lines = sorted(re.findall(r"\d+ inputs processed [a-z ]+(?:\d+ joined|all ranks)!", p.stdout))
    assert lines == sorted([
        "10 inputs processed before rank 0 joined!", "11 inputs processed across all ranks!",
        "11 inputs processed before rank 1 joined!", "11 inputs processed across all ranks!"]), \
        p.stdout + p.stderr
    assert "Traceback" not in p.stderr


def test_join_flag_devices():
    """The join context's flag for each kind of join_device: host memory for the CPU (a string,
    pyddp's and torch's device), a torch tensor built from a non-torch device's string for a GPU."""
    from pyddp.distributed.algorithms import join
    for dev in (None, "cpu", pyddp.device("cpu")):
        f = join._flag(1, dev)
        assert f.dtype.name == "float32" and f.tolist() == [1.0]
    torch = pytest.importorskip("torch")
    assert join._flag(0, torch.device("cpu")).tolist() == [0.0]
    seen = []
    real_full = torch.full
    try:
        torch.full = lambda *a, **k: seen.append(k["device"]) or real_full(
            *a, **dict(k, device="cpu"))
        join._flag(1, pyddp.device("cuda", 1))
        join._flag(1, "cuda:1")
        join._flag(1, 1)
    finally:
        torch.full = real_full
    assert seen[:2] == [torch.device("cuda", 1)] * 2
    assert all(isinstance(d, torch.device) for d in seen[:2])
    assert seen[2] == 1
