"""torch.utils.data._utils's layout: ``collate`` (default_collate, default_convert, collate and
the per-type functions of ``default_collate_fn_map``)."""
from . import collate  # noqa: F401
