"""The Tensor check of pyddp.nn.functional's entry points: a NumPy array (or a torch tensor) given
where a pyddp Tensor is expected raises torch's TypeError ("linear(): argument 'input' (position
1) must be Tensor, not numpy.ndarray"), not an AttributeError from inside the operation.

The same wrapper runs the operation with NumPy's floating-point warnings off (``quiet``): torch
computes inf and NaN silently (an fp16 step that overflows, which GradScaler then skips, prints
nothing), where NumPy would warn "overflow encountered" / "invalid value encountered"."""
import functools
import inspect

import numpy as np

_QUIET = dict(over="ignore", invalid="ignore", divide="ignore")


def quiet(fn):
    """``fn`` run with NumPy's overflow / invalid / divide-by-zero warnings off (see above)."""
    if getattr(fn, "_pyddp_quiet", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(**_QUIET):
            return fn(*args, **kwargs)
    wrapper._pyddp_quiet = True
    return wrapper

_FIRST = ("input", "input1", "tensor")


def _type_name(x):
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _checked(fn, name, tensor_type):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        x = args[0] if args else kwargs.get(name)
        if x is not None and not isinstance(x, tensor_type):
            hint = " (wrap NumPy data with pyddp.from_numpy)" if type(x).__module__ == "numpy" \
                else ""
            raise TypeError(f"{fn.__name__}(): argument '{name}' (position 1) must be Tensor, "
                            f"not {_type_name(x)}{hint}")
        with np.errstate(**_QUIET):
            return fn(*args, **kwargs)
    wrapper._pyddp_checked = wrapper._pyddp_quiet = True
    return wrapper


def quiet_all(namespace, names):
    """Wrap each function ``namespace[n]`` (n in ``names``) not wrapped yet with ``quiet``."""
    for n in names:
        fn = namespace.get(n)
        if inspect.isfunction(fn):
            namespace[n] = quiet(fn)


def require_tensors(namespace, names, tensor_type, exempt=()):
    """Wrap each function ``namespace[n]`` (n in ``names``, not exempt) whose first parameter is
    named input, input1 or tensor with the check above (which is also ``quiet``)."""
    for n in names:
        fn = namespace.get(n)
        if n in exempt or not inspect.isfunction(fn) or getattr(fn, "_pyddp_checked", False):
            continue
        params = list(inspect.signature(fn).parameters)
        if params and params[0] in _FIRST:
            namespace[n] = _checked(fn, params[0], tensor_type)
        elif n in ("softmax", "log_softmax", "tanh", "sigmoid"):   # pyddp's ops, named x
            namespace[n] = _checked(fn, "input", tensor_type)
    quiet_all(namespace, names)   # the exempt and the others: quiet without the check
