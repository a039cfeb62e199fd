"""DataLoader batches are pyddp Tensors made by torch 2.13.0's collate rules, with and without
workers; a user's collate_fn is honoured; batches move with ``.to(device)`` on a CPU device; and
pyddp.nn modules given a NumPy array compute or raise torch's TypeError (never AttributeError)."""
import collections

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
from pyddp.utils.data import DataLoader, Dataset, default_collate, default_convert

Pair = collections.namedtuple("Pair", "img label")


class _Mixed(Dataset):
    """Samples mixing every kind default_collate handles (importable: spawn-safe)."""

    def __len__(self):
        return 11

    def __getitem__(self, i):
        return {
            "x": np.full((2, 3), i, np.float32),
            "pair": Pair(np.arange(4, dtype=np.int16) + i, i),
            "t": (float(i) / 2, bool(i % 2), np.float16(i), np.int8(-i)),
            "name": f"s{i}",
            "raw": [np.uint8(i), np.array(i * 1.5)],
        }


def _plain(v, torch=None):
    """A comparable form: Tensors (pyddp or torch) -> (dtype name, values); containers recursed."""
    if isinstance(v, pyddp.Tensor) or (torch is not None and isinstance(v, torch.Tensor)):
        name = str(v.dtype).replace("torch.", "")
        return ("T", name, tuple(v.shape), np.asarray(v).tolist())
    if isinstance(v, dict):
        return (type(v).__name__, {k: _plain(x, torch) for k, x in v.items()})
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return (type(v).__name__, [_plain(x, torch) for x in v])
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_plain(x, torch) for x in v])
    return v


def _tensors_only(v):
    if isinstance(v, dict):
        return all(_tensors_only(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return all(_tensors_only(x) for x in v)
    return isinstance(v, (pyddp.Tensor, str))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_tensors_as_torch(num_workers):
    torch = pytest.importorskip("torch")
    kw = dict(batch_size=4, num_workers=num_workers)
    if num_workers:
        kw["timeout"] = 120
    got = list(DataLoader(_Mixed(), **kw))
    ref = list(torch.utils.data.DataLoader(_Mixed(), **kw))
    assert len(got) == len(ref) == 3
    for g, r in zip(got, ref):
        assert _tensors_only(g)
        assert _plain(g) == _plain(r, torch)
    # int -> int64, float -> float64, bool -> bool, NumPy scalars keep their dtype
    t = got[0]["t"]
    assert [x.dtype for x in t] == [np.float64, np.bool_, np.float16, np.int8]
    assert got[0]["pair"].label.dtype == np.int64 and isinstance(got[0]["pair"], Pair)
    # no batching: default_convert, as torch's
    one = list(DataLoader(_Mixed(), batch_size=None, num_workers=num_workers,
                          **({"timeout": 120} if num_workers else {})))
    tone = list(torch.utils.data.DataLoader(_Mixed(), batch_size=None))
    assert [_plain(x) for x in one] == [_plain(x, torch) for x in tone]


def _keep_lists(samples):
    return ("mine", len(samples), [s["name"] for s in samples])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_user_collate_fn_is_honoured(num_workers):
    kw = {"timeout": 120} if num_workers else {}
    got = list(DataLoader(_Mixed(), batch_size=5, collate_fn=_keep_lists,
                          num_workers=num_workers, **kw))
    assert got == [("mine", 5, [f"s{i}" for i in range(5)]),
                   ("mine", 5, [f"s{i}" for i in range(5, 10)]), ("mine", 1, ["s10"])]
    # no batching with a collate_fn: it gets each sample
    got = list(DataLoader(_Mixed(), batch_size=None, collate_fn=lambda s: s["name"]))
    assert got == [f"s{i}" for i in range(11)]


def test_batches_move_to_a_cpu_device_and_train():
    torch = pytest.importorskip("torch")
    pyddp.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((12, 5)).astype(np.float32)
    y = np.arange(12) % 3
    model = nn.Linear(5, 3)
    loss_fn = nn.CrossEntropyLoss()
    for device in ("cpu", pyddp.device("cpu"), torch.device("cpu")):
        for inputs, labels in DataLoader(pyddp.utils.data.TensorDataset(x, y), batch_size=4):
            moved, mlabels = inputs.to(device), labels.to(device)
            assert moved is inputs and mlabels is labels
            assert inputs.dtype == np.float32 and labels.dtype == np.int64
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            assert model.weight.grad is not None
    # and not to CUDA: what torch's CPU build raises
    with pytest.raises(AssertionError, match="CUDA"):
        inputs.to("cuda")


def test_default_collate_and_convert_importable_like_torch():
    from pyddp.utils.data._utils.collate import collate, default_collate_fn_map
    from pyddp.utils.data._utils import collate as cmod
    assert cmod.default_collate is default_collate and cmod.default_convert is default_convert
    # extend the map as torch's documentation does
    class Box:
        def __init__(self, v):
            self.v = v

    fmap = dict(default_collate_fn_map)
    fmap[Box] = lambda batch, *, collate_fn_map: sum(b.v for b in batch)
    assert collate([{"b": Box(2), "x": 1}, {"b": Box(3), "x": 2}], collate_fn_map=fmap)["b"] == 5
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        default_collate([Box(1)])
    # pyddp Tensors in samples are stacked
    out = default_collate([pyddp.ones(2), pyddp.zeros(2)])
    assert isinstance(out, pyddp.Tensor) and out.shape == (2, 2)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        default_collate([pyddp.ones(2), pyddp.zeros(3)])


def test_torch_tensors_stay_torch():
    torch = pytest.importorskip("torch")
    out = default_collate([(torch.ones(2), 1), (torch.zeros(2), 2)])
    assert isinstance(out[0], torch.Tensor) and out[0].shape == (2, 2)
    assert isinstance(out[1], pyddp.Tensor)


X2 = np.random.default_rng(1).random((4, 8), dtype=np.float32)
X4 = np.random.default_rng(2).random((2, 3, 6, 6), dtype=np.float32)
MODULES = [
    (lambda: nn.Linear(8, 2), X2), (lambda: nn.Conv2d(3, 2, 3), X4),
    (lambda: nn.MaxPool2d(2), X4), (lambda: nn.AvgPool2d(2), X4),
    (lambda: nn.AdaptiveAvgPool2d(1), X4), (lambda: nn.BatchNorm1d(8), X2),
    (lambda: nn.BatchNorm2d(3), X4), (lambda: nn.SyncBatchNorm(3), X4), (lambda: nn.LayerNorm(8), X2),
    (lambda: nn.Dropout(0.0), X2), (lambda: nn.ReLU(), X2), (lambda: nn.GELU(), X2),
    (lambda: nn.Tanh(), X2), (lambda: nn.Sigmoid(), X2), (lambda: nn.Softmax(1), X2),
    (lambda: nn.LogSoftmax(1), X2), (lambda: nn.Flatten(), X4), (lambda: nn.Identity(), X2),
    (lambda: nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)), X2),
    (lambda: nn.Embedding(10, 3), np.array([[1, 2], [3, 9]])),
]


@pytest.mark.parametrize("make,x", MODULES)
def test_nn_modules_given_numpy(make, x):
    pyddp.manual_seed(3)
    m = make()
    want = m(pyddp.from_numpy(x))
    try:
        got = m(x)
    except TypeError as e:
        assert "must be Tensor" in str(e) and "numpy.ndarray" in str(e)
        return
    assert np.allclose(np.asarray(got), want.detach().numpy())


@pytest.mark.parametrize("loss,args", [
    (nn.CrossEntropyLoss, (X2, np.array([1, 0, 3, 2]))), (nn.MSELoss, (X2, X2 * 2)),
    (nn.L1Loss, (X2, X2 * 2)), (nn.BCEWithLogitsLoss, (X2, (X2 > 0.5).astype(np.float32))),
    (nn.NLLLoss, (X2, np.array([1, 0, 3, 2]))),
])
def test_losses_given_numpy(loss, args):
    want = loss()(*(pyddp.from_numpy(a) for a in args))
    try:
        got = loss()(*args)
    except TypeError as e:
        assert "Tensor" in str(e)
        return
    assert np.allclose(float(got), float(want))
