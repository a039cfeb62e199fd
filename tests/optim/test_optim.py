"""pyddp.optim against torch 2.13's optimizers: same initial weights and gradients, a few steps,
parameters and state equal within 1e-5 relative error (float32); state dicts, scaling, half
precision, and the C binding's argument checks."""
import numpy as np
import pytest

import pyddp.optim as O
from pyddp import _C
from _optim_ref import FakeTensor, rel_close

torch = pytest.importorskip("torch")

SHAPES = [(7, 5), (33,), (3, 4, 5), (1,), (1030,)]


def _data(shapes, steps, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    inits = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]
    return inits, grads


def run_parity(torch_cls, torch_kw, our_cls, our_kw, steps=4, seed=0, use_torch_params=False,
               dtype=np.float32, rtol=1e-5):
    inits, grads = _data(SHAPES, steps, seed, dtype)
    tparams = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in inits]
    if use_torch_params:
        ours = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in inits]
    else:
        ours = [FakeTensor(a.copy()) for a in inits]
    topt = torch_cls(tparams, **torch_kw)
    popt = our_cls(ours, **our_kw)
    for k in range(steps):
        for tp, op, g in zip(tparams, ours, grads[k]):
            tp.grad = torch.from_numpy(g.copy())
            op.grad = torch.from_numpy(g.copy()) if use_torch_params else FakeTensor(g.copy())
        topt.step()
        popt.step()
    for i, (tp, op) in enumerate(zip(tparams, ours)):
        ours_arr = op.detach().numpy() if use_torch_params else op._data
        rel_close(ours_arr, tp.detach().numpy(), rtol, f"param {i}")
        tstate, pstate = topt.state[tp], popt.state[op]
        for key, val in tstate.items():
            if key == "step":
                assert float(pstate["step"]) == float(val)
            elif val is not None:
                rel_close(pstate[key], val.numpy(), rtol, f"state {key} of param {i}")
    return topt, popt, tparams, ours


SGD_OPTIONS = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.8, nesterov=True),
    dict(lr=0.05, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True, maximize=True),
    dict(lr=0.05, momentum=0.5, dampening=0.5, weight_decay=0.05, maximize=True),
]


@pytest.mark.parametrize("kw", SGD_OPTIONS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_sgd_parity(kw):
    run_parity(torch.optim.SGD, kw, O.SGD, kw)


ADAM_OPTIONS = [
    dict(),
    dict(lr=0.01, weight_decay=0.1),
    dict(lr=0.01, amsgrad=True),
    dict(lr=0.01, maximize=True, weight_decay=0.05, amsgrad=True),
    dict(lr=0.02, betas=(0.3, 0.9), eps=1e-6),  # lerp's large-weight branch
    dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.1),
]


@pytest.mark.parametrize("kw", ADAM_OPTIONS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_adam_parity(kw):
    run_parity(torch.optim.Adam, kw, O.Adam, kw, steps=5)


ADAMW_OPTIONS = [
    dict(),
    dict(lr=0.01, weight_decay=0.2),
    dict(lr=0.01, amsgrad=True, weight_decay=0.0),
    dict(lr=0.01, maximize=True, amsgrad=True),
]


@pytest.mark.parametrize("kw", ADAMW_OPTIONS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_adamw_parity(kw):
    run_parity(torch.optim.AdamW, kw, O.AdamW, kw, steps=5)


def test_adamw_updates_torch_parameters_in_place():
    # pyddp optimizers on a torch model: the tensors themselves change
    run_parity(torch.optim.AdamW, dict(lr=0.01), O.AdamW, dict(lr=0.01), use_torch_params=True)
    run_parity(torch.optim.SGD, dict(lr=0.1, momentum=0.9), O.SGD, dict(lr=0.1, momentum=0.9),
               use_torch_params=True)


def test_torch_model_training_loop_matches():
    torch.manual_seed(0)
    m1 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    m2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    m2.load_state_dict(m1.state_dict())
    o1 = torch.optim.Adam(m1.parameters(), lr=1e-2, weight_decay=1e-3)
    o2 = O.Adam(m2.parameters(), lr=1e-2, weight_decay=1e-3)
    for _ in range(5):
        x = torch.randn(4, 8)
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            loss = m(x).pow(2).mean()
            loss.backward()
            o.step()
    for a, b in zip(m1.parameters(), m2.parameters()):
        rel_close(b.detach().numpy(), a.detach().numpy(), 1e-5)


@pytest.mark.parametrize("adam_w_mode", [True, False])
def test_fused_adam_parity(adam_w_mode):
    tcls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    run_parity(tcls, dict(lr=0.01, weight_decay=0.05), O.FusedAdam,
               dict(lr=0.01, weight_decay=0.05, adam_w_mode=adam_w_mode), steps=5)


def test_fused_adam_against_torch_fused():
    run_parity(torch.optim.AdamW, dict(lr=0.01, weight_decay=0.01, fused=True), O.FusedAdam,
               dict(lr=0.01, weight_decay=0.01))


def test_fused_adam_without_bias_correction():
    # apex's bias_correction=False: p -= lr * m / (sqrt(v) + eps); reference in float64
    inits, grads = _data([(50,)], 3, 4)
    p = FakeTensor(inits[0].copy())
    opt = O.FusedAdam([p], lr=0.01, bias_correction=False, weight_decay=0.0)
    ref = inits[0].astype(np.float64)
    m = np.zeros_like(ref)
    v = np.zeros_like(ref)
    for g in grads:
        p.grad = FakeTensor(g[0].copy())
        opt.step()
        g64 = g[0].astype(np.float64)
        m = 0.9 * m + 0.1 * g64
        v = 0.999 * v + 0.001 * g64 * g64
        ref = ref - 0.01 * m / (np.sqrt(v) + 1e-8)
    rel_close(p._data, ref, 1e-5)


@pytest.mark.parametrize("kw", [dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
                                dict(lr=0.1)])
def test_fused_sgd_parity(kw):
    run_parity(torch.optim.SGD, kw, O.FusedSGD, kw)


def test_float64_params_take_numpy_path():
    run_parity(torch.optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.1), O.Adam,
               dict(lr=0.01, amsgrad=True, weight_decay=0.1), dtype=np.float64, rtol=1e-12)
    run_parity(torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True), O.SGD,
               dict(lr=0.1, momentum=0.9, nesterov=True), dtype=np.float64, rtol=1e-12)


def test_param_groups_and_missing_grads():
    inits, grads = _data([(10,), (20,), (5,)], 3, 1)
    tp = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in inits]
    pp = [FakeTensor(a.copy()) for a in inits]
    topt = torch.optim.SGD([{"params": tp[:2], "lr": 0.5}, {"params": tp[2:]}], lr=0.1,
                           momentum=0.9)
    popt = O.SGD([{"params": pp[:2], "lr": 0.5}, {"params": pp[2:]}], lr=0.1, momentum=0.9)
    for k in range(3):
        for i in (0, 2):  # param 1 never gets a gradient
            tp[i].grad = torch.from_numpy(grads[k][i].copy())
            pp[i].grad = FakeTensor(grads[k][i].copy())
        topt.step()
        popt.step()
    for a, b in zip(tp, pp):
        rel_close(b._data, a.detach().numpy(), 1e-5)
    assert pp[1] not in popt.state and tp[1] not in topt.state
    assert np.array_equal(pp[1]._data, inits[1])
    assert [g["lr"] for g in popt.param_groups] == [0.5, 0.1]


def test_state_dict_structure_and_round_trip():
    inits, grads = _data([(6,), (3, 2)], 4, 2)
    params = [FakeTensor(a.copy()) for a in inits]
    opt = O.AdamW(params, lr=0.01, amsgrad=True)
    tparams = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in inits]
    topt = torch.optim.AdamW(tparams, lr=0.01, amsgrad=True)
    for k in range(2):
        for p, tp, g in zip(params, tparams, grads[k]):
            p.grad = FakeTensor(g.copy())
            tp.grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    sd = opt.state_dict()
    tsd = topt.state_dict()
    assert sd["param_groups"] == tsd["param_groups"]
    assert sorted(sd["state"]) == sorted(tsd["state"]) == [0, 1]
    for i in (0, 1):
        assert set(sd["state"][i]) == set(tsd["state"][i])
        assert float(sd["state"][i]["step"]) == float(tsd["state"][i]["step"]) == 2.0

    # a fresh optimizer loaded from ours, and one loaded from torch's dict, continue alike
    fresh = [FakeTensor(p._data.copy()) for p in params]
    opt2 = O.AdamW(fresh, lr=0.5)
    opt2.load_state_dict(sd)
    fresh_t = [FakeTensor(p._data.copy()) for p in params]
    opt3 = O.AdamW(fresh_t, lr=0.5)
    opt3.load_state_dict(tsd)
    assert opt2.param_groups[0]["lr"] == 0.01
    for k in range(2, 4):
        for ps, g in zip((params, fresh, fresh_t), (grads[k],) * 3):
            for p, gi in zip(ps, g):
                p.grad = FakeTensor(gi.copy())
        for tp, gi in zip(tparams, grads[k]):
            tp.grad = torch.from_numpy(gi.copy())
        opt.step()
        opt2.step()
        opt3.step()
        topt.step()
    for a, b, c, t in zip(params, fresh, fresh_t, tparams):
        assert np.array_equal(a._data, b._data)
        rel_close(c._data, t.detach().numpy(), 1e-5)
        rel_close(a._data, t.detach().numpy(), 1e-5)
    # the loaded state is a copy, not shared with the dict it came from
    assert opt2.state[fresh[0]]["exp_avg"] is not sd["state"][0]["exp_avg"]


def test_load_state_dict_validates_sizes():
    p = [FakeTensor(np.zeros(3, np.float32)) for _ in range(3)]
    opt = O.SGD(p, lr=0.1)
    other = O.SGD([{"params": p[:1]}, {"params": p[1:]}], lr=0.1)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        opt.load_state_dict(other.state_dict())
    two = O.SGD(p[:2], lr=0.1)
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        opt.load_state_dict(two.state_dict())


def test_constructor_errors():
    p = FakeTensor(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="Invalid learning rate"):
        O.Adam([p], lr=-1.0)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        O.AdamW([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        O.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="empty parameter list"):
        O.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="iterable of Tensors or dicts"):
        O.SGD(p, lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        O.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="required optimization parameter lr"):
        O.FusedSGD([p])
    with pytest.raises(RuntimeError, match="AMSGrad"):
        O.FusedAdam([p], amsgrad=True)


def test_zero_grad_and_closure():
    p = FakeTensor(np.ones(4, np.float32))
    opt = O.SGD([p], lr=0.1)
    p.grad = FakeTensor(np.full(4, 2.0, np.float32))
    grad_arr = p.grad._data
    opt.zero_grad(set_to_none=False)
    assert p.grad._data is grad_arr and not grad_arr.any()
    opt.zero_grad()
    assert p.grad is None

    def closure():
        p.grad = FakeTensor(np.full(4, 1.0, np.float32))
        return 42.0

    assert opt.step(closure) == 42.0
    np.testing.assert_array_equal(p._data, np.float32(1) + np.float32(-0.1) * np.float32(1))
    fa = O.FusedAdam([p])
    p.grad = FakeTensor(np.ones(4, np.float32))
    fa.zero_grad()
    assert p.grad is None  # apex's set_grad_none=True


@pytest.mark.parametrize("cls,kw", [(O.FusedAdam, dict(lr=0.01)), (O.AdamW, dict(lr=0.01)),
                                    (O.FusedSGD, dict(lr=0.1, momentum=0.9))])
def test_grad_scale_and_found_inf(cls, kw):
    inits, grads = _data([(40,), (9,)], 2, 5)
    scale = 1024.0
    plain = [FakeTensor(a.copy()) for a in inits]
    scaled = [FakeTensor(a.copy()) for a in inits]
    o1, o2 = cls(plain, **kw), cls(scaled, **kw)
    for k in range(2):
        for p, q, g in zip(plain, scaled, grads[k]):
            p.grad = FakeTensor(g.copy())
            q.grad = FakeTensor(g * np.float32(scale))
        o1.step()
        flag = np.zeros(1, np.float32)
        o2.step(grad_scale=scale, found_inf=flag)
        assert flag[0] == 0.0 and not o2.last_step_skipped
    for p, q in zip(plain, scaled):
        np.testing.assert_array_equal(p._data, q._data)  # power-of-two scale: exact
    # a set flag skips the step: params and step counts unchanged
    before = [q._data.copy() for q in scaled]
    o2.step(inv_scale=1 / scale, found_inf=np.ones(1, np.float32))
    assert o2.last_step_skipped
    for q, b in zip(scaled, before):
        np.testing.assert_array_equal(q._data, b)
    # check_finite: an inf in the last gradient of the last group sets the flag and skips
    scaled[1].grad._data[-1] = np.inf
    flag = np.zeros(1, np.float32)
    o2.step(inv_scale=1 / scale, found_inf=flag, check_finite=True)
    assert flag[0] == 1.0 and o2.last_step_skipped
    for q, b in zip(scaled, before):
        np.testing.assert_array_equal(q._data, b)
    if "step" in o2.state[scaled[0]]:
        assert float(o2.state[scaled[0]]["step"]) == 2.0
    # torch's GradScaler protocol: attributes on the optimizer
    o2.found_inf = np.ones(1, np.float32)
    o2.step()
    assert o2.last_step_skipped


def test_fused_adam_float16_with_master_weights():
    inits, grads = _data([(300,), (1100,)], 4, 6)
    half = [torch.nn.Parameter(torch.from_numpy(a.astype(np.float16))) for a in inits]
    ref = [torch.nn.Parameter(torch.from_numpy(a.astype(np.float16).astype(np.float32)))
           for a in inits]
    opt = O.FusedAdam(half, lr=0.01, weight_decay=0.01, master_weights=True)
    topt = torch.optim.AdamW(ref, lr=0.01, weight_decay=0.01)
    for k in range(4):
        for h, r, g in zip(half, ref, grads[k]):
            h.grad = torch.from_numpy(g.astype(np.float16))
            r.grad = torch.from_numpy(g.astype(np.float16).astype(np.float32))
        opt.step()
        topt.step()
    for h, r in zip(half, ref):
        master = opt.state[h]["master_param"]
        rel_close(master, r.detach().numpy(), 1e-5)
        # the half parameter is the master rounded to nearest even
        np.testing.assert_array_equal(h.detach().numpy(), master.astype(np.float16))


def test_half_params_without_master_are_rounded_float32_updates():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    inits, grads = _data([(700,)], 1, 7)
    for dt in (np.float16, ml_dtypes.bfloat16):
        p = FakeTensor(inits[0].astype(dt))
        widened = p._data.astype(np.float32)
        r = torch.nn.Parameter(torch.from_numpy(widened.copy()))
        opt = O.Adam([p], lr=0.01)
        topt = torch.optim.Adam([r], lr=0.01)
        g = grads[0][0].astype(dt)
        p.grad = FakeTensor(g)
        r.grad = torch.from_numpy(g.astype(np.float32))
        opt.step()
        topt.step()
        expect = r.detach().numpy().astype(dt).astype(np.float32)
        got = p._data.astype(np.float32)
        # torch's float32 result and ours may differ by an ulp before rounding to half
        ulp = np.abs(expect) * (2.0 ** -10 if dt is np.float16 else 2.0 ** -7)
        assert np.all(np.abs(got - expect) <= ulp + 1e-7)


def test_bfloat16_torch_params_with_master():
    inits, grads = _data([(257,)], 3, 8)
    p = torch.nn.Parameter(torch.from_numpy(inits[0]).to(torch.bfloat16))
    r = torch.nn.Parameter(p.detach().float().clone())
    opt = O.FusedSGD([p], lr=0.1, momentum=0.9, master_weights=True)
    topt = torch.optim.SGD([r], lr=0.1, momentum=0.9)
    for k in range(3):
        p.grad = torch.from_numpy(grads[k][0]).to(torch.bfloat16)
        r.grad = p.grad.float()
        opt.step()
        topt.step()
    master = opt.state[p]["master_param"]
    rel_close(master, r.detach().numpy(), 1e-5)
    assert torch.equal(p.detach(), torch.from_numpy(master).to(torch.bfloat16))


def test_binding_rejects_bad_arrays():
    p = [np.zeros(4, np.float32), np.zeros(5, np.float32)]
    g = [np.zeros(4, np.float32), np.zeros(5, np.float32)]
    m = [np.zeros(4, np.float32), np.zeros(5, np.float32)]
    v = [np.zeros(4, np.float32), np.zeros(5, np.float32)]
    args = dict(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)

    def call(**over):
        a = dict(params=p, grads=g, exp_avgs=m, exp_avg_sqs=v, max_exp_avg_sqs=None,
                 masters=None, steps=[1.0, 1.0], **args)
        a.update(over)
        return _C.adam_step(**a)

    assert call() is True
    with pytest.raises(TypeError, match=r"grads\[1\] must be float16, bfloat16 or float32"):
        call(grads=[g[0], np.zeros(5, np.int32)])
    with pytest.raises(ValueError, match=r"exp_avgs\[0\] must be C-contiguous"):
        call(exp_avgs=[np.zeros(8, np.float32)[::2], m[1]])
    ro = np.zeros(5, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"params\[1\] is read-only"):
        call(params=[p[0], ro])
    with pytest.raises(ValueError, match=r"exp_avg_sqs\[1\] has 4 elements but params\[1\] has 5"):
        call(exp_avg_sqs=[v[0], np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="grads has 1 arrays, expected 2"):
        call(grads=g[:1])
    with pytest.raises(TypeError, match=r"exp_avgs\[1\] must be float32"):
        call(exp_avgs=[m[0], np.zeros(5, np.float16)])
    with pytest.raises(ValueError, match="steps has 1 entries"):
        call(steps=[1.0])
    with pytest.raises(ValueError, match="exp_avgs and exp_avg_sqs are required"):
        call(exp_avgs=None)
    with pytest.raises(ValueError, match="amsgrad needs max_exp_avg_sqs"):
        call(amsgrad=True)
    with pytest.raises(ValueError, match="found_inf must hold exactly 1 element"):
        call(found_inf=np.zeros(2, np.float32))
    with pytest.raises(TypeError, match=r"params\[0\] must be an array"):
        call(params=[[1.0, 2.0], p[1]])
    with pytest.raises(ValueError, match=r"exp_avgs\[1\] and exp_avg_sqs\[1\] share memory"):
        call(exp_avgs=[m[0], v[1]])
    with pytest.raises(ValueError, match=r"params\[0\] and masters\[0\] share memory"):
        call(masters=[p[0], None])
    with pytest.raises(ValueError, match=r"momentum != 0 needs momentum_buffers"):
        _C.sgd_step(p, g, None, None, None, 0.1, 0.9, 0.0, 0.0)


def test_noncontiguous_and_other_dtype_grads_and_params():
    rng = np.random.default_rng(9)
    init = rng.standard_normal(64).astype(np.float32)
    g_big = rng.standard_normal(128).astype(np.float32)
    g = g_big[::2]  # non-contiguous gradient: copied for the kernel
    ref = FakeTensor(init.copy())
    ref.grad = FakeTensor(np.ascontiguousarray(g))
    a = FakeTensor(init.copy())
    a.grad = FakeTensor(g)
    b = FakeTensor(init.copy())
    b.grad = FakeTensor(g.astype(np.float64))  # float64 gradient of a float32 parameter
    store = np.zeros(128, np.float32)
    store[::2] = init
    c = FakeTensor(store[::2])  # a non-contiguous parameter: the NumPy path, updated in place
    c.grad = FakeTensor(np.ascontiguousarray(g))
    for opt_cls, kw in ((O.Adam, dict(lr=0.01, weight_decay=0.1)),
                        (O.SGD, dict(lr=0.1, momentum=0.9))):
        opts = [opt_cls([x], **kw) for x in (ref, a, b, c)]
        for _ in range(3):
            for o in opts:
                o.step()
        np.testing.assert_array_equal(a._data, ref._data)
        np.testing.assert_array_equal(b._data, ref._data)
        rel_close(c._data, ref._data, 1e-5)
        assert np.shares_memory(c._data, store) and np.array_equal(store[::2], c._data)
    bad = FakeTensor(np.zeros(4, np.int32))
    bad.grad = FakeTensor(np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="floating-point parameters"):
        O.SGD([bad], lr=0.1).step()


def test_step_hooks_copy_and_apex_names():
    import copy

    import pyddp

    p = FakeTensor(np.ones(3, np.float32))
    p.grad = FakeTensor(np.ones(3, np.float32))
    opt = O.FusedAdam([p], lr=0.1)
    calls = []
    h1 = opt.register_step_pre_hook(lambda o, a, k: calls.append(("pre", o is opt)))
    opt.register_step_post_hook(lambda o, a, k: calls.append(("post", k.get("inv_scale"))))
    opt.step(inv_scale=0.5)
    assert calls == [("pre", True), ("post", 0.5)]
    h1.remove()
    opt.step()
    assert calls[-1] == ("post", None) and len(calls) == 3
    # deepcopy keeps the per-parameter state attached to the copied parameters
    clone = copy.deepcopy(opt)
    q = clone.param_groups[0]["params"][0]
    assert q is not p and float(clone.state[q]["step"]) == 2.0
    np.testing.assert_array_equal(clone.state[q]["exp_avg"], opt.state[p]["exp_avg"])
    assert pyddp.optimizers.FusedAdam is O.FusedAdam and pyddp.optimizers.FusedSGD is O.FusedSGD
    # FusedSGD.step calls the base step: hooks still run once per step
    sgd = O.FusedSGD([p], lr=0.1, master_weights=True)
    n = []
    sgd.register_step_pre_hook(lambda o, a, k: n.append(1))
    sgd.step()
    assert n == [1]


@pytest.mark.parametrize("cls", [O.AdamW, O.FusedAdam, O.SGD])
def test_torch_grad_scaler_drives_pyddp_optimizers(cls):
    # torch.amp.GradScaler passes grad_scale / found_inf to optimizers that declare
    # _step_supports_amp_scaling, as pyddp's do; an overflow step is skipped
    torch.manual_seed(0)
    m1 = torch.nn.Linear(6, 3)
    m2 = torch.nn.Linear(6, 3)
    m2.load_state_dict(m1.state_dict())
    kw = dict(lr=1e-2, weight_decay=0.01)
    tcls = {O.AdamW: torch.optim.AdamW, O.FusedAdam: torch.optim.AdamW, O.SGD: torch.optim.SGD}[cls]
    o1, o2 = tcls(m1.parameters(), **kw), cls(m2.parameters(), **kw)
    s1 = torch.amp.GradScaler("cpu", init_scale=1024.0)
    s2 = torch.amp.GradScaler("cpu", init_scale=1024.0)
    skipped = []
    for i in range(4):
        x = torch.randn(5, 6)
        if i == 2:
            x[0, 0] = float("inf")
        for m, o, s in ((m1, o1, s1), (m2, o2, s2)):
            o.zero_grad()
            s.scale(m(x).pow(2).mean()).backward()
            s.step(o)
            s.update()
        skipped.append(o2.last_step_skipped)
    assert skipped == [False, False, True, False]
    assert s1.get_scale() == s2.get_scale() == 512.0
    for a, b in zip(m1.parameters(), m2.parameters()):
        rel_close(b.detach().numpy(), a.detach().numpy(), 1e-5)
