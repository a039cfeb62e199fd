"""pyddp.save / pyddp.load: round trips of checkpoints, the weights-only loader's refusals."""
import argparse
import io
import os
import pickle
from collections import OrderedDict

import numpy as np
import pytest

import pyddp
import pyddp.nn as nn
from pyddp import serialization

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None


def _roundtrip(obj, **kw):
    buf = io.BytesIO()
    pyddp.save(obj, buf)
    buf.seek(0)
    return pyddp.load(buf, **kw)


def _arrays():
    rng = np.random.default_rng(0)
    out = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "f64_0d": np.array(3.25),
        "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "u8": np.arange(7, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "c64": (rng.standard_normal(3) + 1j).astype(np.complex64),
        "empty": np.zeros((0, 4), np.float32),
        "strided": np.arange(20.0).reshape(4, 5)[::2, 1::2],
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "big_endian": np.arange(4, dtype=">i4"),
    }
    if ml_dtypes is not None:
        out["bf16"] = rng.standard_normal(4).astype(ml_dtypes.bfloat16)
    return out


def test_arrays_roundtrip_exactly():
    arrs = _arrays()
    back = _roundtrip(arrs)
    assert list(back) == list(arrs)
    for k, a in arrs.items():
        b = back[k]
        assert type(b) is np.ndarray, k
        assert b.shape == a.shape and b.dtype == a.dtype.newbyteorder("="), k
        np.testing.assert_array_equal(b.view(np.uint8) if k == "bf16" else b,
                                      a.view(np.uint8) if k == "bf16" else a)
        assert b.flags.writeable and b.flags.c_contiguous, k
        assert b.dtype.isnative


def test_checkpoint_of_model_and_optimizer_state(tmp_path):
    pyddp.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    model(pyddp.randn(5, 4))  # move the running statistics
    opt_state = {
        "state": {0: {"step": 3, "exp_avg": np.ones((3, 4), np.float32),
                      "exp_avg_sq": pyddp.zeros(3, 4)},
                  1: {"step": np.int64(3), "momentum_buffer": None}},
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "weight_decay": 0.0,
                          "nesterov": False, "params": [0, 1], "name": "default"}],
    }
    ckpt = {"model": model.state_dict(), "optimizer": opt_state, "epoch": 7, "best": 0.125,
            "tags": {"a", "b"}, "note": "x" * 3, "blob": b"\x00\x01", "cplx": 1 + 2j}
    path = tmp_path / "ckpt.pt"
    pyddp.save(ckpt, path)
    back = pyddp.load(path)
    assert back["epoch"] == 7 and back["best"] == 0.125 and back["tags"] == {"a", "b"}
    assert back["blob"] == b"\x00\x01" and back["cplx"] == 1 + 2j
    sd = back["model"]
    assert isinstance(sd, OrderedDict) and list(sd) == list(model.state_dict())
    assert sd._metadata == model.state_dict()._metadata
    assert all(isinstance(v, pyddp.Tensor) for v in sd.values())
    assert sd["1.num_batches_tracked"].dtype == np.int64
    o = back["optimizer"]
    assert o["state"][0]["step"] == 3 and isinstance(o["state"][1]["step"], np.int64)
    assert isinstance(o["state"][0]["exp_avg_sq"], pyddp.Tensor)
    assert o["param_groups"][0]["betas"] == (0.9, 0.999)
    model2 = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    assert repr(model2.load_state_dict(sd)) == "<All keys matched successfully>"
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    # a path given as str works too, and the file is a plain pickle stream (no zip)
    pyddp.save(ckpt["model"], str(path))
    assert list(pyddp.load(str(path))) == list(sd)
    assert open(path, "rb").read(2) == b"\x80\x05"


def test_tensor_and_parameter_types_and_sharing():
    p = nn.Parameter(pyddp.randn(3))
    frozen = nn.Parameter(pyddp.randn(2), requires_grad=False)
    t = pyddp.randn(2, requires_grad=True)
    a = np.arange(4.0)
    back = _roundtrip({"p": p, "frozen": frozen, "t": t, "plain": pyddp.ones(1), "a": a,
                       "a_again": a, "view": p.data})
    assert type(back["p"]) is nn.Parameter and back["p"].requires_grad
    assert type(back["frozen"]) is nn.Parameter and not back["frozen"].requires_grad
    assert type(back["t"]) is pyddp.Tensor and back["t"].requires_grad and back["t"].is_leaf
    assert not back["plain"].requires_grad
    assert back["a"] is back["a_again"]  # one array referenced twice stays one array
    assert back["view"].numpy() is back["p"].numpy()  # a Tensor sharing p's array still shares it
    np.testing.assert_array_equal(back["p"].numpy(), p.numpy())


def test_old_pickle_protocols():
    buf = io.BytesIO()
    pyddp.save({"w": np.arange(5.0), "t": pyddp.ones(2)}, buf, pickle_protocol=2)
    buf.seek(0)
    back = pyddp.load(buf)
    np.testing.assert_array_equal(back["w"], np.arange(5.0))
    assert back["w"].flags.writeable
    with pytest.raises(ValueError, match="pickle_protocol"):
        pyddp.save({}, io.BytesIO(), pickle_protocol=1)


_side_effects = []


def _evil(arg):
    _side_effects.append(arg)
    return arg


class _Evil:
    def __reduce__(self):
        return (_evil, ("ran",))


def test_weights_only_refuses_code():
    buf = io.BytesIO()
    pyddp.save({"ok": np.ones(2), "evil": _Evil()}, buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError) as ei:
        pyddp.load(buf)
    msg = str(ei.value)
    assert "Weights only load failed" in msg and "test_serialization._evil" in msg
    assert "weights_only" in msg and "add_safe_globals" in msg
    assert _side_effects == []
    buf.seek(0)
    assert pyddp.load(buf, weights_only=False)["evil"] == "ran"
    assert _side_effects == ["ran"]
    # a raw pickle of os.system is refused before it is looked up
    raw = b"\x80\x04\x95\x1d\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93" \
          b"\x8c\x04true\x94\x85\x94R\x94."
    with pytest.raises(pickle.UnpicklingError, match="posix.system"):
        pyddp.load(io.BytesIO(raw))
    # modules and object arrays are not weights
    buf = io.BytesIO()
    pyddp.save(nn.Linear(2, 2), buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
        pyddp.load(buf)
    buf.seek(0)
    assert isinstance(pyddp.load(buf, weights_only=False), nn.Linear)
    buf = io.BytesIO()
    pyddp.save({"o": np.array([object()], dtype=object)}, buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
        pyddp.load(buf)


def test_weights_only_rejects_malformed_array_records():
    good = serialization._rebuild_array("<f4", (2,), bytearray(8))
    assert good.shape == (2,)
    with pytest.raises(pickle.UnpicklingError, match="expected 12"):
        serialization._rebuild_array("<f4", (3,), bytearray(8))
    with pytest.raises(pickle.UnpicklingError, match="bad dtype"):
        serialization._rebuild_array("O", (1,), bytearray(8))
    with pytest.raises(pickle.UnpicklingError, match="bad dtype"):
        serialization._rebuild_array("[('a', 'O')]", (1,), bytearray(8))
    with pytest.raises(pickle.UnpicklingError, match="bad array shape"):
        serialization._rebuild_array("<f4", (-1,), bytearray(8))
    with pytest.raises(pickle.UnpicklingError, match="bad tensor kind"):
        serialization._rebuild_tensor("Module", np.zeros(1), False)


def test_safe_globals():
    ns = argparse.Namespace(lr=0.1, epochs=3)
    buf = io.BytesIO()
    pyddp.save({"args": ns}, buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="argparse.Namespace"):
        pyddp.load(buf)
    with serialization.safe_globals([argparse.Namespace]):
        buf.seek(0)
        assert pyddp.load(buf)["args"] == ns
    assert argparse.Namespace not in serialization.get_safe_globals()
    serialization.add_safe_globals([argparse.Namespace])
    try:
        buf.seek(0)
        assert pyddp.load(buf)["args"].lr == 0.1
    finally:
        serialization.clear_safe_globals()
    assert serialization.get_safe_globals() == []


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="path or a writable"):
        pyddp.save({}, 3)
    with pytest.raises(TypeError, match="path or a readable"):
        pyddp.load(3)
    with pytest.raises(FileNotFoundError):
        pyddp.load(tmp_path / "missing.pt")
    with pytest.raises(Exception):
        pyddp.load(io.BytesIO(b"not a pickle"))


def test_load_torch_checkpoint_vs_torch(tmp_path):
    """Files written by torch.save load without torch's help: tensors, parameters, views, dtypes."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    base = torch.arange(12.0).reshape(3, 4)
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 2,
            "param": model[0].weight, "base": base, "t": base.t(), "row": base[1],
            "bf16": torch.ones(3, dtype=torch.bfloat16) / 3, "f16": torch.ones(2).half(),
            "i32": torch.arange(3, dtype=torch.int32), "dtype": torch.float16,
            "size": base.shape, "empty": torch.zeros(0, 3)}
    path = tmp_path / "torch.pt"
    torch.save(ckpt, path)
    back = pyddp.load(path)
    assert back["epoch"] == 2 and back["dtype"] == np.float16 and back["size"] == (3, 4)
    for key in ("base", "t", "row", "f16", "i32", "empty"):
        assert isinstance(back[key], pyddp.Tensor)
        np.testing.assert_array_equal(back[key].numpy(), ckpt[key].numpy(), err_msg=key)
        assert back[key].dtype == ckpt[key].numpy().dtype
    np.testing.assert_array_equal(back["bf16"].numpy().astype(np.float32),
                                  ckpt["bf16"].float().numpy())
    # views of one storage share memory, as they did in torch
    assert np.shares_memory(back["t"].numpy(), back["base"].numpy())
    assert isinstance(back["param"], nn.Parameter) and back["param"].requires_grad
    sd = back["model"]
    assert list(sd) == list(ckpt["model"]) and sd._metadata == ckpt["model"]._metadata
    pmodel = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    pmodel.load_state_dict(sd)
    for k, v in pmodel.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), ckpt["model"][k].numpy(), err_msg=k)
    st = back["optimizer"]["state"][0]
    np.testing.assert_array_equal(st["exp_avg"].numpy(),
                                  ckpt["optimizer"]["state"][0]["exp_avg"].numpy())
    assert back["optimizer"]["param_groups"][0]["lr"] == 0.01
    # a torch checkpoint holding arbitrary objects is refused in weights-only mode
    torch.save({"args": argparse.Namespace(a=1)}, path)
    with pytest.raises(pickle.UnpicklingError, match="argparse.Namespace"):
        pyddp.load(path)
    assert pyddp.load(path, weights_only=False)["args"].a == 1
    assert os.path.getsize(path) > 0


def test_save_for_torch_loads_in_torch(tmp_path):
    """save_for_torch writes torch's zip format: torch.load (weights_only, mmap) reads it."""
    torch = pytest.importorskip("torch")
    import zipfile
    pyddp.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    model(pyddp.randn(6, 3))
    base = np.arange(12.0).reshape(3, 4)
    obj = {"model": model.state_dict(), "param": model[0].weight, "base": base, "again": base,
           "t": base.T, "step": np.int64(5), "lr": 0.1, "dtype": pyddp.float16,
           "i32": np.arange(3, dtype=np.int32), "empty": np.zeros((0, 3), np.float32),
           "grad": pyddp.ones(2, requires_grad=True), "names": ["a", ("b", 1)]}
    if ml_dtypes is not None:
        obj["bf16"] = np.arange(4).astype(ml_dtypes.bfloat16)
    path = tmp_path / "for_torch.pt"
    serialization.save_for_torch(obj, path)
    for mmap in (False, True):
        back = torch.load(path, mmap=mmap)  # weights_only=True: torch's default
        assert back["step"] == 5 and type(back["step"]) is int and back["lr"] == 0.1
        assert back["dtype"] == torch.float16 and back["names"] == ["a", ("b", 1)]
        for key in ("base", "t", "i32", "empty"):
            assert isinstance(back[key], torch.Tensor)
            np.testing.assert_array_equal(back[key].numpy(), np.asarray(obj[key]), err_msg=key)
        assert back["base"].data_ptr() == back["again"].data_ptr()  # one array, one storage
        assert isinstance(back["param"], torch.nn.Parameter) and back["param"].requires_grad
        assert back["grad"].requires_grad and not isinstance(back["grad"], torch.nn.Parameter)
        if ml_dtypes is not None:
            assert back["bf16"].dtype == torch.bfloat16
            np.testing.assert_array_equal(back["bf16"].float().numpy(), np.arange(4.0))
        sd = back["model"]
        assert list(sd) == list(obj["model"]) and sd._metadata == obj["model"]._metadata
        tmodel = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        assert str(tmodel.load_state_dict(sd)) == "<All keys matched successfully>"
        for k, v in tmodel.state_dict().items():
            np.testing.assert_array_equal(v.numpy(), obj["model"][k].numpy(), err_msg=k)
    # storages start on 64-byte boundaries, as torch's own writer puts them
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if "/data/" in info.filename:
                start = info.header_offset + 30 + len(info.filename) + len(info.extra)
                assert start % 64 == 0, info.filename
    # and pyddp.load reads it back (arrays come back as Tensors: the torch format has no arrays)
    mine = pyddp.load(path)
    assert isinstance(mine["param"], nn.Parameter)
    np.testing.assert_array_equal(mine["t"].numpy(), base.T)
    with pytest.raises(pickle.PicklingError, match="no storage type"):
        serialization.save_for_torch({"u": np.zeros(2, np.uint32)}, io.BytesIO())
