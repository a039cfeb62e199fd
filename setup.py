"""Build pyddp._C from the C11 sources under csrc/ (no C++, no pybind11, no Cython)."""
import glob
import os

from setuptools import Extension, setup

sources = sorted(
    p
    for p in glob.glob(os.path.join("csrc", "**", "*.c"), recursive=True)
    if not p.startswith(os.path.join("csrc", "tests"))
)

extra_compile_args = ["-std=c11", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter",
                      "-fvisibility=hidden", "-D_GNU_SOURCE",
                      # lets sqrtf vectorise (kernels/optim.c); nothing reads errno from libm
                      "-fno-math-errno"]
extra_link_args = ["-pthread"]
# csrc/cuda/loader.c opens libcudart and libnccl with dlopen (in libdl before glibc 2.34)
libraries = ["dl"]
# PYDDP_SANITIZE=address,undefined builds an instrumented extension (see README).
san = os.environ.get("PYDDP_SANITIZE")
if san:
    extra_compile_args += [f"-fsanitize={san}", "-fno-omit-frame-pointer", "-g", "-O1"]
    extra_link_args += [f"-fsanitize={san}"]
if os.environ.get("PYDDP_WERROR"):
    extra_compile_args.append("-Werror")

setup(
    ext_modules=[
        Extension(
            "pyddp._C",
            sources=sources,
            include_dirs=["csrc"],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
            libraries=libraries,
        )
    ],
)
