"""Loading libcudart and libnccl at run time (csrc/cuda/loader.c, pyddp/cuda/_lib.py) and
pyddp.cuda: the search order, every error message, the PYDDP_*_LIBRARY variables, the real NVIDIA
wheels where installed, and pyddp.cuda against torch's CPU build on a machine without a GPU.

A process loads each library once, so every check that loads one runs in a fresh interpreter.
Stand-ins for the libraries are compiled here from csrc/cuda/cudawrap.h's tables (``cc -shared``):
a libnccl with a chosen ncclGetVersion or a missing symbol, a libcudart whose device count,
versions and errors come from environment variables and whose memory is the host's.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import _paths

ROOT = _paths.ROOT
HEADER = os.path.join(ROOT, "csrc", "cuda", "cudawrap.h")
VARS = ("PYDDP_NCCL_LIBRARY", "PYDDP_CUDART_LIBRARY")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


# ----------------------------------------------------------------------------- the stand-ins

def _fields(struct):
    """(required, optional) field names of a table in cudawrap.h."""
    text = open(HEADER, encoding="utf-8").read()
    body = re.search(r"struct %s \{(.*?)\n\};" % struct, text, re.S).group(1)
    req, opt = body.split("/* optional */")
    names = lambda s: re.findall(r"\(\*(\w+)\)", s)  # noqa: E731
    return names(req), names(opt)


NCCL_BODIES = {
    "GetVersion": "int ncclGetVersion(int *v) { *v = VERSION; return 0; }",
    "GetUniqueId": "int ncclGetUniqueId(char *id) { memset(id, 7, 128); return 0; }",
    "GetErrorString": 'const char *ncclGetErrorString(int r) { return r ? "fake error" : "no error"; }',
}
CUDART_BODIES = {
    "GetDeviceCount": "int cudaGetDeviceCount(int *c) { int e = env(\"FAKE_CUDA_ERR\", 0); "
                      "*c = e ? 0 : env(\"FAKE_CUDA_COUNT\", 1); return e; }",
    "GetDevice": "int cudaGetDevice(int *d) { *d = cur; return 0; }",
    "SetDevice": "int cudaSetDevice(int d) { if (d < 0 || d >= env(\"FAKE_CUDA_COUNT\", 1)) "
                 "return 101; cur = d; return 0; }",
    "DeviceSynchronize": "int cudaDeviceSynchronize(void) { syncs[cur]++; return 0; }",
    "RuntimeGetVersion": "int cudaRuntimeGetVersion(int *v) { *v = env(\"FAKE_RUNTIME\", 13000); "
                         "return 0; }",
    "DriverGetVersion": "int cudaDriverGetVersion(int *v) { *v = env(\"FAKE_DRIVER\", 13000); "
                        "return 0; }",
    "GetLastError": "int cudaGetLastError(void) { return 0; }",
    "GetErrorName": "const char *cudaGetErrorName(int e) { return e == 35 ? "
                    "\"cudaErrorInsufficientDriver\" : e == 101 ? \"cudaErrorInvalidDevice\" : "
                    "\"cudaErrorUnknown\"; }",
    "GetErrorString": "const char *cudaGetErrorString(int e) { return e == 101 ? "
                      "\"invalid device ordinal\" : \"fake description\"; }",
    "MemcpyAsync": "int cudaMemcpyAsync(void *d, const void *s, size_t n, int k, void *st) "
                   "{ memcpy(d, s, n); return 0; }",
    "HostAlloc": "int cudaHostAlloc(void **p, size_t n, unsigned f) { *p = malloc(n); "
                 "return *p ? 0 : 2; }",
    "FreeHost": "int cudaFreeHost(void *p) { free(p); fake_frees++; return 0; }",
    "PointerGetAttributes": "int cudaPointerGetAttributes(int *a, const void *p) "
                            "{ a[0] = 1; a[1] = cur; return 0; }",
}
CUDART_PRELUDE = """
static int cur;
int fake_frees, syncs[8];
static int env(const char *k, int d) { const char *s = getenv(k); return s ? atoi(s) : d; }
"""


def _compile(tmp, name, prefix, struct, bodies, omit=(), prelude="", defines=()):
    req, opt = _fields(struct)
    lines = ["#include <stdlib.h>", "#include <string.h>", prelude]
    for f in req + opt:
        if f in omit:
            continue
        lines.append(bodies.get(f, f"int {prefix}{f}(void) {{ return 0; }}"))
    src = os.path.join(tmp, name + ".c")
    with open(src, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    out = os.path.join(tmp, name + ".so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-o", out, src, *[f"-D{d}" for d in defines]],
                   check=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """make(kind, version=..., omit=...) -> path of a compiled stand-in library."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler")
    tmp = str(tmp_path_factory.mktemp("fakes"))
    made = {}

    def make(kind, version=21900, omit=()):
        key = (kind, version, tuple(omit))
        if key not in made:
            name = f"{kind}_{version}_{'_'.join(omit) or 'full'}"
            if kind == "nccl":
                made[key] = _compile(tmp, name, "nccl", "pd_nccl", NCCL_BODIES, omit,
                                     defines=[f"VERSION={version}"])
            else:
                made[key] = _compile(tmp, name, "cuda", "pd_cudart", CUDART_BODIES, omit,
                                     prelude=CUDART_PRELUDE)
        return made[key]

    return make


def _wheel(site, rel, lib):
    """Put lib at site/rel, as a pip wheel lays it out."""
    dst = os.path.join(site, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(lib, dst)
    return dst


def _run(body, sys_path=None, env=None):
    """Run body in a fresh interpreter (with sys_path: the given directories, then the standard
    library's, in place of sys.path after pyddp is imported, so that only the given directories
    hold packages); returns what it prints last, as JSON.
    ``err(f)`` there gives ``["ok", repr(f())]`` or ``[exception type name, message]``."""
    e = {k: v for k, v in os.environ.items() if k not in VARS}
    e["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    e.update(env or {})
    code = textwrap.dedent("""\
        import json, os, sys
        import pyddp, pyddp.cuda, pyddp.cuda._lib as L, pyddp._C as C
        def err(f):
            try:
                return ["ok", repr(f())]
            except Exception as e:
                return [type(e).__name__, str(e)]
        """)
    if sys_path is not None:   # the standard library stays, the installed packages go
        code += (f"sys.path[:] = {list(sys_path)!r} + [p for p in sys.path if "
                 "os.path.basename(p.rstrip('/')) not in ('site-packages', 'dist-packages')]\n")
    code += textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _error(call):
    """Code printing what err() gives for the expression call."""
    return f"print(json.dumps(err(lambda: {call})))\n"


@pytest.fixture(scope="module")
def system_nccl():
    """None when the system loader finds a libnccl.so.2 here (then a search never fails), else
    what dlerror says about it."""
    out = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libnccl.so.2')"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        return None
    return out.stderr.strip().splitlines()[-1].split("OSError: ", 1)[1]


# -------------------------------------------------------------------------------- the search

def test_search_order(tmp_path):
    site1, site2, site3 = (str(tmp_path / n) for n in ("site1", "site2", "site3"))
    empty = os.path.join(tmp_path, "x")
    _wheel(site1, "nvidia/nccl/lib/libnccl.so.2", HEADER)
    for rel in ("nvidia/cuda_runtime/lib/libcudart.so.12", "nvidia/cu13/lib/libcudart.so.13"):
        _wheel(site2, rel, HEADER)
    # an installed torch, with what older torch wheels bundled in its lib directory
    for rel in ("torch/__init__.py", "torch/lib/libnccl.so.2", "torch/lib/libcudart-1a2b.so.12"):
        _wheel(site3, rel, HEADER)
    os.makedirs(empty)
    got = _run("""
        print(json.dumps([L.nccl_candidates(), L.cudart_candidates()]))
    """, sys_path=[empty, site1, site2, site1, site3])
    wheels_n = "NVIDIA pip wheels on sys.path (nvidia/nccl/lib/libnccl.so.2)"
    wheels_c = ("NVIDIA pip wheels on sys.path (nvidia/cu13/lib/libcudart.so.13, "
                "nvidia/cuda_runtime/lib/libcudart.so.12)")
    torch_lib = os.path.join(site3, "torch", "lib")
    system = "the system loader (LD_LIBRARY_PATH, ldconfig)"
    assert got[0] == [
        [wheels_n, os.path.join(site1, "nvidia/nccl/lib/libnccl.so.2")],  # site1 listed once
        [f"torch's lib directory {torch_lib}", os.path.join(torch_lib, "libnccl.so.2")],
        [system, "libnccl.so.2"]]
    assert got[1] == [
        [wheels_c, os.path.join(site2, "nvidia/cu13/lib/libcudart.so.13")],
        [wheels_c, os.path.join(site2, "nvidia/cuda_runtime/lib/libcudart.so.12")],
        [f"torch's lib directory {torch_lib}", os.path.join(torch_lib, "libcudart-1a2b.so.12")],
        [system, "libcudart.so.13"], [system, "libcudart.so.12"], [system, "libcudart.so"]]


def test_variables_replace_the_search(tmp_path):
    _wheel(str(tmp_path), "nvidia/nccl/lib/libnccl.so.2", HEADER)
    got = _run("print(json.dumps([L.nccl_candidates(), L.cudart_candidates()]))",
               sys_path=[str(tmp_path)],
               env={"PYDDP_NCCL_LIBRARY": "/opt/nccl/libnccl.so.2",
                    "PYDDP_CUDART_LIBRARY": "/opt/cuda/libcudart.so.13"})
    assert got == [[["$PYDDP_NCCL_LIBRARY", "/opt/nccl/libnccl.so.2"]],
                   [["$PYDDP_CUDART_LIBRARY", "/opt/cuda/libcudart.so.13"]]]


def test_nothing_found_says_where_it_looked_and_what_to_install(tmp_path, system_nccl):
    if system_nccl is None:
        pytest.skip("the system loader finds a libnccl.so.2 on this machine")
    got = _run("""
        import pyddp.distributed as dist
        from pyddp.distributed.backends import registry as _backend
        print(json.dumps([err(L.load_nccl), err(L.load_nccl), dist.is_nccl_available(),
                          _backend.lookup("nccl").reason()]))
    """, sys_path=[str(tmp_path)])
    (kind, msg), again, available, reason = got
    assert kind == "RuntimeError"
    assert msg.splitlines() == [
        "pyddp could not load libnccl (NCCL 2.18 or later). It looked, in this order:",
        "  1. $PYDDP_NCCL_LIBRARY: not set",
        "  2. NVIDIA pip wheels on sys.path (nvidia/nccl/lib/libnccl.so.2): none found",
        "  3. torch's lib directory: torch is not installed",
        f"  4. the system loader (LD_LIBRARY_PATH, ldconfig): libnccl.so.2: {system_nccl}",
        "To install it into this environment: pip install nvidia-nccl-cu13 (CUDA 13) or "
        "nvidia-nccl-cu12 (CUDA 12); or set PYDDP_NCCL_LIBRARY to the full path of a "
        "libnccl.so.2."]
    # the outcome is kept, and the backend reports it
    assert again == [kind, msg] and available is False
    assert reason.startswith("backend 'nccl' is not available") and reason.endswith(msg)


def test_old_nccl_is_refused_and_the_search_goes_on(tmp_path, fakes, system_nccl):
    old = _wheel(str(tmp_path / "a"), "nvidia/nccl/lib/libnccl.so.2", fakes("nccl", 21703))
    good = _wheel(str(tmp_path / "b"), "nvidia/nccl/lib/libnccl.so.2", fakes("nccl", 21900))
    got = _run("print(json.dumps([L.load_nccl(), pyddp.cuda.nccl.version()]))",
               sys_path=[str(tmp_path / "a"), str(tmp_path / "b")])
    assert got == [[good, 21900], [2, 19, 0]]
    if system_nccl is None:
        return
    kind, msg = _run(_error("L.load_nccl()"), sys_path=[str(tmp_path / "a")])
    assert kind == "RuntimeError"
    assert (f"  2. NVIDIA pip wheels on sys.path (nvidia/nccl/lib/libnccl.so.2): {old}: NCCL "
            "2.17.3 is too old: pyddp needs NCCL 2.18.0 or later") in msg.splitlines()


@pytest.mark.parametrize("code,shown,omit", [
    (21703, "2.17.3", ()), (2804, "2.8.4", ()), (21799, "2.17.99", ()),
    (20705, "2.7.5", ("CommAbort", "Send", "Recv")),   # named by its version, not what it lacks
])
def test_old_nccl_named_by_variable(fakes, code, shown, omit):
    lib = fakes("nccl", code, omit)
    kind, msg = _run(_error("pyddp.cuda.nccl.version()"), env={"PYDDP_NCCL_LIBRARY": lib})
    assert kind == "RuntimeError"
    assert msg.startswith(f"pyddp could not load libnccl (NCCL 2.18 or later) from "
                          f"PYDDP_NCCL_LIBRARY={lib!r}: NCCL {shown} is too old: pyddp needs NCCL "
                          "2.18.0 or later.\n")
    assert "unset it to let pyddp search" in msg


def test_variable_is_the_only_candidate(tmp_path, fakes):
    # a working libnccl in a wheel directory is not used when the variable names another file
    _wheel(str(tmp_path), "nvidia/nccl/lib/libnccl.so.2", fakes("nccl", 21900))
    missing = str(tmp_path / "nope" / "libnccl.so.2")
    kind, msg = _run(_error("L.load_nccl()"), sys_path=[str(tmp_path)],
                     env={"PYDDP_NCCL_LIBRARY": missing})
    assert kind == "RuntimeError"
    assert msg.startswith(f"pyddp could not load libnccl (NCCL 2.18 or later) from "
                          f"PYDDP_NCCL_LIBRARY={missing!r}: {missing}: cannot open shared object")


@pytest.mark.parametrize("kind,omit,symbol", [("nccl", ("CommAbort",), "ncclCommAbort"),
                                              ("nccl", ("GetVersion",), "ncclGetVersion"),
                                              ("cudart", ("HostAlloc",), "cudaHostAlloc")])
def test_missing_required_symbol(fakes, kind, omit, symbol):
    lib = fakes(kind, omit=omit)
    var, call = (("PYDDP_NCCL_LIBRARY", "L.load_nccl()") if kind == "nccl" else
                 ("PYDDP_CUDART_LIBRARY", "L.load_cudart()"))
    exc, msg = _run(_error(call), env={var: lib})
    assert exc == "RuntimeError"
    assert f"{var}={lib!r}: loaded, but it lacks the symbol {symbol}." in msg


def test_optional_symbols_may_be_missing(fakes):
    lib = fakes("nccl", 21806, omit=("CommSplit", "CommInitRankConfig", "GetLastError"))
    assert _run("print(json.dumps(L.load_nccl()))", env={"PYDDP_NCCL_LIBRARY": lib}) == [lib, 21806]


def test_first_outcome_is_kept(fakes):
    a, b = fakes("nccl", 21900), fakes("nccl", 22000)
    got = _run(f"""
        import os
        first = L.load_nccl()
        os.environ["PYDDP_NCCL_LIBRARY"] = {b!r}
        L._outcomes.clear()   # the C loader too keeps its first outcome for the process
        print(json.dumps([first, L.load_nccl(), C._nccl_load([{b!r}])]))
    """, env={"PYDDP_NCCL_LIBRARY": a})
    assert got == [[a, 21900]] * 3


def test_functions_before_loading():
    got = _run("print(json.dumps([err(C.nccl_version), err(C.nccl_unique_id), "
               "err(C.cuda_device_count), err(lambda: C.cuda_host_alloc(8))]))")
    assert [k for k, _ in got] == ["RuntimeError"] * 4
    assert "libnccl is not loaded" in got[0][1] and "libnccl is not loaded" in got[1][1]
    assert "libcudart is not loaded" in got[2][1] and "libcudart is not loaded" in got[3][1]


@pytest.mark.parametrize("call,kind,msg", [
    ("C._nccl_load([])", "RuntimeError", "(no candidates): no library path was given"),
    ("C._nccl_load('libnccl.so.2')", "TypeError", "_nccl_load: paths must be a list of str, not str"),
    ("C._cuda_load([3])", "TypeError", "_cuda_load: paths[0] must be a str without NUL characters"),
    ("C._cuda_load(['a\\0b'])", "TypeError", "_cuda_load: paths[0] must be a str without NUL"),
])
def test_loader_arguments(call, kind, msg):
    got = _run(_error(call))
    assert got[0] == kind and got[1].startswith(msg)


# ------------------------------------------------------------- pyddp.cuda on a stand-in runtime

def test_cuda_without_driver(fakes):
    lib = fakes("cudart")
    got = _run("""
        c = pyddp.cuda
        res = [c.is_available(), c.device_count(), c.is_initialized(), c.manual_seed(3),
               c.manual_seed_all(3)]
        for f in (c.current_device, lambda: c.set_device(0), c.synchronize,
                  lambda: c.device(0).__enter__()):
            try:
                f()
            except c.CudaUnavailableError as e:
                res.append([isinstance(e, AssertionError), isinstance(e, RuntimeError), str(e)])
        print(json.dumps(res))
    """, env={"PYDDP_CUDART_LIBRARY": lib, "FAKE_CUDA_ERR": "35", "FAKE_DRIVER": "0"})
    assert got[:5] == [False, 0, False, None, None]
    assert got[5:] == [[True, True, "pyddp.cuda: CUDA is not available: cudaGetDeviceCount: "
                        "cudaErrorInsufficientDriver (fake description): no NVIDIA driver on "
                        "this machine"]] * 4


def test_cuda_driver_older_than_runtime(fakes):
    lib = fakes("cudart")
    kind, msg = _run(_error("pyddp.cuda.current_device()"),
                     env={"PYDDP_CUDART_LIBRARY": lib, "FAKE_CUDA_ERR": "35",
                          "FAKE_DRIVER": "12040", "FAKE_RUNTIME": "13000"})
    assert kind == "CudaUnavailableError"
    assert (f"the NVIDIA driver supports CUDA 12.4, older than the CUDA runtime 13.0 pyddp loaded "
            f"from {lib}") in msg and "nvidia-cuda-runtime-cu12" in msg


def test_cuda_with_devices(fakes):
    lib = fakes("cudart")
    got = _run("""
        import ctypes
        c = pyddp.cuda
        fake = ctypes.CDLL(L.load_cudart()["path"])   # the same handle: its counters
        syncs = (ctypes.c_int * 8).in_dll(fake, "syncs")
        res = [c.is_available(), c.device_count(), c.is_initialized(), c.current_device()]
        c.set_device("cuda:2"); res.append(c.current_device())
        class Dev:   # a torch.device
            type, index = "cuda", 1
        c.set_device(Dev()); res.append(c.current_device())
        c.set_device(-1); res.append(c.current_device())
        with c.device(3):
            res.append(c.current_device())
            c.synchronize()
        with c.device(None):
            res.append(c.current_device())
        res.append(c.current_device())
        c.synchronize("cuda:0")
        res.append([list(syncs)[:4], c.current_device(), c.is_initialized()])
        try:
            c.set_device(7)
        except RuntimeError as e:
            res.append([type(e).__name__, str(e)])
        print(json.dumps(res))
    """, env={"PYDDP_CUDART_LIBRARY": lib, "FAKE_CUDA_COUNT": "4"})
    assert got[:4] == [True, 4, False, 0]
    assert got[4:10] == [2, 1, 1, 3, 1, 1]
    assert got[10] == [[1, 0, 0, 1], 1, True]
    assert got[11] == ["RuntimeError",
                       "cudaSetDevice(7): cudaErrorInvalidDevice (invalid device ordinal)"]


@pytest.mark.parametrize("arg,msg", [
    ("'cpu'", "Expected a cuda device, but got: cpu"),
    ("'cuda'", "Expected a torch.device with a specified index or an integer, but got:cuda"),
    ("1.5", "Expected a torch.device with a specified index or an integer, but got:1.5"),
    ("'cuda:x'", "Invalid device string: 'cuda:x'"),
    ("'cuda:'", "Invalid device string: 'cuda:'"),
])
def test_set_device_bad_arguments(arg, msg):
    kind, got = _run(_error(f"pyddp.cuda.set_device({arg})"))
    assert kind == "ValueError" and got.startswith(msg)


def test_pinned_buffer_and_memcpy(fakes):
    lib = fakes("cudart")
    got = _run("""
        import ctypes, numpy as np
        L.load_cudart()
        fake = ctypes.CDLL(L.load_cudart()["path"])
        frees = ctypes.c_int.in_dll(fake, "fake_frees")
        b = C.cuda_host_alloc(64)
        a = np.frombuffer(b, dtype=np.float32)
        a[:] = np.arange(16)
        src = np.arange(16, 32, dtype=np.float32)
        C.cuda_memcpy_async(b.ptr + 8, src.ctypes.data, 8, 1, 0)
        C.cuda_stream_synchronize(0)
        res = [b.nbytes, b.ptr == a.ctypes.data, a.tolist(), type(b).__name__,
               C.cuda_pointer_attributes(b.ptr), frees.value, len(memoryview(C.cuda_host_alloc(0)))]
        del a, b
        res.append(frees.value)
        for call in ("C.cuda_memcpy_async(-1, 0, 8, 1, 0)", "C.cuda_memcpy_async(0, 0.5, 8, 1, 0)",
                     "C.cuda_memcpy_async(0, 0, -8, 1, 0)", "C.cuda_memcpy_async(0, 0, 8, 7, 0)",
                     "C.cuda_host_alloc(-1)", "type(C.cuda_host_alloc(1))()"):
            try:
                eval(call)
            except Exception as e:
                res.append([type(e).__name__, str(e)])
        print(json.dumps(res))
    """, env={"PYDDP_CUDART_LIBRARY": lib})
    assert got[:4] == [64, True, [0.0, 1.0, 16.0, 17.0] + [float(i) for i in range(4, 16)],
                       "PinnedBuffer"]
    assert got[4:8] == [[1, 0], 0, 0, 2]  # both buffers freed with cudaFreeHost
    assert got[8] == ["ValueError", "cuda_memcpy_async: dst must be an address, an int in "
                                    "[0, 2**64), got -1"]
    assert got[9] == ["TypeError", "cuda_memcpy_async: src must be an int (an address), not float"]
    assert got[10] == ["ValueError", "cuda_memcpy_async: nbytes must be >= 0, got -8"]
    assert got[11][0] == "ValueError" and "kind must be a cudaMemcpyKind" in got[11][1]
    assert got[12] == ["ValueError", "cuda_host_alloc: nbytes must be >= 0, got -1"]
    assert got[13][0] == "TypeError"


# ---------------------------------------------------------------------------- the real wheels

def _installed(dist_names):
    from importlib import metadata

    for name in dist_names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None


NCCL_WHEEL = _installed(["nvidia-nccl-cu13", "nvidia-nccl-cu12"])
CUDART_WHEEL = _installed(["nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"])


@pytest.mark.skipif(NCCL_WHEEL is None, reason="no nvidia-nccl-cu13/-cu12 wheel installed")
def test_real_nccl():
    got = _run("""
        import pyddp.distributed as dist
        nc = pyddp.cuda.nccl
        a, b = nc.unique_id(), C.nccl_unique_id()
        print(json.dumps([L.load_nccl()[0], list(nc.version()), len(a), len(b), a != b,
                          [C.nccl_error_string(i) for i in range(9)], dist.is_nccl_available()]))
    """)
    path, version, la, lb, differ, strings, available = got
    assert path.endswith(os.path.join("nvidia", "nccl", "lib", "libnccl.so.2"))
    assert tuple(version) == tuple(int(x) for x in NCCL_WHEEL.split(".")[:3])
    assert la == lb == 128 and differ
    assert strings[0] == "no error" and strings[1].startswith("unhandled cuda error")
    assert strings[2].startswith("unhandled system error")
    assert strings[4].startswith("invalid argument") and available


@pytest.mark.skipif(CUDART_WHEEL is None, reason="no nvidia-cuda-runtime wheel installed")
def test_real_cudart():
    got = _run("""
        info = L.load_cudart()
        count, err = C.cuda_device_count()
        print(json.dumps([info, count, err, pyddp.cuda.device_count(), C.cuda_error_string(35)]))
    """)
    info, count, err, dc, s35 = got
    assert "/nvidia/" in info["path"] and info["runtime_version"] // 1000 == \
        int(CUDART_WHEEL.split(".")[0])
    assert dc == count and (count > 0) == (err == 0)
    assert s35 == ("cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA "
                   "runtime version)")
    if count == 0:   # no GPU: the runtime says why, and nothing raises from asking
        assert err in (35, 100)
        kind, msg = _run(_error("(L.load_cudart(), C.cuda_host_alloc(16))"))
        assert kind == "RuntimeError" and msg.startswith("cudaHostAlloc(16 bytes): cudaError")


def test_like_torch_cpu_build():
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None:
        pytest.skip("torch is a CUDA build")
    got = _run("""
        import torch
        res = {}
        for mod in (pyddp.cuda, torch.cuda):
            out = [mod.is_available(), mod.device_count(), mod.is_initialized(),
                   mod.manual_seed(1), mod.manual_seed_all(2)]
            for f in (mod.current_device, mod.synchronize, lambda: mod.set_device(-1),
                      lambda: mod.set_device("cpu"), lambda: mod.set_device("cuda"),
                      lambda: mod.device(-1).__enter__(), lambda: mod.device(0).__enter__()):
                try:
                    out.append(["ok", f()])
                except Exception as e:
                    out.append([[t.__name__ for t in type(e).__mro__], str(e)])
            res[mod.__name__] = out
        print(json.dumps([res, pyddp.cuda.device_count() == 0]))
    """)
    res, no_gpu = got
    if not no_gpu:
        pytest.skip("CUDA sees a GPU here; torch's CPU build does not")
    ours, theirs = res["pyddp.cuda"], res["torch.cuda"]
    assert ours[:5] == theirs[:5] == [False, 0, False, None, None]
    for o, t in zip(ours[5:], theirs[5:]):
        if t[0] == "ok":
            assert o == t
        else:   # an exception of (a subclass of) torch's type, about CUDA
            assert t[0][0] in o[0], (o, t)
            assert "CUDA" in o[1] or "cuda" in o[1], o


def test_import_loads_no_cuda_library():
    got = _run("""
        import pyddp.distributed, pyddp.cuda.nccl
        def mapped():
            with open("/proc/self/maps") as f:
                maps = f.read()
            return ["libcudart" in maps, "libnccl" in maps]
        before = mapped()
        n = pyddp.cuda.device_count()
        print(json.dumps([before, pyddp.cuda.is_initialized(), n >= 0, mapped()[0]]))
    """)
    assert got[0] == [False, False] and got[1] is False and got[2]
    if CUDART_WHEEL is not None:
        assert got[3] is True


def test_cudawrap_abi_facts_match_the_real_headers():
    """csrc/cuda/cudawrap.h declares NCCL's and the CUDA runtime's types without their headers:
    every size, offset and enum value it assumes, against nccl.h and cuda_runtime_api.h where
    they are installed (the NVIDIA wheels of the cuda extra, a CUDA toolkit)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
    try:
        import abi_facts
    finally:
        sys.path.pop(0)
    dirs = abi_facts.include_dirs()
    missing = [h for h in ("nccl.h", "cuda_runtime_api.h", os.path.join("crt", "host_defines.h"))
               if abi_facts.find(h, dirs) is None]
    if missing or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip(f"no {', '.join(missing) or 'C compiler'} here (looked in {dirs})")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpu", "abi_facts.py")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ABI: every fact pyddp assumes matches the headers" in p.stdout
    assert "MISMATCH" not in p.stdout
