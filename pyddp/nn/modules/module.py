"""The Module base class, mirroring ``torch.nn.Module``.

A Module owns Parameters (leaf Tensors that require grad), buffers (Tensors
that are part of the state but not trained, e.g. BatchNorm's running mean) and
child Modules, all registered by plain attribute assignment.  Everything a
torch script relies on is here: the ``parameters()``/``named_*()`` iterators,
``state_dict`` / ``load_state_dict`` with torch's key names, metadata and error
messages, ``train``/``eval``, ``zero_grad``, ``apply``, dtype conversion that
keeps the Parameter objects (so optimizers built before ``half()`` keep
working), forward (pre-)hooks and ``__repr__``.  The hooks' handles and the autograd Functions behind the
full backward hooks are in _hooks.py (torch.utils.hooks).

Devices: pyddp modules keep their state in host (NumPy) arrays.  ``to(device)``,
``cuda()`` and ``cpu()`` accept torch's device arguments so that scripts port
unchanged, and leave the arrays where they are.
"""
import functools
import itertools
import warnings
from collections import OrderedDict, namedtuple
from collections.abc import Mapping

import numpy as np

from ..._tensor import Tensor
from ..parameter import Buffer, Parameter
from ._hooks import (RemovableHandle, _BackwardHookInputs, _BackwardHookOutputs,
                     _BackwardHookState)

__all__ = ["Module", "RemovableHandle"]

_EXTRA_STATE_KEY_SUFFIX = "_extra_state"


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """``load_state_dict``'s result: the missing and unexpected keys."""

    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _addindent(s_, num_spaces):
    s = s_.split("\n")
    if len(s) == 1:
        return s_
    first = s.pop(0)
    s = [(num_spaces * " ") + line if line.strip() else "" for line in s]
    return first + "\n" + "\n".join(s)


def _typename(obj):
    t = type(obj)
    mod = t.__module__
    if mod in (None, "builtins"):
        return t.__qualname__
    return f"{mod}.{t.__qualname__}"


def _is_float_dtype(dt):
    """True for floating dtypes, including ml_dtypes' bfloat16/float8 (kind 'V')."""
    dt = np.dtype(dt)
    if dt.kind == "f":
        return True
    return (dt.kind == "V" and dt.names is None
            and dt.name.startswith(("bfloat16", "float8", "float6", "float4")))


def _is_complex_dtype(dt):
    return np.dtype(dt).kind == "c"


def _resolve_dtype(dtype):
    """np.dtype of a dtype-like (np.dtype, numpy scalar type, name such as 'float16')."""
    try:
        return np.dtype(dtype)
    except TypeError:
        if isinstance(dtype, str):
            try:
                import ml_dtypes
                return np.dtype(getattr(ml_dtypes, dtype))
            except (ImportError, AttributeError):
                pass
        raise TypeError(f"expected a dtype, got {dtype!r}") from None


def _looks_like_device(obj):
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
        return True
    if isinstance(obj, str):
        head = obj.split(":", 1)[0]
        return head in ("cpu", "cuda", "mps", "xpu", "meta", "hip")
    return type(obj).__name__ == "device" or hasattr(obj, "index") and hasattr(obj, "type")


def _state_to_array(value):
    """The ndarray behind a state_dict value (pyddp Tensor, ndarray, numpy scalar, or array-like
    such as a CPU torch.Tensor), or None if it is not tensor-like."""
    if isinstance(value, Tensor):
        return value._data
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    if hasattr(value, "__array__") and hasattr(value, "shape"):
        if hasattr(value, "detach") and callable(value.detach):  # torch.Tensor and friends
            value = value.detach()
            if hasattr(value, "cpu"):
                value = value.cpu()
        return np.asarray(value)
    return None


class Module:
    """Base class for all neural network modules (``torch.nn.Module``).

    Subclasses call ``super().__init__()`` first, assign Parameters, buffers and
    sub-Modules as attributes, and implement ``forward``.  Calling the module
    runs the forward pre-hooks, ``forward`` and the forward hooks.
    """

    dump_patches = False
    _version = 1
    training: bool
    call_super_init = False

    def __init__(self, *args, **kwargs):
        if self.call_super_init is False and bool(kwargs):
            raise TypeError(
                f"{type(self).__name__}.__init__() got an unexpected keyword argument "
                f"'{next(iter(kwargs))}'")
        if self.call_super_init is False and bool(args):
            raise TypeError(
                f"{type(self).__name__}.__init__() takes 1 positional argument but "
                f"{len(args) + 1} were given")
        sa = super().__setattr__
        sa("training", True)
        sa("_parameters", {})
        sa("_buffers", {})
        sa("_non_persistent_buffers_set", set())
        sa("_backward_hooks", OrderedDict())
        sa("_backward_pre_hooks", OrderedDict())
        sa("_forward_hooks", OrderedDict())
        sa("_forward_hooks_with_kwargs", OrderedDict())
        sa("_forward_hooks_always_called", OrderedDict())
        sa("_forward_pre_hooks", OrderedDict())
        sa("_forward_pre_hooks_with_kwargs", OrderedDict())
        sa("_state_dict_hooks", OrderedDict())
        sa("_state_dict_pre_hooks", OrderedDict())
        sa("_load_state_dict_pre_hooks", OrderedDict())
        sa("_load_state_dict_post_hooks", OrderedDict())
        sa("_modules", {})
        if self.call_super_init:
            super().__init__(*args, **kwargs)

    def forward(self, *input):
        """Define the computation performed at every call; overridden by every subclass."""
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function')

    # ------------------------------------------------------------------ registration
    def register_buffer(self, name, tensor, persistent=True):
        """Add a buffer (a Tensor that is state but not a parameter) to the module.

        ``tensor`` is a Tensor, an ndarray (wrapped in a Tensor, a pyddp convenience)
        or None.  Non-persistent buffers are left out of ``state_dict``.
        """
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        elif not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {_typename(name)}")
        elif "." in name:
            raise KeyError('buffer name can\'t contain "."')
        elif name == "":
            raise KeyError('buffer name can\'t be empty string ""')
        elif hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if isinstance(tensor, np.ndarray):
            tensor = Tensor(tensor)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{_typename(tensor)}' object to buffer '{name}' "
                "(pyddp Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_parameter(self, name, param):
        """Add a Parameter (or None) to the module under ``name``."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        elif not isinstance(name, str):
            raise TypeError(f"parameter name should be a string. Got {_typename(name)}")
        elif "." in name:
            raise KeyError('parameter name can\'t contain "."')
        elif name == "":
            raise KeyError('parameter name can\'t be empty string ""')
        elif hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is None:
            self._parameters[name] = None
        elif not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                "(pyddp.nn.Parameter or None required)")
        elif param.grad_fn is not None:
            raise ValueError(
                f"Cannot assign non-leaf Tensor to parameter '{name}'. Model "
                f"parameters must be created explicitly. To express '{name}' "
                "as a function of another Tensor, compute the value in "
                "the forward() method.")
        else:
            self._parameters[name] = param

    def add_module(self, name, module):
        """Add a child module (or None) under ``name``."""
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{_typename(module)} is not a Module subclass")
        elif not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {_typename(name)}")
        elif hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        elif "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        elif name == "":
            raise KeyError('module name can\'t be empty string ""')
        self._modules[name] = module

    def register_module(self, name, module):
        """Alias for :meth:`add_module`."""
        self.add_module(name, module)

    def get_submodule(self, target):
        """The submodule at the dotted path ``target`` ("" is the module itself)."""
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(mod._get_name() + " has no attribute `" + item + "`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError("`" + item + "` is not an nn.Module")
        return mod

    def get_parameter(self, target):
        """The Parameter at the dotted path ``target``."""
        module_path, _, param_name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, param_name):
            raise AttributeError(mod._get_name() + " has no attribute `" + param_name + "`")
        param = getattr(mod, param_name)
        if not isinstance(param, Parameter):
            raise AttributeError("`" + param_name + "` is not an nn.Parameter")
        return param

    def get_buffer(self, target):
        """The buffer at the dotted path ``target``."""
        module_path, _, buffer_name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, buffer_name):
            raise AttributeError(mod._get_name() + " has no attribute `" + buffer_name + "`")
        buffer = getattr(mod, buffer_name)
        if buffer_name not in mod._buffers:
            raise AttributeError("`" + buffer_name + "` is not a buffer")
        return buffer

    def get_extra_state(self):
        """Extra state to put in ``state_dict`` (override together with :meth:`set_extra_state`)."""
        raise RuntimeError(
            "Reached a code path in Module.get_extra_state() that should never be called.")

    def set_extra_state(self, state):
        """Restore the extra state returned by :meth:`get_extra_state`."""
        raise RuntimeError(
            "Reached a code path in Module.set_extra_state() that should never be called.")

    # ------------------------------------------------------------------ attributes
    def __getattr__(self, name):
        if "_parameters" in self.__dict__:
            _parameters = self.__dict__["_parameters"]
            if name in _parameters:
                return _parameters[name]
        if "_buffers" in self.__dict__:
            _buffers = self.__dict__["_buffers"]
            if name in _buffers:
                return _buffers[name]
        if "_modules" in self.__dict__:
            modules = self.__dict__["_modules"]
            if name in modules:
                return modules[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        def remove_from(*dicts_or_sets):
            for d in dicts_or_sets:
                if name in d:
                    if isinstance(d, dict):
                        del d[name]
                    else:
                        d.discard(name)

        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(self.__dict__, self._buffers, self._modules,
                        self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{_typename(value)}' as parameter '{name}' "
                    "(pyddp.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        else:
            modules = self.__dict__.get("_modules")
            if isinstance(value, Module):
                if modules is None:
                    raise AttributeError("cannot assign module before Module.__init__() call")
                remove_from(self.__dict__, self._parameters, self._buffers,
                            self._non_persistent_buffers_set)
                modules[name] = value
            elif modules is not None and name in modules:
                if value is not None:
                    raise TypeError(
                        f"cannot assign '{_typename(value)}' as child module '{name}' "
                        "(pyddp.nn.Module or None expected)")
                modules[name] = value
            else:
                buffers = self.__dict__.get("_buffers")
                if isinstance(value, Buffer):
                    if buffers is None:
                        raise AttributeError("cannot assign buffer before Module.__init__() call")
                    remove_from(self.__dict__, self._parameters, self._modules)
                    self.register_buffer(name, Tensor(value._data), value.persistent)
                elif buffers is not None and name in buffers:
                    if value is not None and not isinstance(value, (Tensor, np.ndarray)):
                        raise TypeError(
                            f"cannot assign '{_typename(value)}' as buffer '{name}' "
                            "(pyddp Tensor or None expected)")
                    self.register_buffer(name, value,
                                         name not in self._non_persistent_buffers_set)
                else:
                    super().__setattr__(name, value)

    def __delattr__(self, name):
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            super().__delattr__(name)

    def __dir__(self):
        module_attrs = dir(self.__class__)
        attrs = list(self.__dict__.keys())
        keys = (module_attrs + attrs + list(self._parameters.keys())
                + list(self._modules.keys()) + list(self._buffers.keys()))
        return sorted(key for key in keys if not key[0].isdigit())

    def __setstate__(self, state):
        self.__dict__.update(state)
        # Modules pickled by an older pyddp may lack some hook dicts.
        for attr in ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_with_kwargs",
                     "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
                     "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                     "_load_state_dict_post_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if attr not in self.__dict__:
                self.__dict__[attr] = OrderedDict()
        if "_non_persistent_buffers_set" not in self.__dict__:
            self._non_persistent_buffers_set = set()

    # ------------------------------------------------------------------ iteration
    def _named_members(self, get_members_fn, prefix="", recurse=True, remove_duplicate=True):
        memo = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        for module_prefix, module in modules:
            for k, v in get_members_fn(module):
                if v is None or id(v) in memo:
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                name = module_prefix + ("." if module_prefix else "") + k
                yield name, v

    def parameters(self, recurse=True):
        """Iterator over the module's Parameters (each once, in registration order)."""
        for _name, param in self.named_parameters(recurse=recurse):
            yield param

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """Iterator over ``(dotted name, Parameter)``."""
        yield from self._named_members(lambda module: module._parameters.items(),
                                       prefix=prefix, recurse=recurse,
                                       remove_duplicate=remove_duplicate)

    def buffers(self, recurse=True):
        """Iterator over the module's buffers."""
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        """Iterator over ``(dotted name, buffer)``."""
        yield from self._named_members(lambda module: module._buffers.items(),
                                       prefix=prefix, recurse=recurse,
                                       remove_duplicate=remove_duplicate)

    def children(self):
        """Iterator over the immediate child modules."""
        for _name, module in self.named_children():
            yield module

    def named_children(self):
        """Iterator over ``(name, child module)`` for the immediate children."""
        memo = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in memo:
                memo.add(id(module))
                yield name, module

    def modules(self, remove_duplicate=True):
        """Iterator over all modules in the tree, this one first."""
        for _, module in self.named_modules(remove_duplicate=remove_duplicate):
            yield module

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """Iterator over ``(dotted name, module)`` for the whole tree, this one first (name "")."""
        if memo is None:
            memo = set()
        if id(self) not in memo:
            if remove_duplicate:
                memo.add(id(self))
            yield prefix, self
            for name, module in self._modules.items():
                if module is None:
                    continue
                submodule_prefix = prefix + ("." if prefix else "") + name
                yield from module.named_modules(memo, submodule_prefix, remove_duplicate)

    # ------------------------------------------------------------------ modes, grads
    def train(self, mode=True):
        """Set training mode (``mode=True``) or evaluation mode on this module and its children."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def eval(self):
        """Set evaluation mode; same as ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        """Set ``requires_grad`` on every parameter."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        """Reset the parameters' gradients: to None (default) or to zeros in place."""
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    # In place, so a .grad that is a view into a communication bucket stays one.
                    p.grad._data[...] = 0

    def apply(self, fn):
        """Call ``fn(module)`` on every submodule (children first), then on self; returns self."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ conversion
    def _apply(self, fn, recurse=True):
        """Replace the array of every parameter, gradient and buffer by ``fn(array)``.

        The Parameter and buffer objects stay the same (only their ``_data`` changes),
        so optimizers and hooks that hold them keep working.
        """
        if recurse:
            for module in self.children():
                module._apply(fn)
        for param in self._parameters.values():
            if param is None:
                continue
            new = fn(param._data)
            if new is not param._data:
                param._data = new
            grad = param.grad
            if grad is not None:
                new_g = fn(grad._data)
                if new_g is not grad._data:
                    grad._data = new_g
        for buf in self._buffers.values():
            if buf is not None:
                new = fn(buf._data)
                if new is not buf._data:
                    buf._data = new
        return self

    def _cast_floating(self, dtype):
        dtype = _resolve_dtype(dtype)

        def convert(a):
            if (_is_float_dtype(a.dtype) or _is_complex_dtype(a.dtype)) and a.dtype != dtype:
                return a.astype(dtype)
            return a
        return self._apply(convert)

    def to(self, *args, **kwargs):
        """Convert floating-point parameters and buffers to a dtype, in place; returns self.

        Accepts torch's forms ``to(dtype)``, ``to(device)``, ``to(device, dtype)``,
        ``to(tensor)`` and the keywords ``device``, ``dtype``, ``non_blocking``,
        ``memory_format``.  Integer buffers keep their dtype.  Devices are accepted
        and ignored (the state stays in host memory).
        """
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"to() got an unexpected keyword argument '{next(iter(kwargs))}'")
        for arg in args:
            if isinstance(arg, Tensor):
                dtype = arg.dtype
            elif isinstance(arg, bool) or arg is None:
                continue  # non_blocking / copy flags
            elif _looks_like_device(arg):
                device = arg
            else:
                dtype = arg
        if device is not None:
            self._place_state(device)
        if dtype is None:
            return self
        dtype = _resolve_dtype(dtype)
        if not (_is_float_dtype(dtype) or _is_complex_dtype(dtype)):
            raise TypeError(
                "nn.Module.to only accepts floating point or complex dtypes, but got desired "
                f"dtype={dtype}")
        return self._cast_floating(dtype)

    def type(self, dst_type):
        """Cast all parameters and buffers to ``dst_type`` (integers included, as torch)."""
        dt = _resolve_dtype(dst_type)
        return self._apply(lambda a: a.astype(dt) if a.dtype != dt else a)

    def float(self):
        """Cast floating-point parameters and buffers to float32."""
        return self._cast_floating(np.float32)

    def double(self):
        """Cast floating-point parameters and buffers to float64."""
        return self._cast_floating(np.float64)

    def half(self):
        """Cast floating-point parameters and buffers to float16."""
        return self._cast_floating(np.float16)

    def bfloat16(self):
        """Cast floating-point parameters and buffers to bfloat16 (needs ml_dtypes)."""
        try:
            import ml_dtypes
        except ImportError:
            raise RuntimeError(
                "bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from None
        return self._cast_floating(ml_dtypes.bfloat16)

    def cpu(self):
        """The state already lives in host memory (under PYDDP_CUDA_ON_CPU=1 its tensors are
        tagged 'cpu' again); returns self."""
        self._place_state("cpu")
        return self

    def cuda(self, device=None):
        """Accepted for torch compatibility; the state stays in host memory (under
        PYDDP_CUDA_ON_CPU=1 its tensors report the emulated CUDA device). Returns self."""
        from ...cuda import _emulation
        if _emulation.enabled():
            self._place_state("cuda" if device is None else
                              device if not isinstance(device, int) else f"cuda:{device}")
        return self

    def _place_state(self, device):
        """Under PYDDP_CUDA_ON_CPU=1, tag every parameter, gradient and buffer with ``device``
        (a device they would move to on a GPU); elsewhere devices are accepted and ignored."""
        from ...cuda import _emulation
        if not _emulation.enabled():
            return
        from ..._tensor._core import _check_device
        dev = _check_device(device)
        for t in list(self.parameters()) + list(self.buffers()):
            for x in (t, t.grad):
                if isinstance(x, Tensor):
                    if dev.type == "cpu":
                        x.__dict__.pop("_dev", None)
                    else:
                        x._dev = dev

    def share_memory(self):
        """No-op kept for torch compatibility; returns self."""
        return self

    # ------------------------------------------------------------------ hooks and call
    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """Register ``hook(module, args) -> None or new args`` run before ``forward``.

        With ``with_kwargs=True`` the hook is ``hook(module, args, kwargs) -> None or
        (new_args, new_kwargs)``.  Returns a :class:`RemovableHandle`.
        """
        handle = RemovableHandle(self._forward_pre_hooks,
                                 extra_dict=self._forward_pre_hooks_with_kwargs)
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        """Register ``hook(module, args, output) -> None or new output`` run after ``forward``.

        With ``with_kwargs=True`` the hook is ``hook(module, args, kwargs, output)``;
        ``always_call=True`` runs it even when ``forward`` raised.  Returns a
        :class:`RemovableHandle`.
        """
        handle = RemovableHandle(self._forward_hooks,
                                 extra_dict=[self._forward_hooks_with_kwargs,
                                             self._forward_hooks_always_called])
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_hook(self, hook, prepend=False):
        """Register ``hook(module, grad_input, grad_output) -> None or new grad_input``.

        Runs once the gradients with respect to the module's positional Tensor inputs
        are computed (``grad_input`` entries are None for inputs that need no grad);
        returns a :class:`RemovableHandle`.
        """
        handle = RemovableHandle(self._backward_hooks)
        self._backward_hooks[handle.id] = hook
        if prepend:
            self._backward_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_pre_hook(self, hook, prepend=False):
        """Register ``hook(module, grad_output) -> None or new grad_output``, run when the
        gradients with respect to the module's outputs are known."""
        handle = RemovableHandle(self._backward_pre_hooks)
        self._backward_pre_hooks[handle.id] = hook
        if prepend:
            self._backward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def _wrap_inputs_for_backward_hooks(self, args):
        st = _BackwardHookState(self, sum(isinstance(a, Tensor) for a in args))
        tensor_args = [a for a in args if isinstance(a, Tensor)]
        positions = [i for i, a in enumerate(tensor_args) if a.requires_grad]
        st.input_positions = tuple(positions)
        if positions and self._backward_hooks:
            from ..._tensor import is_grad_enabled
            if is_grad_enabled():
                wrapped = _BackwardHookInputs.apply(st, *[tensor_args[i] for i in positions])
                st.inputs_wrapped = True
                it = iter(wrapped)
                k = 0
                new_args = []
                for a in args:
                    if isinstance(a, Tensor):
                        new_args.append(next(it) if k in positions else a)
                        k += 1
                    else:
                        new_args.append(a)
                args = tuple(new_args)
        return args, st

    def _wrap_outputs_for_backward_hooks(self, result, st):
        single = isinstance(result, Tensor)
        outs = (result,) if single else result
        if not (isinstance(outs, tuple) and all(isinstance(o, Tensor) for o in outs)):
            warnings.warn("For backward hooks to be called, module output should be a Tensor or "
                          f"a tuple of Tensors but received {type(result)}", stacklevel=3)
            return result
        if not any(o.requires_grad for o in outs):
            return result
        wrapped = _BackwardHookOutputs.apply(st, *outs)
        return wrapped[0] if single else tuple(wrapped)

    def register_state_dict_pre_hook(self, hook):
        """Register ``hook(module, prefix, keep_vars)``, run before ``state_dict`` saves this."""
        handle = RemovableHandle(self._state_dict_pre_hooks)
        self._state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_state_dict_post_hook(self, hook):
        """Register ``hook(module, state_dict, prefix, local_metadata)``, run after state_dict."""
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    def register_load_state_dict_pre_hook(self, hook):
        """Register ``hook(module, state_dict, prefix, local_metadata, strict, missing_keys,
        unexpected_keys, error_msgs)`` run before this module loads its state."""
        handle = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[handle.id] = functools.partial(hook, self)
        return handle

    def register_load_state_dict_post_hook(self, hook):
        """Register ``hook(module, incompatible_keys)`` run after ``load_state_dict``."""
        handle = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[handle.id] = hook
        return handle

    def _call_impl(self, *args, **kwargs):
        forward_call = self.forward
        if not (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks
                or self._backward_pre_hooks):
            return forward_call(*args, **kwargs)
        result = None
        called_always = set()
        try:
            for hook_id, hook in list(self._forward_pre_hooks.items()):
                if hook_id in self._forward_pre_hooks_with_kwargs:
                    out = hook(self, args, kwargs)
                    if out is not None:
                        if isinstance(out, tuple) and len(out) == 2:
                            args, kwargs = out
                        else:
                            raise RuntimeError(
                                "forward pre-hook must return None or a tuple of "
                                f"(new_args, new_kwargs), but got {out}.")
                else:
                    out = hook(self, args)
                    if out is not None:
                        if not isinstance(out, tuple):
                            out = (out,)
                        args = out
            bw_state = None
            if self._backward_hooks or self._backward_pre_hooks:
                args, bw_state = self._wrap_inputs_for_backward_hooks(args)
            result = forward_call(*args, **kwargs)
            for hook_id, hook in list(self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called:
                    called_always.add(hook_id)
                if hook_id in self._forward_hooks_with_kwargs:
                    out = hook(self, args, kwargs, result)
                else:
                    out = hook(self, args, result)
                if out is not None:
                    result = out
            if bw_state is not None:
                result = self._wrap_outputs_for_backward_hooks(result, bw_state)
            return result
        except Exception:
            for hook_id, hook in list(self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called and hook_id not in called_always:
                    try:
                        if hook_id in self._forward_hooks_with_kwargs:
                            out = hook(self, args, kwargs, result)
                        else:
                            out = hook(self, args, result)
                        if out is not None:
                            result = out
                    except Exception as e:  # the forward's error is the one to report
                        warnings.warn("module forward hook with ``always_call=True`` raised an "
                                      "exception that was silenced as another error was raised "
                                      f"in forward: {e}", stacklevel=2)
            raise

    __call__ = _call_impl

    # ------------------------------------------------------------------ state dict
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        if getattr(type(self), "get_extra_state", None) is not Module.get_extra_state:
            destination[prefix + _EXTRA_STATE_KEY_SUFFIX] = self.get_extra_state()

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """An OrderedDict of the parameters and persistent buffers under dotted names.

        The values are detached Tensors sharing memory with the module's state
        (the Parameters themselves with ``keep_vars=True``).  Like torch, the dict
        carries a ``_metadata`` attribute with each module's version.
        """
        if args:
            warnings.warn("Positional args are being deprecated, use kwargs instead.",
                          FutureWarning, stacklevel=2)
            if destination is None:
                destination = args[0]
            if len(args) > 1 and prefix == "":
                prefix = args[1]
            if len(args) > 2 and keep_vars is False:
                keep_vars = args[2]
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        local_metadata = dict(version=self._version)
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = local_metadata
        for hook in self._state_dict_pre_hooks.values():
            hook(self, prefix, keep_vars)
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".",
                                  keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            hook_result = hook(self, destination, prefix, local_metadata)
            if hook_result is not None:
                raise RuntimeError("state_dict post-hook must return None")
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        """Copy this module's own parameters and buffers (not its children's) from state_dict."""
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs)
        persistent_buffers = {k: v for k, v in self._buffers.items()
                              if k not in self._non_persistent_buffers_set}
        local_state = {k: v for k, v in itertools.chain(self._parameters.items(),
                                                        persistent_buffers.items())
                       if v is not None}
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            input_param = state_dict[key]
            arr = _state_to_array(input_param)
            if arr is None:
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected Tensor or array-like '
                    f"object from checkpoint but received {type(input_param)}")
                continue
            if len(param.shape) == 0 and arr.shape == (1,):
                arr = arr.reshape(())
            if tuple(arr.shape) != tuple(param.shape):
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {tuple(arr.shape)} "
                    "from checkpoint, the shape in current model is "
                    f"{tuple(param.shape)}.")
                continue
            try:
                if assign:
                    if isinstance(param, Parameter):
                        if isinstance(input_param, Parameter):
                            new = input_param
                            new.requires_grad_(param.requires_grad)
                        else:
                            src = input_param if isinstance(input_param, Tensor) else Tensor(arr)
                            new = Parameter(src, requires_grad=param.requires_grad)
                    else:
                        new = input_param if isinstance(input_param, Tensor) else Tensor(arr)
                    setattr(self, name, new)
                else:
                    np.copyto(param._data, arr, casting="unsafe")
            except Exception as ex:
                error_msgs.append(
                    f'While copying the parameter named "{key}", whose dimensions in the model '
                    f"are {tuple(param.shape)} and whose dimensions in the checkpoint are "
                    f"{tuple(arr.shape)}, an exception occurred : {ex.args}.")
        extra_state_key = prefix + _EXTRA_STATE_KEY_SUFFIX
        if getattr(type(self), "set_extra_state", None) is not Module.set_extra_state:
            if extra_state_key in state_dict:
                self.set_extra_state(state_dict[extra_state_key])
            elif strict:
                missing_keys.append(extra_state_key)
        elif strict and extra_state_key in state_dict:
            unexpected_keys.append(extra_state_key)
        if strict:
            for key in state_dict.keys():
                if key.startswith(prefix) and key != extra_state_key:
                    input_name = key[len(prefix):].split(".", 1)
                    if len(input_name) > 1:
                        if input_name[0] not in self._modules:
                            unexpected_keys.append(key)
                    elif input_name[0] not in local_state:
                        unexpected_keys.append(key)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copy parameters and buffers from ``state_dict`` into this module and its descendants.

        Values may be pyddp Tensors, NumPy arrays or other array-likes (CPU torch
        tensors included); they are copied into the existing arrays in place, cast
        to the parameter's dtype.  With ``strict=True`` missing or unexpected keys
        raise torch's ``RuntimeError("Error(s) in loading state_dict for ...")``;
        size mismatches always raise.  Returns ``(missing_keys, unexpected_keys)``.
        With ``assign=True`` the checkpoint's tensors replace the module's instead.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing_keys = []
        unexpected_keys = []
        error_msgs = []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)
        if metadata is not None:
            state_dict._metadata = metadata

        def load(module, local_state_dict, prefix=""):
            local_metadata = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                local_metadata["assign_to_params_buffers"] = assign
            module._load_from_state_dict(local_state_dict, prefix, local_metadata, True,
                                         missing_keys, unexpected_keys, error_msgs)
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    child_state_dict = {k: v for k, v in local_state_dict.items()
                                        if k.startswith(child_prefix)}
                    load(child, child_state_dict, child_prefix)  # noqa: F821
            incompatible_keys = _IncompatibleKeys(missing_keys, unexpected_keys)
            for hook in module._load_state_dict_post_hooks.values():
                out = hook(module, incompatible_keys)
                if out is not None:
                    raise AssertionError(
                        "Hooks registered with ``register_load_state_dict_post_hook`` are not "
                        "expected to return new values, if incompatible_keys need to be modified, "
                        "it should be done inplace.")

        load(self, state_dict)
        del load
        if strict:
            if unexpected_keys:
                error_msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected_keys)))
            if missing_keys:
                error_msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing_keys)))
        if error_msgs:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                self.__class__.__name__, "\n\t".join(error_msgs)))
        return _IncompatibleKeys(missing_keys, unexpected_keys)

    # ------------------------------------------------------------------ repr
    def _get_name(self):
        return self.__class__.__name__

    def extra_repr(self):
        """Extra text shown inside this module's repr (one line or several)."""
        return ""

    def __repr__(self):
        extra_lines = []
        extra_repr = self.extra_repr()
        if extra_repr:
            extra_lines = extra_repr.split("\n")
        child_lines = []
        for key, module in self._modules.items():
            mod_str = _addindent(repr(module), 2)
            child_lines.append("(" + key + "): " + mod_str)
        lines = extra_lines + child_lines
        main_str = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main_str += extra_lines[0]
            else:
                main_str += "\n  " + "\n  ".join(lines) + "\n"
        main_str += ")"
        return main_str
