"""Config modules of switches (torch.utils._config_module's behaviour, small): a module whose
known names read and write recorded values, whose unknown names raise torch's AttributeError
("torch._dynamo.config.foo does not exist", with pyddp's module name), with ``patch`` (a context
manager and decorator setting some for a while), ``get_config_copy``, ``load_config`` and
``save_config``.  Nothing reads the values back to change a computation: pyddp compiles nothing.
"""
import contextlib
import copy
import pickle
import sys
import types

__all__ = ["install", "Switches"]


class Switches:
    """A namespace of known switches (the module's own, or a nested group such as
    ``torch._inductor.config.triton``)."""

    def __init__(self, qualname, defaults):
        object.__setattr__(self, "_qualname", qualname)
        object.__setattr__(self, "_values", dict(defaults))

    def __getattr__(self, name):
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"{object.__getattribute__(self, '_qualname')}.{name} does not exist")

    def __setattr__(self, name, value):
        values = object.__getattribute__(self, "_values")
        if name not in values:
            raise AttributeError(f"{self._qualname}.{name} does not exist")
        values[name] = value

    def __dir__(self):
        return sorted(self._values)


def _flat(values, prefix=""):
    out = {}
    for k, v in values.items():
        if isinstance(v, Switches):
            out.update(_flat(object.__getattribute__(v, "_values"), f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


class _ConfigModule(types.ModuleType):
    def __getattr__(self, name):
        values = self.__dict__["_switches"]._values
        if name in values:
            return values[name]
        raise AttributeError(f"{self.__name__}.{name} does not exist")

    def __setattr__(self, name, value):
        sw = self.__dict__.get("_switches")
        if sw is not None and not name.startswith("_") and name not in self.__dict__:
            if name not in sw._values or isinstance(sw._values[name], Switches):
                raise AttributeError(f"{self.__name__}.{name} does not exist")
            sw._values[name] = value
            return
        super().__setattr__(name, value)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.__dict__["_switches"]._values))

    def _get(self, dotted):
        obj = self
        *path, last = dotted.split(".")
        for p in path:
            obj = getattr(obj, p)
        return obj, last

    def get_config_copy(self):
        """{dotted name: value} of every switch (a copy)."""
        return copy.deepcopy(_flat(self.__dict__["_switches"]._values))

    def save_config(self):
        """The switches pickled (bytes), for load_config."""
        return pickle.dumps(self.get_config_copy(), protocol=2)

    def load_config(self, data):
        """Set the switches from save_config's bytes or a {dotted name: value} dict."""
        values = pickle.loads(data) if isinstance(data, (bytes, bytearray)) else dict(data)
        for k, v in values.items():
            obj, last = self._get(k)
            setattr(obj, last, v)

    def patch(self, arg1=None, arg2=None, **kwargs):
        """Set switches for the duration of a ``with`` block or a decorated function:
        ``patch("name", value)``, ``patch({"name": value})`` or ``patch(name=value)``; the
        previous values come back afterwards."""
        changes = dict(kwargs)
        if isinstance(arg1, str):
            changes[arg1] = arg2
        elif isinstance(arg1, dict):
            changes.update(arg1)
        module = self

        @contextlib.contextmanager
        def patched():
            old = {}
            for k, v in changes.items():
                obj, last = module._get(k)
                old[k] = getattr(obj, last)
                setattr(obj, last, v)
            try:
                yield
            finally:
                for k, v in old.items():
                    obj, last = module._get(k)
                    setattr(obj, last, v)
        return patched()


def install(module_name, defaults):
    """Make the module ``module_name`` a config module of ``defaults`` ({name: value}; a dict
    value is a nested group of switches)."""
    mod = sys.modules[module_name]
    values = {k: Switches(f"{module_name}.{k}", v) if isinstance(v, dict) else v
              for k, v in defaults.items()}
    mod.__dict__["_switches"] = Switches(module_name, values)
    mod.__class__ = _ConfigModule
