"""Backend "mpi": pyddp's collectives through the site's MPI, by way of mpi4py (backend.py; see
its docstring).  This module registers it, with the rendezvous hook that takes MPI's ranks, and
answers whether it is available without importing mpi4py or the implementation.
"""
from __future__ import annotations

from ..registry import BackendEntry, register
from ._probe import INSTALL_HINT, available, reason  # noqa: F401  (the registry calls these names)

__all__ = ["available", "reason", "create"]


def create(opts):
    """The factory registered for backend 'mpi' (loads MPI)."""
    from . import backend

    return backend.create(opts)


class _Rendezvous:
    """Backend 'mpi''s rendezvous hook (backends.interface.Rendezvous): the ranks are MPI's."""

    @staticmethod
    def world(rank, world_size):
        from . import backend

        return backend.world_rank_size(rank, world_size)

    @staticmethod
    def prepare_env(environ):
        from . import backend

        backend.rendezvous_env(environ)


register(BackendEntry("mpi", ("cpu", "cuda"), create, available=lambda: available(),
                      reason=lambda: reason(), rendezvous=_Rendezvous(),
                      needs="mpi4py built against the site's MPI (pip install 'pyddp[mpi]')"))
