"""Whether backend 'mpi' can run here (mpi4py looked up, not imported), and what to install when
not: shared by the package (the registry's entry) and the implementation (backend.py)."""
from __future__ import annotations

import importlib.util
import sys

INSTALL_HINT = ("install mpi4py (pip install 'pyddp[mpi]', or pip install mpi4py) where an MPI is "
                "installed: Open MPI (Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin) or "
                "MPICH; mpi4py builds against the MPI whose mpicc is on the PATH")


def available() -> bool:
    """Whether mpi4py is installed (looked up, not imported)."""
    mod = sys.modules.get("mpi4py", False)
    if mod is not False:
        return mod is not None  # None: imports of it are blocked
    try:
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


def reason() -> str:
    """Why backend 'mpi' is not available: mpi4py is missing."""
    return f"backend 'mpi' needs mpi4py, which is not installed: {INSTALL_HINT}"
