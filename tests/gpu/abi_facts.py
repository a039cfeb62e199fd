"""Build and run tests/gpu/abi_facts.c: csrc/cuda/cudawrap.h's ABI facts against the real nccl.h and
cuda_runtime_api.h (tests/gpu/verify.sh step 2; tests/cuda/test_cuda_loader.py runs it in the suite).

The headers are looked for in the NVIDIA wheels (nvidia/nccl/include, nvidia/cu13/include,
nvidia/cuda_runtime/include, nvidia/cuda_nvcc/include), $CUDA_HOME/include and /usr/local/cuda/include.
Without both headers or a C compiler it prints what it skipped and exits 0; a mismatch exits 1."""
import glob
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def include_dirs():
    """Candidate include directories, most specific first."""
    roots = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    try:
        roots.append(site.getusersitepackages())
    except AttributeError:
        pass
    roots += [p for p in sys.path if p.endswith("site-packages")]
    dirs = []
    for r in dict.fromkeys(roots):
        dirs += sorted(glob.glob(os.path.join(r, "nvidia", "*", "include")))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs += sorted(glob.glob("/usr/local/cuda*/include")) + ["/usr/include"]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def find(header, dirs):
    return next((d for d in dirs if os.path.isfile(os.path.join(d, header))), None)


def main():
    dirs = include_dirs()
    nccl, cudart = find("nccl.h", dirs), find("cuda_runtime_api.h", dirs)
    crt = find(os.path.join("crt", "host_defines.h"), dirs)  # cuda_runtime_api.h's own includes
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    missing = [n for n, v in (("nccl.h", nccl), ("cuda_runtime_api.h", cudart), ("crt/host_defines.h", crt),
                                                ("a C compiler", cc)) if not v]
    if missing:
        print(f"ABI check skipped: no {', '.join(missing)} found (looked in {dirs})")
        return 0
    print(f"nccl.h from {nccl}\ncuda_runtime_api.h from {cudart}")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "abi_facts")
        cmd = [cc, "-std=c11", "-Wall", "-o", exe, os.path.join(HERE, "abi_facts.c"),
               "-I", os.path.join(ROOT, "csrc", "cuda"), "-I", nccl, "-I", cudart, "-I", crt]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            print(f"ABI check: the program did not build:\n{' '.join(cmd)}\n{p.stdout}{p.stderr}")
            return 1
        return subprocess.run([exe]).returncode


if __name__ == "__main__":
    sys.exit(main())
