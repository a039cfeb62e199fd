"""pyddp: torch.distributed-style data-parallel training for NumPy and CUDA arrays."""
__version__ = "0.1.0"

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

try:
    from . import _C  # noqa: F401  (fail early if the extension is missing)
except ImportError as _e:
    # NumPy's kind of message for the usual cause: Python started in a checkout (its directory is
    # first on sys.path) that was installed with a non-editable ``pip install .``, so this source
    # copy, which has no compiled extension, hides the installed one.
    import os as _os
    _here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.exists(_os.path.join(_os.path.dirname(_here), "setup.py")):
        _built = [f for f in _os.listdir(_here) if f.startswith("_C.") and f != "_C.pyi"]
        _why = f"it failed to load: {_e}" if _built else "there is none"
        raise ImportError(
            f"pyddp's compiled extension pyddp._C could not be imported from {_here} ({_why}).\n"
            "You are importing pyddp from its source directory, which has not been built in place "
            "(a non-editable 'pip install .' puts the extension into site-packages only). Either "
            "build it in place: 'python setup.py build_ext --inplace' (or 'pip install -e .') "
            "in the checkout, or run Python and pytest from another directory to use the "
            "installed pyddp.", name="pyddp._C", path=_here) from None
    raise

# torch's CPU generator and data loading (pyddp.default_generator is torch-compatible mt19937)
# (pyddp.randperm, a Tensor as torch's, is served from pyddp._tensor like the other factories)
from ._random import Generator, default_generator, initial_seed  # noqa: F401,E402

# The rest is imported on first use (PEP 562 __getattr__ below), so that ``import pyddp.distributed``
# does not load the tensor library, nn, amp, optim, data loading, checkpoints or notebook_launcher:
# ``pyddp.zeros``, ``pyddp.nn``, ``pyddp.save`` or ``from pyddp import DistributedDataParallel``
# import their module then.  Every name of pyddp._tensor.__all__ (Tensor, dtypes, factories, ops)
# is served from pyddp._tensor.
_LAZY_SUBMODULES = frozenset({
    "autograd",     # backward, grad, Function (torch.autograd)
    "fp16_utils",   # apex.fp16_utils (to_python_float, network_to_half, FP16_Optimizer)
    "amp_C", "multi_tensor_apply",   # apex's multi_tensor_applier and the ops it applies
    "hub",          # torch.hub: the checkpoint cache, load_state_dict_from_url, local hubconfs
    "parallel",     # apex.parallel's names (`import pyddp as apex`: apex.parallel.SyncBatchNorm)
    "amp",          # apex.amp's API, torch.amp.GradScaler
    "optim",        # pyddp.optim.SGD as torch.optim
    "optimizers",   # pyddp.optimizers.FusedAdam as apex.optimizers
    "nn", "utils", "serialization", "notebook", "distributed", "multiprocessing", "_kernels",
    "cuda",         # torch.cuda's device queries (loads libcudart on first call, not on import)
    "accelerator",  # torch.accelerator (CUDA through pyddp.cuda, else torch's CPU-build answers)
    "backends",     # torch.backends.cudnn's switches
    "version",      # torch.version (__version__, cuda None as a CPU build, git_version)
    "_dynamo",      # torch._dynamo.config's switches, reset(): recorded, doing nothing
    "_inductor",    # torch._inductor.config's switches: recorded, doing nothing
})
_LAZY_ATTRIBUTES = {   # name -> (submodule, attribute)
    # checkpoints (torch.save / torch.load)
    "save": ("serialization", "save"),
    "load": ("serialization", "load"),
    "DataLoader": ("utils.data", "DataLoader"),
    "DistributedSampler": ("utils.data", "DistributedSampler"),
    "DistributedDataParallel": ("nn.parallel", "DistributedDataParallel"),
    "notebook_launcher": ("notebook", "notebook_launcher"),
    "autocast": ("_autocast", "autocast"),
    "is_autocast_enabled": ("_autocast", "is_autocast_enabled"),
    "get_autocast_dtype": ("_autocast", "get_autocast_dtype"),
    # torch.compile: pyddp has no compiler; the model comes back as it is (pyddp/_dynamo)
    "compile": ("_dynamo", "compile"),
}


def _tensor_names():
    return _importlib.import_module(f"{__name__}._tensor").__all__

if _TYPE_CHECKING:   # what type checkers and IDEs see: the names as if imported eagerly
    from . import autograd  # noqa: F401
    from ._autocast import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: F401
    from ._tensor import *  # noqa: F401,F403
    from ._tensor import Tensor  # noqa: F401
    from . import _kernels, accelerator, amp, backends, cuda, distributed  # noqa: F401
    from . import multiprocessing, nn, notebook, optim, optimizers  # noqa: F401
    from . import amp_C, hub, multi_tensor_apply, serialization, utils, version  # noqa: F401
    from . import _dynamo, _inductor  # noqa: F401
    from ._dynamo import compile  # noqa: F401
    from . import parallel  # noqa: F401
    from .nn.parallel import DistributedDataParallel  # noqa: F401
    from .notebook import notebook_launcher  # noqa: F401
    from .serialization import load, save  # noqa: F401
    from .utils.data import DataLoader, DistributedSampler  # noqa: F401


def __getattr__(name):
    # Never ``from . import x`` here: that looks the name up on this module first, i.e. calls this.
    if name in _LAZY_SUBMODULES:
        value = _importlib.import_module(f"{__name__}.{name}")
    elif name in _LAZY_ATTRIBUTES:
        module, attr = _LAZY_ATTRIBUTES[name]
        value = getattr(_importlib.import_module(f"{__name__}.{module}"), attr)
    elif name == "__all__":
        # ``from pyddp import *``: every public name, as when they were all imported eagerly.
        return [n for n in __dir__() if not n.startswith("_")]
    elif not name.startswith("_") and name in _tensor_names():
        value = getattr(_importlib.import_module(f"{__name__}._tensor"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | _LAZY_SUBMODULES | set(_LAZY_ATTRIBUTES) | set(_tensor_names()))


def load_ipython_extension(ipython):
    """``%load_ext pyddp``: the %ddp and %%ddp magics, which run notebook cells on persistent ranks
    (pyddp.notebook_magics; IPython is imported only then)."""
    _importlib.import_module(f"{__name__}.notebook_magics").load_ipython_extension(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext pyddp``: stops the ranks %ddp started."""
    _importlib.import_module(f"{__name__}.notebook_magics").unload_ipython_extension(ipython)


def manual_seed(seed):
    """Seed pyddp's generator (``torch.manual_seed``): ``pyddp.default_generator``, which every
    random draw uses (randperm, samplers, data loading, randn/rand/dropout/initialisation).
    Returns it."""
    from . import _random

    return _random.manual_seed(seed)


def _cuda_on_cpu():
    # PYDDP_CUDA_ON_CPU=1 (pyddp.cuda._emulation): refused where a GPU is visible, said once.
    import os
    if "PYDDP_CUDA_ON_CPU" not in os.environ:  # (most imports: no config table to load)
        return
    from . import _config
    if _config.get("PYDDP_CUDA_ON_CPU"):
        from .cuda import _emulation
        _emulation.announce()


_cuda_on_cpu()
