"""apex.multi_tensor_apply.multi_tensor_applier with pyddp.amp_C's ops (apex's amp_C
multi_tensor_scale / axpby / l2norm), against hand-computed references; the noop (overflow) flag;
a clear error for an op pyddp does not have."""
import numpy as np
import pytest

import pyddp
from pyddp import amp_C
from pyddp.multi_tensor_apply import MultiTensorApply, multi_tensor_applier


def test_available_and_chunk_size():
    assert multi_tensor_applier.available and MultiTensorApply.available
    assert multi_tensor_applier.chunk_size == 2048 * 32
    import pyddp as apex
    assert apex.multi_tensor_apply.multi_tensor_applier is multi_tensor_applier


def test_scale_and_overflow_flag():
    rng = np.random.default_rng(0)
    srcs = [pyddp.tensor(rng.standard_normal(s).astype(np.float16)) for s in ((3,), (2, 5))]
    dsts = [pyddp.zeros(3), pyddp.zeros(2, 5)]
    flag = pyddp.tensor([0], dtype=pyddp.int32)
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [srcs, dsts], 0.25)
    for s, d in zip(srcs, dsts):
        np.testing.assert_array_equal(d.numpy(), s.numpy().astype(np.float32) * 0.25)
    assert flag.item() == 0
    srcs[1][0, 0] = float("inf")
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [srcs, dsts], 0.5)
    assert flag.item() == 1
    # NumPy arrays work as well
    a, b = np.arange(4.0), np.zeros(4)
    f = np.zeros(1, dtype=np.int32)
    multi_tensor_applier(amp_C.multi_tensor_scale, f, [[a], [b]], 2.0)
    np.testing.assert_array_equal(b, [0, 2, 4, 6]) and f[0] == 0


def test_axpby():
    x = [pyddp.tensor([1.0, 2.0]), pyddp.tensor([3.0])]
    y = [pyddp.tensor([10.0, 20.0]), pyddp.tensor([float("nan")])]
    out = [pyddp.zeros(2), pyddp.zeros(1)]
    flag = pyddp.tensor([0], dtype=pyddp.int32)
    multi_tensor_applier(amp_C.multi_tensor_axpby, flag, [x[:1], y[:1], out[:1]], 2.0, 0.5, -1)
    np.testing.assert_array_equal(out[0].numpy(), [7.0, 14.0])
    assert flag.item() == 0
    multi_tensor_applier(amp_C.multi_tensor_axpby, flag, [x, y, out], 2.0, 0.5, 0)
    assert flag.item() == 0          # only x is checked
    multi_tensor_applier(amp_C.multi_tensor_axpby, flag, [x, y, out], 2.0, 0.5, 1)
    assert flag.item() == 1


def test_l2norm_as_gradient_clipping_uses_it():
    rng = np.random.default_rng(2)
    grads = [pyddp.tensor(rng.standard_normal(s)) for s in ((4,), (3, 3), (1,))]
    flag = pyddp.tensor([0], dtype=pyddp.int32)
    total, per = multi_tensor_applier(amp_C.multi_tensor_l2norm, flag, [grads], False)
    ref = [np.sqrt((g.numpy().astype(np.float32) ** 2).sum()) for g in grads]
    assert total.dtype == pyddp.float32 and tuple(total.shape) == (1,)
    np.testing.assert_allclose(total.item(), np.sqrt(np.sum(np.square(ref))), rtol=1e-6)
    assert per.numel() == 0
    total, per = multi_tensor_applier(amp_C.multi_tensor_l2norm, flag, [grads], True)
    np.testing.assert_allclose(per.numpy(), ref, rtol=1e-6)
    assert flag.item() == 0
    grads[0][0] = float("inf")
    multi_tensor_applier(amp_C.multi_tensor_l2norm, flag, [grads], False)
    assert flag.item() == 1


def test_unknown_op_and_bad_lists():
    def multi_tensor_adam(*a):
        raise AssertionError("not called")
    with pytest.raises(TypeError, match="'multi_tensor_adam' is not one of pyddp.amp_C's ops"):
        multi_tensor_applier(multi_tensor_adam, pyddp.tensor([0]), [[]])
    with pytest.raises(RuntimeError, match="different lengths"):
        multi_tensor_applier(amp_C.multi_tensor_scale, pyddp.tensor([0]),
                             [[pyddp.zeros(1)], []], 1.0)
