"""``pyddp.version``: torch.version's names as a CPU build answers them (``torch.version``).

``__version__`` is pyddp's version; ``cuda``, ``hip``, ``rocm`` and ``xpu`` are None (pyddp
compiles no GPU code: CUDA and NCCL are loaded at run time when present, see pyddp.cuda);
``git_version`` is the commit of the source tree when known (``"Unknown"`` otherwise, as torch
built outside git says); ``debug`` is False.
"""
import os as _os

__all__ = ["__version__", "cuda", "hip", "rocm", "xpu", "debug", "git_version"]

__version__ = "0.1.0"   # pyddp.__version__ (pyddp/__init__.py) is this string
cuda = None
hip = None
rocm = None
xpu = None
debug = False


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _git_version():
    """The commit checked out in the source tree pyddp runs from, read from .git's files (no git
    process at import); "Unknown" for an installed copy."""
    git = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), ".git")
    if _os.path.isfile(git):   # a worktree or submodule: "gitdir: <path>"
        line = _read(git) or ""
        git = line[len("gitdir:"):].strip() if line.startswith("gitdir:") else ""
    head = _read(_os.path.join(git, "HEAD")) if git else None
    if not head:
        return "Unknown"
    if not head.startswith("ref:"):
        return head
    ref = head[4:].strip()
    common = _read(_os.path.join(git, "commondir"))
    for d in (git, _os.path.join(git, common) if common else None):
        if d is None:
            continue
        sha = _read(_os.path.join(d, ref))
        if sha:
            return sha
        for line in (_read(_os.path.join(d, "packed-refs")) or "").splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    return "Unknown"


git_version = _git_version()
