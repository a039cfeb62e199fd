"""pyddp's one torch detector: whether a value is a torch tensor or module, never importing torch
(a program that has not imported torch has no torch tensors).  A leaf module: pyddp._interop
re-exports it, and code that must stay light (utils.data's collate) imports it from here."""
import sys

__all__ = ["loaded_torch", "is_torch_tensor", "is_torch_module"]


def loaded_torch():
    """The torch module when something has imported it, else None (never imports it)."""
    return sys.modules.get("torch")


def is_torch_tensor(x) -> bool:
    """True for a torch.Tensor (nn.Parameter and subclasses included); never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_torch_module(m) -> bool:
    """True for a torch.nn.Module; never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(m, torch.nn.Module)
