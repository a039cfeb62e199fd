"""``import pyddp`` / ``import pyddp.distributed`` load only what they need; the rest on first use.

Each check runs in a fresh interpreter: this test session has imported everything already.
"""
import json
import os
import subprocess
import sys

import pytest

import _paths

ROOT = _paths.ROOT

# Modules that ``import pyddp.distributed`` must not load (each costs import time and none is needed
# to run collectives).
HEAVY = ["pyddp.nn", "pyddp.amp", "pyddp.optim", "pyddp.optimizers", "pyddp.notebook",
         "pyddp.utils.data", "pyddp.serialization", "pyddp.multiprocessing", "pyddp._tensor",
         "pyddp.autograd", "pyddp._autocast", "pyddp.cuda"]

# Names pyddp exposes that are imported on first use: (name, module the object lives in).
LAZY = [
    ("nn", "pyddp.nn"), ("amp", "pyddp.amp"), ("optim", "pyddp.optim"),
    ("optimizers", "pyddp.optimizers"), ("utils", "pyddp.utils"),
    ("serialization", "pyddp.serialization"), ("notebook", "pyddp.notebook"),
    ("distributed", "pyddp.distributed"), ("multiprocessing", "pyddp.multiprocessing"),
    ("_kernels", "pyddp._kernels"), ("cuda", "pyddp.cuda"),
    ("accelerator", "pyddp.accelerator"), ("backends", "pyddp.backends"),
    ("save", "pyddp.serialization"), ("load", "pyddp.serialization"),
    ("DataLoader", "pyddp.utils.data"), ("DistributedSampler", "pyddp.utils.data"),
    ("DistributedDataParallel", "pyddp.nn.parallel"), ("notebook_launcher", "pyddp.notebook"),
    ("autograd", "pyddp.autograd"), ("Tensor", "pyddp._tensor"), ("zeros", "pyddp._tensor._factories"),
    ("randn", "pyddp._tensor._factories"), ("no_grad", "pyddp._tensor"),
    ("autocast", "pyddp._autocast"),
]


def _run(code):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("statement", ["import pyddp", "import pyddp.distributed"])
def test_import_loads_no_heavy_module(statement):
    loaded = _run(f"import json, sys\n{statement}\n"
                  "print(json.dumps(sorted(m for m in sys.modules if m.startswith('pyddp'))))")
    heavy = [m for m in HEAVY if m in loaded or any(n.startswith(m + ".") for n in loaded)]
    assert heavy == [], f"`{statement}` imported {heavy}"


@pytest.mark.parametrize("name,module", LAZY)
def test_lazy_name_resolves_on_first_use(name, module):
    got = _run(
        "import json, sys, types\n"
        "import pyddp\n"
        f"before = {module!r} in sys.modules\n"
        f"listed = {name!r} in dir(pyddp)\n"
        f"obj = getattr(pyddp, {name!r})\n"
        "where = obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__\n"
        f"print(json.dumps([before, listed, where, {module!r} in sys.modules, "
        f"getattr(pyddp, {name!r}) is obj]))")
    before, listed, where, after, same = got
    assert not before and listed and after and same
    assert where == module or where.startswith(module + ".")


def test_lazy_names_are_the_real_objects():
    # In this session everything is imported: the lazy names are the modules' own objects.
    from pyddp import DataLoader, DistributedDataParallel, notebook_launcher, save  # noqa: F401
    import pyddp.nn.parallel
    import pyddp.notebook
    import pyddp.utils.data

    assert pyddp.DistributedDataParallel is pyddp.nn.parallel.DistributedDataParallel
    assert pyddp.DataLoader is pyddp.utils.data.DataLoader
    assert pyddp.notebook_launcher is pyddp.notebook.notebook_launcher
    assert pyddp.save is pyddp.serialization.save
    for name, _ in LAZY:
        assert name in dir(pyddp)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pyddp.no_such_name  # noqa: B018


def test_star_import_gives_every_public_name():
    names = _run("import json\nfrom pyddp import *\n"
                 "print(json.dumps(sorted(n for n in dir() if not n.startswith('_'))))")
    for name in ("nn", "amp", "optim", "DistributedDataParallel", "DataLoader", "save", "load",
                 "notebook_launcher", "Tensor", "zeros", "manual_seed", "default_generator"):
        assert name in names


def test_autograd_names_resolve_to_the_functions():
    # pyddp.autograd serves its Tensor-dependent names on first use; gradcheck stays the function
    # (its submodule of the same name must not shadow it)
    out = _run("import pyddp.autograd as A, sys; assert 'pyddp._tensor' not in sys.modules; "
               "g = A.gradcheck; import pyddp.autograd.gradcheck; from pyddp.autograd import gradcheck; "
               "assert callable(g) and gradcheck is g and A.Variable.__mro__[1] is A.Tensor; print('\"ok\"')")
    assert out == "ok"
