"""default_collate / default_convert (kept under this name; they live in
pyddp/utils/data/_utils/collate.py, where torch keeps them)."""
from ._utils.collate import (collate, default_collate, default_collate_err_msg_format,  # noqa: F401
                             default_collate_fn_map, default_convert)

__all__ = ["default_collate", "default_convert"]
