"""csrc/kernels against numpy, through ctypes.

Builds csrc/kernels/*.c and csrc/util/status.c into a small shared library
with the system C compiler (skipped when there is none), then runs every
(dtype, op) pair on random arrays and compares with numpy's ufuncs, and the
float16 / bfloat16 casts with numpy and ml_dtypes.
"""
import ctypes
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import _paths
from _tiers import FULL

ROOT = _paths.ROOT
CSRC = os.path.join(ROOT, "csrc")

try:
    import ml_dtypes
except ImportError:  # bfloat16 checks are skipped without it
    ml_dtypes = None


def _enum(name):
    """Enumerator -> value for `typedef enum name {...}` in kernels.h, so the
    test cannot drift from the header."""
    with open(os.path.join(CSRC, "kernels", "kernels.h")) as f:
        text = f.read()
    body = re.search(r"typedef enum %s \{(.*?)\}" % name, text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    values, nxt = {}, 0
    for item in body.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            key, val = (s.strip() for s in item.split("="))
            nxt = int(val, 0)
        else:
            key = item
        values[key] = nxt
        nxt += 1
    return values


DT = _enum("pd_dtype")
OP = _enum("pd_redop")
PD_OK = 0

NUMPY_DTYPES = {
    "PD_BOOL": np.bool_,
    "PD_INT8": np.int8,
    "PD_UINT8": np.uint8,
    "PD_INT16": np.int16,
    "PD_UINT16": np.uint16,
    "PD_INT32": np.int32,
    "PD_UINT32": np.uint32,
    "PD_INT64": np.int64,
    "PD_UINT64": np.uint64,
    "PD_FLOAT16": np.float16,
    "PD_FLOAT32": np.float32,
    "PD_FLOAT64": np.float64,
    "PD_COMPLEX64": np.complex64,
    "PD_COMPLEX128": np.complex128,
}
if ml_dtypes is not None:
    NUMPY_DTYPES["PD_BFLOAT16"] = ml_dtypes.bfloat16

INTS = ["PD_INT8", "PD_UINT8", "PD_INT16", "PD_UINT16", "PD_INT32", "PD_UINT32",
        "PD_INT64", "PD_UINT64"]
FLOATS = ["PD_FLOAT32", "PD_FLOAT64"]
HALVES = ["PD_FLOAT16", "PD_BFLOAT16"]
COMPLEX = ["PD_COMPLEX64", "PD_COMPLEX128"]


def _compiler():
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


# "dispatch" is the library as shipped (F16C / AVX2 cast paths where the CPU has them);
# "portable" compiles those out, so the portable casts meet numpy on every machine.
@pytest.fixture(scope="module", params=["dispatch", pytest.param("portable", marks=FULL)])
def lib(request, tmp_path_factory):
    if not sys.platform.startswith("linux") and sys.platform != "darwin":
        pytest.skip("builds a shared library with a Unix C compiler")
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler")
    kdir = os.path.join(CSRC, "kernels")
    sources = sorted(os.path.join(kdir, f) for f in os.listdir(kdir) if f.endswith(".c"))
    sources.append(os.path.join(CSRC, "util", "status.c"))
    out = str(tmp_path_factory.mktemp("kernels") / "libpdkernels.so")
    cmd = [cc, "-std=c11", "-O3", "-Wall", "-Wextra", "-D_GNU_SOURCE", "-fPIC", "-shared",
           "-I" + CSRC, "-o", out] + sources + ["-lm"]
    if request.param == "portable":
        cmd.insert(1, "-DPD_KERNELS_PORTABLE")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", "compiler warnings:\n" + proc.stderr
    so = ctypes.CDLL(out)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    so.pd_reduce.argtypes = [ctypes.c_int, ctypes.c_int, vp, vp, sz]
    so.pd_reduce.restype = None
    so.pd_reduce3.argtypes = [ctypes.c_int, ctypes.c_int, vp, vp, vp, sz]
    so.pd_reduce3.restype = None
    so.pd_reduce_avg_finish.argtypes = [ctypes.c_int, vp, sz, ctypes.c_int]
    so.pd_reduce_avg_finish.restype = None
    so.pd_cast_to_f32.argtypes = [ctypes.c_int, vp, vp, sz]
    so.pd_cast_to_f32.restype = None
    so.pd_cast_from_f32.argtypes = [ctypes.c_int, vp, vp, sz]
    so.pd_cast_from_f32.restype = None
    so.pd_redop_check.argtypes = [ctypes.c_int, ctypes.c_int]
    so.pd_redop_check.restype = ctypes.c_int
    so.pd_errmsg.argtypes = []
    so.pd_errmsg.restype = ctypes.c_char_p
    so.pd_dtype_size.argtypes = [ctypes.c_int]
    so.pd_dtype_size.restype = ctypes.c_size_t
    so.pd_dtype_name.argtypes = [ctypes.c_int]
    so.pd_dtype_name.restype = ctypes.c_char_p
    so.pd_redop_name.argtypes = [ctypes.c_int]
    so.pd_redop_name.restype = ctypes.c_char_p
    so.pd_dtype_accum.argtypes = [ctypes.c_int]
    so.pd_dtype_accum.restype = ctypes.c_int
    return so


def ptr(a):
    assert a.flags.c_contiguous
    return a.ctypes.data


# ---- random inputs -------------------------------------------------------------------------

FLOAT_SPECIALS = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 0.5, 3.0]


def random_floats(rng, n, dtype):
    ftype = np.dtype(dtype)
    info = np.finfo(ftype)
    x = rng.standard_normal(n).astype(ftype) * ftype.type(rng.choice([1, 100, 1e-3]))
    # repeats, so MIN/MAX ties and equal values occur
    x[rng.random(n) < 0.15] = ftype.type(0.25)
    pick = rng.random(n)
    special = np.array(FLOAT_SPECIALS + [info.tiny, -info.tiny, info.max, -info.max,
                                         info.smallest_subnormal], dtype=ftype)
    x[pick < 0.1] = rng.choice(special, size=int((pick < 0.1).sum()))
    raw = (pick >= 0.1) & (pick < 0.15)  # arbitrary bit patterns
    bits = rng.integers(0, 2 ** (8 * ftype.itemsize), size=int(raw.sum()),
                        dtype=np.uint64).astype("u%d" % ftype.itemsize)
    x[raw] = bits.view(ftype)
    return x


def random_array(rng, name, n):
    dtype = NUMPY_DTYPES[name]
    if name == "PD_BOOL":
        return rng.random(n) < 0.5
    if name in INTS:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
        pick = rng.random(n)
        x[pick < 0.05] = info.min
        x[(pick >= 0.05) & (pick < 0.1)] = info.max
        small = pick >= 0.9
        x[small] = rng.integers(-3 if info.min < 0 else 0, 4, size=int(small.sum())).astype(dtype)
        return x
    if name in FLOATS:
        return random_floats(rng, n, dtype)
    if name in COMPLEX:
        f = np.float32 if name == "PD_COMPLEX64" else np.float64
        return random_floats(rng, 2 * n, f).view(dtype)
    # float16 / bfloat16: round random float32s, plus arbitrary 16-bit patterns
    with np.errstate(all="ignore"):
        x = random_floats(rng, n, np.float32).astype(dtype)
    raw = rng.random(n) < 0.2
    x[raw] = rng.integers(0, 65536, size=int(raw.sum()), dtype=np.uint16).view(dtype)
    return x


# ---- expected results ----------------------------------------------------------------------

def expected(name, op, a, b):
    if name == "PD_BOOL":
        fn = {"PD_SUM": np.logical_or, "PD_MAX": np.logical_or, "PD_BOR": np.logical_or,
              "PD_PRODUCT": np.logical_and, "PD_MIN": np.logical_and, "PD_BAND": np.logical_and,
              "PD_BXOR": np.logical_xor}[op]
        return fn(a, b)
    if name in HALVES:
        # widened to float32, reduced there, rounded once
        with np.errstate(all="ignore"):
            wide = expected("PD_FLOAT32", op, a.astype(np.float32), b.astype(np.float32))
            return wide.astype(a.dtype)
    fn = {"PD_SUM": np.add, "PD_AVG": np.add, "PD_PRODUCT": np.multiply,
          "PD_MIN": np.minimum, "PD_MAX": np.maximum, "PD_BAND": np.bitwise_and,
          "PD_BOR": np.bitwise_or, "PD_BXOR": np.bitwise_xor}[op]
    with np.errstate(all="ignore"):
        return fn(a, b)


def allowed(name, op):
    if op in ("PD_BAND", "PD_BOR", "PD_BXOR"):
        return name == "PD_BOOL" or name in INTS
    if op in ("PD_MIN", "PD_MAX"):
        return name not in COMPLEX
    if op == "PD_AVG":
        return name != "PD_BOOL"
    return True


def uint_view(x):
    return x.view("u%d" % x.dtype.itemsize)


def assert_same(got, want, what):
    """Bit-identical, except that a NaN only has to be a NaN (numpy's payload choice is
    not part of the contract)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind in "fcV" or got.dtype == NUMPY_DTYPES.get("PD_BFLOAT16"):
        if got.dtype.kind == "c":
            got = got.view(got.real.dtype)
            want = want.view(want.real.dtype)
        with np.errstate(all="ignore"):
            gnan = np.isnan(got.astype(np.float64))
            wnan = np.isnan(want.astype(np.float64))
        bad = (gnan != wnan) | (~gnan & (uint_view(got) != uint_view(want)))
    else:
        bad = got != want
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError("%s: %d of %d differ; first at %d: got %r want %r"
                             % (what, int(bad.sum()), bad.size, i, got[i], want[i]))


def complex_product_close(got, a, b, what):
    """numpy's complex multiply may use FMA (its AVX-512 loops do), the kernel does not:
    equal to the plain formula bit for bit, and to np.multiply within rounding."""
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    with np.errstate(all="ignore"):
        formula = np.empty_like(a)
        formula.real = ar * br - ai * bi
        formula.imag = ar * bi + ai * br
        assert_same(got, formula, what + " (plain formula)")
        ref = np.multiply(a, b)
        eps = np.finfo(ar.dtype).eps
        finite = np.isfinite(formula) & np.isfinite(ref)
        scale_re = np.abs(ar * br) + np.abs(ai * bi)
        scale_im = np.abs(ar * bi) + np.abs(ai * br)
        ok_re = np.abs(got.real - ref.real) <= 4 * eps * scale_re
        ok_im = np.abs(got.imag - ref.imag) <= 4 * eps * scale_im
    bad = finite & ~(ok_re & ok_im)
    assert not bad.any(), "%s: %d differ from np.multiply beyond rounding" % (what, bad.sum())


# ---- the tests -----------------------------------------------------------------------------

ALL_NAMES = [n for n in DT if n != "PD_NDTYPES"]
ALL_OPS = [o for o in OP if o != "PD_NREDOPS"]


def test_enums_match_names(lib):
    for name in ALL_NAMES:
        assert lib.pd_dtype_name(DT[name]).decode() == {"PD_BFLOAT16": "bfloat16"}.get(
            name, name[3:].lower())
        if name in NUMPY_DTYPES:
            assert lib.pd_dtype_size(DT[name]) == np.dtype(NUMPY_DTYPES[name]).itemsize
        accum = DT["PD_FLOAT32"] if name in HALVES else DT[name]
        assert lib.pd_dtype_accum(DT[name]) == accum
    for op in ALL_OPS:
        assert lib.pd_redop_name(OP[op]).decode() == op[3:]


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("op", ALL_OPS)
def test_redop_check(lib, name, op):
    st = lib.pd_redop_check(DT[name], OP[op])
    if allowed(name, op):
        assert st == PD_OK
    else:
        assert st != PD_OK
        assert lib.pd_errmsg().decode() == "ReduceOp.%s is not supported for dtype %s" % (
            op[3:], lib.pd_dtype_name(DT[name]).decode())


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("op", ALL_OPS)
def test_reduce_matches_numpy(lib, name, op):
    if not allowed(name, op):
        pytest.skip("not a valid pair")
    if name not in NUMPY_DTYPES:
        pytest.skip("ml_dtypes not installed")
    rng = np.random.default_rng([DT[name], OP[op]])
    for n in (1, 17, 1000, 4099):
        a = random_array(rng, name, n)
        b = random_array(rng, name, n)
        want = expected(name, op, a, b)
        what = "%s %s n=%d" % (name, op, n)

        def check(got, how):
            if name in COMPLEX and op == "PD_PRODUCT":
                complex_product_close(got, a, b, what + " " + how)
            else:
                assert_same(got, want, what + " " + how)

        dst = np.empty_like(a)
        lib.pd_reduce3(DT[name], OP[op], ptr(dst), ptr(a), ptr(b), n)
        check(dst, "distinct")
        d = a.copy()
        lib.pd_reduce(DT[name], OP[op], ptr(d), ptr(b), n)
        check(d, "pd_reduce")
        d = b.copy()
        lib.pd_reduce3(DT[name], OP[op], ptr(d), ptr(a), ptr(d), n)
        check(d, "dst==b")
        d = a.copy()
        lib.pd_reduce3(DT[name], OP[op], ptr(d), ptr(d), ptr(d), n)
        want_self = expected(name, op, a, a)
        if name in COMPLEX and op == "PD_PRODUCT":
            complex_product_close(d, a, a, what + " dst==a==b")
        else:
            assert_same(d, want_self, what + " dst==a==b")


def trunc_div(a, n):
    """Integer division rounding toward zero (C's, NCCL's), in numpy without overflow."""
    q = np.floor_divide(a, a.dtype.type(n))
    r = a - q * a.dtype.type(n)
    fix = (r != 0) & (a < 0)
    q[fix] += 1
    return q


@pytest.mark.parametrize("name", [n for n in ALL_NAMES if n != "PD_BOOL"])
def test_avg_finish(lib, name):
    if name not in NUMPY_DTYPES:
        pytest.skip("ml_dtypes not installed")
    rng = np.random.default_rng(DT[name])
    for world in (1, 2, 3, 7, 64):
        buf = random_array(rng, name, 1001)
        with np.errstate(all="ignore"):
            if name in INTS:
                want = trunc_div(buf, world)
            elif name in FLOATS:
                want = buf / buf.dtype.type(world)
            elif name in COMPLEX:
                want = np.empty_like(buf)
                want.real = buf.real / buf.real.dtype.type(world)
                want.imag = buf.imag / buf.real.dtype.type(world)
            else:
                want = (buf.astype(np.float32) / np.float32(world)).astype(buf.dtype)
        got = buf.copy()
        lib.pd_reduce_avg_finish(DT[name], ptr(got), got.size, world)
        assert_same(got, want, "%s avg n=%d" % (name, world))
    # explicit truncation toward zero
    if name in INTS and np.iinfo(NUMPY_DTYPES[name]).min < 0:
        x = np.array([-7, 7, -1, np.iinfo(NUMPY_DTYPES[name]).min], dtype=NUMPY_DTYPES[name])
        lib.pd_reduce_avg_finish(DT[name], ptr(x), 4, 2)
        assert list(x[:3]) == [-3, 3, 0]
        assert int(x[3]) == np.iinfo(NUMPY_DTYPES[name]).min // 2


# ---- half casts ----------------------------------------------------------------------------

def float32_inputs(rng, n):
    """Random float32 bit patterns, half of them forced onto or next to a float16 or
    bfloat16 rounding boundary, plus every special range."""
    u = rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
    k = n // 4
    low13 = np.array([0x1000, 0x0fff, 0x1001, 0, 0x1fff], dtype=np.uint32)
    u[:k] = (u[:k] & ~np.uint32(0x1fff)) | rng.choice(low13, size=k)
    low16 = np.array([0x8000, 0x7fff, 0x8001, 0, 0xffff], dtype=np.uint32)
    u[k:2 * k] = (u[k:2 * k] & ~np.uint32(0xffff)) | rng.choice(low16, size=k)
    # float16's subnormal range and its edges: 2^-26 .. 2^-13
    sub = rng.integers(0x32800000, 0x39000000, size=k, dtype=np.uint64).astype(np.uint32)
    u[2 * k:3 * k] = sub | (rng.integers(0, 2, size=k, dtype=np.uint32) << np.uint32(31))
    fixed = np.array([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff,
                      0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
                      0xff800001, 0x7fbfffff, 0x477fe000, 0x477fefff, 0x477ff000,
                      0x477ff001, 0x7f7fffff, 0xff7fffff, 0x33000000, 0x33000001,
                      0x33800000, 0x33c00000, 0x387fc000, 0x387fe000, 0x38800000,
                      0x7f7f8000, 0x7f7f7fff, 0x00008000, 0x00018000], dtype=np.uint32)
    return np.concatenate([u, fixed]).view(np.float32)


def half_nan_ok(got_bits, src_f32, nan_bit, exp_mask):
    """A NaN input must give a quiet NaN of the same sign."""
    src_bits = src_f32.view(np.uint32)
    sign_ok = (got_bits >> 15) == (src_bits >> 31)
    is_nan = ((got_bits & 0x7fff) & exp_mask) == exp_mask
    is_nan &= (got_bits & 0x7fff) != exp_mask
    quiet = (got_bits & nan_bit) != 0
    return sign_ok & is_nan & quiet


def test_float16_to_float32_all_values(lib):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = np.empty(65536, dtype=np.float32)
    lib.pd_cast_to_f32(DT["PD_FLOAT16"], ptr(got), ptr(h), 65536)
    want = h.view(np.float16).astype(np.float32)
    # numpy keeps NaN payloads, signalling ones included; so must we
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    back = np.empty(65536, dtype=np.uint16)
    lib.pd_cast_from_f32(DT["PD_FLOAT16"], ptr(back), ptr(got), 65536)
    nan = np.isnan(h.view(np.float16))
    np.testing.assert_array_equal(back[~nan], h[~nan])
    np.testing.assert_array_equal(back[nan], h[nan] | 0x200)


def test_float32_to_float16_vs_numpy(lib):
    rng = np.random.default_rng(16)
    f = float32_inputs(rng, 1 << 21)
    got = np.empty(f.size, dtype=np.uint16)
    lib.pd_cast_from_f32(DT["PD_FLOAT16"], ptr(got), ptr(f), f.size)
    with np.errstate(all="ignore"):
        want = f.astype(np.float16).view(np.uint16)
    nan = np.isnan(f)
    bad = ~nan & (got != want)
    assert not bad.any(), "f32 %s -> %s, numpy %s" % (
        hex(f.view(np.uint32)[bad][0]), hex(got[bad][0]), hex(want[bad][0]))
    assert half_nan_ok(got[nan], f[nan], 0x200, 0x7c00).all()


def test_bfloat16_to_float32_all_values(lib):
    if ml_dtypes is None:
        pytest.skip("ml_dtypes not installed")
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = np.empty(65536, dtype=np.float32)
    lib.pd_cast_to_f32(DT["PD_BFLOAT16"], ptr(got), ptr(h), 65536)
    want = h.view(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    # bfloat16 is the top half of a float32: widening keeps every bit
    np.testing.assert_array_equal(got.view(np.uint32), h.astype(np.uint32) << 16)
    back = np.empty(65536, dtype=np.uint16)
    lib.pd_cast_from_f32(DT["PD_BFLOAT16"], ptr(back), ptr(got), 65536)
    np.testing.assert_array_equal(back[~nan], h[~nan])
    np.testing.assert_array_equal(back[nan], h[nan] | 0x40)


def test_float32_to_bfloat16_vs_ml_dtypes(lib):
    if ml_dtypes is None:
        pytest.skip("ml_dtypes not installed")
    rng = np.random.default_rng(32)
    f = float32_inputs(rng, 1 << 21)
    got = np.empty(f.size, dtype=np.uint16)
    lib.pd_cast_from_f32(DT["PD_BFLOAT16"], ptr(got), ptr(f), f.size)
    with np.errstate(all="ignore"):
        want = f.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(f)
    bad = ~nan & (got != want)
    assert not bad.any(), "f32 %s -> %s, ml_dtypes %s" % (
        hex(f.view(np.uint32)[bad][0]), hex(got[bad][0]), hex(want[bad][0]))
    assert half_nan_ok(got[nan], f[nan], 0x40, 0x7f80).all()


@pytest.mark.parametrize("name", HALVES)
def test_cast_lengths_and_offsets(lib, name):
    """Every length up to 40 and odd start offsets, so vector bodies and scalar tails of
    each code path see the same values."""
    if name not in NUMPY_DTYPES:
        pytest.skip("ml_dtypes not installed")
    dtype = NUMPY_DTYPES[name]
    rng = np.random.default_rng(7)
    f = float32_inputs(rng, 200)
    with np.errstate(all="ignore"):
        want = f.astype(dtype).view(np.uint16)
    nan = np.isnan(f)
    for off in (0, 1, 3):
        for n in range(41):
            src = f[off:off + n]
            dst = np.empty(n, dtype=np.uint16)
            lib.pd_cast_from_f32(DT[name], ptr(dst), ptr(src), n)
            ok = nan[off:off + n] | (dst == want[off:off + n])
            assert ok.all(), (name, off, n)
            wide = np.empty(n, dtype=np.float32)
            lib.pd_cast_to_f32(DT[name], ptr(wide), ptr(dst), n)
            ref = dst.view(dtype).astype(np.float32)
            good = np.isnan(ref) | (wide.view(np.uint32) == ref.view(np.uint32))
            assert good.all(), (name, off, n)


def test_gelu_kernels_match_erf_in_place_and_check_their_arguments():
    """pyddp._C.gelu / gelu_backward (the exact GELU's vectorised kernels) against math.erf in
    float64, for every length up to a few vectors (the loops' tails) and in place."""
    import math

    from pyddp import _C

    for n in (0, 1, 7, 8, 15, 16, 17, 33, 1001):
        x = np.linspace(-9.0, 9.0, n).astype(np.float32)
        xd = x.astype(np.float64)
        want = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in xd])
        out = np.empty_like(x)
        _C.gelu(out, x)
        np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)
        g = np.linspace(-1.0, 1.0, n).astype(np.float32)
        dwant = g * np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) +
                              v * math.exp(-v * v / 2.0) / math.sqrt(2.0 * math.pi) for v in xd])
        gx = np.empty_like(x)
        _C.gelu_backward(gx, g, x)
        np.testing.assert_allclose(gx, dwant, rtol=2e-6, atol=2e-6)
        y = x.copy()
        _C.gelu(y, y)                      # in place
        np.testing.assert_array_equal(y, out)
    with pytest.raises(ValueError, match="differ in size"):
        _C.gelu(np.empty(3, np.float32), np.empty(4, np.float32))
    with pytest.raises(TypeError, match="float32"):
        _C.gelu(np.empty(3, np.float64), np.empty(3, np.float64))


def _gemm_ref(a, b, bias=None):
    """float64 product of bfloat16 operands (exact products, one rounding per sum) and the bound
    on a float32 sum's error: K * 2^-24 * (|a| @ |b|), with slack."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.matmul(a64, b64)
    bound = np.matmul(np.abs(a64), np.abs(b64))
    if bias is not None:
        ref = ref + bias.astype(np.float64)
        bound = bound + np.abs(bias.astype(np.float64))
    k = a.shape[-1]
    return ref, 2.0 * (k + 2) * 2.0 ** -24 * bound + 1e-30


def _gemm_impls():
    from pyddp import _C

    return [True] + ([False] if _C.gemm_bf16_native() else [])


@pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes")
def test_gemm_bf16_matches_float64_reference_shapes_layouts_and_bias():
    """pyddp._C.gemm_bf16 (native AVX512-BF16 where present, and the portable C) against a float64
    product of the same bfloat16 values: ragged M/N/K around the register tile (14 x 32) and the
    K block (384, pairs: odd K), transposed and negative-stride operands, 3-D batches with a
    stride-0 broadcast operand, the bias, and K = 0."""
    from pyddp import _C

    bf = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(7)
    shapes = [(1, 1, 1), (1, 5, 3), (13, 31, 2), (14, 32, 1), (15, 33, 3), (29, 65, 383),
              (28, 64, 384), (30, 17, 385), (7, 97, 769), (113, 40, 20), (120, 1537, 2)]
    for portable in _gemm_impls():
        for (M, N, K) in shapes:
            for at in (False, True):
                for bt in (False, True):
                    a = rng.standard_normal((K, M) if at else (M, K)).astype(bf)
                    b = rng.standard_normal((N, K) if bt else (K, N)).astype(bf)
                    a = a.T if at else a
                    b = b.T if bt else b
                    bias = rng.standard_normal(N).astype(np.float32) if (M + K) % 2 else None
                    out = np.full((M, N), np.nan, np.float32)
                    _C.gemm_bf16(out, a.view(np.uint16), b.view(np.uint16), bias,
                                 portable=portable)
                    ref, tol = _gemm_ref(a, b, bias)
                    assert (np.abs(out - ref) <= tol).all(), (portable, M, N, K, at, bt)
        # negative strides, a row-strided out, and K = 0 (out = bias)
        a = rng.standard_normal((40, 50)).astype(bf)[::-1, ::-2]
        b = rng.standard_normal((25, 70)).astype(bf)[::-1]
        big = np.full((40, 90), 7.0, np.float32)
        out = big[:, 5:75]
        _C.gemm_bf16(out, a.view(np.uint16), b.view(np.uint16), portable=portable)
        ref, tol = _gemm_ref(a, b)
        assert (np.abs(out - ref) <= tol).all()
        assert (big[:, :5] == 7.0).all() and (big[:, 75:] == 7.0).all()
        out = np.full((3, 4), np.nan, np.float32)
        bias = np.arange(4, dtype=np.float32)
        empty = np.zeros((3, 0), np.uint16)
        _C.gemm_bf16(out, empty, np.zeros((0, 4), np.uint16), bias, portable=portable)
        assert (out == bias).all()
        # batches: a per-batch A against one B broadcast with stride 0, and transposed B
        a = rng.standard_normal((5, 37, 70)).astype(bf)
        b = np.broadcast_to(rng.standard_normal((70, 45)).astype(bf), (5, 70, 45))
        bt = np.swapaxes(rng.standard_normal((5, 45, 70)).astype(bf), 1, 2)
        for bb in (b, bt):
            out = np.empty((5, 37, 45), np.float32)
            _C.gemm_bf16(out, a.view(np.uint16), bb.view(np.uint16), portable=portable)
            ref, tol = _gemm_ref(a, bb)
            assert (np.abs(out - ref) <= tol).all()
        # 4-D and 5-D batches of strided views (attention's heads split out of one projection)
        qkv = rng.standard_normal((3, 70, 3, 4, 16)).astype(bf)
        q = qkv[:, :, 0].transpose(0, 2, 1, 3)                # (3, 4, 70, 16)
        kT = qkv[:, :, 1].transpose(0, 2, 3, 1)               # (3, 4, 16, 70)
        out = np.empty((3, 4, 70, 70), bf)
        _C.gemm_bf16(out.view(np.uint16), q.view(np.uint16), kT.view(np.uint16),
                     portable=portable)
        ref, tol = _gemm_ref(q, kT)
        assert (np.abs(out.astype(np.float64) - ref) <= tol + 2 ** -8 * np.abs(ref)).all()
        a5 = rng.standard_normal((2, 3, 2, 20, 30)).astype(bf)
        b5 = np.broadcast_to(rng.standard_normal((2, 1, 1, 30, 9)).astype(bf), (2, 3, 2, 30, 9))
        out = np.empty((2, 3, 2, 20, 9), np.float32)
        _C.gemm_bf16(out, a5.view(np.uint16), b5.view(np.uint16), portable=portable)
        ref, tol = _gemm_ref(a5, b5)
        assert (np.abs(out - ref) <= tol).all()
        out = np.empty((2, 0, 2, 20, 9), np.float32)
        _C.gemm_bf16(out, a5[:, :0].view(np.uint16), b5[:, :0].view(np.uint16))


@pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes")
def test_gemm_bf16_native_and_portable_agree_and_arguments_are_checked():
    """Both implementations sum in float32 in the same blocked order, so they agree to float32
    rounding; inf propagates; bad arguments raise before anything is computed."""
    from pyddp import _C

    bf = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(8)
    a = rng.standard_normal((77, 500)).astype(bf)
    b = rng.standard_normal((500, 70)).astype(bf)
    outs = []
    for portable in _gemm_impls():
        out = np.empty((77, 70), np.float32)
        _C.gemm_bf16(out, a.view(np.uint16), b.view(np.uint16), portable=portable)
        outs.append(out)
    np.testing.assert_allclose(outs[0], outs[-1], rtol=1e-5, atol=1e-4)
    a2 = a.copy()
    a2[3, 10] = np.inf
    out = np.empty((77, 70), np.float32)
    _C.gemm_bf16(out, a2.view(np.uint16), np.abs(b.astype(np.float32)).astype(bf).view(np.uint16))
    assert np.isinf(out[3]).all() and np.isfinite(np.delete(out, 3, 0)).all()
    u = np.zeros((4, 5), np.uint16)
    v = np.zeros((5, 6), np.uint16)
    with pytest.raises(TypeError, match="float32"):
        _C.gemm_bf16(np.empty((4, 6), np.float64), u, v)
    with pytest.raises(TypeError, match="uint16"):
        _C.gemm_bf16(np.empty((4, 6), np.float32), u.astype(np.float32), v)
    with pytest.raises(ValueError, match="shapes"):
        _C.gemm_bf16(np.empty((4, 7), np.float32), u, v)
    with pytest.raises(ValueError, match="shapes"):
        _C.gemm_bf16(np.empty((1, 4, 6), np.float32), u, v)
    with pytest.raises(ValueError, match="shapes"):
        _C.gemm_bf16(np.empty((2, 3, 4, 6), np.float32), np.zeros((2, 3, 4, 5), np.uint16),
                     np.zeros((2, 1, 5, 6), np.uint16))
    with pytest.raises(ValueError, match="2 to 8"):
        _C.gemm_bf16(np.empty(6, np.float32), u[0], v)
    with pytest.raises(ValueError, match="bias"):
        _C.gemm_bf16(np.empty((4, 6), np.float32), u, v, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        _C.gemm_bf16(np.empty((4, 12), np.float32)[:, ::2], u, v)
    with pytest.raises(ValueError, match="bias"):
        _C.gemm_bf16(np.empty((4, 6), np.float32), u, v, np.zeros((1, 5), np.float32))


@pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes")
def test_gemm_bf16_bfloat16_output_is_the_float32_result_rounded():
    """out as uint16 (bfloat16 bits): the kernel rounds its float32 result once, to nearest even
    (ml_dtypes' rounding), in its last K block, partial sums of earlier K blocks (K > 384) held in
    float32; NaN stays NaN, overflow gives inf; bias included; K = 0 gives the rounded bias."""
    from pyddp import _C

    bf = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(9)
    for portable in _gemm_impls():
        for (M, N, K) in [(15, 33, 3), (29, 65, 384), (30, 70, 385), (9, 1600, 800),
                          (3, 4, 0)]:
            a = rng.standard_normal((M, K)).astype(bf)
            b = rng.standard_normal((N, K)).astype(bf).T
            if K:
                a[0, 0] = np.nan
                a[1, :] = 3e38
                b[:, 1] = np.abs(b[:, 1])
            bias = rng.standard_normal(N).astype(np.float32)
            o32 = np.empty((M, N), np.float32)
            o16 = np.empty((M, N), bf)
            _C.gemm_bf16(o32, a.view(np.uint16), b.view(np.uint16), bias, portable=portable)
            _C.gemm_bf16(o16.view(np.uint16), a.view(np.uint16), b.view(np.uint16), bias,
                         portable=portable)
            with np.errstate(over="ignore"):
                want = o32.astype(bf)
            same = (o16.view(np.uint16) == want.view(np.uint16)) | \
                (np.isnan(o16.astype(np.float32)) & np.isnan(o32))
            assert same.all(), (portable, M, N, K)
            if K:
                assert np.isnan(o16[0].astype(np.float32)).all()
                assert np.isinf(o16[1, 1].astype(np.float32))
