"""The layer, container and loss modules of pyddp.nn (torch.nn.modules)."""
from .module import Module, RemovableHandle  # noqa: F401
from .linear import Identity, Linear  # noqa: F401
from .conv import Conv2d  # noqa: F401
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm  # noqa: F401
from .normalization import GroupNorm, LayerNorm, RMSNorm  # noqa: F401
from .sparse import Embedding  # noqa: F401
from .dropout import Dropout, Dropout1d, Dropout2d, Dropout3d  # noqa: F401
from .attention import MultiheadAttention  # noqa: F401
from .activation import GELU, LogSoftmax, ReLU, Sigmoid, Softmax, Tanh  # noqa: F401
from .activation import (CELU, ELU, GLU, SELU, CosineSimilarity, Hardshrink,  # noqa: F401
                         Hardsigmoid, Hardswish, Hardtanh, LeakyReLU, LogSigmoid, Mish,
                         PairwiseDistance, PReLU, ReLU6, SiLU, Softmin, Softplus, Softshrink,
                         Softsign, Tanhshrink, Threshold)
from .pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d  # noqa: F401
from .flatten import Flatten, Unflatten  # noqa: F401
from .container import (ModuleDict, ModuleList, ParameterDict, ParameterList,  # noqa: F401
                        Sequential)
from .padding import (CircularPad1d, CircularPad2d, CircularPad3d, ConstantPad1d,  # noqa: F401
                      ConstantPad2d, ConstantPad3d, ReflectionPad1d, ReflectionPad2d,
                      ReflectionPad3d, ReplicationPad1d, ReplicationPad2d, ReplicationPad3d,
                      ZeroPad1d, ZeroPad2d, ZeroPad3d)
from .pixelshuffle import PixelShuffle, PixelUnshuffle  # noqa: F401
from .upsampling import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d  # noqa: F401
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss, NLLLoss  # noqa: F401
from .loss import BCELoss, HuberLoss, KLDivLoss, SmoothL1Loss  # noqa: F401

__all__ = [
    "Module", "Identity", "Linear", "Conv2d", "BatchNorm1d", "BatchNorm2d", "SyncBatchNorm",
    "LayerNorm",
    "Embedding", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "MultiheadAttention", "ReLU", "GELU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax",
    "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Flatten", "Sequential", "ModuleList",
    "ModuleDict", "ParameterList", "ParameterDict", "CrossEntropyLoss", "NLLLoss", "MSELoss",
    "L1Loss", "BCEWithLogitsLoss", "LeakyReLU", "ELU", "CELU", "SELU", "SiLU", "Mish", "ReLU6",
    "Hardtanh", "Softplus", "Softsign", "Hardswish", "Hardsigmoid", "LogSigmoid", "Tanhshrink",
    "Softshrink", "Hardshrink", "Threshold", "GLU", "Softmin", "PReLU", "CosineSimilarity",
    "PairwiseDistance", "BatchNorm3d", "GroupNorm", "ConstantPad1d", "ConstantPad2d",
    "ConstantPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ReflectionPad1d", "ReflectionPad2d",
    "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
    "CircularPad2d", "CircularPad3d", "PixelShuffle", "PixelUnshuffle", "Upsample",
    "UpsamplingNearest2d", "UpsamplingBilinear2d", "RMSNorm", "Unflatten", "BCELoss", "KLDivLoss",
    "SmoothL1Loss", "HuberLoss",
]
