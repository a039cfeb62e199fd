"""pyddp.utils.data.DataLoader, datasets and default_collate.

References: batches built by hand with NumPy slicing; num_workers=0 for the
worker runs; torch 2.13.0 (when installed) for the shuffled order, worker
seeding, argument errors and collate semantics.  Every worker test checks
that no worker process is left behind.
"""
import collections
import multiprocessing
import os
import time

import numpy as np
import pytest

from _tiers import FULL

import pyddp
from pyddp.utils.data import (ConcatDataset, DataLoader, Dataset,
                              DistributedSampler, IterableDataset, Subset,
                              TensorDataset, default_collate, get_worker_info)

X = np.arange(60, dtype=np.float32).reshape(20, 3)
Y = np.arange(20, dtype=np.int64) * 10


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _assert_gone(pids, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return
        time.sleep(0.05)
    raise AssertionError(f"worker processes still alive: "
                         f"{[p for p in pids if _alive(p)]}")


def _pids(it):
    return [w.pid for w in it._workers]


def _batches(loader):
    return [tuple(np.asarray(a) for a in b) for b in loader]


def _eq(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y)
        for u, v in zip(x, y):
            assert u.dtype == v.dtype and u.shape == v.shape
            assert np.array_equal(u, v)


# ------------------------------------------------------------ batches

@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (4, False),
                                                  (6, False), (6, True),
                                                  (20, True), (32, False)])
def test_batches_equal_hand_built(batch_size, drop_last):
    dl = DataLoader(TensorDataset(X, Y), batch_size=batch_size,
                    drop_last=drop_last)
    ref = []
    for s in range(0, 20, batch_size):
        if drop_last and s + batch_size > 20:
            break
        ref.append((X[s:s + batch_size], Y[s:s + batch_size]))
    _eq(_batches(dl), ref)
    assert len(dl) == len(ref)


def test_sampler_and_no_batching():
    s = DistributedSampler(range(20), num_replicas=3, rank=2, seed=4)
    dl = DataLoader(TensorDataset(X, Y), batch_size=5, sampler=s)
    idx = s.indices()
    ref = [(X[idx[i:i + 5]], Y[idx[i:i + 5]]) for i in range(0, len(idx), 5)]
    _eq(_batches(dl), ref)
    single = list(DataLoader(TensorDataset(X, Y), batch_size=None))
    assert len(single) == 20
    assert np.array_equal(single[3][0], X[3]) and single[3][1] == Y[3]


def test_shuffle_order_matches_torch():
    torch = pytest.importorskip("torch")
    tds = torch.utils.data.TensorDataset(torch.from_numpy(X),
                                         torch.from_numpy(Y))
    for seed in (0, 17):
        pg = pyddp.Generator().manual_seed(seed)
        tg = torch.Generator()
        tg.manual_seed(seed)
        pdl = DataLoader(TensorDataset(X, Y), batch_size=3, shuffle=True,
                         generator=pg)
        tdl = torch.utils.data.DataLoader(tds, batch_size=3, shuffle=True,
                                          generator=tg)
        for _ in range(2):  # epochs continue the generator's stream
            got = _batches(pdl)
            ref = [tuple(t.numpy() for t in b) for b in tdl]
            _eq(got, ref)


def test_collate_matches_torch_semantics():
    torch = pytest.importorskip("torch")
    from torch.utils.data import default_collate as tcollate
    Point = collections.namedtuple("Point", "x y")
    samples = [
        [1, 2, 3], [1.5, 2.5], [True, False], ["a", "b"],
        [np.float32(1), np.float32(2)], [np.arange(3), np.arange(3) + 1],
        [{"a": 1, "b": np.ones(2)}, {"a": 2, "b": np.zeros(2)}],
        [Point(1, 2.0), Point(3, 4.0)], [(1, "x"), (2, "y")],
        [[np.int16(1), 2.0], [np.int16(3), 4.0]],
        [np.str_("p"), np.str_("q")], [np.arange(4.0).reshape(2, 2)] * 3,
        [1, 2.5], [True, 2], [np.float16(1), np.float16(2)], [np.bool_(True)] * 2,
        [np.array(1.5), np.array(2.5)], [np.arange(3, dtype=np.uint16)] * 2,
        [np.complex64(1j)] * 2, [b"x", b"y"], [{"k": (1, [2.0, np.int8(3)])}] * 2,
        [collections.OrderedDict(a=np.float32(1), b="s")] * 2,
    ]

    def to_np(v):
        if isinstance(v, torch.Tensor):
            return v.numpy()
        if isinstance(v, dict):
            return type(v)((k, to_np(x)) for k, x in v.items())
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return type(v)(*(to_np(x) for x in v))
        if isinstance(v, (list, tuple)):
            return type(v)(to_np(x) for x in v)
        return v

    def same(a, b):
        if isinstance(b, np.ndarray):   # a torch tensor's values: a pyddp Tensor of that dtype
            assert isinstance(a, pyddp.Tensor), type(a)
            assert a.dtype == b.dtype and np.array_equal(a.numpy(), b)
        elif isinstance(b, dict):
            assert type(a) is type(b) and a.keys() == b.keys()
            for k in b:
                same(a[k], b[k])
        elif isinstance(b, (list, tuple)):
            assert type(a) is type(b) and len(a) == len(b)
            for x, y in zip(a, b):
                same(x, y)
        else:
            assert a == b

    for batch in samples:
        same(default_collate(batch), to_np(tcollate(batch)))
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([np.arange(3), np.arange(4)])
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [1, 2, 3]])
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        default_collate([object(), object()])
    for bad in ([np.array(["a"]), np.array(["b"])],
                [np.array([None]), np.array([None])], [None, None], [1j, 2j],
                [np.datetime64(1, "s")] * 2):
        with pytest.raises(TypeError) as pe:
            default_collate(bad)
        with pytest.raises(TypeError) as te:
            tcollate(bad)
        assert str(pe.value) == str(te.value)


# ------------------------------------------------------------- workers

class _Squares(Dataset):
    """Importable (spawn-safe) dataset: dicts of arrays and numbers."""

    def __len__(self):
        return 23

    def __getitem__(self, i):
        return {"x": np.full(2, i, np.float64), "sq": i * i, "tag": f"s{i}"}


def _same_dict_batches(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.keys() == v.keys()
        assert np.array_equal(u["x"], v["x"]) and np.array_equal(u["sq"],
                                                                v["sq"])
        assert u["tag"] == v["tag"]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("num_workers,prefetch", [(1, 1), (2, 2), (3, 1)])
def test_workers_equal_no_workers(num_workers, prefetch):
    ref = list(DataLoader(_Squares(), batch_size=4, shuffle=True,
                          generator=pyddp.Generator().manual_seed(8)))
    dl = DataLoader(_Squares(), batch_size=4, shuffle=True,
                    generator=pyddp.Generator().manual_seed(8),
                    num_workers=num_workers, prefetch_factor=prefetch,
                    timeout=60)
    it = iter(dl)
    pids = _pids(it)
    got = list(it)
    _same_dict_batches(got, ref)
    _assert_gone(pids)  # exhausted: workers stopped


def test_out_of_order_yields_every_batch():
    ref = list(DataLoader(_Squares(), batch_size=3))
    it = iter(DataLoader(_Squares(), batch_size=3, num_workers=2,
                         in_order=False, timeout=60))
    pids = _pids(it)
    got = sorted(it, key=lambda b: int(b["sq"][0]))
    _same_dict_batches(got, ref)
    _assert_gone(pids)


def test_spawn_context_importable_dataset():
    ref = list(DataLoader(_Squares(), batch_size=5))
    dl = DataLoader(_Squares(), batch_size=5, num_workers=2,
                    multiprocessing_context="spawn", timeout=120)
    it = iter(dl)
    pids = _pids(it)
    _same_dict_batches(list(it), ref)
    _assert_gone(pids)


def test_persistent_workers_two_epochs():
    dl = DataLoader(_Squares(), batch_size=3, num_workers=2,
                    persistent_workers=True, shuffle=True,
                    generator=pyddp.Generator().manual_seed(2), timeout=60)
    ref_dl = DataLoader(_Squares(), batch_size=3, shuffle=True,
                        generator=pyddp.Generator().manual_seed(2))
    ref_it = iter(ref_dl)  # one base-seed draw, like the persistent loader
    ref1 = list(ref_it)
    ref2 = [b for b in ref_it]  # exhausted iterator yields nothing
    assert ref2 == []
    e1 = list(dl)
    it = dl._iterator
    pids = _pids(it)
    assert all(_alive(p) for p in pids)  # persistent: still there
    e2 = list(dl)
    assert dl._iterator is it
    _same_dict_batches(e1, ref1)
    # the second epoch reshuffles from the same generator stream
    assert sorted(int(i) for b in e2 for i in b["sq"]) == \
        sorted(i * i for i in range(23))
    del dl, it
    import gc
    gc.collect()
    _assert_gone(pids)


class _Fails(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 7:
            raise ValueError(f"bad sample {i}")
        if i == 9:
            raise KeyError("missing")
        return np.array([i])


def _where_it_failed():
    return "raise ValueError"


def test_worker_exception_reraised_with_traceback():
    dl = DataLoader(_Fails(), batch_size=2, num_workers=2, timeout=60)
    it = iter(dl)
    pids = _pids(it)
    got = [next(it) for _ in range(3)]
    assert [b.ravel().tolist() for b in got] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError) as ei:
        next(it)
    msg = str(ei.value)
    assert "Caught ValueError in DataLoader worker process 1" in msg
    assert "Traceback (most recent call last)" in msg
    assert "__getitem__" in msg and "bad sample 7" in msg
    with pytest.raises(KeyError) as ei:
        next(it)  # the iterator goes on, like torch's
    assert "in DataLoader worker process 0" in str(ei.value)
    assert next(it).ravel().tolist() == [10, 11]
    with pytest.raises(StopIteration):
        next(it)
    _assert_gone(pids)


def test_worker_init_fn_error_and_break_early():
    def boom(worker_id):
        raise RuntimeError(f"init failed in {worker_id}")

    dl = DataLoader(_Squares(), batch_size=2, num_workers=2,
                    worker_init_fn=boom, timeout=60,
                    multiprocessing_context="fork")
    it = iter(dl)
    pids = _pids(it)
    with pytest.raises(RuntimeError, match="init failed in 0"):
        next(it)
    del it
    _assert_gone(pids)
    # breaking out of an epoch and dropping the iterator stops the workers
    it = iter(DataLoader(_Squares(), batch_size=2, num_workers=2, timeout=60))
    pids = _pids(it)
    next(it)
    del it
    _assert_gone(pids)


class _Dies(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            os._exit(3)
        return i


class _Slow(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(5)
        return i


@FULL
def test_dead_worker_and_timeout():
    it = iter(DataLoader(_Dies(), batch_size=2, num_workers=2))
    pids = _pids(it)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) "
                       r"\d+\) exited unexpectedly"):
        list(it)
    del it
    _assert_gone(pids)
    it = iter(DataLoader(_Slow(), batch_size=1, num_workers=1, timeout=0.3))
    pids = _pids(it)
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.3 "
                       "seconds"):
        next(it)
    del it
    _assert_gone(pids)


class _Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))

    def __len__(self):
        return self.n


def test_iterable_dataset_with_workers():
    ref = [b.tolist() for b in DataLoader(_Stream(10), batch_size=3)]
    assert ref == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    it = iter(DataLoader(_Stream(10), batch_size=2, num_workers=2,
                         timeout=60))
    pids = _pids(it)
    got = [b.tolist() for b in it]
    # round robin: worker 0 streams 0,2,4,..., worker 1 streams 1,3,5,...
    assert got == [[0, 2], [1, 3], [4, 6], [5, 7], [8], [9]]
    _assert_gone(pids)
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        DataLoader(_Stream(3), shuffle=True)


def test_a_worker_that_ends_never_blocks_the_others():
    # A worker whose stream ends exits right after its last message; it
    # used to exit without waiting for its queue's feeder thread, which can
    # die holding the result queue's write lock and hang the other worker
    # (seen about once in 300 loaders on 2 busy cores).
    for _ in range(150):
        it = iter(DataLoader(_Stream(6), batch_size=2, num_workers=2,
                             timeout=30))
        assert [b.tolist() for b in it] == [[0, 2], [1, 3], [4], [5]]


class _Seeds(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = get_worker_info()
        return np.array([info.id, info.seed, np.random.randint(2**31),
                         info.num_workers], dtype=np.int64)


def test_worker_seeding_matches_torch():
    torch = pytest.importorskip("torch")

    class TSeeds(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return torch.tensor([info.id, info.seed,
                                 np.random.randint(2**31), info.num_workers])

    tg = torch.Generator()
    tg.manual_seed(99)
    ref = [b.numpy() for b in torch.utils.data.DataLoader(
        TSeeds(), batch_size=1, num_workers=2, generator=tg,
        multiprocessing_context="fork", timeout=60)]
    got = list(DataLoader(_Seeds(), batch_size=1, num_workers=2,
                          generator=pyddp.Generator().manual_seed(99),
                          timeout=60))
    assert [g.tolist() for g in got] == [r.tolist() for r in ref]


# --------------------------------------------------------- argument checks

def test_argument_errors_match_torch():
    torch = pytest.importorskip("torch")
    tds = torch.utils.data.TensorDataset(torch.arange(4))
    pds = TensorDataset(np.arange(4))
    tsamp = torch.utils.data.SequentialSampler(range(4))
    psamp = pyddp.utils.data.SequentialSampler(range(4))
    cases = [
        (dict(num_workers=-1), {}),
        (dict(timeout=-1), {}),
        (dict(prefetch_factor=2), {}),
        (dict(num_workers=1, prefetch_factor=-1), {}),
        (dict(persistent_workers=True), {}),
        (dict(shuffle=True), dict(sampler=True)),
        (dict(batch_size=2), dict(batch_sampler=True)),
        (dict(drop_last=True), dict(batch_sampler=True)),
        (dict(batch_size=None, drop_last=True), {}),
        (dict(multiprocessing_context="spawn"), {}),
        (dict(num_workers=1, multiprocessing_context="nope"), {}),
        (dict(batch_size=0), {}),
    ]
    for kw, extra in cases:
        tkw, pkw = dict(kw), dict(kw)
        if extra.get("sampler"):
            tkw["sampler"], pkw["sampler"] = tsamp, psamp
        if extra.get("batch_sampler"):
            tkw["batch_sampler"] = torch.utils.data.BatchSampler(tsamp, 2,
                                                                 False)
            pkw["batch_sampler"] = pyddp.utils.data.BatchSampler(psamp, 2,
                                                                 False)
        with pytest.raises(Exception) as te:
            torch.utils.data.DataLoader(tds, **tkw)
        with pytest.raises(Exception) as pe:
            DataLoader(pds, **pkw)
        assert type(pe.value) is type(te.value), kw
        assert str(pe.value) == str(te.value), kw
    dl = DataLoader(pds)
    with pytest.raises(ValueError, match="batch_size attribute should not "
                       "be set"):
        dl.batch_size = 3


def test_datasets():
    ds = TensorDataset(X, Y)
    assert len(ds) == 20 and np.array_equal(ds[4][0], X[4])
    with pytest.raises(AssertionError, match="Size mismatch"):
        TensorDataset(X, Y[:3])
    lst = TensorDataset([1, 2, 3], np.arange(3))  # any indexable array-like
    assert lst[1] == (2, 1)
    cat = ConcatDataset([TensorDataset(Y[:5]), TensorDataset(Y[5:])])
    assert [cat[i][0] for i in range(20)] == Y.tolist()
    assert cat[-1][0] == Y[-1]
    with pytest.raises(ValueError, match="absolute value of index"):
        cat[-21]
    both = TensorDataset(Y[:5]) + TensorDataset(Y[5:])
    assert len(both) == 20
    sub = Subset(ds, [3, 1])
    assert len(sub) == 2 and sub[0][1] == Y[3]
    assert [s[1] for s in sub.__getitems__([1, 0])] == [Y[1], Y[3]]
    with pytest.raises(AssertionError, match="empty iterable"):
        ConcatDataset([])


def test_no_leftover_children():
    before = {p.pid for p in multiprocessing.active_children()}
    for w in (1, 2):
        list(DataLoader(_Squares(), batch_size=4, num_workers=w, timeout=60))
    after = {p.pid for p in multiprocessing.active_children()}
    assert after <= before
