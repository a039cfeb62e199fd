"""Build pyddp._C from the C11 sources under csrc/ (no C++, no pybind11, no Cython).

The sources compile in parallel (one job per core; PYDDP_BUILD_JOBS=N to choose) into a cache of
object files kept in the checkout (build/obj/<flags hash>/), so a second `pip install -e .` or
`python setup.py build_ext --inplace` recompiles only the files whose source or included headers
changed (the compiler's own dependency lists, -MMD, say which headers each file includes) and links
again: a few seconds instead of a full build.  `--force` rebuilds every file.
"""
import glob
import hashlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

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
# PYDDP_SANITIZE=address,undefined builds an instrumented extension (see docs/testing.md).
san = os.environ.get("PYDDP_SANITIZE")
if san:
    extra_compile_args += [f"-fsanitize={san}", "-fno-omit-frame-pointer", "-g", "-O1"]
    extra_link_args += [f"-fsanitize={san}"]
if os.environ.get("PYDDP_WERROR"):
    extra_compile_args.append("-Werror")


def _jobs():
    value = os.environ.get("PYDDP_BUILD_JOBS", "")
    if value:
        try:
            n = int(value)
        except ValueError:
            sys.exit(f"PYDDP_BUILD_JOBS={value!r}: expected a positive integer (the number of "
                     "compile jobs)")
        if n < 1:
            sys.exit(f"PYDDP_BUILD_JOBS={value!r}: expected a positive integer")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _deps_fresh(obj, dep_file):
    """True when ``obj`` is newer than every file its dependency list (-MMD) names."""
    try:
        obj_time = os.stat(obj).st_mtime_ns
        with open(dep_file, encoding="utf-8") as f:
            text = f.read().replace("\\\n", " ")
    except OSError:
        return False
    _, _, deps = text.partition(":")
    for dep in deps.split():
        try:
            if os.stat(dep).st_mtime_ns > obj_time:
                return False
        except OSError:     # a header that went away: compile again
            return False
    return True


class BuildExt(build_ext):
    """build_ext with parallel compiles and a persistent object cache (see the module docstring)."""

    def build_extension(self, ext):
        cc = self.compiler
        args = list(ext.extra_compile_args or [])
        macros = list(ext.define_macros or [])
        key = hashlib.sha1(repr((cc.compiler_so, args, macros, ext.include_dirs, sys.version,
                                 sys.platform)).encode()).hexdigest()[:12]
        obj_root = os.path.join(HERE, "build", "obj", key)
        try:
            os.makedirs(obj_root, exist_ok=True)
        except OSError:     # a read-only checkout: the default temporary directory
            obj_root = os.path.abspath(self.build_temp)
        todo, objects = [], []
        for src in ext.sources:     # relative to the checkout, as distutils names the objects
            obj = os.path.join(obj_root, os.path.splitext(src)[0] + ".o")
            dep = obj[:-2] + ".d"
            objects.append(obj)
            if self.force or not _deps_fresh(obj, dep):
                todo.append((src, dep))
        for d in sorted({os.path.dirname(o) for o in objects}):
            os.makedirs(d, exist_ok=True)

        def compile_one(item):
            src, dep = item
            cc.compile([src], output_dir=obj_root, macros=macros, include_dirs=ext.include_dirs,
                       extra_postargs=args + ["-MMD", "-MF", dep])

        if todo:
            print(f"pyddp: compiling {len(todo)} of {len(ext.sources)} C files with "
                  f"{min(_jobs(), len(todo))} jobs (objects cached in {obj_root})")
            with ThreadPoolExecutor(max_workers=_jobs()) as pool:
                for _ in pool.map(compile_one, todo):
                    pass
        else:
            print(f"pyddp: all {len(ext.sources)} C files up to date in {obj_root}; linking")
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        # Always linked (a second or two), to a new file put in place whole: distutils skips a
        # link whose output is newer than the objects, which kept an extension built with other
        # flags (PYDDP_SANITIZE's) in place after a plain build; and a process loading the old
        # file meanwhile sees it whole.
        final, out = out, f"{out}.{os.getpid()}.tmp"
        cc.link_shared_object(objects, out, libraries=self.get_libraries(ext),
                              library_dirs=ext.library_dirs,
                              runtime_library_dirs=ext.runtime_library_dirs,
                              extra_postargs=ext.extra_link_args,
                              export_symbols=self.get_export_symbols(ext),
                              debug=self.debug, build_temp=self.build_temp,
                              target_lang=self.compiler.detect_language(ext.sources))
        os.replace(out, final)


setup(
    cmdclass={"build_ext": BuildExt},
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
