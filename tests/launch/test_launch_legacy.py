"""pyddp.launch (torch.distributed.launch) and a script written the way the seed notes write them
(argparse with --local_rank, init_process_group("gloo"), all_reduce), under both launchers."""
import pytest

from _launch import launcher_env, read_json_files, run, write_script

pytestmark = pytest.mark.timeout(120)

ARGV_SCRIPT = r"""
import json, os, sys
with open(os.path.join(os.environ["OUT"], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"argv": sys.argv[1:], "LOCAL_RANK": os.environ["LOCAL_RANK"]}, f)
"""


@pytest.mark.parametrize("style, expected", [
    ([], "--local_rank={}"),
    (["--local-rank-style", "dash"], "--local-rank={}"),
    (["--use_env"], None),
])
def test_launch_passes_the_local_rank_argument(tmp_path, style, expected):
    script = write_script(tmp_path, "argv.py", ARGV_SCRIPT)
    rc, _, err = run(["--nproc_per_node", 2] + style + [script, "--epochs", "3"], module="pyddp.launch",
                     env=launcher_env(OUT=tmp_path))
    assert rc == 0, err
    for rank, d in read_json_files(tmp_path, n=2).items():
        assert d["LOCAL_RANK"] == str(rank)
        # As torch.distributed.launch: right after the script, before the script's own arguments.
        want = ([expected.format(rank)] if expected else []) + ["--epochs", "3"]
        assert d["argv"] == want
    assert err.count("warning:") == 1 and "the modern form is `python -m pyddp.run`" in err, err


SEED_SCRIPT = r"""
# The shape of the seed notes' DDP scripts, with `torch.distributed` swapped for pyddp.
import argparse
import json
import os

import numpy as np
import pyddp.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1, help="node rank for distributed training")
parser.add_argument("-e", "--epochs", default=10, type=int)
parser.add_argument("--out", required=True)
args = parser.parse_args()

dist.init_process_group(backend="gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
grad = np.arange(8, dtype=np.float32) * (rank + 1)
dist.all_reduce(grad)
grad /= world_size
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump({"local_rank": args.local_rank, "LOCAL_RANK": int(os.environ["LOCAL_RANK"]),
               "world_size": world_size, "epochs": args.epochs, "grad": grad.tolist()}, f)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("module", ["pyddp.launch", "pyddp.run"])
def test_a_seed_style_script_runs_under_both_launchers(tmp_path, module):
    script = write_script(tmp_path, "main.py", SEED_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    rc, _, err = run(["--standalone", "--nproc_per_node=2", script, "--epochs", "2", "--out", out],
                     module=module)
    assert rc == 0, err
    for rank, d in read_json_files(out, n=2).items():
        assert d["world_size"] == 2 and d["epochs"] == 2 and d["LOCAL_RANK"] == rank
        assert d["grad"] == [i * 1.5 for i in range(8)]
        # pyddp.launch passes --local_rank; under pyddp.run the script keeps its default and
        # would read LOCAL_RANK from the environment instead.
        assert d["local_rank"] == (rank if module == "pyddp.launch" else -1)
