"""pyddp.nn modules: Module semantics, containers, and forward/backward parity with torch 2.13.

The parity tests build the same layer in torch and in pyddp, copy torch's weights into the pyddp
module through ``load_state_dict`` (a dict of NumPy arrays), run forward and backward with the same
input and upstream gradient, and compare the output, the input gradient and every parameter
gradient (and BatchNorm's running statistics) to a relative error of 1e-5 in float32, measured as
max|pyddp - torch| / max|torch| per array.
"""
import copy
import re
import warnings
from collections import OrderedDict

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
from pyddp.nn import functional as F

RTOL = 1e-5


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = np.max(np.abs(b)) if b.size else 0.0
    if scale == 0.0:
        return float(np.max(np.abs(a))) if a.size else 0.0
    return float(np.max(np.abs(a - b)) / scale)


def assert_close(a, b, rtol=RTOL, what=""):
    e = rel_err(a, b)
    assert e <= rtol, f"{what}: relative error {e:.3g} > {rtol}"


# ----------------------------------------------------------------------------------------------
# Module semantics (no torch needed)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 3, bias=False)
        self.scale = nn.Parameter(pyddp.ones(3))
        self.register_buffer("steps", pyddp.zeros(1))
        self.register_buffer("cache", pyddp.zeros(2), persistent=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) * self.scale


def test_registration_and_iteration():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["scale", "fc1.weight", "fc1.bias", "fc2.weight"]
    assert [n for n, _ in net.named_buffers()] == ["steps", "cache"]
    assert [n for n, _ in net.named_children()] == ["fc1", "act", "fc2"]
    assert [n for n, _ in net.named_modules()] == ["", "fc1", "act", "fc2"]
    assert list(net.state_dict().keys()) == ["scale", "steps", "fc1.weight", "fc1.bias",
                                             "fc2.weight"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert net.fc2.bias is None and "bias" in net.fc2._parameters
    assert net.get_parameter("fc1.weight") is net.fc1.weight
    assert net.get_submodule("fc2") is net.fc2
    assert net.get_buffer("steps") is net.steps
    # a shared module / parameter is listed once (remove_duplicate)
    seq = nn.Sequential(net.fc1, net.fc1)
    assert len(list(seq.parameters())) == 2
    assert len(list(seq.named_parameters(remove_duplicate=False))) == 4
    # state_dict values share memory with the module but are detached
    sd = net.state_dict()
    assert np.shares_memory(sd["fc1.weight"].numpy(), net.fc1.weight.numpy())
    assert not sd["fc1.weight"].requires_grad
    assert net.state_dict(keep_vars=True)["fc1.weight"] is net.fc1.weight
    assert "fc1.weight" in dir(net) or "fc1" in dir(net)


def test_setattr_rules():
    net = Net()
    with pytest.raises(TypeError, match="cannot assign .* as parameter 'scale'"):
        net.scale = pyddp.ones(3)
    net.scale = None
    assert "scale" in net._parameters and net.scale is None
    with pytest.raises(TypeError, match="cannot assign .* as child module 'fc1'"):
        net.fc1 = 3
    with pytest.raises(TypeError, match="as buffer 'steps'"):
        net.steps = 5
    net.steps = pyddp.ones(1)
    assert float(net.steps.numpy()[0]) == 1.0 and "steps" in net._buffers
    # re-assigning an attribute name moves it between categories
    net.fc2 = nn.Parameter(pyddp.zeros(2))
    assert "fc2" in net._parameters and "fc2" not in net._modules
    del net.fc2
    assert not hasattr(net, "fc2")
    with pytest.raises(KeyError, match="already exists"):
        net.register_buffer("act", pyddp.zeros(1))
    with pytest.raises(KeyError, match="contain"):
        net.register_parameter("a.b", None)
    with pytest.raises(TypeError, match="is not a Module subclass"):
        net.add_module("x", 3)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        net.nope
    y = pyddp.ones(2, requires_grad=True) * 2
    with pytest.raises(ValueError, match="non-leaf"):
        net.register_parameter("w", _nonleaf_param(y))
    net.buf = nn.Buffer(np.arange(3.0), persistent=False)
    assert "buf" in net._buffers and "buf" not in net.state_dict()

    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(pyddp.ones(1))

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Early()


def _nonleaf_param(y):
    p = nn.Parameter(pyddp.ones(2))
    p.grad_fn = y.grad_fn  # simulate a parameter that is the result of an operation
    return p


def test_train_eval_apply_zero_grad():
    net = Net()
    assert net.training and net.fc1.training
    assert net.eval() is net
    assert not net.training and not net.fc1.training and not net.act.training
    net.train()
    assert net.fc2.training
    with pytest.raises(ValueError, match="boolean"):
        net.train("yes")
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "ReLU", "Linear", "Net"]
    out = net(pyddp.randn(5, 4)).sum()
    out.backward()
    g = net.fc1.weight.grad
    assert g is not None and np.any(g.numpy() != 0)
    arr = g.numpy()
    net.zero_grad(set_to_none=False)
    assert net.fc1.weight.grad.numpy() is arr and not arr.any()  # zeroed in place
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_dtype_conversion_keeps_parameter_objects():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params = list(net.parameters())
    net(pyddp.randn(6, 3)).sum().backward()
    assert net.half() is net
    assert [id(p) for p in net.parameters()] == [id(p) for p in params]
    assert all(p.dtype == np.float16 for p in params)
    assert all(p.grad.dtype == np.float16 for p in params)
    assert net[1].running_mean.dtype == np.float16
    assert net[1].num_batches_tracked.dtype == np.int64  # integer buffers keep their dtype
    net.float()
    assert all(p.dtype == np.float32 for p in net.parameters())
    net.to(pyddp.float64)
    assert net[0].weight.dtype == np.float64
    net.to("cpu").to(0).to("cuda:0", dtype=np.float32).cuda().cpu().to(pyddp.device("cuda", 1))
    assert net[0].weight.dtype == np.float32
    net.to(pyddp.zeros(1, dtype=pyddp.float64))
    assert net[0].weight.dtype == np.float64
    net.double().to(device="cpu", dtype=pyddp.float32, non_blocking=True)
    assert net[0].weight.dtype == np.float32
    with pytest.raises(TypeError, match="floating point or complex"):
        net.to(pyddp.int64)
    if pyddp.bfloat16 is not None:
        net.bfloat16()
        assert net[0].weight.dtype == pyddp.bfloat16


def test_forward_hooks():
    lin = nn.Linear(2, 2)
    calls = []

    def pre(mod, args):
        calls.append("pre")
        return (args[0] * 0,)

    def post(mod, args, out):
        calls.append("post")
        return out + 1

    h1 = lin.register_forward_pre_hook(pre)
    h2 = lin.register_forward_hook(post)
    out = lin(pyddp.randn(3, 2))
    expected = lin.bias.numpy() + 1
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(expected, (3, 2)), rtol=1e-6)
    assert calls == ["pre", "post"]
    h1.remove()
    h2.remove()
    x = pyddp.randn(3, 2)
    np.testing.assert_allclose(lin(x).numpy(), F.linear(x, lin.weight, lin.bias).numpy())
    assert calls == ["pre", "post"]

    def pre_kw(mod, args, kwargs):
        return (args[0] + 1,), kwargs

    seen = []
    with lin.register_forward_pre_hook(pre_kw, with_kwargs=True):
        lin.register_forward_hook(lambda m, a, k, o: seen.append(k), with_kwargs=True,
                                  prepend=True)
        lin(x)
    assert seen == [{}]
    np.testing.assert_allclose(lin(x).numpy(), F.linear(x, lin.weight, lin.bias).numpy())

    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    b = Boom()
    always = []
    b.register_forward_hook(lambda m, a, o: always.append(o), always_call=True)
    with pytest.raises(ValueError, match="boom"):
        b(x)
    assert always == [None]


def test_state_dict_roundtrip_and_errors():
    a, b = Net(), Net()
    a.steps.numpy()[:] = 7
    res = b.load_state_dict(a.state_dict())
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert repr(res) == "<All keys matched successfully>"
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    assert b.steps.numpy()[0] == 7
    # copies go into the existing arrays (optimizers keep working)
    w = b.fc1.weight
    arr = w.numpy()
    sd = {k: v.numpy() * 2 for k, v in a.state_dict().items()}
    b.load_state_dict(sd)
    assert b.fc1.weight is w and b.fc1.weight.numpy() is arr
    np.testing.assert_array_equal(arr, a.fc1.weight.numpy() * 2)
    # strict errors
    sd = a.state_dict()
    del sd["fc1.bias"]
    sd["fc3.weight"] = np.zeros(2, np.float32)
    sd["extra"] = np.zeros(1, np.float32)
    with pytest.raises(RuntimeError) as ei:
        b.load_state_dict(sd)
    assert str(ei.value) == (
        'Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: "fc1.bias". '
        '\n\tUnexpected key(s) in state_dict: "fc3.weight", "extra". ')
    res = b.load_state_dict(sd, strict=False)
    assert res.missing_keys == ["fc1.bias"]
    assert sorted(res.unexpected_keys) == ["extra", "fc3.weight"]
    # a size mismatch raises even with strict=False
    sd = a.state_dict()
    sd["fc1.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(RuntimeError, match=re.escape(
            "size mismatch for fc1.weight: copying a param with shape (2, 2) from checkpoint, "
            "the shape in current model is (8, 4).")):
        b.load_state_dict(sd, strict=False)
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like"):
        b.load_state_dict([1, 2])
    sd = a.state_dict()
    sd["scale"] = "nope"
    with pytest.raises(RuntimeError, match='While copying the parameter named "scale"'):
        b.load_state_dict(sd)
    # assign=True takes the checkpoint's arrays
    sd = {k: v.numpy().copy() for k, v in a.state_dict().items()}
    b.load_state_dict(sd, assign=True)
    assert isinstance(b.fc1.weight, nn.Parameter) and b.fc1.weight.requires_grad
    assert b.fc1.weight.numpy() is sd["fc1.weight"]


def test_batchnorm_state_dict_versions():
    bn = nn.BatchNorm1d(3)
    sd = bn.state_dict()
    assert list(sd) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert sd._metadata[""]["version"] == 2
    # without metadata (e.g. a plain dict of arrays), a missing num_batches_tracked is tolerated
    plain = {k: v.numpy() for k, v in sd.items() if k != "num_batches_tracked"}
    assert nn.BatchNorm1d(3).load_state_dict(plain).missing_keys == []
    # with version-2 metadata it is reported missing
    od = OrderedDict(plain)
    od._metadata = sd._metadata
    with pytest.raises(RuntimeError,
                       match='Missing key\\(s\\) in state_dict: "num_batches_tracked"'):
        nn.BatchNorm1d(3).load_state_dict(od)


def test_deepcopy_and_pickle():
    import pickle
    net = Net()
    net2 = copy.deepcopy(net)
    assert isinstance(net2.fc1.weight, nn.Parameter)
    assert not np.shares_memory(net2.fc1.weight.numpy(), net.fc1.weight.numpy())
    np.testing.assert_array_equal(net2.fc1.weight.numpy(), net.fc1.weight.numpy())
    net3 = pickle.loads(pickle.dumps(net))
    assert isinstance(net3.fc2.weight, nn.Parameter) and net3.fc2.weight.requires_grad
    x = pyddp.randn(2, 4)
    np.testing.assert_array_equal(net3(x).numpy(), net(x).numpy())


def test_sequential_modulelist_moduledict():
    layers = [nn.Linear(2, 2) for _ in range(4)]
    seq = nn.Sequential(*layers)
    assert len(seq) == 4 and seq[1] is layers[1] and seq[-1] is layers[3]
    sub = seq[1:3]
    assert isinstance(sub, nn.Sequential) and list(sub) == layers[1:3]
    del seq[0]
    assert list(seq._modules) == ["0", "1", "2"] and seq[0] is layers[1]
    seq.insert(0, layers[0])
    seq.append(nn.ReLU())
    assert len(seq) == 5 and seq[0] is layers[0]
    seq.extend([nn.Tanh()])
    assert isinstance(seq.pop(-1), nn.Tanh)
    seq2 = nn.Sequential(OrderedDict([("a", nn.Linear(2, 3)), ("b", nn.ReLU())]))
    assert seq2.a is seq2[0] and list(seq2.state_dict()) == ["a.weight", "a.bias"]
    x = pyddp.randn(4, 2)
    expected = F.relu(F.linear(x, seq2.a.weight, seq2.a.bias))
    np.testing.assert_allclose(seq2(x).numpy(), expected.numpy())
    assert len(seq + seq2) == 7 and len(seq2 * 2) == 4
    with pytest.raises(IndexError):
        seq[10]

    ml = nn.ModuleList(layers[:2])
    ml.append(layers[2])
    ml += [layers[3]]
    assert len(ml) == 4 and ml[-1] is layers[3]
    ml.insert(1, nn.ReLU())
    assert isinstance(ml[1], nn.ReLU) and ml[2] is layers[1]
    del ml[1]
    assert list(ml) == layers
    assert isinstance(ml[1:], nn.ModuleList) and len(ml[1:]) == 3
    assert len(list(ml.parameters())) == 8

    md = nn.ModuleDict({"x": nn.Linear(1, 1), "y": nn.ReLU()})
    md["z"] = nn.Tanh()
    assert list(md.keys()) == ["x", "y", "z"] and "y" in md and len(md) == 3
    assert isinstance(md.pop("y"), nn.ReLU) and list(md) == ["x", "z"]
    md.update([("w", nn.Sigmoid())])
    assert list(md.keys()) == ["x", "z", "w"]

    pl = nn.ParameterList([nn.Parameter(pyddp.ones(2)), pyddp.zeros(3)])
    assert len(pl) == 2 and isinstance(pl[1], nn.Parameter)
    assert [n for n, _ in pl.named_parameters()] == ["0", "1"]
    pd = nn.ParameterDict({"a": pyddp.ones(1)})
    assert isinstance(pd["a"], nn.Parameter) and list(pd.keys()) == ["a"]


def test_default_init_distributions():
    pyddp.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / np.sqrt(400)
    w = lin.weight.numpy()
    assert w.dtype == np.float32 and w.shape == (300, 400)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() - bound / np.sqrt(3)) < 0.01 * bound
    assert np.abs(lin.bias.numpy()).max() <= bound
    conv = nn.Conv2d(8, 16, 3)
    bound = 1 / np.sqrt(8 * 9)
    assert np.abs(conv.weight.numpy()).max() <= bound
    assert np.abs(conv.weight.numpy()).max() > 0.98 * bound
    assert np.abs(conv.bias.numpy()).max() <= bound
    emb = nn.Embedding(1000, 64, padding_idx=3)
    e = emb.weight.numpy()
    assert abs(e.std() - 1) < 0.02 and abs(e.mean()) < 0.02 and not e[3].any()
    bn = nn.BatchNorm2d(5)
    assert (bn.weight.numpy() == 1).all() and (bn.bias.numpy() == 0).all()
    assert (bn.running_var.numpy() == 1).all() and int(bn.num_batches_tracked.numpy()) == 0
    ln = nn.LayerNorm((4, 5))
    assert ln.weight.shape == (4, 5) and (ln.weight.numpy() == 1).all()
    assert nn.Linear(3, 3, dtype=pyddp.float64).weight.dtype == np.float64


def test_misc_module_errors():
    with pytest.raises(ValueError, match="dropout probability"):
        nn.Dropout(1.5)
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="padding='same' is not supported for strided"):
        nn.Conv2d(3, 3, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="expected 4D input"):
        nn.BatchNorm2d(3)(pyddp.randn(2, 3))
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        nn.BatchNorm1d(3)(pyddp.randn(2, 3, 4, 5))
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        nn.Module()(1)


def test_dropout_train_eval():
    pyddp.manual_seed(1)
    d = nn.Dropout(0.25)
    x = pyddp.ones(200, 100)
    y = d(x).numpy()
    vals = set(np.unique(y).tolist())
    assert vals <= {0.0, np.float32(1 / 0.75)}
    assert abs((y == 0).mean() - 0.25) < 0.02
    d.eval()
    assert np.array_equal(d(x).numpy(), x.numpy())
    assert repr(d) == "Dropout(p=0.25, inplace=False)"
    # training-mode gradient: the kept elements pass g / (1 - p), the dropped ones nothing
    d.train()
    xr = pyddp.tensor(np.random.default_rng(2).uniform(1, 2, (50, 40)).astype(np.float32),
                      requires_grad=True)
    y = d(xr)
    g = np.random.default_rng(3).standard_normal((50, 40)).astype(np.float32)
    y.backward(pyddp.tensor(g))
    kept = y.numpy() != 0
    np.testing.assert_allclose(y.numpy()[kept], xr.numpy()[kept] / 0.75, rtol=1e-6)
    np.testing.assert_allclose(xr.grad.numpy(), np.where(kept, g / 0.75, 0), rtol=1e-6)
    assert np.array_equal(nn.Dropout(0.0)(xr).numpy(), xr.numpy())
    assert not nn.Dropout(1.0)(xr).numpy().any()


# ----------------------------------------------------------------------------------------------
# parity with torch

def _torch():
    return pytest.importorskip("torch")


def _copy_from_torch(tmod, pmod):
    sd = {k: v.detach().numpy().copy() for k, v in tmod.state_dict().items()}
    res = pmod.load_state_dict(sd)
    assert not res.missing_keys and not res.unexpected_keys


def _run_parity(tmod, pmod, x, *, dtype=np.float32, rtol=RTOL, grad_input=True, seed=12345,
                index_input=False):
    torch = _torch()
    _copy_from_torch(tmod, pmod)
    if dtype == np.float64:
        tmod.double()
        pmod.double()
    xt = torch.tensor(x)
    if grad_input and not index_input:
        xt.requires_grad_(True)
    xp = pyddp.tensor(x, requires_grad=grad_input and not index_input)
    out_t = tmod(xt)
    out_p = pmod(xp)
    assert out_p.dtype == out_t.detach().numpy().dtype
    assert_close(out_p.numpy(), out_t.detach().numpy(), rtol, "forward")
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(tuple(out_t.shape)).astype(dtype)
    out_t.backward(torch.tensor(g))
    out_p.backward(pyddp.tensor(g))
    if grad_input and not index_input:
        assert_close(xp.grad.numpy(), xt.grad.numpy(), rtol, "input grad")
    tparams = dict(tmod.named_parameters())
    for name, p in pmod.named_parameters():
        tp = tparams[name]
        if tp.grad is None:
            assert p.grad is None or not p.grad.numpy().any(), name
            continue
        assert p.grad is not None, name
        assert_close(p.grad.numpy(), tp.grad.numpy(), rtol, f"grad of {name}")
    tbufs = dict(tmod.named_buffers())
    for name, b in pmod.named_buffers():
        assert_close(b.numpy(), tbufs[name].numpy(), rtol, f"buffer {name}")
    return out_p, out_t


def _x(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


LAYER_CASES = [
    ("Linear", lambda m: m.Linear(7, 5), (4, 7)),
    ("Linear-3d-nobias", lambda m: m.Linear(7, 5, bias=False), (2, 3, 7)),
    ("Conv2d", lambda m: m.Conv2d(3, 4, 3), (2, 3, 9, 8)),
    ("Conv2d-stride-pad", lambda m: m.Conv2d(4, 6, (3, 2), stride=2, padding=(1, 2)), (2, 4, 9, 9)),
    ("Conv2d-dilation-groups", lambda m: m.Conv2d(4, 6, 3, dilation=2, groups=2, bias=False),
     (2, 4, 10, 9)),
    ("Conv2d-same", lambda m: m.Conv2d(3, 5, 4, padding="same"), (1, 3, 7, 8)),
    ("Conv2d-unbatched", lambda m: m.Conv2d(3, 2, 3, padding=1), (3, 6, 6)),
    ("Conv2d-reflect", lambda m: m.Conv2d(2, 3, 3, padding=(1, 2), padding_mode="reflect"),
     (2, 2, 6, 7)),
    ("Conv2d-replicate", lambda m: m.Conv2d(2, 3, 3, padding=1, padding_mode="replicate"),
     (2, 2, 5, 5)),
    ("Conv2d-circular", lambda m: m.Conv2d(2, 3, 3, padding="same", padding_mode="circular"),
     (2, 2, 5, 6)),
    ("LayerNorm", lambda m: m.LayerNorm(6), (3, 4, 6)),
    ("LayerNorm-2d-nobias", lambda m: m.LayerNorm((4, 6), bias=False), (3, 4, 6)),
    ("ReLU", lambda m: m.ReLU(), (5, 6)),
    ("GELU", lambda m: m.GELU(), (5, 6)),
    ("GELU-tanh", lambda m: m.GELU(approximate="tanh"), (5, 6)),
    ("Tanh", lambda m: m.Tanh(), (5, 6)),
    ("Sigmoid", lambda m: m.Sigmoid(), (5, 6)),
    ("Softmax", lambda m: m.Softmax(dim=1), (5, 6)),
    ("Softmax-dim0", lambda m: m.Softmax(dim=0), (5, 6, 2)),
    ("LogSoftmax", lambda m: m.LogSoftmax(dim=-1), (5, 6)),
    ("Flatten", lambda m: m.Flatten(), (2, 3, 4, 5)),
    ("Flatten-range", lambda m: m.Flatten(0, 2), (2, 3, 4, 5)),
    ("Identity", lambda m: m.Identity(3, k=1), (2, 3)),
    ("MaxPool2d", lambda m: m.MaxPool2d(2), (2, 3, 8, 7)),
    ("MaxPool2d-stride-pad-ceil", lambda m: m.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
     (2, 3, 8, 7)),
    ("AvgPool2d", lambda m: m.AvgPool2d(2), (2, 3, 8, 6)),
    ("AvgPool2d-pad", lambda m: m.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
     (2, 3, 9, 7)),
    ("AdaptiveAvgPool2d", lambda m: m.AdaptiveAvgPool2d((3, 2)), (2, 3, 7, 5)),
    ("AdaptiveAvgPool2d-1", lambda m: m.AdaptiveAvgPool2d(1), (2, 3, 6, 6)),
    ("Dropout-eval", lambda m: m.Dropout(0.5).eval(), (4, 5)),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note on even kernels
@pytest.mark.parametrize("name,make,shape", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_layer_vs_torch(name, make, shape):
    torch = _torch()
    torch.manual_seed(0)
    tmod = make(torch.nn)
    pmod = make(nn)
    out_p, _ = _run_parity(tmod, pmod, _x(*shape))
    assert repr(pmod) == repr(tmod)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (6, 4)), ("BatchNorm1d", (5, 4, 3)),
                                       ("BatchNorm2d", (3, 4, 5, 2))])
def test_batchnorm_vs_torch(cls, shape, momentum):
    torch = _torch()
    tmod = getattr(torch.nn, cls)(4, momentum=momentum)
    pmod = getattr(nn, cls)(4, momentum=momentum)
    with torch.no_grad():
        tmod.weight.uniform_(0.5, 1.5)
        tmod.bias.uniform_(-0.5, 0.5)
    # two training steps (running statistics and the batch counter move), then eval
    _run_parity(tmod, pmod, _x(*shape, seed=1) * 3 + 1)
    _run_parity(tmod, pmod, _x(*shape, seed=2) * 2 - 1)
    assert int(pmod.num_batches_tracked.numpy()) == 2
    tmod.eval()
    pmod.eval()
    _run_parity(tmod, pmod, _x(*shape, seed=3))
    assert repr(pmod) == repr(tmod)


def test_batchnorm_no_affine_no_stats_vs_torch():
    torch = _torch()
    tmod = torch.nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    pmod = nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    assert list(pmod.state_dict()) == list(tmod.state_dict()) == []
    _run_parity(tmod, pmod, _x(2, 3, 4, 4))
    pmod.eval()
    tmod.eval()
    _run_parity(tmod, pmod, _x(2, 3, 4, 4, seed=5))


@pytest.mark.parametrize("kw", [dict(), dict(padding_idx=2), dict(padding_idx=-1),
                                dict(max_norm=1.0), dict(scale_grad_by_freq=True, padding_idx=0)],
                         ids=["plain", "padding", "padding-neg", "max_norm", "freq"])
def test_embedding_vs_torch(kw):
    torch = _torch()
    tmod = torch.nn.Embedding(10, 4, **kw)
    pmod = nn.Embedding(10, 4, **kw)
    idx = np.array([[1, 2, 3], [2, 9, 1]], dtype=np.int64)
    _run_parity(tmod, pmod, idx, index_input=True)
    assert repr(pmod) == repr(tmod)


def test_model_vs_torch():
    """A small CNN + MLP: same keys, same repr, same outputs and gradients as torch."""
    torch = _torch()

    def build(m):
        return m.Sequential(
            m.Conv2d(3, 8, 3, padding=1, bias=False), m.BatchNorm2d(8), m.ReLU(), m.MaxPool2d(2),
            m.Conv2d(8, 8, 3, stride=2, bias=False), m.BatchNorm2d(8), m.GELU(),
            m.AdaptiveAvgPool2d(1), m.Flatten(), m.Linear(8, 16), m.LayerNorm(16), m.Tanh(),
            m.Dropout(0.0), m.Linear(16, 5))

    torch.manual_seed(0)
    tmod, pmod = build(torch.nn), build(nn)
    assert list(pmod.state_dict()) == list(tmod.state_dict())
    assert repr(pmod) == repr(tmod)
    assert [n for n, _ in pmod.named_modules()] == [n for n, _ in tmod.named_modules()]
    _run_parity(tmod, pmod, _x(4, 3, 12, 12))
    # the same model in float64 agrees to much tighter precision
    torch.manual_seed(0)
    tmod, pmod = build(torch.nn), build(nn)
    _run_parity(tmod, pmod, _x(4, 3, 12, 12, dtype=np.float64), dtype=np.float64, rtol=1e-10)


def test_load_state_dict_errors_vs_torch():
    torch = _torch()

    def build(m):
        return m.Sequential(m.Linear(3, 4), m.BatchNorm1d(4), m.Linear(4, 2))

    tmod, pmod = build(torch.nn), build(nn)
    sd = {k: v.numpy() for k, v in tmod.state_dict().items()}
    del sd["0.bias"]
    sd["1.bogus"] = np.zeros(1, np.float32)
    sd["3.weight"] = np.zeros(1, np.float32)
    sd["2.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(RuntimeError) as et:
        tmod.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    with pytest.raises(RuntimeError) as ep:
        pmod.load_state_dict(sd)
    # torch prints shapes as torch.Size([...]); pyddp as tuples
    expected = re.sub(r"torch\.Size\(\[([0-9, ]*)\]\)", lambda m: f"({m.group(1)})", str(et.value))
    assert str(ep.value) == expected
    rt = tmod.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items() if k != "2.weight"},
                              strict=False)
    rp = pmod.load_state_dict({k: v for k, v in sd.items() if k != "2.weight"}, strict=False)
    assert rp.missing_keys == rt.missing_keys and rp.unexpected_keys == rt.unexpected_keys
    # a torch state_dict (CPU tensors) loads directly
    tmod2 = build(torch.nn)
    pmod.load_state_dict(tmod2.state_dict())
    assert_close(pmod[0].weight.numpy(), tmod2[0].weight.detach().numpy(), 0)


def test_module_list_repr_vs_torch():
    torch = _torch()

    def build(m):
        blocks = m.ModuleList([m.Linear(2, 2) for _ in range(3)] + [m.ReLU()])
        return m.ModuleDict({"blocks": blocks, "head": m.Conv2d(2, 2, 1, bias=False)})

    assert repr(build(nn)) == repr(build(torch.nn))


def test_loss_modules_repr_and_buffers_vs_torch():
    torch = _torch()
    w = np.arange(1, 4, dtype=np.float32)
    t = torch.nn.CrossEntropyLoss(weight=torch.tensor(w), label_smoothing=0.1)
    p = nn.CrossEntropyLoss(weight=pyddp.tensor(w), label_smoothing=0.1)
    assert repr(p) == repr(t)
    assert list(p.state_dict()) == list(t.state_dict()) == ["weight"]
    t = torch.nn.BCEWithLogitsLoss(pos_weight=torch.ones(3))
    p = nn.BCEWithLogitsLoss(pos_weight=pyddp.ones(3))
    assert list(p.state_dict()) == list(t.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert nn.MSELoss(size_average=False).reduction == torch.nn.MSELoss(
            size_average=False).reduction


def test_training_step_reduces_loss():
    """A loss module in a small training loop decreases the loss (module + loss + autograd)."""
    pyddp.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    crit = nn.CrossEntropyLoss(label_smoothing=0.05)
    x = pyddp.tensor(np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32))
    y = pyddp.tensor(np.random.default_rng(1).integers(0, 3, 32))
    first = None
    for _ in range(30):
        model.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        for p in model.parameters():
            p.numpy()[...] -= 0.5 * p.grad.numpy()
        first = float(loss.numpy()) if first is None else first
    assert float(loss.numpy()) < 0.7 * first


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # torch's, by design here
def test_full_backward_hooks_vs_torch():
    """register_full_backward_(pre_)hook: same call order, arguments and replacements as torch."""
    torch = _torch()

    def run(m, T, tmod=None):
        lin = m.Linear(3, 2)
        if tmod is not None:
            _copy_from_torch(tmod, lin)
        log = []

        def pre(mod, go):
            log.append(("pre", [g.numpy().copy() for g in go]))
            return (go[0] * 0.5,)

        def full(mod, gi, go):
            log.append(("full", [None if g is None else g.numpy().copy() for g in gi],
                        [g.numpy().copy() for g in go]))
            return None if gi[0] is None else (gi[0] * 2,)

        lin.register_full_backward_pre_hook(pre)
        h = lin.register_full_backward_hook(full)
        x = T(np.arange(6, dtype=np.float32).reshape(2, 3), True)
        (lin(x) * 3).sum().backward()
        xg = x.grad.numpy().copy()
        wg = lin.weight.grad.numpy().copy()
        (lin(T(np.ones((2, 3), np.float32), False)) * 3).sum().backward()  # no input grad
        h.remove()
        (lin(x) * 3).sum().backward()  # only the pre-hook is left
        return lin, log, xg, wg

    tlin, tlog, txg, twg = run(torch.nn, lambda a, rg: torch.tensor(a, requires_grad=rg))
    _, plog, pxg, pwg = run(nn, lambda a, rg: pyddp.tensor(a, requires_grad=rg), tlin)
    assert [e[0] for e in plog] == [e[0] for e in tlog] == ["pre", "full", "pre", "full", "pre"]
    for pe, te in zip(plog, tlog):
        for pa, ta in zip(pe[1:], te[1:]):
            assert len(pa) == len(ta)
            for a, b in zip(pa, ta):
                assert (a is None) == (b is None)
                if a is not None:
                    assert_close(a, b, what=pe[0])
    assert_close(pxg, txg, what="input grad through hooks")
    assert_close(pwg, twg, what="weight grad through hooks")


def test_consume_prefix_in_state_dict():
    from pyddp.nn.modules.utils import consume_prefix_in_state_dict_if_present

    class Wrapper(nn.Module):  # what DistributedDataParallel's state_dict looks like
        def __init__(self, module):
            super().__init__()
            self.module = module

    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    sd = Wrapper(net).state_dict()
    assert list(sd)[0] == "module.0.weight"
    consume_prefix_in_state_dict_if_present(sd, "module.")
    assert list(sd) == list(net.state_dict())
    assert sd._metadata == net.state_dict()._metadata
    fresh = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    assert repr(fresh.load_state_dict(sd)) == "<All keys matched successfully>"
