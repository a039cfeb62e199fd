"""The seed notes' amp checkpoint recipe: train, save {'model', 'optimizer', 'amp'}, restore in
a new process (amp.initialize first, then load the three) and continue: the continued run must
equal an uninterrupted one exactly (parameters, O2 masters, loss scale)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import _paths
from _tiers import FULL

HERE = _paths.TESTS
ROOT = os.path.dirname(HERE)


def _run(args, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(HERE, "_amp_ckpt_script.py"), *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


# quick tier: O2 with FusedAdam (master weights, fp16 model); --full every level and optimizer
@pytest.mark.parametrize("level,opt_name", [pytest.param(*c, marks=() if c == ("O2", "fused_adam") else FULL)
                                            for c in [("O0", "sgd"), ("O1", "sgd"), ("O2", "sgd"),
                                                      ("O2", "fused_adam"), ("O1", "fused_adam")]])
def test_amp_checkpoint_resume_exact(level, opt_name, tmp_path):
    ckpt, out = str(tmp_path / "amp_checkpoint.pt"), str(tmp_path / "run")
    _run([level, opt_name, "first", ckpt, out], tmp_path)
    _run([level, opt_name, "resume", ckpt, out], tmp_path)
    full = np.load(out + ".full.npz")
    resumed = np.load(out + ".resumed.npz")
    assert sorted(full.files) == sorted(resumed.files)
    for k in full.files:
        assert full[k].dtype == resumed[k].dtype, k
        np.testing.assert_array_equal(full[k], resumed[k], err_msg=k)
    if level != "O0":
        assert float(full["loss_scale"]) == 2.0 ** 14  # two overflows, one on each side
    if level == "O2":
        assert full["param0"].dtype == np.float16 and full["master0"].dtype == np.float32
        assert full["model.0.weight"].dtype == np.float32  # state_dict in float32
