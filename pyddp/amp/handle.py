"""amp.scale_loss and the O1 autocast switch (apex's handle.py)."""
from __future__ import annotations

import contextlib

import numpy as np

from . import _fw
from ._amp_state import _amp_state

__all__ = ["scale_loss", "disable_casts", "AmpHandle"]


class AmpHandle:
    """O1's process-wide casts: pyddp's autocast (float16) and, for torch models, torch's CPU
    autocast (float16), switched on by initialize as apex patches torch functions globally."""

    def __init__(self, loss_scale="dynamic", pyddp=True, torch=False, verbose=False,
                 torch_devices=("cpu",)):
        self._pyddp = pyddp
        self._torch = torch
        # torch's autocast per device type of the models ("cuda": float16 as apex's O1)
        self._torch_devices = tuple(torch_devices) or ("cpu",)
        self._verbose = verbose
        self._prev = None
        self._active = False

    def _activate(self):
        """Switch the casts on (remembering what was active before)."""
        from .._tensor._dtypes import float16
        from .._tensor._grad_mode import _st

        if self._active:
            return
        self._prev = (_st.autocast, None)
        if self._pyddp:
            _st.autocast = float16
        if self._torch:
            import torch

            self._prev = (self._prev[0], [(d, torch.is_autocast_enabled(d),
                                           torch.get_autocast_dtype(d))
                                          for d in self._torch_devices])
            for d in self._torch_devices:
                torch.set_autocast_dtype(d, torch.float16)
                torch.set_autocast_enabled(d, True)
        self._active = True

    def _deactivate(self):
        """Restore the autocast state from before _activate()."""
        from .._tensor._grad_mode import _st

        if not self._active:
            return
        if self._pyddp:
            _st.autocast = self._prev[0]
        if self._torch and self._prev[1] is not None:
            import torch

            for d, enabled, dtype in self._prev[1]:
                torch.set_autocast_enabled(d, enabled)
                torch.set_autocast_dtype(d, dtype)
            torch.clear_autocast_cache()
        self._active = False

    @property
    def is_active(self):
        """Whether the O1 casts are on."""
        return self._active

    def _clear_cache(self):
        """Drop torch's autocast weight-cast cache (after each scale_loss, as apex)."""
        if self._torch:
            import torch

            torch.clear_autocast_cache()


@contextlib.contextmanager
def disable_casts():
    """Turn O1's casts off inside the block (apex.amp.disable_casts)."""
    handle = _amp_state.handle
    if handle is None or not handle.is_active:
        yield
        return
    handle._deactivate()
    try:
        yield
    finally:
        handle._activate()


def _sync_overflow(scaler):
    """Under DistributedDataParallel make the skip decision the same on every rank: MAX-allreduce
    the found-inf flag when a process group with more than one rank is initialised."""
    from .. import distributed as dist

    if not dist.is_initialized() or dist.get_world_size() <= 1:
        return
    found = scaler._found
    # a rank without gradients this time still reduces where the others do (its model's GPU)
    dev = next((d for d in found if d.type != "cpu"), scaler._device)
    if dev is not None:
        # torch gradients on a GPU: the flags are combined and agreed on the device (the nccl
        # backend takes device memory), then read once
        import torch

        flag = torch.stack([f.to(dev) for f in found.values()]).amax().reshape(1) if found else \
            torch.zeros(1, dtype=torch.float32, device=dev)
        if scaler._has_overflow or scaler._overflow_buf[0] != 0.0:
            flag.fill_(1.0)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        scaler._found = {dev: flag}
        value = float(flag.item())
    else:
        flag = np.array([1.0 if scaler.has_overflow() else 0.0], dtype=np.float32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        value = float(flag[0])
    scaler._found = {}
    scaler._overflow_buf[0] = value
    scaler._has_overflow = value != 0.0


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False,
               delay_overflow_check=False):
    """``with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()``.

    Yields ``loss.float() * loss_scale``.  On exit (unless ``delay_unscale``) every gradient of
    the optimizers' parameters is multiplied by ``1/loss_scale`` and checked for inf/NaN in the
    same pass (into the float32 master gradients under O2): pyddp's C kernel for host arrays,
    torch's ``_amp_foreach_non_finite_check_and_unscale_`` on torch gradients, where they are.  On an overflow with dynamic
    scaling the scale halves and the next ``optimizer.step()`` of each optimizer is skipped
    once, printing apex's "Gradient overflow.  Skipping step, ..." (on rank 0 only).  Under
    DistributedDataParallel the found-inf flag is MAX-allreduced so every rank decides the same
    (on the GPU for CUDA gradients).
    Without amp enabled it yields the loss unchanged.
    """
    if not hasattr(_amp_state, "opt_properties"):
        raise RuntimeError("Invoked 'with amp.scale_loss`, but internal Amp state has not been "
                           "initialized.  model, optimizer = amp.initialize(model, optimizer, "
                           "opt_level=...) must be called before `with amp.scale_loss`.")
    if not _amp_state.opt_properties.enabled:
        yield loss
        return

    if _fw.is_optimizer(optimizers):
        optimizers = [optimizers]
    else:
        optimizers = list(optimizers)
    for opt in optimizers:
        if not hasattr(opt, "_amp_stash"):
            raise RuntimeError("scale_loss was given an optimizer that did not go through "
                               "amp.initialize.")

    loss_scaler = _amp_state.loss_scalers[loss_id]
    loss_scale = loss_scaler.loss_scale()

    if (not _amp_state.opt_properties.master_weights and not loss_scaler.dynamic
            and loss_scale == 1.0):
        yield loss.float()
        if _amp_state.opt_properties.patch_torch_functions and _amp_state.handle is not None:
            _amp_state.handle._clear_cache()
        return

    if not delay_unscale:
        for optimizer in optimizers:
            if not optimizer._amp_stash.params_have_scaled_gradients:
                optimizer._prepare_amp_backward()

    # inf/NaN from the scaled backward are expected: the scaler finds them and skips the step,
    # so NumPy's overflow warnings are silenced inside the block
    with np.errstate(over="ignore", invalid="ignore"):
        yield loss.float() * loss_scale

    if delay_unscale:
        for optimizer in optimizers:
            optimizer._amp_stash.params_have_scaled_gradients = True
    else:
        loss_scaler.clear_overflow_state()
        for optimizer in optimizers:
            optimizer._post_amp_backward(loss_scaler)
            optimizer._amp_stash.params_have_scaled_gradients = False
        if loss_scaler.dynamic and not delay_overflow_check:
            _sync_overflow(loss_scaler)
        should_skip = False if delay_overflow_check else loss_scaler.update_scale()
        if should_skip:
            for optimizer in optimizers:
                optimizer._amp_stash.skip_next = (loss_id, loss_scaler)
    if _amp_state.opt_properties.patch_torch_functions and _amp_state.handle is not None:
        _amp_state.handle._clear_cache()
