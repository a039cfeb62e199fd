"""SyncBatchNorm for torch models: torch's algorithm, pyddp's collectives, torch's operations.

torch's ``SyncBatchNorm`` (torch/nn/modules/_functions.py) gathers every rank's per-channel
(mean, invstd, count), combines them with the counts (ranks may hold different batch sizes; a rank
with an empty batch takes part with a zero count), normalises with the group statistics, and in
backward all-reduces (sum dy, sum dy*(x - mean)). Its fused kernels (``torch.batch_norm_stats``,
``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt``, ``batch_norm_backward_reduce``,
``batch_norm_backward_elemt``) exist on CUDA only, so this module writes the same arithmetic with
torch's ordinary operations, in the accumulation dtype (float32 for float16/bfloat16 inputs): the
same code runs on CPU tensors (CI) and CUDA tensors. The statistics go through
``pyddp.distributed.all_gather_into_tensor`` and ``all_reduce`` on the input's device.

Only imported once a torch model is converted (``pyddp.nn.SyncBatchNorm.convert_sync_batchnorm``
or ``pyddp.nn.parallel.convert_syncbn_model`` given a torch.nn.Module).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import distributed as dist

__all__ = ["TorchSyncBatchNorm", "convert"]


def _acc_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


def _shape(x):
    """(1, C, 1, ...) for broadcasting a per-channel vector against x."""
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, group,
                world_size):
        input = input.contiguous()
        c = input.shape[1]
        n = input.numel() // c if c else 0
        if n == 1 and world_size < 2:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size {n}")
        acc = _acc_dtype(input.dtype)
        if input.numel() > 0:
            xa = input.to(acc)
            dims = _reduce_dims(input)
            mean = xa.mean(dims)
            var = (xa - mean.view(_shape(input))).square().mean(dims)  # biased, as torch's stats
            invstd = torch.rsqrt(var + eps)
            count = torch.full((1,), n, dtype=acc, device=input.device)
            combined = torch.cat([mean, invstd, count])
        else:
            combined = torch.zeros(2 * c + 1, dtype=acc, device=input.device)
        gathered = torch.empty(world_size * combined.numel(), dtype=acc, device=input.device)
        dist.all_gather_into_tensor(gathered, combined, group=group)
        gathered = gathered.view(world_size, 2 * c + 1)
        mean_all, invstd_all, count_all = torch.split(gathered, c, dim=1)
        mask = count_all.squeeze(-1) >= 1  # ranks with an empty batch do not count
        mean_all, invstd_all, count_all = mean_all[mask], invstd_all[mask], count_all[mask]
        counts = count_all.view(-1, 1)
        total = counts.sum()
        # the group's mean and biased variance from each rank's (mean, var, count)
        g_mean = (mean_all * counts).sum(0) / total
        var_all = invstd_all.reciprocal().square() - eps
        g_var = ((var_all + (mean_all - g_mean).square()) * counts).sum(0) / total
        g_invstd = torch.rsqrt(g_var + eps)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = g_var * (total / (total - 1)) if float(total) > 1 else g_var
                running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        ctx.save_for_backward(input, weight, g_mean, g_invstd, total.reshape(1))
        ctx.group = group
        if input.numel() == 0:
            return torch.empty_like(input)
        shape = _shape(input)
        out = (input.to(acc) - g_mean.view(shape)) * g_invstd.view(shape)
        if weight is not None:
            out = out * weight.to(acc).view(shape)
        if bias is not None:
            out = out + bias.to(acc).view(shape)
        return out.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, invstd, total = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], \
            ctx.needs_input_grad[2]
        c = input.shape[1]
        gx = gw = gb = None
        acc = mean.dtype
        if input.numel() > 0:
            grad_output = grad_output.contiguous()
            shape = _shape(input)
            dims = _reduce_dims(input)
            dy = grad_output.to(acc)
            xmu = input.to(acc) - mean.view(shape)
            sum_dy = dy.sum(dims)
            sum_dy_xmu = (dy * xmu).sum(dims)
            if weight is not None and need_w:
                gw = (sum_dy_xmu * invstd).to(weight.dtype)
            if weight is not None and need_b:
                gb = sum_dy.to(weight.dtype)
            if need_x:
                combined = torch.cat([sum_dy, sum_dy_xmu])
                dist.all_reduce(combined, op=dist.ReduceOp.SUM, group=ctx.group)
                sum_dy, sum_dy_xmu = torch.split(combined, c)
                mean_dy = (sum_dy / total).view(shape)
                mean_dy_xmu = (sum_dy_xmu / total).view(shape)
                inv = invstd.view(shape)
                scale = inv if weight is None else inv * weight.to(acc).view(shape)
                gx = ((dy - mean_dy - xmu * inv * inv * mean_dy_xmu) * scale).to(input.dtype)
        elif need_x:
            # an empty batch still takes part in the others' reduction
            dist.all_reduce(torch.zeros(2 * c, dtype=acc, device=input.device),
                            op=dist.ReduceOp.SUM, group=ctx.group)
        return gx, gw, gb, None, None, None, None, None, None


class TorchSyncBatchNorm(torch.nn.SyncBatchNorm):
    """torch.nn.SyncBatchNorm's module on pyddp's collectives (any device; ``isinstance(m,
    torch.nn.SyncBatchNorm)`` holds), with apex's extras: ``channel_last`` (channels in the last
    dimension), ``fuse_relu`` and the residual ``z`` of ``forward(input, z=None)``:
    ``relu(bn(input) + z)``."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None,
                 channel_last=False, fuse_relu=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, process_group,
                         device, dtype)
        self.channel_last = bool(channel_last)
        self.fuse_relu = bool(fuse_relu)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _bn(self, input):
        self._check_input_dim(input)
        if input.shape[1] == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.item())
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        running_mean = self.running_mean if not self.training or self.track_running_stats \
            else None
        running_var = self.running_var if not self.training or self.track_running_stats \
            else None
        world = 1
        if bn_training and self.training and dist.is_initialized():
            world = dist.get_world_size(self.process_group)
        if world <= 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                bn_training, factor, self.eps)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias, running_mean, running_var,
                                      self.eps, factor, self.process_group, world)

    def forward(self, input, z=None):
        last = self.channel_last and input.dim() > 2
        x = input.movedim(-1, 1) if last else input
        out = self._bn(x)
        if last:
            out = out.movedim(1, -1)
        if z is not None:
            if tuple(z.shape) != tuple(out.shape):
                raise ValueError(f"SyncBatchNorm: z must have the shape of the output "
                                 f"{list(out.shape)}, got {list(z.shape)}")
            out = out + z
        if self.fuse_relu:
            out = torch.relu(out)
        return out


def convert(module, process_group=None, channel_last=False, share=True):
    """Every torch BatchNorm*d of ``module`` replaced by TorchSyncBatchNorm. ``share``: the new
    layer takes the old one's Parameter and buffer objects (torch's convert_sync_batchnorm);
    otherwise apex's convert_syncbn_model: buffers shared, weight and bias values copied."""
    out = module
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and \
            not isinstance(module, TorchSyncBatchNorm):
        ref = module.weight if module.affine else module.running_mean
        out = TorchSyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                 module.track_running_stats, process_group,
                                 device=None if ref is None else ref.device,
                                 dtype=None if ref is None else ref.dtype,
                                 channel_last=channel_last)
        if module.affine:
            if share:
                out.weight = module.weight
                out.bias = module.bias
            else:
                with torch.no_grad():
                    out.weight.copy_(module.weight)
                    out.bias.copy_(module.bias)
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    for name, child in module.named_children():
        out.add_module(name, convert(child, process_group, channel_last, share))
    del module
    return out
