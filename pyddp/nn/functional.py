"""pyddp.nn.functional: neural-network operations on pyddp Tensors (torch.nn.functional).

Everything is NumPy.  The operations live by concern in pyddp/nn/_functional/ and are re-exported
here under torch's names: linear.py (linear, bilinear), conv.py (conv2d: im2col, a strided view
copied once, plus one BLAS matmul), pooling.py (max / avg / adaptive pooling over strided slices),
dropout.py, sparse.py (embedding, one_hot), normalization.py (layer_norm, group_norm, batch_norm,
normalize), activation.py (relu, gelu, silu, mish, ...), attention.py
(scaled_dot_product_attention, multi_head_attention_forward), distance.py (cosine_similarity,
pairwise_distance), shape.py (pad, flatten) and upsampling.py (interpolate, pixel_shuffle,
pixel_unshuffle), rms_norm.py (rms_norm and the in-place activations relu_, elu_, ...).  Losses
(cross_entropy, nll_loss, mse_loss, ...) come from pyddp/nn/_loss_functional.py, and kl_div,
smooth_l1_loss, huber_loss and binary_cross_entropy from pyddp/nn/_loss_extra.py.
"""
from __future__ import annotations

from .._tensor import Tensor, log_softmax, sigmoid, softmax, tanh  # noqa: F401
from ._argcheck import quiet_all as _quiet_all
from ._argcheck import require_tensors as _require_tensors
from ._functional import (activation, attention, conv, distance, dropout as _dropout, linear as
                          _linear, normalization, pooling, rms_norm as _rms_norm, shape, sparse,
                          upsampling)
from ._functional.activation import *  # noqa: F401,F403,E402
from ._functional.attention import *  # noqa: F401,F403,E402
from ._functional.conv import *  # noqa: F401,F403,E402
from ._functional.distance import *  # noqa: F401,F403,E402
from ._functional.dropout import *  # noqa: F401,F403,E402
from ._functional.linear import *  # noqa: F401,F403,E402
from ._functional.normalization import *  # noqa: F401,F403,E402
from ._functional.pooling import *  # noqa: F401,F403,E402
from ._functional.shape import *  # noqa: F401,F403,E402
from ._functional.sparse import *  # noqa: F401,F403,E402
from ._functional.upsampling import *  # noqa: F401,F403,E402
from ._functional.rms_norm import *  # noqa: F401,F403,E402
# the losses (cross_entropy, nll_loss, mse_loss, l1_loss, binary_cross_entropy_with_logits, ...)
from ._loss_functional import *  # noqa: F401,F403,E402
from ._loss_functional import __all__ as _loss_all  # noqa: E402
# kl_div, smooth_l1_loss, huber_loss, binary_cross_entropy (composites of pyddp's ops)
from ._loss_extra import *  # noqa: F401,F403,E402
from ._loss_extra import __all__ as _loss_extra_all  # noqa: E402

__all__ = [
    "linear", "bilinear", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "adaptive_max_pool2d", "dropout", "embedding", "layer_norm", "batch_norm", "relu", "relu6",
    "leaky_relu", "gelu", "silu", "elu", "softplus", "hardtanh", "tanh", "sigmoid", "softmax",
    "log_softmax", "pad", "one_hot", "normalize", "flatten", "threshold", "dropout1d",
    "dropout2d", "dropout3d", "scaled_dot_product_attention", "multi_head_attention_forward",
]
__all__ += list(_loss_all) + list(_loss_extra_all)
__all__ += list(_rms_norm.__all__)
__all__ += ["mish", "selu", "celu", "hardsigmoid", "hardswish", "logsigmoid", "softsign",
            "tanhshrink", "softshrink", "hardshrink", "glu", "softmin", "prelu",
            "cosine_similarity", "pairwise_distance"]
__all__ += ["group_norm", "interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
            "pixel_shuffle", "pixel_unshuffle"]

# Each module checks its own entry points (a NumPy array where a Tensor is expected: torch's
# TypeError); softmax and log_softmax are pyddp's ops, checked under their names here.  The
# functions say they are pyddp.nn.functional's, where users find them (as torch's do).
_require_tensors(globals(), ["softmax", "log_softmax"], Tensor)
_quiet_all(globals(), ["tanh", "sigmoid"])   # (pyddp's ops; they convert what they are given)
for _m in (activation, attention, conv, distance, _dropout, _linear, normalization, pooling, shape,
           sparse, upsampling, _rms_norm):
    for _n in _m.__all__:
        getattr(_m, _n).__module__ = __name__
del _m, _n, activation, attention, conv, distance, _dropout, _linear, normalization, pooling, \
    shape, sparse, upsampling, _rms_norm
