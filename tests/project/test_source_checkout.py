"""Python or pytest started in a checkout that was installed with a non-editable ``pip install .``:
the checkout's pyddp (no compiled extension) comes first on sys.path.  Importing it must fail with
NumPy's kind of message (source directory; build in place or run elsewhere), not "cannot import
name '_C' from partially initialized module 'pyddp' (most likely due to a circular import)".

Simulated without installing anything: a copy of the source tree without the built extension is
the "checkout", and this repository's built pyddp (on PYTHONPATH) the "installed" one."""
import os
import shutil
import subprocess
import sys

import _paths

ROOT = _paths.ROOT


def _run(args, cwd, timeout=120):
    # -S: no site initialisation, so no .pth file (an editable install's import hook would serve
    # pyddp._C from elsewhere); NumPy's and pytest's directories are given explicitly instead.
    import numpy
    import pytest
    dirs = [ROOT]   # the "installed" pyddp
    for mod in (numpy, pytest):
        d = os.path.dirname(os.path.dirname(os.path.abspath(mod.__file__)))
        if d not in dirs:
            dirs.append(d)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(dirs))
    return subprocess.run([sys.executable, "-S"] + args, cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=timeout)


def _checkout(tmp_path):
    src = tmp_path / "checkout"
    shutil.copytree(os.path.join(ROOT, "pyddp"), src / "pyddp",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    shutil.copy(os.path.join(ROOT, "setup.py"), src / "setup.py")
    (src / "tests").mkdir()
    (src / "tests" / "test_uses_pyddp.py").write_text(
        "import pyddp\n\ndef test_it():\n    assert pyddp.zeros(2).sum().item() == 0\n")
    return src


def _assert_clear(out):
    assert "source directory" in out and "build_ext --inplace" in out, out
    assert "run Python and pytest from another directory" in out, out
    assert "circular import" not in out, out


def test_python_in_an_unbuilt_checkout_explains(tmp_path):
    src = _checkout(tmp_path)
    r = _run(["-c", "import pyddp"], src)
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    _assert_clear(r.stderr)
    # the same from pytest
    r = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_uses_pyddp.py"], src)
    assert r.returncode != 0
    _assert_clear(r.stdout + r.stderr)
    # from another directory the installed pyddp is used and works
    other = tmp_path / "elsewhere"
    other.mkdir()
    r = _run(["-c", "import pyddp; print(pyddp.__file__, pyddp.zeros(2).sum().item())"], other)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(os.path.join(ROOT, "pyddp")) and r.stdout.split()[-1] == "0.0"


def test_a_missing_extension_outside_a_checkout_keeps_pythons_error(tmp_path):
    # no setup.py beside the package: not a checkout, the original ImportError is kept
    pkg = tmp_path / "site"
    shutil.copytree(os.path.join(ROOT, "pyddp"), pkg / "pyddp",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    r = _run(["-c", "import pyddp"], pkg)
    assert r.returncode != 0 and "_C" in r.stderr and "source directory" not in r.stderr
