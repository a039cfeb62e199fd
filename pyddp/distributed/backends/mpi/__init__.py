"""Backend "mpi": pyddp's collectives through the site's MPI, by way of mpi4py (backend.py, see its
docstring: the backend object, its signature check and small-call path; kinds.py: each collective
kind as MPI calls; work.py: nonblocking work and bounded polling; library.py: loading MPI, the
dtype and op tables, the rendezvous hooks).  This module registers it, with the rendezvous hook
that takes MPI's ranks, and answers whether it is available without importing mpi4py or the
implementation.
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
        from . import library

        return library.world_rank_size(rank, world_size)

    @staticmethod
    def prepare_env(environ):
        from . import library

        library.rendezvous_env(environ)


register(BackendEntry("mpi", ("cpu", "cuda"), create, available=lambda: available(),
                      reason=lambda: reason(), rendezvous=_Rendezvous(),
                      needs="mpi4py built against the site's MPI (pip install 'pyddp[mpi]')"))
