"""Porting proof for the API the README says behaves "the same": the scripts tests/porting/fidelity_*.py
(written in the style of torch's DDP tutorial, the pytorch/examples DDP series and apex's distributed
tests) run under mp.spawn, pyddp-run and pyddp.launch with only their imports changed, and print what
torch prints for the same script."""
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from _tiers import full

from test_porting import PORTING, _free_port, _port_import, _run

FILES = sorted(glob.glob(os.path.join(PORTING, "fidelity_*.py")))

pytestmark = pytest.mark.timeout(180)


def _torch_version_of(path, dest):
    """The torch script: the commented torch imports instead of the pyddp ones."""
    out = []
    for ln in open(path, encoding="utf-8").read().splitlines():
        if re.match(r"(import|from) pyddp", ln):
            continue
        m = re.match(r"# ((import|from) torch.*)", ln)
        out.append(m.group(1) if m else ln)
    with open(dest, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return str(dest)


def test_fidelity_files_exist():
    assert [os.path.basename(f) for f in FILES] == ["fidelity_spawn_store.py",
                                                   "fidelity_torchrun_errors.py",
                                                   "fidelity_zero_join_mha.py"]


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_only_imports_changed(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    commented = [ln[2:] for ln in lines if re.match(r"# (import|from) torch", ln)]
    assert commented
    first = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert lines[first:first + len(commented)] == [_port_import(c) for c in commented]
    for i, ln in enumerate(lines):
        if "pyddp" in ln.split("#", 1)[0]:
            assert re.match(r"(import|from) pyddp", ln), f"line {i + 1}: {ln}"


def _spawn_lines(stdout):
    # (the ranks share one pipe: a line's text and its newline may be written apart)
    return sorted(re.findall(r"rank \d: tasks .*?on all ranks: (?:True|False)", stdout))


def test_spawn_store_script_on_3_ranks(tmp_path):
    stdout, out = _run([os.path.join(PORTING, "fidelity_spawn_store.py"), "3"], tmp_path,
                       MASTER_PORT=str(_free_port()))
    lines = _spawn_lines(stdout)
    assert len(lines) == 3, out
    for rank, ln in enumerate(lines):
        assert ln == (f"rank {rank}: tasks 12 finished True keys 3 pair [2, 0] first 2 pg_count 2 "
                      "complex AVG True complex MAX False parameters identical on all ranks: True"), out


def test_spawn_store_script_prints_what_torch_prints(tmp_path):
    pytest.importorskip("torch")
    script = os.path.join(PORTING, "fidelity_spawn_store.py")
    ours, out = _run([script, "2"], tmp_path, MASTER_PORT=str(_free_port()))
    theirs, tout = _run([_torch_version_of(script, tmp_path / "torch_version.py"), "2"], tmp_path,
                        MASTER_PORT=str(_free_port()))
    assert _spawn_lines(ours) == _spawn_lines(theirs) and len(_spawn_lines(ours)) == 2, out + tout


@pytest.mark.parametrize("launcher", ["run", *full("launch")])
def test_errors_script_under_launchers(tmp_path, launcher):
    script = os.path.join(PORTING, "fidelity_torchrun_errors.py")
    if launcher == "run":
        args = ["-m", "pyddp.run", "--standalone", "--nproc-per-node", "2", script]
        env = {}
    else:
        args = ["-m", "pyddp.launch", "--nproc_per_node", "2", script]
        env = {"MASTER_PORT": str(_free_port())}
    stdout, out = _run(args, tmp_path, **env)
    lines = sorted(re.findall(r"rank \d: avg .*?loader \w+ (?:True|False)", stdout))
    assert lines == [f"rank {r}: avg True gather True errors RuntimeError,RuntimeError,ValueError,"
                     "RuntimeError store DistStoreError True loader RuntimeError True"
                     for r in (0, 1)], out


def _mha_lines(stdout):
    # (the ranks share one pipe: a line's text and its newline may be written apart)
    return sorted(re.findall(r"rank \d: device .*?DataParallel keys module\.[a-z]+\.[a-z_]+?_bias",
                             stdout))


def test_zero_join_attention_script_prints_what_torch_prints(tmp_path):
    """ZeroRedundancyOptimizer + Join with uneven inputs, MultiheadAttention with a causal mask,
    LayerNorm, Embedding, Dropout1d, default-collated DataLoader batches, clip_grad_norm_,
    parameters_to_vector, DataParallel keys and the no-GPU housekeeping, under mp.spawn on 2
    ranks: the same lines as torch's run of the same script."""
    script = os.path.join(PORTING, "fidelity_zero_join_mha.py")
    ours, out = _run([script, "2"], tmp_path, MASTER_PORT=str(_free_port()))
    lines = _mha_lines(ours)
    assert len(lines) == 2, out
    assert lines[0].startswith("rank 0: device cpu; accelerator False; backend gloo; cudnn True; "
                               "batch list Tensor int64 (2, 6); steps 2 clip norm finite True; "
                               "parameters identical on all ranks: True; zero state groups 1"), out
    assert "steps 3" in lines[1] and "module.attn.in_proj_bias" in lines[1], out
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: the comparison with torch's output is skipped")
    theirs, tout = _run([_torch_version_of(script, tmp_path / "torch_version.py"), "2"], tmp_path,
                        MASTER_PORT=str(_free_port()))
    assert lines == _mha_lines(theirs), out + tout
