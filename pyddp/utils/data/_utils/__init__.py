"""torch.utils.data._utils's layout: ``collate`` (default_collate, default_convert, collate and
the per-type functions of ``default_collate_fn_map``), and ``python_exit_status``."""
import atexit
import multiprocessing.util  # noqa: F401  (its exit hook is registered first, so ours runs first)

from . import collate  # noqa: F401

python_exit_status = False
"""Whether Python is exiting (torch's flag, set by an atexit hook).  A DataLoader iterator freed
after this (a global, or a local of a frame the uncaught exception's traceback keeps, freed as the
interpreter finalises) must not shut its workers down through its queues: a put may start a queue
feeder thread, and a thread started while the interpreter finalises never runs, so Thread.start
waits for it forever.  The workers are daemonic: multiprocessing's exit hook terminates them."""


def _set_python_exit_flag() -> None:
    global python_exit_status
    python_exit_status = True


atexit.register(_set_python_exit_flag)
