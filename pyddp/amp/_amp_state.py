"""The module-global state of pyddp.amp (apex keeps the same in ``apex.amp._amp_state``).

``initialize`` fills it; ``scale_loss``, ``state_dict`` and ``load_state_dict`` read it.  A new
``initialize`` call first undoes what the previous one switched on globally (the O1 autocast).
"""
from __future__ import annotations


class AmpState:
    """Holder of the process-wide amp state."""

    def __init__(self):
        self.hard_override = False
        self.allow_incoming_model_not_fp32 = False
        self.verbosity = 1
        self.min_loss_scale = None
        self.max_loss_scale = 2.0 ** 24
        self.loss_scalers = []
        self.handle = None
        # id(model fp16 parameter) -> its float32 master (amp O2), for model.state_dict() and
        # model.load_state_dict()
        self.masters = {}

    def reset(self):
        """Switch off what an earlier initialize() turned on (the O1 autocast) and forget it."""
        handle = self.handle
        if handle is not None:
            handle._deactivate()
        self.__init__()
        self.__dict__.pop("opt_properties", None)


_amp_state = AmpState()


def _rank0() -> bool:
    try:
        from .. import distributed as dist

        return not dist.is_initialized() or dist.get_rank() == 0
    except Exception:  # pragma: no cover - distributed unavailable
        return True


def maybe_print(msg, rank0=False):
    """apex's maybe_print: print when verbosity > 0 (with rank0=True only on rank 0 under DDP)."""
    if _amp_state.verbosity > 0:
        if rank0 and not _rank0():
            return
        print(msg)


def warn_or_err(msg):
    """apex's warn_or_err: a warning with hard_override=True, else RuntimeError."""
    if _amp_state.hard_override:
        print("Warning:  " + msg)
    else:
        raise RuntimeError(msg + "  If you're sure you know what you're doing, supply "
                           "hard_override=True to amp.initialize.")
