"""Porting proof: the PyTorch / apex scripts of the seed notes (tests/porting/*.py) run on pyddp with
only their imports changed.

Each file starts with the seed's torch/apex imports, commented out, followed by the pyddp imports.
``test_only_imports_changed`` checks that the pyddp imports are exactly the torch ones under the
porting page's mapping (torch.X -> pyddp.X, apex.amp -> pyddp.amp, apex.parallel -> pyddp.nn.parallel,
``import torch``/``import apex`` -> ``import pyddp as torch``/``as apex``), that pyddp appears on no
other line, and that every other changed line is marked ``# PORT: <why>`` and listed in docs/porting.md.
The other tests run each script the way the seed notes launch it (pyddp.launch for
torch.distributed.launch, pyddp.run for torchrun, mp.spawn) and check what it computed."""
import glob
import os
import re
import socket
import subprocess
import sys

import pytest

import pyddp

import _paths

ROOT = _paths.ROOT
PORTING = os.path.join(ROOT, "tests", "porting")
FILES = sorted(glob.glob(os.path.join(PORTING, "seed*.py")))

pytestmark = pytest.mark.timeout(180)

# torch/apex module -> pyddp module (the porting table, docs/porting.md)
_MODULES = [("apex.parallel", "pyddp.nn.parallel"), ("apex.optimizers", "pyddp.optimizers"),
            ("apex", "pyddp"), ("torch", "pyddp")]


def _port_module(name):
    for old, new in _MODULES:
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return name


def _port_import(line):
    """The pyddp import line for a torch/apex import line; None for torchvision (not needed)."""
    m = re.fullmatch(r"import (\S+)", line)
    if m and m.group(1) in ("torch", "apex"):
        return f"import pyddp as {m.group(1)}"
    if "torchvision" in line:
        return None
    m = re.fullmatch(r"import (\S+) as (\S+)", line)
    if m:
        return f"import {_port_module(m.group(1))} as {m.group(2)}"
    m = re.fullmatch(r"from (\S+) import (.+)", line)
    if m:
        return f"from {_port_module(m.group(1))} import {m.group(2)}"
    return line


def _env(**extra):
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra)
    return env


def _run(args, cwd, timeout=150, **env):
    proc = subprocess.run([sys.executable] + args, cwd=str(cwd), env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return proc.stdout, out


def test_porting_files_exist():
    names = [os.path.basename(f) for f in FILES]
    assert names == ["seed000_launch_apex.py", "seed001_apex_parallel.py", "seed002_torchrun.py",
                     "seed003_spawn.py"]


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_only_imports_changed(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    commented = [ln[2:] for ln in lines if re.match(r"# (import|from) ", ln)]
    assert commented, "the seed's imports come first, commented"
    first_code = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    block = []
    for ln in lines[first_code:]:
        if not re.match(r"(import|from) ", ln):
            break
        block.append(ln)
    expected = [p for p in map(_port_import, commented) if p is not None]
    assert block[:len(expected)] == expected
    # pyddp is named on import lines only: everything else is the seed's text
    for i, ln in enumerate(lines):
        code = ln.split("#", 1)[0]
        if "pyddp" in code:
            assert re.match(r"(import|from) pyddp", ln), f"line {i + 1}: {ln}"
    # every other change is marked and listed in the porting page (docs/porting.md) with its reason
    readme = open(os.path.join(ROOT, "docs", "porting.md"), encoding="utf-8").read()
    marked = [ln for ln in lines if "# PORT:" in ln and "<why>" not in ln]
    assert marked
    for ln in marked:
        code, why = (s.strip() for s in ln.split("# PORT:", 1))
        key = code if code else why.split(" removed")[0]
        assert key in readme, f"not listed in docs/porting.md's porting table: {ln.strip()}"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_seed003_mp_spawn(tmp_path):
    stdout, out = _run([os.path.join(PORTING, "seed003_spawn.py")], tmp_path,
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    for rank in (0, 1):
        assert f"rank {rank}: parameters identical on all ranks: True" in stdout, out


def test_seed002_torchrun(tmp_path):
    pytest.importorskip("sklearn")
    stdout, out = _run(["-m", "pyddp.run", "--standalone", "--nproc_per_node=2",
                        os.path.join(PORTING, "seed002_torchrun.py"), "--epochs", "3"], tmp_path)
    accs = [float(a) for a in re.findall(r"rank \d: test accuracy ([0-9.]+)", stdout)]
    assert len(accs) == 2 and accs[0] == accs[1] and accs[0] > 0.9, out
    assert len(re.findall(r"^epoch \d step \d+ loss", stdout, re.M)) == 9, out  # rank 0 logs only
    state = pyddp.load(str(tmp_path / "seed002_checkpoint.pt"))
    # DDP's state_dict: torch's "module." prefix, SyncBatchNorm's running statistics included
    assert any(k.startswith("module.") and k.endswith("running_mean") for k in state), list(state)


@pytest.mark.parametrize("opt_level", ["O0", "O1", "O2"])
def test_seed000_launch_apex(tmp_path, opt_level):
    pytest.importorskip("pyddp.amp", reason="pyddp.amp (apex-style amp) is not in this build")
    # (pyddp.launch runs workers with python -u, as torch's launcher: two ranks' lines may
    # interleave, so the patterns below do not rely on line starts)
    stdout, out = _run(["-m", "pyddp.launch", "--nproc_per_node", "2",
                        os.path.join(PORTING, "seed000_launch_apex.py")], tmp_path,
                       OPT_LEVEL=opt_level, MASTER_PORT=str(_free_port()))
    lines = re.findall(rf"rank (\d): opt_level {opt_level} loss ([0-9.]+) -> ([0-9.]+), "
                       r"parameters identical on all ranks: (True|False), restored: (True|False)", stdout)
    assert sorted(r for r, *_ in lines) == ["0", "1"], out
    for _, before, after, same, restored in lines:
        assert float(after) < float(before), out
        assert same == "True" and restored == "True", out
    assert os.path.exists(tmp_path / "amp_checkpoint.pt")


def test_seed001_apex_parallel(tmp_path):
    pytest.importorskip("pyddp.amp", reason="pyddp.amp (apex-style amp) is not in this build")
    pytest.importorskip("sklearn")
    stdout, out = _run(["-m", "pyddp.launch", "--nproc_per_node=2",
                        os.path.join(PORTING, "seed001_apex_parallel.py")], tmp_path,
                       MASTER_PORT=str(_free_port()))
    lines = re.findall(r"rank (\d): train accuracy ([0-9.]+), parameters identical on all ranks: "
                       r"(True|False)", stdout)
    assert sorted(r for r, *_ in lines) == ["0", "1"], out
    assert all(float(a) > 0.9 and same == "True" for _, a, same in lines), out
