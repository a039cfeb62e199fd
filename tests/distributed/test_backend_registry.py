"""pyddp.distributed's backend registry: parsing of backend strings, per-device dispatch of
collectives, Backend.register_backend (single-process groups on a HashStore)."""
import warnings

from datetime import timedelta

import numpy as np
import pytest

import pyddp.distributed as dist
from pyddp import _C
from pyddp.distributed import distributed_c10d as c10d
from pyddp.distributed.backends import registry as _backend

NCCL_MSG = "backend 'nccl' is not available"
MISSING = "pyddp could not load libnccl (the loader's report)"


class FakeCuda:
    def __init__(self, shape=(4,), typestr="<f4", readonly=False):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (0x7f0000, readonly), "version": 3,
                                         "strides": None}

    def __dlpack_device__(self):
        return (2, 0)


class Recorder:
    """A user backend object: records each request instead of moving bytes."""

    def __init__(self, store, rank, size, timeout):
        self.args = (store, rank, size, timeout)
        self.calls = []
        self.destroyed = False

    def submit(self, kind, dtype, op, root, tag, count, inputs, outputs, in_splits, out_splits,
               timeout, wait_all, name, blocking):
        self.calls.append((kind, dtype, op, count, inputs, outputs, name, blocking))
        return None

    def destroy(self):
        self.destroyed = True


@pytest.fixture
def registry():
    saved = dict(_backend._registry)
    saved_attrs = set(vars(dist.Backend))
    yield
    _backend._registry.clear()
    _backend._registry.update(saved)
    for k in set(vars(dist.Backend)) - saved_attrs:
        delattr(dist.Backend, k)


@pytest.fixture
def no_libnccl(monkeypatch):
    """A machine without libnccl and mpi4py, whatever this one has: the loader raises its report."""
    from pyddp.cuda import _lib

    def missing():
        raise RuntimeError(MISSING)

    monkeypatch.setattr(_lib, "load_nccl", missing)
    # ... and without mpi4py (backend 'mpi' is tested under mpirun in test_backend_mpi.py)
    from pyddp.distributed.backends import mpi as _mpi

    monkeypatch.setattr(_mpi, "available", lambda: False)


@pytest.fixture
def world():
    def init(backend):
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=30))
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def test_registry_entries(no_libnccl):
    cpu = _backend.lookup("cpu")
    assert _backend.lookup("gloo") is cpu and _backend.lookup("GLOO") is cpu
    assert cpu.devices == ("cpu",) and cpu.is_available() and cpu.reason() == ""
    nccl, mpi = _backend.lookup("nccl"), _backend.lookup("mpi")
    assert nccl.devices == ("cuda",) and not nccl.is_available()
    assert NCCL_MSG in nccl.reason() and MISSING in nccl.reason()
    assert not mpi.is_available() and "needs mpi4py" in mpi.reason()
    assert mpi.devices == ("cpu", "cuda")
    assert dist.is_gloo_available() and not dist.is_nccl_available()
    assert not dist.is_mpi_available()


def test_nccl_available_when_libnccl_loads():
    # whatever this machine has: is_nccl_available() is what the loader says, no GPU needed
    from pyddp.cuda import _lib

    try:
        _lib.load_nccl()
        loads, reason = True, ""
    except RuntimeError as e:
        loads, reason = False, str(e)
    assert dist.is_nccl_available() is loads and _backend.lookup("nccl").is_available() is loads
    assert reason in _backend.lookup("nccl").reason()


@pytest.mark.parametrize("gpu", [False, True])
def test_default_backend_adds_nccl_only_with_a_gpu(monkeypatch, gpu):
    from pyddp.cuda import _lib

    monkeypatch.setattr(_lib, "load_nccl", lambda: ("libnccl.so.2", 23203))
    monkeypatch.setattr(_backend, "_has_gpu", lambda: gpu)
    cpu, nccl = _backend.lookup("cpu"), _backend.lookup("nccl")
    assert _backend.parse(None) == ("cpu", {"cpu": cpu, "cuda": nccl} if gpu else {"cpu": cpu})
    assert _backend.parse("nccl") == ("nccl", {"cuda": nccl})


def test_parse(no_libnccl):
    cpu = _backend.lookup("cpu")
    assert _backend.parse(None) == ("cpu", {"cpu": cpu})
    assert _backend.parse("gloo") == ("gloo", {"cpu": cpu})
    assert _backend.parse("CPU") == ("cpu", {"cpu": cpu})
    assert _backend.parse("cpu:gloo") == ("cpu:gloo", {"cpu": cpu})
    name, plan = _backend.parse("cpu:gloo,cuda:nccl")
    assert name == "cpu:gloo,cuda:nccl" and plan["cpu"] is cpu
    assert type(plan["cuda"]) is _backend.Unavailable and plan["cuda"].entry.name == "nccl"
    with pytest.raises(RuntimeError, match=NCCL_MSG):
        _backend.parse("nccl")
    with pytest.raises(RuntimeError, match=NCCL_MSG):
        _backend.parse("cuda:nccl")
    with pytest.raises(RuntimeError, match="'mpi' needs mpi4py, which is not installed"):
        _backend.parse("mpi")
    with pytest.raises(ValueError, match="Invalid backend 'nope' pyddp's backends: 'cpu' "
                       r"\(alias 'gloo'\) for CPU arrays; 'nccl' for CUDA arrays, needs libnccl"):
        _backend.parse("nope")
    # a typo: the nearest name, and what each backend needs
    with pytest.raises(ValueError, match=r"Invalid backend 'ncll'; did you mean 'nccl'\?.*'mpi' for "
                       r"CPU and CUDA arrays, needs mpi4py.*\(not available here\)"):
        _backend.parse("ncll")
    with pytest.raises(ValueError, match="does not serve device 'cpu'"):
        _backend.parse("cpu:nccl")
    with pytest.raises(ValueError, match="does not serve device 'cuda'"):
        _backend.parse("cpu:gloo,cuda:gloo")
    with pytest.raises(ValueError, match="Duplicate device type 'cpu'"):
        _backend.parse("cpu:gloo,cpu:gloo")
    with pytest.raises(ValueError, match="Invalid device:backend pairing"):
        _backend.parse("cpu:gloo:x")
    with pytest.raises(TypeError, match="backend must be a string"):
        _backend.parse(3)


def test_init_errors_as_before(world, no_libnccl):
    for b, exc, msg in (("nccl", RuntimeError, NCCL_MSG), ("mpi", RuntimeError, "mpi"),
                        ("no-such-backend", ValueError, "no-such-backend")):
        with pytest.raises(exc, match=msg):
            world(b)
        assert not dist.is_initialized()


@pytest.mark.parametrize("backend,name", [(None, "cpu"), ("cpu", "cpu"), ("gloo", "gloo"),
                                          ("GLOO", "gloo")])
def test_cpu_only_group(world, no_libnccl, backend, name):
    world(backend)
    pg = c10d._default_pg()
    assert dist.get_backend() == name and set(pg._backends) == {"cpu"}
    # device arrays go to _device_array: CUDA arrays are staged where CUDA works
    assert pg._route is None and pg._on_device == pg._device_array and pg._fast is not None
    assert isinstance(pg._cpg, _C.ProcessGroup)
    a = np.arange(3.0)
    dist.all_reduce(a)
    dist.all_reduce(a, group=pg, async_op=True).wait()
    with pytest.raises(ValueError, match=r"tensor is on device cuda:0; the 'cpu' backend takes "
                                         r"CPU tensors \(CUDA tensors need the nccl backend, or CUDA working here"):
        dist.all_reduce(FakeCuda())
    with pytest.raises(ValueError, match="tensor_list\\[0\\] is on device cuda:0"):
        dist.all_gather([FakeCuda()], np.zeros(4, np.float32))


def test_cpu_gloo_cuda_nccl(world, no_libnccl):
    world("cpu:gloo,cuda:nccl")
    assert dist.get_backend() == "cpu:gloo,cuda:nccl"
    pg = c10d._default_pg()
    assert pg._fast is not None and isinstance(pg._cpg, _C.ProcessGroup)
    a = np.arange(4.0)
    dist.all_reduce(a)
    dist.all_reduce(a, group=pg)
    dist.broadcast(a, 0, group=pg)
    dist.barrier(group=pg)
    assert np.array_equal(a, np.arange(4.0))
    with pytest.raises(RuntimeError,
                       match=f"tensor is on device cuda:0: {NCCL_MSG}"):
        dist.all_reduce(FakeCuda())
    with pytest.raises(RuntimeError, match=NCCL_MSG):
        dist.broadcast(FakeCuda(), 0)
    g = dist.new_group()
    assert dist.get_backend(g) == "cpu:gloo,cuda:nccl"
    dist.all_reduce(a, group=g)
    with pytest.raises(RuntimeError, match=NCCL_MSG):
        dist.all_reduce(FakeCuda(), group=g)
    g2 = dist.new_group(backend="gloo")
    assert dist.get_backend(g2) == "gloo" and g2._route is None


def test_register_backend_device_dispatch(registry, world):
    made = []

    def create(store, rank, size, timeout):
        made.append(Recorder(store, rank, size, timeout))
        return made[-1]
    dist.Backend.register_backend("fakegpu", create, devices=["cuda"])
    assert dist.Backend.FAKEGPU == "fakegpu"
    world("cpu:gloo,cuda:fakegpu")
    assert dist.get_backend() == "cpu:gloo,cuda:fakegpu"
    (rec,) = made
    assert rec.args[1:3] == (0, 1) and rec.args[3].total_seconds() > 0
    a = np.arange(4.0)
    dist.all_reduce(a)  # CPU arrays: the C group
    assert rec.calls == []
    x = FakeCuda()
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    kind, dtype, op, count, ins, outs, name, blocking = rec.calls[-1]
    assert (kind, dtype, op, count, name, blocking) == (_C.K_ALLREDUCE, 11, 4, 4, "all_reduce",
                                                        True)
    assert ins == () and outs[0].owner is x and outs[0].device == "cuda"
    dist.all_gather_into_tensor(FakeCuda(shape=(4,)), FakeCuda(shape=(4,)))
    assert rec.calls[-1][0] == _C.K_ALLGATHER
    with pytest.raises(ValueError, match="all arrays of one call must be on one device"):
        dist.all_gather_into_tensor(np.zeros(4, np.float32), FakeCuda())
    with pytest.raises(ValueError, match="tensor is read-only"):
        dist.all_reduce(FakeCuda(readonly=True))
    with pytest.raises(TypeError, match="unsupported dtype"):
        dist.all_reduce(FakeCuda(typestr="|V3"))
    dist.destroy_process_group()
    assert rec.destroyed


def test_register_backend_cpu_only_user_backend(registry, world):
    with pytest.warns(UserWarning, match="Device capability of loop unspecified"):
        dist.Backend.register_backend("loop", lambda *a: Recorder(*a))
    assert _backend.lookup("loop").devices == ("cpu", "cuda")
    calls = []

    def extended(opts, pg_options):
        calls.append((opts.group_rank, opts.group_size, opts.global_ranks_in_group, pg_options))
        return Recorder(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist.Backend.register_backend("loopx", extended, extended_api=True, devices="cpu")
    world("loopx")
    assert calls == [(0, 1, [0], None)]
    pg = c10d._default_pg()
    rec = pg._cpg
    assert isinstance(rec, Recorder) and pg._fast is None
    a = np.arange(3.0)
    dist.all_reduce(a)
    dist.barrier()
    assert [c[6] for c in rec.calls] == ["all_reduce", "barrier"]
    with pytest.raises(ValueError, match=r"tensor is on device cuda:0; the 'cpu' backend"):
        dist.all_reduce(FakeCuda())
    with pytest.raises(dist.DistError, match="_shared_array"):
        c10d._shared_array(4)


def test_no_backend_for_device(registry, world):
    dist.Backend.register_backend("gpuonly", lambda *a: Recorder(*a), devices=["cuda"])
    world("cuda:gpuonly")
    with pytest.raises(ValueError, match=r"the arrays are on device cpu: no backend of group "
                                         r"'default_pg' serves it \(its backends: cuda:gpuonly\)"):
        dist.all_reduce(np.zeros(3))
    dist.all_reduce(FakeCuda())


def test_factory_must_return_backend(registry, world):
    dist.Backend.register_backend("bad", lambda *a: object(), devices=["cpu"])
    with pytest.raises(TypeError, match="has no submit"):
        world("bad")
    assert not dist.is_initialized()
