"""Module hooks' machinery (torch.utils.hooks): ``RemovableHandle``, which the ``register_*_hook``
methods return, and the identity autograd Functions through which a module's full backward
(pre-)hooks see grad_output and grad_input (torch's BackwardHook)."""
import weakref

from ..._tensor import Tensor
from ...autograd.function import Function


class RemovableHandle:
    """A handle returned by the ``register_*_hook`` methods; ``remove()`` unregisters the hook.

    Also a context manager that removes the hook on exit, as torch's
    ``torch.utils.hooks.RemovableHandle``.
    """

    next_id = 0

    def __init__(self, hooks_dict, *, extra_dict=None):
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = RemovableHandle.next_id
        RemovableHandle.next_id += 1
        self.extra_dict_ref = ()
        if isinstance(extra_dict, dict):
            self.extra_dict_ref = (weakref.ref(extra_dict),)
        elif isinstance(extra_dict, list):
            self.extra_dict_ref = tuple(weakref.ref(d) for d in extra_dict)

    def remove(self):
        """Unregister the hook (no-op if already removed)."""
        hooks_dict = self.hooks_dict_ref()
        if hooks_dict is not None and self.id in hooks_dict:
            del hooks_dict[self.id]
        for ref in self.extra_dict_ref:
            extra = ref()
            if extra is not None and self.id in extra:
                del extra[self.id]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()



class _BackwardHookState:
    """What a module's full backward hooks need between its output and input gradient nodes."""

    __slots__ = ("module", "n_inputs", "input_positions", "grad_output", "inputs_wrapped")

    def __init__(self, module, n_inputs):
        self.module = module
        self.n_inputs = n_inputs
        self.input_positions = ()
        self.grad_output = None
        self.inputs_wrapped = False



def _identity_outputs(xs):
    return tuple(Tensor._wrap(x._data) for x in xs)



class _BackwardHookOutputs(Function):
    """Identity on the module's outputs; its backward sees grad_output (pre-hooks run here)."""

    @staticmethod
    def forward(ctx, state, *outs):
        ctx.state = state
        return _identity_outputs(outs)

    @staticmethod
    def backward(ctx, *grads):
        st = ctx.state
        mod = st.module
        for hook in list(mod._backward_pre_hooks.values()):
            r = hook(mod, grads)
            if r is not None:
                r = tuple(r) if isinstance(r, (tuple, list)) else (r,)
                if len(r) != len(grads):
                    raise RuntimeError(
                        f"Backward pre hook returned an invalid number of grad_output, got "
                        f"{len(r)}, but expected {len(grads)}")
                grads = r
        st.grad_output = grads
        if not st.inputs_wrapped:
            # no input requires grad: torch calls the hooks now, with None input gradients
            none_in = (None,) * st.n_inputs
            for hook in list(mod._backward_hooks.values()):
                r = hook(mod, none_in, grads)
                if r is not None and not all(g is None for g in r):
                    raise RuntimeError(
                        "Backward hook for Modules where no input requires gradient should "
                        "always return None or None for all gradients.")
        return (None,) + tuple(grads)



class _BackwardHookInputs(Function):
    """Identity on the module's inputs; its backward sees grad_input and runs the full hooks."""

    @staticmethod
    def forward(ctx, state, *ins):
        ctx.state = state
        return _identity_outputs(ins)

    @staticmethod
    def backward(ctx, *grads):
        st = ctx.state
        mod = st.module
        full = [None] * st.n_inputs
        for pos, g in zip(st.input_positions, grads):
            full[pos] = g
        grad_input = tuple(full)
        for hook in list(mod._backward_hooks.values()):
            r = hook(mod, grad_input, st.grad_output)
            if r is not None:
                r = tuple(r) if isinstance(r, (tuple, list)) else (r,)
                if len(r) != len(grad_input):
                    raise RuntimeError(
                        f"Backward hook returned an invalid number of grad_input, got {len(r)}, "
                        f"but expected {len(grad_input)}")
                grad_input = r
        return (None,) + tuple(grad_input[pos] for pos in st.input_positions)
