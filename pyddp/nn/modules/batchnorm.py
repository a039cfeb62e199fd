"""BatchNorm1d, BatchNorm2d, BatchNorm3d and SyncBatchNorm (torch.nn.BatchNorm*)."""
import numpy as np

from ...autograd.function import Function
from .. import functional as F
from .._argcheck import quiet
from .. import init
from .module import Module
from ..._tensor import Tensor
from .utils import _buffer, _empty_parameter, _factory_dtype

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"]


class _NormBase(Module):
    """Common state of the batch norms: affine weight/bias, running statistics, batch counter."""

    _version = 2
    __constants__ = ["track_running_stats", "momentum", "eps", "num_features", "affine"]

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, *, bias=True):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if self.affine:
            self.weight = _empty_parameter((num_features,), dtype)
            if bias:
                self.bias = _empty_parameter((num_features,), dtype)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            dt = _factory_dtype(dtype)
            self.register_buffer("running_mean", _buffer(np.zeros(num_features, dtype=dt)))
            self.register_buffer("running_var", _buffer(np.ones(num_features, dtype=dt)))
            self.register_buffer("num_batches_tracked", _buffer(np.array(0, dtype=np.int64)))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self):
        """Running mean 0, running variance 1, batch counter 0 (in place)."""
        if self.track_running_stats:
            self.running_mean._data[...] = 0
            self.running_var._data[...] = 1
            self.num_batches_tracked._data[...] = 0

    def reset_parameters(self):
        """Reset the running statistics, weight to ones and bias to zeros."""
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def _check_input_dim(self, input):
        raise NotImplementedError

    def extra_repr(self):
        """The constructor arguments shown in the repr (as torch)."""
        return ("{num_features}, eps={eps}, momentum={momentum}, affine={affine}, "
                "bias={use_bias}, track_running_stats={track_running_stats}".format(
                    **self.__dict__, use_bias=self.bias is not None))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        version = local_metadata.get("version", None)
        if (version is None or version < 2) and self.track_running_stats:
            # Checkpoints from before the batch counter existed (or without metadata) load with it.
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                state_dict[key] = (self.num_batches_tracked if self.num_batches_tracked is not None
                                   else _buffer(np.array(0, dtype=np.int64)))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs)


class _BatchNorm(_NormBase):
    def forward(self, input):
        """Normalise with batch statistics (training) or running statistics (eval)."""
        self._check_input_dim(input)
        exponential_average_factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            if self.num_batches_tracked is not None:
                self.num_batches_tracked._data += 1
                if self.momentum is None:  # cumulative moving average
                    exponential_average_factor = 1.0 / float(self.num_batches_tracked._data)
                else:
                    exponential_average_factor = self.momentum
        if self.training:
            bn_training = True
        else:
            bn_training = (self.running_mean is None) and (self.running_var is None)
        use_running = not self.training or self.track_running_stats
        return F.batch_norm(
            input,
            self.running_mean if use_running else None,
            self.running_var if use_running else None,
            self.weight, self.bias, bn_training, exponential_average_factor, self.eps)


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over (N, C) or (N, C, L) input, as ``torch.nn.BatchNorm1d``.

    ``bias=False`` (keyword) drops the shift.  In training the running statistics are
    updated in place with ``momentum`` (cumulative average when ``momentum=None``) using the
    unbiased batch variance.
    """

    def _check_input_dim(self, input):
        nd = len(input.shape)
        if nd != 2 and nd != 3:
            raise ValueError(f"expected 2D or 3D input (got {nd}D input)")


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over (N, C, H, W) input, as ``torch.nn.BatchNorm2d``."""

    def _check_input_dim(self, input):
        nd = len(input.shape)
        if nd != 4:
            raise ValueError(f"expected 4D input (got {nd}D input)")


class BatchNorm3d(_BatchNorm):
    """Batch normalisation over (N, C, D, H, W) input, as ``torch.nn.BatchNorm3d``."""

    def _check_input_dim(self, input):
        nd = len(input.shape)
        if nd != 5:
            raise ValueError(f"expected 5D input (got {nd}D input)")


class _SyncBatchNormFunction(Function):
    """Batch norm whose statistics (forward) and gradient sums (backward) are all-reduced.

    Forward: one all_reduce of [count, sum, sum of squares] per channel (float64), so ranks
    may hold different batch sizes.  Backward: one all_reduce of [sum(dy), sum(dy * xhat)]
    when the input needs a gradient; the weight/bias gradients stay local (DDP averages them),
    as in torch.
    """

    @staticmethod
    @quiet   # inf / NaN statistics computed silently, as torch's (pyddp/nn/_argcheck.py)
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, group):
        from ... import distributed as dist
        x = input._data
        wdt = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
        C = x.shape[1]
        axes = (0,) + tuple(range(2, x.ndim))
        bshape = (1, C) + (1,) * (x.ndim - 2)
        x64 = x.astype(np.float64)
        buf = np.empty(2 * C + 1, dtype=np.float64)
        buf[0] = x.size // C
        buf[1:C + 1] = x64.sum(axis=axes)
        buf[C + 1:] = np.square(x64).sum(axis=axes)
        dist.all_reduce(buf, group=group)
        n = buf[0]
        if n <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got input "
                             f"size {list(x.shape)} and a total of {int(n)} values per channel")
        mean = buf[1:C + 1] / n
        var = np.maximum(buf[C + 1:] / n - mean * mean, 0.0)
        invstd = 1.0 / np.sqrt(var + eps)
        if running_mean is not None:
            rm = running_mean._data
            rm *= (1 - momentum)
            rm += (momentum * mean).astype(rm.dtype)
        if running_var is not None:
            rv = running_var._data
            rv *= (1 - momentum)
            rv += (momentum * var * (n / (n - 1))).astype(rv.dtype)
        xhat = ((x64 - mean.reshape(bshape)) * invstd.reshape(bshape)).astype(wdt)
        w = None if weight is None else weight._data.astype(wdt, copy=False).reshape(bshape)
        out = xhat * w if w is not None else xhat.copy()
        if bias is not None:
            out += bias._data.astype(wdt, copy=False).reshape(bshape)
        ctx.saved = (xhat, invstd.astype(wdt).reshape(bshape), w, n, axes, group, wdt)
        return Tensor(out.astype(x.dtype, copy=False))

    @staticmethod
    def backward(ctx, grad):
        from ... import distributed as dist
        xhat, invstd, w, n, axes, group, wdt = ctx.saved
        g = grad._data.astype(wdt, copy=False)
        sum_dy = g.sum(axis=axes)
        sum_dy_xhat = (g * xhat).sum(axis=axes)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            C = sum_dy.shape[0]
            buf = np.concatenate([sum_dy, sum_dy_xhat]).astype(np.float64)
            dist.all_reduce(buf, group=group)
            shape = (1, C) + (1,) * (g.ndim - 2)
            mean_dy = (buf[:C] / n).astype(wdt).reshape(shape)
            mean_dy_xhat = (buf[C:] / n).astype(wdt).reshape(shape)
            scale = invstd * w if w is not None else invstd
            gx = (g - mean_dy - xhat * mean_dy_xhat) * scale
        if ctx.needs_input_grad[1]:
            gw = sum_dy_xhat
        if ctx.needs_input_grad[2]:
            gb = sum_dy
        return gx, gw, gb, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation with statistics over the whole process group (torch.nn.SyncBatchNorm).

    In training, with a process group of more than one rank initialised, the per-channel mean
    and variance are those of the union of every rank's batch (batch sizes may differ); the
    gradient with respect to the input is exact for that union.  Otherwise (eval mode, no
    process group, one rank) it is plain batch norm.  Use :meth:`convert_sync_batchnorm` to
    swap the BatchNorm layers of a model before wrapping it in DistributedDataParallel.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None, *,
                 bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype, bias=bias)
        self.process_group = process_group

    def _check_input_dim(self, input):
        if not isinstance(input, Tensor):   # torch's TypeError, not an AttributeError below
            raise TypeError("batch_norm(): argument 'input' (position 1) must be Tensor, not "
                            f"{type(input).__module__}.{type(input).__qualname__}")
        nd = len(input.shape)
        if nd < 2:
            raise ValueError(f"expected at least 2D input (got {nd}D input)")

    def forward(self, input):
        """Normalise ``input`` (N, C, ...) with group-wide batch statistics when training."""
        self._check_input_dim(input)
        if input.shape[1] == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        exponential_average_factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked._data += 1
            if self.momentum is None:
                exponential_average_factor = 1.0 / float(self.num_batches_tracked._data)
        if self.training:
            bn_training = True
        else:
            bn_training = (self.running_mean is None) and (self.running_var is None)
        running_mean = self.running_mean if not self.training or self.track_running_stats \
            else None
        running_var = self.running_var if not self.training or self.track_running_stats \
            else None
        need_sync = False
        if bn_training and self.training:
            from ... import distributed as dist
            if dist.is_available() and dist.is_initialized():
                need_sync = dist.get_world_size(self.process_group) > 1
        if not need_sync:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                bn_training, exponential_average_factor, self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                            running_var, self.eps, exponential_average_factor,
                                            self.process_group)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """Replace every BatchNorm*d in ``module`` by a SyncBatchNorm sharing its parameters
        and buffers (so optimizers built earlier keep working); returns the converted module
        (a new object when ``module`` itself is a batch norm). A torch.nn.Module gets pyddp's
        torch SyncBatchNorm layers (torch's algorithm on pyddp's collectives, any device)."""
        from ..._detect import is_torch_module

        if is_torch_module(module):
            from . import _torch_syncbn

            return _torch_syncbn.convert(module, process_group, share=True)
        module_output = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            module_output = cls(module.num_features, module.eps, module.momentum, module.affine,
                                module.track_running_stats, process_group,
                                bias=module.bias is not None)
            if module.affine:
                module_output.weight = module.weight
                module_output.bias = module.bias
            module_output.running_mean = module.running_mean
            module_output.running_var = module.running_var
            module_output.num_batches_tracked = module.num_batches_tracked
            module_output.training = module.training
            if hasattr(module, "qconfig"):
                module_output.qconfig = module.qconfig
        for name, child in module.named_children():
            module_output.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        del module
        return module_output
