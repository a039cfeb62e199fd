"""The optimizer base class: torch.optim.Optimizer's param_groups, state, add_param_group,
state_dict / load_state_dict and zero_grad, for pyddp Tensors and torch CPU tensors.

State tensors are NumPy arrays (float32; float64 for float64 parameters).  ``state_dict()`` has
torch's structure -- ``{'state': {0: {'step': ..., 'exp_avg': ...}}, 'param_groups': [{...,
'params': [0, 1, ...]}]}`` -- and ``load_state_dict`` also takes a torch optimizer's state dict
(torch tensors are copied into NumPy arrays).
"""
from __future__ import annotations

import copy
import functools
from collections.abc import MutableMapping
from itertools import chain

import numpy as np

from .._interop import is_torch_tensor as _is_torch
from .._kernels import as_array

__all__ = ["Optimizer", "required"]


class _RequiredParameter:
    """Singleton marking a hyper-parameter that has no default (torch.optim.optimizer.required)."""

    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


def _is_param(x) -> bool:
    return _is_torch(x) or isinstance(getattr(x, "_data", None), np.ndarray)


class ParamState(MutableMapping):
    """``optimizer.state``: per-parameter state dicts keyed by the parameter object itself.

    Keys are compared by identity (as torch's tensor hashing does), so tensors whose ``==`` is
    elementwise work as keys.  A missing parameter reads as a new empty dict (defaultdict).
    """

    def __init__(self):
        self._d = {}

    def __getitem__(self, p):
        entry = self._d.get(id(p))
        if entry is None:
            entry = (p, {})
            self._d[id(p)] = entry
        return entry[1]

    def __setitem__(self, p, value):
        self._d[id(p)] = (p, value)

    def __delitem__(self, p):
        del self._d[id(p)]

    def __contains__(self, p):
        return id(p) in self._d

    def __iter__(self):
        return iter([e[0] for e in self._d.values()])

    def __len__(self):
        return len(self._d)

    def __repr__(self):
        return f"ParamState({len(self)} parameters)"

    # copy / deepcopy / pickle: keys are object ids, so store the pairs and re-key them
    def __getstate__(self):
        return list(self._d.values())

    def __setstate__(self, pairs):
        self._d = {id(p): (p, st) for p, st in pairs}


class _RemovableHandle:
    """Returned by the hook registrations; ``remove()`` unregisters the hook."""

    _next_id = 0

    def __init__(self, hooks: dict):
        self._hooks = hooks
        self.id = _RemovableHandle._next_id
        _RemovableHandle._next_id += 1

    def remove(self):
        """Unregister the hook (idempotent)."""
        self._hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _with_step_hooks(step):
    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        if self.__dict__.get("_in_step_hooks"):  # a subclass's step calling super().step()
            return step(self, *args, **kwargs)
        self._in_step_hooks = True
        try:
            return _run_hooked(step, self, args, kwargs)
        finally:
            self._in_step_hooks = False

    wrapper._pyddp_step_hooks = True
    return wrapper


def _run_hooked(step, self, args, kwargs):
    """Pre-hooks, the step, post-hooks (torch's order)."""
    for hook in list(getattr(self, "_optimizer_step_pre_hooks", {}).values()):
        result = hook(self, args, kwargs)
        if result is not None:
            if not (isinstance(result, tuple) and len(result) == 2):
                raise RuntimeError(
                    f"{hook} must return None or a tuple of (new_args, new_kwargs), but got "
                    f"{result}.")
            args, kwargs = result
    out = step(self, *args, **kwargs)
    for hook in list(getattr(self, "_optimizer_step_post_hooks", {}).values()):
        hook(self, args, kwargs)
    return out


def _state_value(key, value, param_dtype):
    """A loaded state value as an owned NumPy array (torch tensors copied)."""
    if _is_torch(value):
        value = value.detach().cpu()
        if key == "step":
            return np.array(float(value.item()), dtype=np.float32)
        value = value.float().numpy() if str(value.dtype) == "torch.bfloat16" else value.numpy()
    if key == "step":
        return np.array(float(np.asarray(value)), dtype=np.float32)
    if isinstance(value, np.ndarray) or np.isscalar(value):
        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            want = np.float64 if param_dtype == "float64" else np.float32
            return np.array(arr, dtype=want, copy=True, order="C")
        return np.array(arr, copy=True)
    return copy.deepcopy(value)


class Optimizer:
    """Base class of pyddp's optimizers (torch.optim.Optimizer's interface).

    Args:
        params: an iterable of parameters (pyddp Tensors or torch CPU tensors), of dicts defining
            parameter groups (``{'params': [...], 'lr': ...}``), or of ``(name, param)`` pairs.
        defaults: default hyper-parameters for groups that do not set them.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "_pyddp_step_hooks", False):
            cls.step = _with_step_hooks(step)

    def __init__(self, params, defaults: dict):
        self.defaults = defaults
        self._optimizer_step_pre_hooks = {}
        self._optimizer_step_post_hooks = {}
        self.state = ParamState()
        self.param_groups: list[dict] = []
        if _is_param(params):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {type(params).__name__}")
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_optimizer_step_pre_hooks", {})
        self.__dict__.setdefault("_optimizer_step_post_hooks", {})

    def register_step_pre_hook(self, hook):
        """``hook(optimizer, args, kwargs)`` runs before each ``step``; it may return
        ``(new_args, new_kwargs)``.  Returns a handle whose ``remove()`` unregisters it."""
        handle = _RemovableHandle(self._optimizer_step_pre_hooks)
        self._optimizer_step_pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook):
        """``hook(optimizer, args, kwargs)`` runs after each ``step``.  Returns a handle whose
        ``remove()`` unregisters it."""
        handle = _RemovableHandle(self._optimizer_step_post_hooks)
        self._optimizer_step_post_hooks[handle.id] = hook
        return handle

    def __repr__(self):
        lines = [self.__class__.__name__ + " ("]
        for i, group in enumerate(self.param_groups):
            lines.append("")
            lines.append(f"Parameter Group {i}")
            for key in sorted(group):
                if key != "params":
                    lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)

    def add_param_group(self, param_group: dict) -> None:
        """Add a parameter group (a dict with 'params' and optional hyper-parameters)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if _is_param(params):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead.")
        else:
            param_group["params"] = list(params)
        plist = param_group["params"]
        names = []
        if plist and isinstance(plist[0], tuple):
            names = [n for n, _ in plist]
            plist = param_group["params"] = [p for _, p in plist]
            param_group["param_names"] = names
        for p in plist:
            if not _is_param(p):
                raise TypeError(
                    "optimizer can only optimize Tensors, but one of the params is "
                    f"{type(p).__name__}")
            if not getattr(p, "is_leaf", True):
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(
                    "parameter group didn't specify a value of required optimization "
                    f"parameter {name}")
            param_group.setdefault(name, default)
        seen = set()
        for p in plist:
            if id(p) in seen:
                import warnings

                warnings.warn(
                    "optimizer contains a parameter group with duplicate parameters; in future, "
                    "this will cause an error", stacklevel=3)
            seen.add(id(p))
        existing = {id(p) for g in self.param_groups for p in g["params"]}
        if existing & seen:
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of every parameter: to None (default) or to zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                elif _is_torch(p):
                    p.grad.detach_()
                    p.grad.zero_()
                else:
                    as_array(p.grad, "grad")[...] = 0

    def step(self, closure=None):
        """Perform one optimization step; returns ``closure()``'s value when given."""
        raise NotImplementedError

    def _run_closure(self, closure):
        """closure() with gradient recording on (torch's enable_grad, else pyddp's)."""
        if closure is None:
            return None
        if _is_torch(self.param_groups[0]["params"][0]):
            import torch

            with torch.enable_grad():
                return closure()
        from .._tensor._grad_mode import enable_grad

        with enable_grad():
            return closure()

    # ---- checkpoints ----
    def state_dict(self) -> dict:
        """The optimizer's state in torch's layout: ``{'state': {index: {...}}, 'param_groups':
        [{..., 'params': [indices]}]}``; parameters are numbered in group order."""
        mapping = {}
        index = 0
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            ids = []
            for p in group["params"]:
                if id(p) not in mapping:
                    mapping[id(p)] = index
                    index += 1
                ids.append(mapping[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {mapping[id(p)]: s for p, s in self.state.items() if id(p) in mapping and s}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict made by ``state_dict()`` (of pyddp or of the same torch optimizer).

        The number of groups and of parameters per group must match (torch's ValueErrors).
        """
        state_dict = dict(state_dict)
        groups = self.param_groups
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        param_lens = (len(g["params"]) for g in groups)
        saved_lens = (len(g["params"]) for g in saved_groups)
        if any(p_len != s_len for p_len, s_len in zip(param_lens, saved_lens)):
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of "
                "optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))
        self.state = ParamState()
        for k, v in state_dict["state"].items():
            if k in id_map:
                p = id_map[k]
                pdt = np.dtype(as_array(p).dtype).name
                self.state[p] = {key: _state_value(key, val, pdt) for key, val in v.items()}

        new_groups = []
        for group, new_group in zip(groups, saved_groups):
            new_group["params"] = group["params"]
            if "param_names" in group and "param_names" not in new_group:
                new_group["param_names"] = group["param_names"]
            new_groups.append(new_group)
        self.param_groups = new_groups
        self._after_load()

    def _after_load(self):
        """Subclasses restore group defaults a loaded dict may lack (torch's __setstate__)."""
        for group in self.param_groups:
            for name, default in self.defaults.items():
                group.setdefault(name, default)
