"""The amp kernels of pyddp._C (through pyddp._kernels): fused unscale + non-finite check over
float16/bfloat16/float32/float64 arrays against NumPy and torch, and the multi-array casts
against NumPy / ml_dtypes rounding, including inf, NaN and subnormals; bad inputs raise."""
import numpy as np
import pytest

from pyddp import _C
from pyddp import _kernels as K

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16
DTYPES = [np.float16, BF16, np.float32, np.float64]
IDS = ["float16", "bfloat16", "float32", "float64"]


def _expected_unscale(a, inv):
    """torch's rule: multiply in float32 (float64 for float64 arrays), round back once."""
    if a.dtype == np.float64:
        return a * np.float64(np.float32(inv))
    return (a.astype(np.float32) * np.float32(inv)).astype(a.dtype)


def _same(x, y):
    x = np.asarray(x).astype(np.float64)
    y = np.asarray(y).astype(np.float64)
    return np.array_equal(x, y, equal_nan=True)


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
def test_unscale_matches_numpy(dt):
    rng = np.random.default_rng(0)
    arrays = [(rng.standard_normal(n) * 1000).astype(dt) for n in (1, 7, 1024, 1025, 5000)]
    expected = [_expected_unscale(a, 1 / 1024) for a in arrays]
    found = np.zeros(1, np.float32)
    assert K.unscale_(arrays, found, 1 / 1024) is False
    assert found[0] == 0.0
    for a, e in zip(arrays, expected):
        assert a.dtype == dt and _same(a, e)
    # a non-power-of-two inverse scale rounds like the float32 product
    arrays = [(rng.standard_normal(3001) * 7).astype(dt)]
    expected = [_expected_unscale(arrays[0], 1 / 3)]
    K.unscale_(arrays, None, np.array([1 / 3], np.float32))
    assert _same(arrays[0], expected[0])


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_nonfinite_found_at_every_position(dt, bad):
    n = 2 * 1024 + 37  # several half-precision blocks plus a tail
    positions = [0, 1, 7, 8, 15, 16, 1023, 1024, 1025, n - 38, n - 2, n - 1]
    for pos in positions:
        arrays = [np.ones(5, dt), np.ones(n, dt), np.ones(3, dt)]
        arrays[1][pos] = bad
        found = np.zeros(1, np.float32)
        assert K.unscale_(arrays, found, 0.5) is True, pos
        assert found[0] == 1.0
        # every element is still scaled, as torch does
        assert np.all(arrays[0].astype(np.float32) == 0.5)
        rest = np.delete(arrays[1].astype(np.float32), pos)
        assert np.all(rest == 0.5)
        assert K.nonfinite(arrays) is True
    # in the first and in the last array of the list
    for which in (0, 2):
        arrays = [np.ones(5, dt), np.ones(n, dt), np.ones(3, dt)]
        arrays[which][-1] = bad
        assert K.nonfinite(arrays) is True
    # largest finite values are finite
    fi = ml_dtypes.finfo(dt) if dt is BF16 else np.finfo(dt)
    arrays = [np.array([fi.max, -fi.max, fi.tiny], dt)]
    assert K.nonfinite(arrays) is False


def test_check_only_does_not_write_and_found_inf_is_sticky():
    a = np.full(10, 3.0, np.float32)
    a.flags.writeable = False  # inv_scale 1.0 only reads: read-only arrays are fine
    found = np.ones(1, np.float32)
    assert K.unscale_([a], found, 1.0) is False
    assert found[0] == 1.0  # never reset by the kernel
    with pytest.raises(ValueError, match=r"arrays\[0\] is read-only"):
        K.unscale_([a], found, 0.5)


def test_mixed_dtypes_in_one_call():
    arrays = [np.full(9, 4.0, dt) for dt in DTYPES]
    arrays[2][4] = np.nan
    found = np.zeros(1, np.float32)
    assert K.unscale_(arrays, found, 0.25)
    assert found[0] == 1.0
    assert all(float(x[0]) == 1.0 for x in arrays)


def test_unscale_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    for tdt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        base = torch.from_numpy(rng.standard_normal(4099) * 300).to(tdt)
        base[17] = float("inf") if tdt != torch.float64 else float("nan")
        for inv in (1 / 65536, 1 / 3):
            ours = [base.clone(), base[:100].clone()]
            ref = [base.clone(), base[:100].clone()]
            f_ours = torch.zeros(1)
            f_ref = torch.zeros(1)
            inv_t = torch.full((1,), inv, dtype=torch.float32)
            torch._amp_foreach_non_finite_check_and_unscale_(ref, f_ref, inv_t)
            K.unscale_(ours, f_ours, inv_t)  # torch tensors updated in place
            assert f_ours.item() == f_ref.item() == 1.0
            for a, b in zip(ours, ref):
                assert torch.equal(a.isnan(), b.isnan())
                assert torch.equal(a.nan_to_num(), b.nan_to_num()), tdt


def _special_f32(rng, n):
    bits = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0,
                         6e-8, 2.98e-8, 2.9802322e-08, 5.96e-8, 1e-40, -1e-45,
                         3.3895314e38, 3.4e38, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11,
                         1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8], np.float32)
    # values near the float16 range: random in [2^-26, 2^17)
    near = (rng.random(n) * 2 - 1) * np.exp2(rng.uniform(-26, 17, n))
    return np.concatenate([x, specials, near.astype(np.float32)])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
def test_cast_float32_to_half_rounds_like_numpy_and_ml_dtypes():
    rng = np.random.default_rng(2)
    x = _special_f32(rng, 200_000)
    for dt in (np.float16, BF16):
        out = np.empty(x.shape, dt)
        K.cast_([out], [x])
        ref = x.astype(dt)
        nan = np.isnan(x)
        assert np.array_equal(np.isnan(out.astype(np.float32)), nan)
        assert np.array_equal(out[~nan].view(np.uint16), ref[~nan].view(np.uint16)), dt
        # and back: half -> float32 is exact
        back = np.empty(x.shape, np.float32)
        K.cast_([back], [out])
        assert np.array_equal(back.view(np.uint32)[~nan],
                              out.astype(np.float32).view(np.uint32)[~nan])


def test_cast_every_half_value_round_trips():
    h = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
    for dt in (np.float16, BF16):
        src = h.view(dt)
        f = np.empty(h.shape, np.float32)
        K.cast_([f], [src])
        ref = src.astype(np.float32)
        assert np.array_equal(f.view(np.uint32)[~np.isnan(ref)],
                              ref.view(np.uint32)[~np.isnan(ref)])
        assert np.array_equal(np.isnan(f), np.isnan(ref))
        again = np.empty(h.shape, dt)
        K.cast_([again], [f])
        finite = ~np.isnan(ref)
        assert np.array_equal(again.view(np.uint16)[finite], h[finite])


def test_cast_many_pairs_and_other_dtypes():
    rng = np.random.default_rng(3)
    srcs = [rng.standard_normal(n).astype(np.float32) for n in (3, 1000, 4097)]
    dsts = [np.empty(3, np.float16), np.empty((10, 100), BF16), np.empty(4097, np.float64)]
    K.cast_(dsts, srcs)
    assert np.array_equal(dsts[0], srcs[0].astype(np.float16))
    assert np.array_equal(dsts[1].reshape(-1).view(np.uint16), srcs[1].astype(BF16).view(np.uint16))
    assert np.array_equal(dsts[2], srcs[2].astype(np.float64))
    # float16 -> bfloat16 (one rounding through exact float32), float64 -> float32
    h = (rng.standard_normal(3000) * 100).astype(np.float16)
    b = np.empty(3000, BF16)
    K.cast_([b], [h])
    assert np.array_equal(b.view(np.uint16), h.astype(np.float32).astype(BF16).view(np.uint16))
    d = rng.standard_normal(500) * 1e30
    f = np.empty(500, np.float32)
    K.cast_([f], [d])
    assert np.array_equal(f, d.astype(np.float32))


def test_cast_into_torch_half_params():
    torch = pytest.importorskip("torch")
    masters = [np.linspace(-3, 3, 50, dtype=np.float32), np.full(7, 1 / 3, np.float32)]
    params = [torch.zeros(5, 10, dtype=torch.float16), torch.zeros(7, dtype=torch.bfloat16)]
    K.cast_(params, masters)
    assert torch.equal(params[0], torch.from_numpy(masters[0]).reshape(5, 10).half())
    assert torch.equal(params[1], torch.from_numpy(masters[1]).bfloat16())


def test_bad_inputs_raise():
    f = np.zeros(1, np.float32)
    with pytest.raises(TypeError, match=r"arrays\[1\] must be float16, bfloat16, float32 or float64"):
        K.unscale_([np.zeros(3, np.float32), np.zeros(3, np.int32)], f, 0.5)
    with pytest.raises(ValueError, match=r"arrays\[0\] must be C-contiguous"):
        K.unscale_([np.zeros((4, 4), np.float32)[:, 1]], f, 0.5)
    with pytest.raises(ValueError, match="found_inf must hold exactly 1 element"):
        K.unscale_([np.zeros(3, np.float32)], np.zeros(2, np.float32), 0.5)
    with pytest.raises(TypeError, match="found_inf must be float32"):
        K.unscale_([np.zeros(3, np.float32)], np.zeros(1, np.float64), 0.5)
    with pytest.raises(TypeError, match="inv_scale must be a float"):
        _C.amp_unscale_([np.zeros(3, np.float32)], None, "x")
    with pytest.raises(TypeError, match="must be a list of arrays"):
        K.unscale_(np.zeros(3, np.float32), None, 0.5)
    with pytest.raises(ValueError, match=r"dsts\[0\] has 3 elements but srcs\[0\] has 4"):
        K.cast_([np.zeros(3, np.float16)], [np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="srcs has 2 arrays, expected 1"):
        K.cast_([np.zeros(3, np.float16)], [np.zeros(3, np.float32)] * 2)
    with pytest.raises(TypeError, match=r"float64\) to dsts\[0\] \(float16\)"):
        K.cast_([np.zeros(3, np.float16)], [np.zeros(3, np.float64)])
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        _C.cast_([a[:4]], [a[2:6]])
    ro = np.zeros(3, np.float16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"dsts\[0\] is read-only"):
        K.cast_([ro], [np.zeros(3, np.float32)])
