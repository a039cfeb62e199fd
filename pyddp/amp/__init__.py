"""pyddp.amp: apex.amp's mixed-precision API (initialize, scale_loss, state_dict, ...) and
torch.amp's GradScaler and autocast, for pyddp.nn and torch models on the CPU.

    from pyddp import amp
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()

See pyddp/amp/frontend.py for the opt-level table and docs/amp.md.
"""
from .._autocast import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: F401
from .frontend import initialize, load_state_dict, master_params, state_dict  # noqa: F401
from .grad_scaler import GradScaler, OptState  # noqa: F401
from .handle import disable_casts, scale_loss  # noqa: F401
from .scaler import LossScaler  # noqa: F401

__all__ = ["initialize", "scale_loss", "state_dict", "load_state_dict", "master_params",
           "disable_casts", "GradScaler", "autocast", "LossScaler"]
