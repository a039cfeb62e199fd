"""pyddp's tensors: ``pyddp.Tensor``, dtypes, grad mode, factories and functional ops.

The package is split by concern; this module re-exports the public names (``__all__``, which
``pyddp`` star-imports) and the small internal API other pyddp modules use:

* ``_dtypes``: dtype objects under torch's names, ``device``, ``_dtype`` (normalise a dtype
  argument), ``_is_float_dtype``, ``_F32``/``_F64``/``_HALFS``, get/set_default_dtype;
* ``_grad_mode``: no_grad/enable_grad/set_grad_enabled/inference_mode, is_grad_enabled, and ``_st``
  (grad mode, autocast dtype, default float dtype: the state every op reads);
* ``_core``: the Tensor class; ``_new`` (wrap an ndarray), ``_mk`` (wrap an op's result and record
  its graph node), ``_red`` (reduce a broadcast gradient), ``_to_array``, ``_mm``,
  ``_claim_grad_dest`` (DDP's gradient buckets); backward / grad;
* ``_factories``: tensor, zeros, randn, arange, ...;
* ``_ops``: the differentiable functions (add, exp, sum, reshape, cat, softmax, ...) and ``_cast``,
  ``_ac_low``/``_ac_f32`` (autocast casts), ``_sigmoid_f``;
* ``_methods``: Tensor's methods that call _ops and _factories (``t.sum()``, ``t + u``,
  ``t.to(...)``, ``t.new_zeros``), attached to the class (so _core imports neither);
* more ops by concern, each module attaching the Tensor methods that call its functions the same
  way: ``_compare`` (eq, logical_and, isclose, ...), ``_sorting`` (topk, sort, median, unique,
  unique_consecutive), ``_indexing`` (gather, scatter, index_select, take, ...), ``_reductions``
  (prod, norm, cumsum, nansum, histc, ...), ``_linalg`` (diagonal, einsum, addmm, dot, cdist, ...),
  ``_shape`` (narrow, select, as_strided, flip, roll, tile, ...), ``_pointwise`` (erf, erfinv,
  atan2, fmod, lerp, logit, ...), ``_sampling`` (multinomial, bernoulli); ``_args`` holds the
  argument checks they share;
* ``_precision``: set/get_float32_matmul_precision (recorded, changing nothing);
* ``_aliases``: method aliases, small predicates and the in-place ``_`` variants, attached last;
* then issue 55's next rows, attaching their own methods: ``_combine`` (hstack, meshgrid, kron,
  tensordot, cross, ...), ``_special`` (lgamma, digamma, xlogy, hypot, ...), ``_stats`` (cummax,
  kthvalue, quantile, var_mean, ...), ``_lookup`` (searchsorted, bincount, isin, index_add with
  gradients, scatter_reduce), ``_matrix`` (inverse, det, cholesky, pinverse, ...), ``_runtime``
  (set_num_threads, get/set_rng_state, use_deterministic_algorithms, normal, windows),
  ``_nnfuncs`` (torch.layer_norm, torch.embedding, ... over pyddp.nn.functional) and
  ``_inplace`` (torch.relu_, torch.clamp_, ... and Tensor.nan_to_num_);

Random numbers come from pyddp's one generator (pyddp/_random.py); manual_seed, seed,
initial_seed and default_generator here are its.
"""
from . import _core  # noqa: F401  (first: the class; _methods attaches its ops' methods below)
from .._random import default_generator, initial_seed, manual_seed, seed
from ._core import (Tensor, _rebuild, backward, grad, is_floating_point, is_tensor,  # noqa: F401
                    numel)
from ._dtypes import (bfloat16, bool, channels_last, channels_last_3d, complex64, complex128,
                      contiguous_format, device, double, float, float16, float32, float64,
                      get_default_dtype, half, int, int8, int16, int32, int64, long,
                      memory_format, preserve_format, set_default_dtype, short, uint8)
from ._factories import (arange, as_tensor, empty, empty_like, eye, from_numpy, full, full_like,
                         linspace, ones, ones_like, rand, rand_like, randint, randn, randn_like,
                         randperm, tensor, zeros, zeros_like)
from ._str import set_printoptions
from ._precision import get_float32_matmul_precision, set_float32_matmul_precision
from ._grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from ._ops import (abs, add, all, allclose, amax, amin, any, argmax, argmin, bmm, cat, ceil, chunk,
                   clamp, clip, concat, cos, div, equal, exp, expm1, flatten, floor, isfinite,
                   isinf, isnan, log, log1p, log_softmax, logsumexp, matmul, max, maximum, mean,
                   min, minimum, mm, mul, neg, outer, permute, pow, relu, reshape, round, rsqrt,
                   sigmoid, sign, sin, softmax, split, sqrt, square, squeeze, stack, std, sub, sum,
                   swapaxes, tanh, transpose, tril, triu, unsqueeze, var, where)
from . import _methods  # noqa: E402,F401  (attaches the Tensor methods that call _ops, _factories)
# the op modules by concern: each attaches its Tensor methods when imported
from . import (_compare, _indexing, _linalg, _pointwise, _reductions, _sampling,  # noqa: E402
               _shape, _sorting)
from ._compare import *  # noqa: F401,F403,E402
from ._indexing import *  # noqa: F401,F403,E402
from ._linalg import *  # noqa: F401,F403,E402
from ._pointwise import *  # noqa: F401,F403,E402
from ._reductions import *  # noqa: F401,F403,E402
from ._sampling import *  # noqa: F401,F403,E402
from ._shape import *  # noqa: F401,F403,E402
from ._sorting import *  # noqa: F401,F403,E402
from . import _aliases  # noqa: E402,F401  (last: aliases and in-place variants of all the above)
# issue 55's next rows, each module attaching its methods (and in-place variants) itself
from . import (_combine, _inplace, _lookup, _matrix, _nnfuncs, _runtime, _special,  # noqa: E402
               _stats)
from ._combine import *  # noqa: F401,F403,E402
from ._inplace import *  # noqa: F401,F403,E402
from ._lookup import *  # noqa: F401,F403,E402
from ._matrix import *  # noqa: F401,F403,E402
from ._nnfuncs import *  # noqa: F401,F403,E402
from ._runtime import *  # noqa: F401,F403,E402
from ._special import *  # noqa: F401,F403,E402
from ._stats import *  # noqa: F401,F403,E402

# the internal API, importable from here too (as before the split)
from ..autograd._graph import Node, _edge  # noqa: F401
from ._core import _claim_grad_dest, _mk, _mm, _new, _red, _to_array  # noqa: F401
from ._dtypes import _F32, _HALFS, _dtype  # noqa: F401
from ._grad_mode import _st  # noqa: F401
from ._ops import _ac_f32, _ac_low, _cast, _sigmoid_f  # noqa: F401

__all__ = [
    "Tensor", "device", "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "zeros_like",
    "ones_like", "empty_like", "full_like", "rand", "randn", "randint", "randperm", "rand_like",
    "randn_like", "arange", "linspace", "eye", "manual_seed", "seed", "initial_seed",
    "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "inference_mode",
    "get_default_dtype", "set_default_dtype", "is_tensor", "is_floating_point", "numel",
    "cat", "concat", "stack", "where", "matmul", "mm", "bmm", "exp", "log", "sqrt", "rsqrt", "abs",
    "neg", "sin", "cos", "tanh", "sigmoid", "relu", "clamp", "clip", "sum", "mean", "max", "min",
    "amax", "amin", "var", "std", "argmax", "argmin", "reshape", "flatten", "permute", "transpose",
    "squeeze", "unsqueeze", "softmax", "log_softmax", "maximum", "minimum", "pow", "add", "sub",
    "mul", "div", "allclose", "equal", "isfinite", "isnan", "isinf", "log1p", "expm1", "square",
    "split", "chunk", "all", "any", "logsumexp", "swapaxes", "default_generator", "sign", "floor",
    "ceil", "round", "outer", "tril", "triu", "set_printoptions",
    "set_float32_matmul_precision", "get_float32_matmul_precision",
    "float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8",
    "int16", "short", "int32", "int", "int64", "long", "bool", "complex64", "complex128",
    "memory_format", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
] + (_compare.__all__ + _sorting.__all__ + _indexing.__all__ + _reductions.__all__ + _linalg.__all__
     + _shape.__all__ + _pointwise.__all__ + _sampling.__all__ + _combine.__all__
     + _inplace.__all__ + _lookup.__all__ + _matrix.__all__ + _nnfuncs.__all__ + _runtime.__all__
     + _special.__all__ + _stats.__all__)

# Pickles and reprs name these pyddp._tensor.X, as they did before the split (a pickled Tensor
# is rebuilt by pyddp._tensor._rebuild; a pickled device by its class).
for _obj in (Tensor, device, memory_format, no_grad, enable_grad, set_grad_enabled, inference_mode, _rebuild):
    _obj.__module__ = __name__
del _obj
