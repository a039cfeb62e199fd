"""NumPy references for the collective tests: dtypes, deterministic per-rank inputs, reductions.

Nothing here calls pyddp: every expected value is computed with NumPy (in float64 / complex128 for
floating types, then cast once), so the tests compare pyddp against an independent reference.
"""
import numpy as np

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 tests are skipped
    ml_dtypes = None
    BFLOAT16 = None

ALL_DTYPE_NAMES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                   "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
DTYPE_NAMES = [d for d in ALL_DTYPE_NAMES if d != "bfloat16" or BFLOAT16 is not None]
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]

# A few dtypes spanning every element size (1, 2, 4, 8, 16 bytes) and the float32-accumulated
# half types; used where running all fifteen at the large size would cost too much time.
LARGE_DTYPE_NAMES = [d for d in ["bool", "uint8", "int16", "float16", "bfloat16", "int32", "float32",
                                 "float64", "uint64", "complex128"] if d in DTYPE_NAMES]

SMALL_SIZES = [0, 1, 7, 33]
LARGE_BYTES = 3 << 20  # 3 MiB


def dtype(name):
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def kind(name):
    if name == "bool":
        return "bool"
    if name in ("float16", "bfloat16", "float32", "float64"):
        return "float"
    if name.startswith("complex"):
        return "complex"
    return "uint" if name.startswith("uint") else "int"


def large_count(name):
    """About 3 MiB of elements, never divisible by 2, 3 or 4 (so chunks are uneven)."""
    n = LARGE_BYTES // dtype(name).itemsize
    while n % 2 == 0 or n % 3 == 0:
        n += 1
    return n


def op_valid(name, op):
    """The ops pyddp.distributed accepts for a host array's dtype, as torch's gloo backend:
    bitwise only on bool/integers, only SUM and AVG on complex, AVG only on floating types."""
    k = kind(name)
    if op in ("BAND", "BOR", "BXOR"):
        return k in ("bool", "int", "uint")
    if k == "complex":
        return op in ("SUM", "AVG")
    if op == "AVG":
        return k not in ("bool", "int", "uint")
    return True


def op_error(name, op, coll):
    """The exception type torch's gloo backend raises for an op op_valid refuses."""
    if kind(name) == "complex" and op not in ("SUM", "AVG") and coll == "all_reduce":
        return ValueError
    return RuntimeError


def input_kind(name, op):
    """Which input values a (dtype, op) pair is tested with.

    full:   every bit pattern (integers): exercises wrap-around (SUM), MIN/MAX and bitwise ops.
    small:  small integers (k/4 for floats): SUM/PRODUCT/AVG stay exact in float32 and in range.
    normal: standard normal floats (MIN/MAX select, so comparison stays exact).
    """
    k = kind(name)
    if k == "bool":
        return "small"
    if k in ("int", "uint"):
        return "small" if op in ("AVG", "PRODUCT") else "full"
    if op in ("MIN", "MAX"):
        return "normal"
    return "small"


_DT_INDEX = {n: i for i, n in enumerate(ALL_DTYPE_NAMES)}
_KIND_INDEX = {"full": 0, "small": 1, "normal": 2}


def rank_input(name, n, rank, ikind="small", seed=1234, shape=None):
    """Deterministic input of rank `rank` (any int: also used to name list entries)."""
    rng = np.random.default_rng([seed, rank + 1000, n, _DT_INDEX[name], _KIND_INDEX[ikind]])
    dt = dtype(name)
    k = kind(name)
    if k == "bool":
        out = rng.integers(0, 2, size=n, dtype=np.uint8).astype(bool)
    elif k in ("int", "uint"):
        if ikind == "full":
            out = rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8).view(dt)
        elif k == "int":
            out = rng.integers(-3, 4, size=n, dtype=np.int8).astype(dt)
        else:
            out = rng.integers(0, 4, size=n, dtype=np.int8).astype(dt)
    else:
        def part():
            if ikind == "normal":
                return rng.standard_normal(n, dtype=np.float32)
            return rng.integers(-12, 13, size=n, dtype=np.int8).astype(np.float32) / 4
        if k == "complex":
            out = (part() + 1j * part()).astype(dt)
        else:
            out = part().astype(dt)
    out = np.ascontiguousarray(out)
    return out.reshape(shape) if shape is not None else out


def reduce_ref(arrays, op, name):
    """Reduce equally-shaped arrays elementwise the way pyddp defines op for dtype name."""
    dt = dtype(name)
    n = len(arrays)
    st = np.stack(arrays) if arrays[0].size else np.empty((n,) + arrays[0].shape, dt)
    k = kind(name)
    if k == "bool":
        if op in ("SUM", "MAX", "BOR"):
            return np.logical_or.reduce(st, axis=0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return np.logical_and.reduce(st, axis=0)
        if op == "BXOR":
            return np.logical_xor.reduce(st, axis=0)
        raise ValueError(op)
    if k in ("int", "uint"):
        if op == "SUM":
            return np.add.reduce(st, axis=0, dtype=dt)  # wraps like C unsigned arithmetic
        if op == "PRODUCT":
            return np.multiply.reduce(st, axis=0, dtype=dt)
        if op == "AVG":  # sum, then integer division truncating toward zero
            s = st.astype(np.int64).sum(axis=0) if k == "int" else st.astype(np.uint64).sum(axis=0)
            if k == "int":
                q = np.where(s < 0, -((-s) // n), s // n)
            else:
                q = s // np.uint64(n)
            return q.astype(dt)
        ufunc = {"MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and,
                 "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
        return ufunc.reduce(st, axis=0)
    wide = np.complex128 if k == "complex" else np.float64
    x = st.astype(wide)
    if op == "SUM":
        r = x.sum(axis=0)
    elif op == "PRODUCT":
        r = x.prod(axis=0)
    elif op == "AVG":
        r = x.sum(axis=0) / n
    elif op == "MIN":
        r = np.minimum.reduce(x, axis=0)
    elif op == "MAX":
        r = np.maximum.reduce(x, axis=0)
    else:
        raise ValueError(op)
    if name == "bfloat16":
        r = r.astype(np.float32)  # exact for every value the exact tests produce
    return r.astype(dt)


_TOL = {  # (rtol, atol) for results that are not exact by construction
    # atol: float32/float64 partial sums of values of magnitude ~4 carry ~(ws-1) half-ulps of error
    "float16": (2e-3, 1e-4), "bfloat16": (1.6e-2, 1e-3), "float32": (2e-6, 2e-6),
    "float64": (1e-13, 1e-14), "complex64": (2e-6, 2e-6), "complex128": (1e-13, 1e-14),
}


def mismatch(got, want, name, exact=True, tol=None):
    """None if got matches want (value and dtype and shape), else a short description."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != expected {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape} != expected {want.shape}"
    k = kind(name)
    if k in ("float", "complex"):
        wide = np.complex128 if k == "complex" else np.float64
        g = got.astype(wide)
        w = want.astype(wide)
        if exact:
            bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
        else:
            rtol, atol = tol or _TOL[name]
            bad = ~(np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
    else:
        g, w = got, want
        bad = g != w
    if not bad.any():
        return None
    idx = np.flatnonzero(bad.reshape(-1))
    i = idx[0]
    return (f"{idx.size} of {got.size} elements differ; first at flat index {i}: "
            f"got {got.reshape(-1)[i]!r}, expected {want.reshape(-1)[i]!r}")


def same_bytes(got, want):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{got.shape} != expected {want.dtype}{want.shape}"
    if got.tobytes() == want.tobytes():
        return None
    gb = np.frombuffer(got.tobytes(), np.uint8)
    wb = np.frombuffer(want.tobytes(), np.uint8)
    i = int(np.flatnonzero(gb != wb)[0])
    return f"bytes differ from byte {i} (element {i // max(got.itemsize, 1)}) of {gb.size}"


def garbage(name, n, shape=None):
    """An output buffer pre-filled with a recognisable pattern (so untouched outputs are caught)."""
    dt = dtype(name)
    out = np.frombuffer(bytes([0xA5]) * (n * dt.itemsize), dtype=np.uint8).copy().view(dt)
    if kind(name) == "bool":
        out = np.ones(n, dtype=bool)  # 0xA5 is not a valid bool
    return out.reshape(shape) if shape is not None else out


class Checker:
    """Collects failures inside a child so one run reports every failing combination."""

    MAX_REPORTED = 40

    def __init__(self, rank):
        self.rank = rank
        self.count = 0
        self.failures = []

    def expect(self, label, problem):
        self.count += 1
        if problem:
            self.failures.append(f"{label}: {problem}")

    def call(self, label, fn):
        """Run fn(); an exception counts as a failure of label."""
        self.count += 1
        try:
            fn()
        except Exception as e:
            self.failures.append(f"{label}: raised {type(e).__name__}: {e}")
            return False
        return True

    def raises(self, label, exc_type, text, fn):
        """fn() must raise exc_type with ``text`` in its message."""
        self.count += 1
        try:
            fn()
        except exc_type as e:
            if text not in str(e):
                self.failures.append(f"{label}: raised {type(e).__name__} without {text!r}: {e}")
        except Exception as e:
            self.failures.append(f"{label}: raised {type(e).__name__} (expected {exc_type.__name__}): {e}")
        else:
            self.failures.append(f"{label}: did not raise {exc_type.__name__}")

    def report(self):
        return {"rank": self.rank, "count": self.count, "nfail": len(self.failures),
                "failures": self.failures[: self.MAX_REPORTED]}


def assert_clean(reports, min_checks=1):
    """Parent side: every rank's Checker report must be empty of failures."""
    lines = []
    for rep in reports:
        assert rep["count"] >= min_checks, f"rank {rep['rank']} checked only {rep['count']} cases"
        if rep["nfail"]:
            lines.append(f"rank {rep['rank']}: {rep['nfail']} of {rep['count']} checks failed")
            lines += ["    " + f for f in rep["failures"]]
    if lines:
        raise AssertionError("\n".join(lines))
