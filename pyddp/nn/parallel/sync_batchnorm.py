"""apex.parallel's SyncBatchNorm and convert_syncbn_model (the target of apex's porting row).

``pyddp.nn.parallel.SyncBatchNorm`` is pyddp.nn.SyncBatchNorm (statistics over the whole process
group, exact also when ranks hold different batch sizes) with apex's constructor and forward:
``channel_last`` (channels in the last dimension), ``fuse_relu`` and the residual ``z`` of
``forward(input, z=None)``: ``relu(bn(input) + z)``.
"""
from __future__ import annotations

from ..modules.batchnorm import SyncBatchNorm as _TorchSyncBatchNorm
from ..modules.batchnorm import _BatchNorm
from ..modules.module import Module
from ..._tensor import Tensor

__all__ = ["SyncBatchNorm", "convert_syncbn_model"]


class SyncBatchNorm(_TorchSyncBatchNorm):
    """apex.parallel.SyncBatchNorm on pyddp: ``SyncBatchNorm(num_features, eps=1e-5,
    momentum=0.1, affine=True, track_running_stats=True, process_group=None,
    channel_last=False, fuse_relu=False)``."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, channel_last=False,
                 fuse_relu=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         process_group)
        self.channel_last = bool(channel_last)
        self.fuse_relu = bool(fuse_relu)

    def _specify_process_group(self, process_group):
        self.process_group = process_group

    def _specify_channel_last(self, channel_last):
        self.channel_last = channel_last

    def forward(self, input, z=None):
        """Batch norm with group-wide statistics (training); then ``+ z`` and ReLU when asked."""
        if not isinstance(input, Tensor):
            raise TypeError(f"SyncBatchNorm: input must be a pyddp Tensor, got "
                            f"{type(input).__name__}")
        last = self.channel_last and input.ndim > 2
        # (N, *spatial, C) -> (N, C, *spatial), keeping the spatial order
        x = input.permute(0, input.ndim - 1, *range(1, input.ndim - 1)) if last else input
        out = super().forward(x)
        if last:
            out = out.permute(0, *range(2, input.ndim), 1)
        if z is not None:
            if tuple(z.shape) != tuple(out.shape):
                raise ValueError(f"SyncBatchNorm: z must have the shape of the output "
                                 f"{list(out.shape)}, got {list(z.shape)}")
            out = out + z
        if self.fuse_relu:
            out = out.relu()
        return out


def convert_syncbn_model(module, process_group=None, channel_last=False):
    """Replace every BatchNorm layer of ``module`` by apex's SyncBatchNorm (as apex does: running
    statistics shared, weight and bias copied into the new layer); returns the converted module.
    A torch.nn.Module gets pyddp's torch SyncBatchNorm layers (torch's algorithm on pyddp's
    collectives, on the module's device; ``channel_last`` as apex's)."""
    from ..._detect import is_torch_module

    if is_torch_module(module):
        from ..modules import _torch_syncbn

        return _torch_syncbn.convert(module, process_group, channel_last, share=False)
    if not isinstance(module, Module):
        raise TypeError(f"convert_syncbn_model: module must be a pyddp.nn.Module or a "
                        f"torch.nn.Module, got {type(module).__name__}")
    mod = module
    if isinstance(module, _BatchNorm):
        mod = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group, channel_last=channel_last)
        mod.running_mean = module.running_mean
        mod.running_var = module.running_var
        mod.num_batches_tracked = module.num_batches_tracked
        if module.affine:
            mod.weight._data[...] = module.weight._data
            if module.bias is not None:
                mod.bias._data[...] = module.bias._data
            else:
                mod.bias = None
        mod.training = module.training
    for name, child in module.named_children():
        mod.add_module(name, convert_syncbn_model(child, process_group=process_group,
                                                  channel_last=channel_last))
    return mod


def create_syncbn_process_group(group_size):
    """apex.parallel.create_syncbn_process_group: split the world into consecutive groups of
    ``group_size`` ranks for SyncBatchNorm and return the one this rank is in.

    Every rank creates every group (new_group is collective), as in apex.  ``group_size`` 0 means
    the whole world and returns None (SyncBatchNorm's default group); it must divide the world
    size (AssertionError otherwise, as apex's asserts)."""
    from ...distributed import distributed_c10d as dist

    if group_size == 0:
        return None
    world_size = dist.get_world_size()
    assert world_size >= group_size, \
        f"create_syncbn_process_group: group_size {group_size} > world size {world_size}"
    assert world_size % group_size == 0, \
        f"create_syncbn_process_group: group_size {group_size} does not divide world size " \
        f"{world_size}"
    group = None
    rank = dist.get_rank()
    for group_num in range(world_size // group_size):
        ranks = list(range(group_num * group_size, (group_num + 1) * group_size))
        cur = dist.new_group(ranks=ranks)
        if rank // group_size == group_num:
            group = cur   # every rank still creates every group
    assert group is not None
    return group
