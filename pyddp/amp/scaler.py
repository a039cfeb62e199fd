"""apex's LossScaler: dynamic (or static) loss scaling with a fused unscale + overflow check.

Dynamic: the scale starts at ``min(max_loss_scale, 2**16)``; an overflow halves it (not below
``min_loss_scale``) and skips the step; after ``scale_window`` (2000) clean steps in a row it
doubles (not above ``max_loss_scale``).  A static scale never changes and never skips (as apex).
"""
from __future__ import annotations

import numpy as np

from .. import _kernels
from . import _fw


class LossScaler:
    """One loss scaler (``amp.initialize(num_losses=n)`` makes n of them)."""

    def __init__(self, loss_scale, init_scale=2.0 ** 16, scale_factor=2.0, scale_window=2000,
                 min_loss_scale=None, max_loss_scale=2.0 ** 24):
        if loss_scale == "dynamic":
            self.dynamic = True
            self._loss_scale = min(max_loss_scale, init_scale)
        else:
            self.dynamic = False
            self._loss_scale = loss_scale
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_seq_len = scale_window
        self._scale_factor = scale_factor
        self._unskipped = 0
        self._has_overflow = False
        self._overflow_buf = np.zeros(1, dtype=np.float32)
        self._found = {}  # torch gradients: device -> one-element float32 flag on that device
        self._device = None  # the GPU whose flags were last seen (the found-inf allreduce goes there)

    def loss_scale(self):
        """The current scale (a Python float)."""
        return self._loss_scale

    def clear_overflow_state(self):
        """Forget any overflow seen so far (called before unscaling a new backward)."""
        self._has_overflow = False
        self._overflow_buf[0] = 0.0
        self._found = {}

    def unscale(self, grads, scale):
        """Multiply every array in ``grads`` by ``1/scale`` in place and record inf/NaN, in one
        pass: pyddp._C.amp_unscale_ for host arrays, torch's fused kernel per device and dtype for
        torch gradients (the flag then stays on the device until read).  ``scale == 1.0`` only
        checks."""
        if not grads:
            return
        if _fw.is_torch(grads[0]):
            # torch's fused kernel on the gradients' device (CPU tensors in CI, CUDA on a GPU)
            _fw.torch_unscale_(grads, self._found, 1.0 / float(scale))
            self._device = next((d for d in self._found if d.type != "cpu"), self._device)
            return
        _kernels.unscale_(grads, self._overflow_buf, 1.0 / float(scale))

    def _fold_found(self):
        """Fold the torch per-device flags into the host flag (reads them: one sync per device)."""
        if self._found:
            if any(float(f.item()) != 0.0 for f in self._found.values()):
                self._overflow_buf[0] = 1.0
            self._found = {}

    def has_overflow(self) -> bool:
        """Whether an inf/NaN was seen since clear_overflow_state()."""
        self._fold_found()
        return self._has_overflow or bool(self._overflow_buf[0] != 0.0)

    def update_scale(self) -> bool:
        """apex's update_scale: returns True when the coming step must be skipped."""
        self._fold_found()
        if self.dynamic and not self._has_overflow:
            self._has_overflow = bool(self._overflow_buf[0] != 0.0)
        if self._has_overflow and self.dynamic:
            should_skip = True
            if self._min_loss_scale:
                self._loss_scale = max(self._min_loss_scale, self._loss_scale / 2.0)
            else:
                self._loss_scale = self._loss_scale / 2.0
            self._unskipped = 0
        else:
            should_skip = False
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len and self.dynamic:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return should_skip
