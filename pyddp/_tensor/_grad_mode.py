"""Grad mode (no_grad, enable_grad, set_grad_enabled, inference_mode) and ``_st``, the process-wide
state ops read on every call: grad mode, the autocast dtype, the default float dtype."""
import builtins

import numpy as np

_pybool = builtins.bool


class _State:
    __slots__ = ("grad", "autocast", "default")


_st = _State()
_st.grad = True
_st.autocast = None      # the lower-precision dtype while pyddp.autocast is active
_st.default = np.dtype(np.float32)  # set_default_dtype


class _GradMode:
    """Base of no_grad / enable_grad / set_grad_enabled: context manager and decorator."""

    _value = True

    def __enter__(self):
        self._prev = _st.grad
        _st.grad = self._value

    def __exit__(self, *exc):
        _st.grad = self._prev
        return False

    def __call__(self, fn):
        import functools

        mode = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = _st.grad
            _st.grad = mode._value
            try:
                return fn(*args, **kwargs)
            finally:
                _st.grad = prev
        return wrapper


class no_grad(_GradMode):
    """Context manager / decorator disabling graph recording (torch.no_grad); ``@no_grad`` and
    ``@no_grad()`` both decorate."""

    _value = False

    def __new__(cls, orig_func=None):
        self = super().__new__(cls)
        if orig_func is not None and callable(orig_func):
            return self(orig_func)
        return self

    def __init__(self, orig_func=None):
        pass


class enable_grad(_GradMode):
    """Context manager / decorator enabling graph recording (torch.enable_grad)."""

    _value = True


class set_grad_enabled(_GradMode):
    """set_grad_enabled(mode): sets grad mode now and, as a context manager, restores it on exit."""

    def __init__(self, mode):
        self._prev = _st.grad
        self._value = _pybool(mode)
        _st.grad = self._value

    def __enter__(self):
        pass

    def __call__(self, fn):
        _st.grad = self._prev
        return _GradMode.__call__(self, fn)


class inference_mode(_GradMode):
    """inference_mode(mode=True): like no_grad here."""

    def __init__(self, mode=True):
        self._value = not mode


def is_grad_enabled():
    """True when operations record the autograd graph."""
    return _st.grad
