"""The shape of pyddp: the whole package is a stack of layers (LAYERS below: no module imports a
module of a higher layer) whose import graph has no circle; in pyddp.distributed no backend
reaches the API module (distributed_c10d), and a backend is one module implementing
backends.interface (the example of the backends package docstring, registered and run here).

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` counts,
at module level and inside functions alike (a function-level import is an arrow that only waits
for its first call).  ``from package import name`` points at ``package.name`` when that is a
module, else at ``package``.  Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``;
those implied arrows to parent packages are not drawn (a package importing its own modules would
otherwise always be a circle), as import-graph tools do not draw them.
"""
import ast
import functools
import os
import textwrap
from datetime import timedelta

import numpy as np
import pytest

import pyddp
import pyddp.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
API = "pyddp.distributed.distributed_c10d"
BACKENDS = "pyddp.distributed.backends"


def modules(root, package):
    """{module name: file} for every .py file (and extension module) of ``package`` under
    ``root``."""
    out = {}
    base = os.path.join(root, *package.split("."))
    for d, dirs, files in os.walk(base):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            if f.endswith((".so", ".pyd")):  # an extension module: a leaf (pyddp._C)
                stem = f.partition(".")[0]
            elif f.endswith(".py"):
                stem = f[:-3]
            else:
                continue
            rel = os.path.relpath(os.path.join(d, stem), root).split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join(rel)] = os.path.join(d, f)
    return out


@functools.lru_cache(maxsize=None)
def import_graph(root, package):
    """{module: set of modules of ``package`` it imports} (see the module docstring); read once per
    session (the callers do not change it)."""
    mods = modules(root, package)
    graph = {}
    for name, path in mods.items():
        if not path.endswith(".py"):
            graph[name] = set()
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_pkg = path.endswith("__init__.py")
        here = name if is_pkg else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = here.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:  # 'import a.b.c' of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def circles(graph):
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def reaches(graph, start, goal):
    """A path of imports from ``start`` to ``goal``, or None."""
    seen, todo = {start: None}, [start]
    while todo:
        v = todo.pop()
        for w in graph.get(v, ()):
            if w not in seen:
                seen[w] = v
                if w == goal:
                    path = [w]
                    while seen[path[-1]] is not None:
                        path.append(seen[path[-1]])
                    return path[::-1]
                todo.append(w)
    return None


# pyddp's layers, lowest first.  Each entry is a module name standing for that module and every
# module under it; a module is in the layer of its longest (most specific) entry, so a package's
# __init__ can sit above some of its own modules (pyddp.cuda, pyddp.nn, pyddp itself).
LAYERS = [
    ("core", [  # the extension, configuration, detection of other libraries, process lifecycle,
        # the array adapter, the C kernels' Python side, libcudart/libnccl loading, emulation
        "pyddp._C", "pyddp._config", "pyddp._detect", "pyddp._lifecycle", "pyddp._interop",
        "pyddp._kernels", "pyddp.backends", "pyddp.cuda._lib", "pyddp.cuda._emulation",
        "pyddp.cuda._pinned", "pyddp.cuda.nccl",
        # torch.version, and torch._dynamo / torch._inductor's switches (recorded, doing nothing)
        "pyddp.version", "pyddp._dynamo", "pyddp._inductor"]),
    ("devices", [  # torch.device, the CUDA runtime's questions, torch.accelerator
        "pyddp._device", "pyddp.cuda._runtime", "pyddp.cuda._stream", "pyddp.cuda.nvtx",
        "pyddp.accelerator"]),
    ("distributed", [  # process groups and collectives on arrays: no tensors, nn or optim
        "pyddp.distributed", "pyddp._threads"]),  # (_threads: the BLAS pools' share, logged
    # through distributed's observer; used by the cpu backend and the launchers)
    ("tensor", [  # pyddp.Tensor, its generator, the autograd graph and engine, autocast, and
        # pyddp.cuda's package (its legacy tensor types: torch.cuda.FloatTensor, ...)
        "pyddp._random", "pyddp._tensor", "pyddp.autograd._graph", "pyddp.autograd._engine",
        "pyddp._autocast", "pyddp.cuda"]),
    ("autograd", [  # torch.autograd's API over Tensor: Function, grad, gradcheck
        "pyddp.autograd"]),
    ("nn, optim", [  # modules (SyncBatchNorm included, which uses collectives), functional,
        # init, optimizers, schedulers, checkpoints
        "pyddp.nn", "pyddp.optim", "pyddp.optimizers", "pyddp.serialization"]),
    ("data", [  # Dataset, samplers (DistributedSampler), DataLoader, TensorBoard's writer
        "pyddp.utils", "pyddp.hub"]),  # (hub: torch.hub's checkpoint cache, beside model_zoo)
    ("parallel", [  # DataParallel, DistributedDataParallel (and apex's), ZeRO; pyddp.nn's
        # package, which serves nn.parallel as torch.nn does
        "pyddp.nn.parallel", "pyddp.distributed.optim", "pyddp.nn!", "pyddp.parallel"]),
    ("amp", [  # apex amp (which refuses models already wrapped in DDP), GradScaler, fp16_utils
        "pyddp.amp", "pyddp.cuda.amp", "pyddp.fp16_utils", "pyddp.amp_C",
        "pyddp.multi_tensor_apply"]),  # (amp_C, multi_tensor_apply: apex's multi-tensor ops)
    ("launchers", [  # processes: spawn, torchrun, elastic, notebooks; tools; the root package
        "pyddp._launcher", "pyddp.run", "pyddp.launch", "pyddp.multiprocessing",
        "pyddp.notebook", "pyddp._notebook_ranks", "pyddp.notebook_magics", "pyddp._rank_io",
        "pyddp._rank_mpl", "pyddp.elastic",
        "pyddp.torch_backend", "pyddp.tools", "pyddp!"]),
]


def layer_of(module, layers=None):
    """The index in ``layers`` (LAYERS) of ``module``'s layer: that of its longest entry; an entry
    ending in '!' stands for that module alone (and wins over the same name without it).  None
    when no entry covers it."""
    best, where = -1, None
    for i, (_, entries) in enumerate(layers or LAYERS):
        for e in entries:
            exact = e.endswith("!")
            e = e.rstrip("!")
            if module == e or (not exact and module.startswith(e + ".")):
                if len(e) + exact / 2 > best:   # 'm!' wins over 'm'
                    best, where = len(e) + exact / 2, i
    return where


def test_layers_cover_every_module_once():
    entries = [e for _, es in LAYERS for e in es]
    assert len(entries) == len(set(entries)), "an entry is listed twice"
    mods = modules(ROOT, "pyddp")
    assert all(e.rstrip("!") in mods for e in entries), \
        [e for e in entries if e.rstrip("!") not in mods]
    assert [m for m in sorted(mods) if layer_of(m) is None] == []


def test_no_module_imports_a_higher_layer():
    g = import_graph(ROOT, "pyddp")
    up = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})"
                for m, deps in g.items() for d in deps if layer_of(d) > layer_of(m))
    assert up == [], "imports of a higher layer:\n  " + "\n  ".join(up)


def test_no_import_circle_in_pyddp():
    bad = circles(import_graph(ROOT, "pyddp"))
    assert bad == [], "import circles (each a list of the modules it passes through): " + \
        "; ".join(" <-> ".join(c) for c in bad)


def test_the_layer_rule_reads_longest_entries():
    layers = [("low", ["p.a", "p.b.x", "p.d"]), ("high", ["p.b", "p!", "p.d!"])]
    assert [layer_of(m, layers) for m in ("p", "p.a", "p.a.y", "p.b", "p.b.x", "p.b.z", "p.c",
                                          "p.d", "p.d.e")] == [1, 0, 0, 1, 0, 1, None, 1, 0]


def test_the_graph_reader_sees_circles_and_function_level_imports(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (pkg / "c.py").write_text("import p.sub.b\nfrom p import a, _ext\n")
    (pkg / "_ext.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    g = import_graph(str(tmp_path), "p")
    assert g == {"p": {"p.a"}, "p.a": {"p.sub.b"}, "p.sub": set(), "p.sub.b": {"p.a"},
                 "p.c": {"p.sub.b", "p.a", "p._ext"}, "p._ext": set()}
    assert circles(g) == [["p.a", "p.sub.b"]]
    assert reaches(g, "p.c", "p.a") == ["p.c", "p.a"] and reaches(g, "p.a", "p.c") is None


def test_no_backend_reaches_the_api_module():
    g = import_graph(ROOT, "pyddp")
    backends = [m for m in g if m == BACKENDS or m.startswith(BACKENDS + ".")]
    assert {f"{BACKENDS}.{b}" for b in ("cpu", "nccl", "mpi", "interface", "registry",
                                        "staging")} <= set(backends)
    paths = {(b, up): reaches(g, b, up) for b in backends
             for up in (API, "pyddp.distributed.process_group", "pyddp.distributed")}
    assert {k: p for k, p in paths.items() if p} == {}


def test_the_torch_bridge_routes_through_process_group():
    """The torch bridge is a caller of ProcessGroup, as distributed_c10d is: it imports the group
    and the backends' interface, never the API module, and keeps no request path of its own
    (its methods end in ProcessGroup._submit; no call of a C group's submit or a backend's run)."""
    bridge = "pyddp.distributed.torch_bridge"
    g = import_graph(ROOT, "pyddp")
    assert "pyddp.distributed.process_group" in g[bridge + ".group"]
    assert reaches(g, bridge, API) is None
    assert not any(reaches(g, b, bridge) or reaches(g, b, bridge + ".group")
                   for b in g if b.startswith(BACKENDS))
    files = [p for m, p in modules(ROOT, "pyddp").items() if m == bridge or
             m.startswith(bridge + ".")]
    assert len(files) > 1  # a package: group, work, nccl
    trees = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            trees.append(ast.parse(f.read()))
    nodes = [n for tree in trees for n in ast.walk(tree)]
    calls = {n.func.attr for n in nodes
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "_submit" in calls and "submit" not in calls
    runs = [ast.unparse(n.func) for n in nodes if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "run"]
    assert runs == ["be.run"], runs  # only _TorchNccl.run, the group's 'cuda' backend, calls
    # the NCCL backend it wraps


def example_backend():
    """The code block of the backends package docstring (after 'the devices it serves::')."""
    doc = pyddp.distributed.backends.__doc__
    block = doc.split("the devices it serves::\n", 1)[1].split("\nafter which", 1)[0]
    return textwrap.dedent(block).strip()


def test_example_backend_registers_and_runs(tmp_path, monkeypatch):
    from pyddp.distributed.backends import registry

    body = example_backend()
    assert body.startswith("import numpy as np") and "class Solo(Backend):" in body
    # the docs' architecture page shows the same code
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        assert body in f.read()
    saved = dict(registry._registry)
    (tmp_path / "solo_backend.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import solo_backend  # noqa: F401  (registers 'solo')

        dist.init_process_group("solo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=30))
        try:
            assert dist.get_backend() == "solo" and dist.is_backend_available("solo")
            a = np.arange(4.0)
            dist.all_reduce(a)
            assert dist.all_reduce(a, async_op=True).wait(timedelta(seconds=30))
            out = [np.zeros(4)]
            dist.all_gather(out, a)
            assert np.array_equal(out[0], np.arange(4.0))
            big = np.zeros(4)
            dist.all_gather_into_tensor(big, a)
            assert np.array_equal(big, a)
            dist.broadcast(a, 0)
            dist.barrier()
            got = [None]
            dist.all_gather_object(got, {"rank": 0})
            assert got == [{"rank": 0}]
        finally:
            dist.destroy_process_group()
        with pytest.raises(ValueError, match="one rank"):
            dist.init_process_group("solo", store=dist.HashStore(), rank=0, world_size=2)
        assert not dist.is_initialized()
    finally:
        registry._registry.clear()
        registry._registry.update(saved)
        import sys
        sys.modules.pop("solo_backend", None)
