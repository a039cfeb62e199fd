"""The four seed scripts with their GPU lines put back as the originals have them (set_device,
backend 'nccl', .cuda(), device("cuda", local_rank), .to(rank)): under PYDDP_CUDA_ON_CPU=1 they run
unchanged but for the imports (and the seeds' own bug fixes), with the results tests/porting/test_porting.py
expects of the ported versions.  Without the stand-in the same lines fail as on torch's CPU build."""
import os
import re
import subprocess
import sys

import pytest

import _paths


HERE = _paths.TESTS
PORTING = os.path.join(HERE, "porting")
sys.path.insert(0, HERE)
from test_porting import _env, _free_port  # noqa: E402

pytestmark = pytest.mark.timeout(240)

# seed -> {ported line (its code, stripped): the original GPU line}
ORIGINAL = {
    "seed000_launch_apex.py": {
        "# PORT: torch.cuda.set_device(f'cuda:{local_rank}') removed":
            "    torch.cuda.set_device(f'cuda:{local_rank}')",
        "dist.init_process_group(backend='gloo')": "    dist.init_process_group(backend='nccl')",
    },
    "seed001_apex_parallel.py": {
        "dist.init_process_group(backend='gloo')": "dist.init_process_group(backend='nccl')",
        "# PORT: torch.cuda.set_device(gpu) removed": "torch.cuda.set_device(gpu)",
        "images = data.to('cpu', non_blocking=True)": "      images = data.cuda(non_blocking=True)",
        "target = target.to('cpu', non_blocking=True)":
            "      target = target.cuda(non_blocking=True)",
    },
    "seed002_torchrun.py": {
        "# PORT: torch.cuda.set_device(rank % torch.cuda.device_count()) removed":
            "torch.cuda.set_device(rank % torch.cuda.device_count())",
        'dist.init_process_group(backend="gloo")': 'dist.init_process_group(backend="nccl")',
        'device = torch.device("cpu")': 'device = torch.device("cuda", local_rank)',
    },
    "seed003_spawn.py": {
        "outputs = ddp_model(torch.randn(20, 10))":
            "    outputs = ddp_model(torch.randn(20, 10).to(rank))",
        "labels = torch.randn(20, 10)": "    labels = torch.randn(20, 10).to(rank)",
    },
}


def _unport(name, tmp_path):
    lines = open(os.path.join(PORTING, name), encoding="utf-8").read().splitlines()
    done = set()
    out = []
    for ln in lines:
        code = ln.strip()
        if "  # PORT:" in ln and not code.startswith("# PORT:"):
            code = ln.split("  # PORT:")[0].strip()
        key = next((k for k in ORIGINAL[name] if code == k or code.startswith(k)), None)
        if key is not None and "PORT" in ln:
            out.append(ORIGINAL[name][key])
            done.add(key)
        else:
            out.append(ln)
    assert done == set(ORIGINAL[name]), set(ORIGINAL[name]) - done
    path = tmp_path / name
    path.write_text("\n".join(out) + "\n")
    return str(path)


def _run(args, cwd, **env):
    p = subprocess.run([sys.executable] + args, cwd=str(cwd), env=_env(**env),
                       capture_output=True, text=True, timeout=200)
    return p, p.stdout + p.stderr


@pytest.mark.parametrize("emulated", [True, False])
def test_seed003_spawn_with_to_rank(tmp_path, emulated):
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if emulated:
        env["PYDDP_CUDA_ON_CPU"] = "1"
    p, out = _run([_unport("seed003_spawn.py", tmp_path)], tmp_path, **env)
    if emulated:
        assert p.returncode == 0, out
        for rank in (0, 1):
            assert f"rank {rank}: parameters identical on all ranks: True" in p.stdout, out
    else:
        assert p.returncode != 0 and "Cannot access accelerator device" in out, out


def test_seed000_launch_apex_with_nccl_and_set_device(tmp_path):
    port = str(_free_port())   # on the command line too: the launcher's default is 29500
    p, out = _run(["-m", "pyddp.launch", "--nproc_per_node", "2", f"--master_port={port}",
                   _unport("seed000_launch_apex.py", tmp_path)], tmp_path, OPT_LEVEL="O1",
                  MASTER_PORT=port, PYDDP_CUDA_ON_CPU="1")
    assert p.returncode == 0, out
    lines = re.findall(r"rank (\d): opt_level O1 loss ([0-9.]+) -> ([0-9.]+), parameters identical "
                       r"on all ranks: (True|False), restored: (True|False)", p.stdout)
    assert sorted(r for r, *_ in lines) == ["0", "1"], out
    assert all(s == "True" and r == "True" for *_, s, r in lines), out


def test_seed001_apex_parallel_with_cuda_calls(tmp_path):
    pytest.importorskip("sklearn")
    port = str(_free_port())
    p, out = _run(["-m", "pyddp.launch", "--nproc_per_node=2", f"--master_port={port}",
                   _unport("seed001_apex_parallel.py", tmp_path)], tmp_path,
                  MASTER_PORT=port, PYDDP_CUDA_ON_CPU="1")
    assert p.returncode == 0, out
    lines = re.findall(r"rank (\d): train accuracy ([0-9.]+), parameters identical on all ranks: "
                       r"(True|False)", p.stdout)
    assert sorted(r for r, *_ in lines) == ["0", "1"], out
    assert all(float(a) > 0.9 and same == "True" for _, a, same in lines), out


def test_seed002_torchrun_with_cuda_device(tmp_path):
    pytest.importorskip("sklearn")
    p, out = _run(["-m", "pyddp.run", "--standalone", "--nproc_per_node=2",
                   _unport("seed002_torchrun.py", tmp_path), "--epochs", "2"], tmp_path,
                  PYDDP_CUDA_ON_CPU="1")
    assert p.returncode == 0, out
    accs = [float(a) for a in re.findall(r"rank \d: test accuracy ([0-9.]+)", p.stdout)]
    assert len(accs) == 2 and accs[0] == accs[1] and accs[0] > 0.8, out
