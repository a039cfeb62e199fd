"""Type information and docstrings: the py.typed marker ships as package data, pyddp/_C.pyi
declares exactly what the built extension exports (and the methods of its types), and every public
function, class and method of pyddp has a docstring."""
import ast
import importlib
import inspect
import os
import pkgutil
import sys

import pytest

import pyddp
import pyddp._C as C

PKG = os.path.dirname(os.path.abspath(pyddp.__file__))
ROOT = os.path.dirname(PKG)


def _stub():
    return ast.parse(open(os.path.join(PKG, "_C.pyi"), encoding="utf-8").read())


def _public(name):
    return not name.startswith("_")


def test_py_typed_is_package_data():
    assert os.path.exists(os.path.join(PKG, "py.typed"))
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        conf = tomllib.load(f)
    data = conf["tool"]["setuptools"]["package-data"]["pyddp"]
    assert "py.typed" in data and "_C.pyi" in data


def test_stub_declares_every_export():
    tree = _stub()
    declared = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared[node.target.id] = node
    exported = {n for n in dir(C) if not n.startswith("__")}
    # private stub names (_Store: the methods the store types share) are not exports
    assert exported <= set(declared), sorted(exported - set(declared))
    assert {n for n in declared if not n.startswith("_")} <= exported
    for name in exported:
        obj = getattr(C, name)
        node = declared[name]
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            assert isinstance(node, ast.ClassDef), name
            members = {b.name for b in node.body if isinstance(b, ast.FunctionDef)}
            for base in node.bases:  # the members of _Store count for the stores
                if isinstance(base, ast.Name) and base.id in declared:
                    members |= {b.name for b in declared[base.id].body
                                if isinstance(b, ast.FunctionDef)}
                    members |= {b.target.id for b in declared[base.id].body
                                if isinstance(b, ast.AnnAssign)}
            members |= {b.target.id for b in node.body if isinstance(b, ast.AnnAssign)}
            real = {m for m in vars(obj) if _public(m)}
            assert real <= members, (name, sorted(real - members))
        elif callable(obj) and not isinstance(obj, type):
            assert isinstance(node, ast.FunctionDef), name
            # every keyword the C function's docstring names is in the stub's signature
            params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            sig = (obj.__doc__ or "").split("\n", 1)[0]
            if sig.startswith(name + "("):
                named = [p.strip().split("=")[0] for p in sig[len(name) + 1:].split(")")[0].split(",")
                         if p.strip()]
                assert named == params, (name, named, params)


# Packages a public module may need that pyddp does not (pyddp.torch_backend imports torch): without
# them that module is left out here, and checked where they are installed (CI's second environment).
_OPTIONAL = {"torch", "mpi4py", "cupy", "jax", "jaxlib"}


def _walk_public():
    seen = set()
    for info in pkgutil.walk_packages(pyddp.__path__, "pyddp."):
        if any(p.startswith("_") for p in info.name.split(".")[1:]):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError as e:
            if (e.name or "").partition(".")[0] in _OPTIONAL:
                continue
            raise
        yield mod, seen
    yield pyddp, seen


def test_every_public_function_has_a_docstring():
    missing = []
    for mod, seen in _walk_public():
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if _public(n)]
        for n in names:
            obj = getattr(mod, n, None)
            if obj is None or inspect.ismodule(obj) or id(obj) in seen:
                continue
            if not (getattr(obj, "__module__", "") or "").startswith("pyddp"):
                continue
            seen.add(id(obj))
            if inspect.isclass(obj):
                if not (obj.__doc__ or "").strip():
                    missing.append(f"{obj.__module__}.{obj.__qualname__}")
                for mn, m in vars(obj).items():
                    if not _public(mn):
                        continue
                    f = m.fget if isinstance(m, property) else getattr(m, "__func__", m)
                    if (inspect.isfunction(f) or isinstance(m, property)) and \
                            not inspect.getdoc(getattr(obj, mn, None)):
                        missing.append(f"{obj.__module__}.{obj.__qualname__}.{mn}")
            elif (inspect.isfunction(obj) or inspect.isbuiltin(obj)) and not (obj.__doc__ or "").strip():
                missing.append(f"{obj.__module__}.{n}")
    assert not missing, "public objects without a docstring:\n" + "\n".join(sorted(missing))
