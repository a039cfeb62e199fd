"""str/repr of pyddp Tensors as torch formats them (torch/_tensor_str.py of torch 2.13, ported to
NumPy), and torch's print options: ``set_printoptions``, ``get_printoptions``, ``printoptions``.

The same precision, scientific-notation choice, integer-valued float display (``1.``), widths,
line wrapping at ``linewidth``, summarisation above ``threshold`` with ``edgeitems`` and the
suffixes (``dtype=...`` for a dtype other than the default float dtype, int64 and bool;
``grad_fn=<...>`` / ``requires_grad=True``; ``size=...`` for empty tensors).  Dtypes are
spelled ``pyddp.float16`` where torch writes ``torch.float16``.
"""
import contextlib
import dataclasses
import math

import numpy as np

from ._dtypes import bfloat16, _is_float_dtype
from ._grad_mode import _st

__all__ = ["set_printoptions", "get_printoptions", "printoptions"]


@dataclasses.dataclass
class _PrinterOptions:
    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: object = None


PRINT_OPTS = _PrinterOptions()


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None,
                     profile=None, sci_mode=None):
    """Set the options for printing tensors (torch.set_printoptions): precision (4), threshold
    (1000 elements, above which tensors are summarised), edgeitems (3), linewidth (80),
    profile ('default', 'short' or 'full'), sci_mode (None: chosen per tensor; True or False).
    As in torch, sci_mode is reset to None by any call that does not give it."""
    for name, value in (("precision", precision), ("edgeitems", edgeitems),
                        ("linewidth", linewidth)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"set_printoptions(): {name} must be an int, got "
                            f"{type(value).__name__}")
    if threshold is not None and (isinstance(threshold, bool)
                                  or not isinstance(threshold, (int, float))):
        raise TypeError(f"set_printoptions(): threshold must be a number, got "
                        f"{type(threshold).__name__}")
    if sci_mode is not None and not isinstance(sci_mode, bool):
        raise TypeError(f"set_printoptions(): sci_mode must be None, True or False, got "
                        f"{sci_mode!r}")
    if profile is not None:
        if profile == "default":
            PRINT_OPTS.precision, PRINT_OPTS.threshold = 4, 1000
            PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 3, 80
        elif profile == "short":
            PRINT_OPTS.precision, PRINT_OPTS.threshold = 2, 1000
            PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 2, 80
        elif profile == "full":
            PRINT_OPTS.precision, PRINT_OPTS.threshold = 4, math.inf
            PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 3, 80
    if precision is not None:
        PRINT_OPTS.precision = precision
    if threshold is not None:
        PRINT_OPTS.threshold = threshold
    if edgeitems is not None:
        PRINT_OPTS.edgeitems = edgeitems
    if linewidth is not None:
        PRINT_OPTS.linewidth = linewidth
    PRINT_OPTS.sci_mode = sci_mode


def get_printoptions():
    """The current print options, as keyword arguments for set_printoptions."""
    return dataclasses.asdict(PRINT_OPTS)


@contextlib.contextmanager
def printoptions(**kwargs):
    """Change the print options inside a ``with`` block."""
    old = get_printoptions()
    set_printoptions(**kwargs)
    try:
        yield
    finally:
        set_printoptions(**old)


def _values(a):
    """Python numbers of an ndarray (bfloat16 through float64, as torch's tolist)."""
    if bfloat16 is not None and a.dtype == bfloat16:
        a = a.astype(np.float64)
    return a.tolist()


class _Formatter:
    def __init__(self, a):
        self.floating_dtype = _is_float_dtype(a.dtype) and a.dtype.kind != "c"
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = a.reshape(-1)
        if not self.floating_dtype:
            for value in _values(flat):
                self.max_width = max(self.max_width, len(f"{value}"))
            return
        f64 = flat.astype(np.float64)
        vals = f64[np.isfinite(f64) & (f64 != 0)]
        if vals.size == 0:
            return
        absv = np.abs(vals)
        vmin, vmax = float(absv.min()), float(absv.max())
        self.int_mode = bool(np.all(vals == np.ceil(vals)))
        p = PRINT_OPTS.precision
        self.sci_mode = (vmax / vmin > 1000.0 or vmax > 1.0e8 or vmin < 1.0e-4) \
            if PRINT_OPTS.sci_mode is None else PRINT_OPTS.sci_mode
        values = vals.tolist()
        if self.sci_mode:
            for value in values:
                self.max_width = max(self.max_width, len(f"{{:.{p}e}}".format(value)))
        elif self.int_mode:
            for value in values:
                self.max_width = max(self.max_width, len(f"{value:.0f}") + 1)
        else:
            for value in values:
                self.max_width = max(self.max_width, len(f"{{:.{p}f}}".format(value)))

    def width(self):
        return self.max_width

    def format(self, value):
        p = PRINT_OPTS.precision
        if self.floating_dtype:
            if self.sci_mode:
                ret = f"{{:{self.max_width}.{p}e}}".format(value)
            elif self.int_mode:
                ret = f"{value:.0f}"
                if not (math.isinf(value) or math.isnan(value)):
                    ret += "."
            else:
                ret = f"{{:.{p}f}}".format(value)
        else:
            ret = f"{value}"
        return (self.max_width - len(ret)) * " " + ret


def _complex_str(val, f1, f2):
    real_str = f1.format(val.real)
    imag_str = (f2.format(val.imag) + "j").lstrip()
    if imag_str[0] == "+" or imag_str[0] == "-":
        return real_str + imag_str
    return real_str + "+" + imag_str


def _vector_str(a, indent, summarize, f1, f2=None):
    element_length = f1.width() + 2
    if f2 is not None:
        element_length += f2.width() + 1
    per_line = max(1, math.floor((PRINT_OPTS.linewidth - indent) / element_length))

    def fmt(val):
        return _complex_str(val, f1, f2) if f2 is not None else f1.format(val)

    e = PRINT_OPTS.edgeitems
    if summarize and not e:
        data = ["..."]
    elif summarize and a.shape[0] > 2 * e:
        data = ([fmt(v) for v in _values(a[:e])] + [" ..."]
                + [fmt(v) for v in _values(a[-e:])])
    else:
        data = [fmt(v) for v in _values(a)]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"


def _str_with_formatter(a, indent, summarize, f1, f2=None):
    dim = a.ndim
    if dim == 0:
        v = _values(a)
        return _complex_str(v, f1, f2) if f2 is not None else f1.format(v)
    if dim == 1:
        return _vector_str(a, indent, summarize, f1, f2)
    e = PRINT_OPTS.edgeitems
    if summarize and a.shape[0] > 2 * e:
        rows = ([_str_with_formatter(a[i], indent + 1, summarize, f1, f2) for i in range(e)]
                + ["..."]
                + [_str_with_formatter(a[i], indent + 1, summarize, f1, f2)
                   for i in range(a.shape[0] - e, a.shape[0])])
    else:
        rows = [_str_with_formatter(a[i], indent + 1, summarize, f1, f2)
                for i in range(a.shape[0])]
    return "[" + ("," + "\n" * (dim - 1) + " " * (indent + 1)).join(rows) + "]"


def _summarized(a):
    dim = a.ndim
    e = PRINT_OPTS.edgeitems
    if dim == 0:
        return a
    if dim == 1:
        return np.concatenate((a[:e], a[-e:])) if a.shape[0] > 2 * e else a
    if not e:
        return a[(slice(0, 0),) * dim]
    if a.shape[0] > 2 * e:
        parts = [a[i] for i in range(e)] + [a[i] for i in range(a.shape[0] - e, a.shape[0])]
        return np.stack([_summarized(x) for x in parts])
    return np.stack([_summarized(x) for x in a])


def _tensor_str(a, indent):
    if a.size == 0:
        return "[]"
    summarize = a.size > PRINT_OPTS.threshold
    if a.dtype.kind == "c":
        f1 = _Formatter(_summarized(a.real) if summarize else a.real)
        f2 = _Formatter(_summarized(a.imag) if summarize else a.imag)
        return _str_with_formatter(a, indent, summarize, f1, f2)
    f = _Formatter(_summarized(a) if summarize else a)
    return _str_with_formatter(a, indent, summarize, f)


def _add_suffixes(tensor_str, suffixes, indent):
    out = [tensor_str]
    last_line_len = len(tensor_str) - tensor_str.rfind("\n") + 1
    for suffix in suffixes:
        if last_line_len + len(suffix) + 2 > PRINT_OPTS.linewidth:
            out.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
        else:
            out.append(", " + suffix)
            last_line_len += len(suffix) + 2
    out.append(")")
    return "".join(out)


def tensor_repr(t):
    """torch's ``_str_intern`` for a pyddp Tensor (pyddp's dtype names)."""
    a = t._data
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    default = _st.default
    default_complex = np.dtype(np.complex128) if default == np.float64 else np.dtype(np.complex64)
    has_default_dtype = a.dtype in (default, default_complex, np.dtype(np.int64),
                                    np.dtype(np.bool_))
    dtype_str = f"dtype=pyddp.{a.dtype.name}"
    if a.size == 0:
        if a.ndim != 1:
            suffixes.append("size=" + str(tuple(a.shape)))
        if a.dtype != default:
            suffixes.append(dtype_str)
        body = "[]"
    else:
        if not PRINT_OPTS.edgeitems:
            suffixes.append("size=" + str(tuple(a.shape)))
        if not has_default_dtype:
            suffixes.append(dtype_str)
        body = _tensor_str(a, indent)
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + body, suffixes, indent)
