"""apex.multi_tensor_apply: ``from apex.multi_tensor_apply import multi_tensor_applier`` ports as
``from pyddp.multi_tensor_apply import multi_tensor_applier``.

``multi_tensor_applier(op, noop_flag_buffer, tensor_lists, *args)`` calls
``op(chunk_size, noop_flag_buffer, tensor_lists, *args)`` as apex's does, for the ops of
``pyddp.amp_C`` (multi_tensor_scale, multi_tensor_axpby, multi_tensor_l2norm); an op that is not
one of them (apex's own amp_C kernels, which need CUDA) raises a TypeError naming the ones pyddp
has.  ``multi_tensor_applier.available`` is True (and ``MultiTensorApply.available``).
"""
from __future__ import annotations

__all__ = ["MultiTensorApply", "multi_tensor_applier"]


class MultiTensorApply:
    """apex's MultiTensorApply(chunk_size): a callable applying a multi-tensor op."""

    available = True
    warned = False

    def __init__(self, chunk_size):
        self.chunk_size = chunk_size

    def check_avail(self):
        """Nothing to check: pyddp's ops need no CUDA extension."""

    def __call__(self, op, noop_flag_buffer, tensor_lists, *args):
        from . import amp_C
        known = {getattr(amp_C, n) for n in amp_C.__all__}
        if op not in known:
            name = getattr(op, "__name__", type(op).__name__)
            raise TypeError(
                f"multi_tensor_applier: {name!r} is not one of pyddp.amp_C's ops "
                f"({', '.join(amp_C.__all__)}); apex's own amp_C kernels need its CUDA extension. "
                "Port `import amp_C` as `from pyddp import amp_C` (the fused optimizers: "
                "pyddp.optimizers.FusedAdam, FusedSGD, FusedLAMB)")
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
