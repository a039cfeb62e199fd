"""Print what the GPU verification runs against (tests/gpu/verify.sh step 2): Python, NumPy, torch, CuPy,
JAX, the NCCL and CUDA runtime pyddp loads (and from where), torch's own NCCL, the driver, the devices.
Each line is independent: a library that is missing or fails prints why, and this never fails."""
import os
import platform
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def line(name, fn):
    try:
        print(f"{name:<22} {fn()}")
    except Exception as e:  # noqa: BLE001 - every failure is reported, none is fatal
        print(f"{name:<22} unavailable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def _torch():
    import torch
    out = f"{torch.__version__} (CUDA {torch.version.cuda})"
    if torch.cuda.is_available():
        out += f", {torch.cuda.device_count()} device(s): {torch.cuda.get_device_name(0)}"
        out += f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
    else:
        out += ", no CUDA device"
    return out


def _cupy():
    import cupy
    rt = cupy.cuda.runtime
    return f"{cupy.__version__}, runtime {rt.runtimeGetVersion()}, {rt.getDeviceCount()} device(s)"


def _jax():
    import jax
    return f"{jax.__version__}, devices {[str(d) for d in jax.devices()]}"


def _pyddp_nccl():
    from pyddp.cuda import _lib
    path, code = _lib.load_nccl()
    return f"{'.'.join(map(str, _lib.nccl_version_tuple(code)))} from {path}"


def _pyddp_cudart():
    from pyddp.cuda import _lib
    info = _lib.load_cudart()
    return (f"runtime {_lib.cuda_version_str(info['runtime_version'])}, driver "
            f"{_lib.cuda_version_str(info['driver_version'])}, from {info['path']}")


def _pyddp_devices():
    import pyddp.cuda
    return f"is_available {pyddp.cuda.is_available()}, device_count {pyddp.cuda.device_count()}"


def _smi():
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi"
    p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=30)
    return p.stdout.strip() or p.stderr.strip()


line("python", lambda: f"{platform.python_version()} ({sys.executable})")
line("platform", platform.platform)
line("numpy", lambda: __import__("numpy").__version__)
line("torch", _torch)
line("cupy", _cupy)
line("jax", _jax)
line("pyddp NCCL", _pyddp_nccl)
line("pyddp CUDA runtime", _pyddp_cudart)
line("pyddp.cuda", _pyddp_devices)
line("nvidia-smi", _smi)
for mod in ("mpi4py", "pytest", "xdist", "pytest_timeout"):
    line(mod, lambda m=mod: getattr(__import__(m), "__version__", "present"))
