"""Parametrizations (torch.nn.utils.parametrize): ``register_parametrization(module, "weight",
p)`` makes ``module.weight`` computed on each access as ``p(original)`` (or ``p(*originals)``
when ``p.right_inverse`` splits the tensor into several, as weight_norm's does), with the
originals stored as ``module.parametrizations.weight.original`` (``original0``, ``original1``,
...), torch's names and state_dict keys.  The module's class becomes
``Parametrized<Class>``, as in torch; ``remove_parametrizations`` undoes it.  ``cached()`` keeps
each parametrized tensor computed once inside a ``with`` block."""
import contextlib

from ..._tensor import Tensor, no_grad
from ..modules.container import ModuleDict, ModuleList
from ..parameter import Parameter

__all__ = ["register_parametrization", "remove_parametrizations", "is_parametrized", "cached",
           "ParametrizationList", "type_before_parametrizations"]

_cache = {"enabled": 0, "values": {}}


@contextlib.contextmanager
def cached():
    """Compute each parametrized tensor once inside the block (torch's parametrize.cached)."""
    _cache["enabled"] += 1
    try:
        yield
    finally:
        _cache["enabled"] -= 1
        if not _cache["enabled"]:
            _cache["values"] = {}


def _as_original(t, like):
    if isinstance(like, Parameter):
        return Parameter(t.detach()._data, requires_grad=like.requires_grad)
    return t.detach()


class ParametrizationList(ModuleList):
    """The parametrizations of one tensor and its original(s) (torch's ParametrizationList)."""

    def __init__(self, modules, original, unsafe=False):
        super().__init__(modules)
        self.unsafe = unsafe
        new = original
        with no_grad():
            for m in reversed(list(self)):
                if hasattr(m, "right_inverse"):
                    new = m.right_inverse(new)
        self.is_tensor = isinstance(new, Tensor)
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            if not unsafe and (new.shape != original.shape or new.dtype != original.dtype):
                raise ValueError("When `right_inverse` outputs one tensor, it may not change the "
                                 f"dtype or shape.\noriginal.shape: {original.shape}\n"
                                 f"right_inverse(original).shape: {new.shape}")
            if new is original or (not isinstance(original, Parameter) and
                                   new._data is original._data):
                orig = original
            else:
                orig = _as_original(new, original)
            self._set_original("original", orig, original)
        else:
            for i, t in enumerate(new):
                self._set_original(f"original{i}", _as_original(t, original), original)

    def _set_original(self, name, value, like):
        if isinstance(value, Parameter):
            self.register_parameter(name, value)
        else:
            self.register_buffer(name, value)

    def right_inverse(self, value):
        """Set the original(s) from a new value of the parametrized tensor."""
        with no_grad():
            for m in reversed(list(self)):
                if hasattr(m, "right_inverse"):
                    value = m.right_inverse(value)
            if self.is_tensor:
                self.original._data[...] = value._data
            else:
                for i, t in enumerate(value):
                    getattr(self, f"original{i}")._data[...] = t._data

    def forward(self):
        """The parametrized tensor, from the original(s)."""
        if self.is_tensor:
            x = self[0](self.original)
        else:
            x = self[0](*(getattr(self, f"original{i}") for i in range(self.ntensors)))
        for m in list(self)[1:]:
            x = m(x)
        return x


def _inject_property(cls, tensor_name):
    def get_parametrized(self):
        plist = self.parametrizations[tensor_name]
        if _cache["enabled"]:
            key = (id(self), tensor_name)
            if key not in _cache["values"]:
                _cache["values"][key] = plist()
            return _cache["values"][key]
        return plist()

    def set_original(self, value):
        self.parametrizations[tensor_name].right_inverse(value)
    setattr(cls, tensor_name, property(get_parametrized, set_original,
                                       doc=f"The parametrized {tensor_name}."))


def is_parametrized(module, tensor_name=None):
    """Whether ``module`` has a parametrization (of ``tensor_name`` when given)."""
    plists = module.__dict__.get("_modules", {}).get("parametrizations")
    if plists is None or not isinstance(plists, ModuleDict):
        return False
    return len(plists) > 0 if tensor_name is None else tensor_name in plists


def type_before_parametrizations(module):
    """The module's class before any parametrization was registered."""
    return module.__class__.__bases__[0] if is_parametrized(module) else type(module)


def register_parametrization(module, tensor_name, parametrization, *, unsafe=False):
    """Make ``module.<tensor_name>`` be ``parametrization(original)`` on each access (see the
    module docstring); a second call on the same name chains another parametrization.
    Returns the module."""
    parametrization.train(module.training)
    if is_parametrized(module, tensor_name):
        module.parametrizations[tensor_name].append(parametrization)
        return module
    original = getattr(module, tensor_name)
    plist = ParametrizationList([parametrization], original, unsafe=unsafe)
    delattr(module, tensor_name)
    if not is_parametrized(module):
        cls = module.__class__
        module.__class__ = type(f"Parametrized{cls.__name__}", (cls,), {})
        module.parametrizations = ModuleDict()
    _inject_property(module.__class__, tensor_name)
    module.parametrizations[tensor_name] = plist
    return module


def remove_parametrizations(module, tensor_name, leave_parametrized=True):
    """Remove the parametrizations of ``module.<tensor_name>``: it becomes a Parameter again,
    holding the parametrized value (``leave_parametrized=True``) or the original.  Returns the
    module."""
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"Module {module} does not have a parametrization on {tensor_name}")
    plist = module.parametrizations[tensor_name]
    if plist.is_tensor:
        original = plist.original
        if leave_parametrized:
            with no_grad():
                t = getattr(module, tensor_name)
            original._data = t._data.astype(original._data.dtype, copy=True)
    else:
        if not leave_parametrized:
            raise ValueError("Cannot leave unparametrized (`leave_parametrized=False`) a tensor "
                             "that is parametrized in terms of a sequence of tensors.")
        with no_grad():
            t = getattr(module, tensor_name)
        like = plist.original0
        original = Parameter(t._data.copy(), requires_grad=like.requires_grad) \
            if isinstance(like, Parameter) else t.detach()
    delattr(module.__class__, tensor_name)
    del module.parametrizations[tensor_name]
    if isinstance(original, Parameter):
        module.register_parameter(tensor_name, original)
    else:
        module.register_buffer(tensor_name, original)
    if not is_parametrized(module):
        delattr(module, "parametrizations")
        module.__class__ = module.__class__.__bases__[0]
    return module

