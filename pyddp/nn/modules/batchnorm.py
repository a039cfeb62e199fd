"""BatchNorm1d and BatchNorm2d (torch.nn.BatchNorm*)."""
import numpy as np

from .. import functional as F
from .. import init
from .module import Module
from .utils import _buffer, _empty_parameter, _factory_dtype

__all__ = ["BatchNorm1d", "BatchNorm2d"]


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
