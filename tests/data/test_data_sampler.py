"""pyddp.Generator, pyddp.randperm and the samplers of pyddp.utils.data.

References: NumPy's own mt19937 (legacy seeding is init_genrand, the engine
torch uses) for the raw generator, a plain-Python Fisher-Yates over those raw
outputs for randperm, and torch 2.13.0 (when installed) for everything torch
defines: randperm, generator states, DistributedSampler over hundreds of
random cases, RandomSampler, SubsetRandomSampler, WeightedRandomSampler,
BatchSampler, random_split.

The parity case at torch's 214,748,364 randperm threshold needs ~6 GB and a
minute: it runs with PYDDP_SLOW_TESTS=1.
"""
import os
import pickle
import random

import numpy as np
import pytest

import pyddp
from pyddp.utils.data import (BatchSampler, DistributedSampler, RandomSampler,
                              SequentialSampler, SubsetRandomSampler,
                              WeightedRandomSampler, random_split)

SEEDS = [0, 1, 42, -1, -7, 2**32 + 1, 2**63 - 5, 2**64 - 1, -2**63]


def _numpy_mt_raw(seed, n):
    """n raw 32-bit outputs of mt19937 seeded like torch (low 32 bits)."""
    mt = np.random.MT19937()
    mt._legacy_seeding(seed & 0xFFFFFFFF)
    return [int(x) for x in mt.random_raw(n)]


def _torch():
    return pytest.importorskip("torch")


def _tgen(torch, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


# ------------------------------------------------------------ generator

@pytest.mark.parametrize("seed", SEEDS)
def test_engine_matches_numpy_mt19937(seed):
    g = pyddp.Generator().manual_seed(seed)
    got = [g._random() for _ in range(1500)]  # crosses two state refills
    assert got == _numpy_mt_raw(seed % 2**64, 1500)
    assert g.initial_seed() == seed % 2**64


def test_random64_is_two_draws():
    g = pyddp.Generator().manual_seed(5)
    raw = _numpy_mt_raw(5, 8)
    assert [g._random64() for _ in range(4)] == [
        (raw[2 * i] << 32) | raw[2 * i + 1] for i in range(4)]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 625, 5000])
@pytest.mark.parametrize("seed", [0, 3, -2])
def test_randperm_matches_python_fisher_yates(n, seed):
    raw = iter(_numpy_mt_raw(seed % 2**64, max(n, 1)))
    ref = list(range(n))
    for i in range(n - 1):
        z = next(raw) % (n - i)
        ref[i], ref[i + z] = ref[i + z], ref[i]
    got = pyddp.randperm(n, generator=pyddp.Generator().manual_seed(seed))
    assert got.dtype == np.int64
    assert got.tolist() == ref


def test_generator_api():
    g = pyddp.Generator()
    assert g.initial_seed() == 67280421310721  # torch.Generator()'s default
    assert g.manual_seed(3) is g
    with pytest.raises(ValueError, match="Overflow"):
        g.manual_seed(2**64)
    with pytest.raises(ValueError, match="Overflow"):
        g.manual_seed(-2**63 - 1)
    with pytest.raises(TypeError, match="seed must be an int"):
        g.manual_seed("3")
    for bad in (True, 1.5):
        with pytest.raises(RuntimeError, match="manual_seed expected a long"):
            g.manual_seed(bad)
    g.manual_seed(np.int64(9))
    assert g.initial_seed() == 9
    s = g.seed()
    assert g.initial_seed() == s
    # state round trip and pickling continue the same stream
    g.manual_seed(11)
    pyddp.randperm(7, generator=g)
    state = g.get_state()
    assert state.dtype == np.uint8 and state.shape == (5056,)
    a = pyddp.randperm(50, generator=g)
    g2 = pickle.loads(pickle.dumps(g.set_state(state)))
    assert pyddp.randperm(50, generator=g2).tolist() == a.tolist()
    with pytest.raises(RuntimeError, match="size"):
        g.set_state(state[:100])
    bad = state.copy()
    bad[8:12] = 0  # left = 0 is not a valid mt19937 state
    with pytest.raises(RuntimeError, match="Invalid mt19937 state"):
        g.set_state(bad)
    with pytest.raises(RuntimeError, match="randperm expects n >= 0"):
        pyddp.randperm(-1)
    with pytest.raises(TypeError):
        pyddp.randperm(3, generator=object())
    with pytest.raises(RuntimeError):
        pyddp.Generator(device="cuda")


def test_default_generator_manual_seed():
    pyddp.manual_seed(123)
    a = pyddp.randperm(20)
    assert pyddp.initial_seed() == 123
    pyddp.manual_seed(123)
    assert pyddp.randperm(20).tolist() == a.tolist()


# --------------------------------------------------------- torch parity

@pytest.mark.parametrize("seed", SEEDS)
def test_randperm_and_state_parity_torch(seed):
    torch = _torch()
    g = pyddp.Generator().manual_seed(seed)
    tg = _tgen(torch, seed)
    for n in [0, 1, 2, 10, 100, 1000, 12345]:
        assert pyddp.randperm(n, generator=g).tolist() == \
            torch.randperm(n, generator=tg).tolist()
    assert g.initial_seed() == tg.initial_seed()
    assert g.get_state().tobytes() == tg.get_state().numpy().tobytes()


def test_state_moves_between_torch_and_pyddp():
    torch = _torch()
    tg = _tgen(torch, 77)
    torch.randperm(1000, generator=tg)
    g = pyddp.Generator().set_state(tg.get_state())
    assert pyddp.randperm(300, generator=g).tolist() == \
        torch.randperm(300, generator=tg).tolist()
    tg2 = torch.Generator()
    tg2.set_state(torch.from_numpy(g.get_state()))
    assert torch.randperm(99, generator=tg2).tolist() == \
        pyddp.randperm(99, generator=g).tolist()


def _dist_cases(count, rng):
    cases = []
    for _ in range(count):
        n = rng.choice([0, 1, 2, 3, 5, 7, 10, 31, 100, 1000,
                        rng.randrange(1, 20000)])
        r = rng.randrange(1, 17)
        cases.append(dict(
            n=n, num_replicas=r, rank=rng.randrange(r),
            shuffle=rng.random() < 0.8,
            seed=rng.choice([0, 1, -1, -12345, 2**32, 2**32 + 7, 2**63 - 1,
                             rng.randrange(-2**63, 2**64 - 10)]),
            epoch=rng.randrange(0, 6), drop_last=rng.random() < 0.5))
    # length smaller than the number of replicas, both drop_last settings
    for n in range(0, 6):
        for dl in (False, True):
            cases.append(dict(n=n, num_replicas=8, rank=n % 8, shuffle=True,
                              seed=n, epoch=1, drop_last=dl))
    return cases


def test_distributed_sampler_parity_torch():
    torch = _torch()
    from torch.utils.data.distributed import \
        DistributedSampler as TDistributedSampler
    rng = random.Random(20260)
    cases = _dist_cases(400, rng)
    for c in cases:
        kw = dict(num_replicas=c["num_replicas"], rank=c["rank"],
                  shuffle=c["shuffle"], seed=c["seed"],
                  drop_last=c["drop_last"])
        ts = TDistributedSampler(range(c["n"]), **kw)
        ps = DistributedSampler(range(c["n"]), **kw)
        ts.set_epoch(c["epoch"])
        ps.set_epoch(c["epoch"])
        ref = list(ts)
        got = list(ps)
        assert got == ref, c
        assert all(type(i) is int for i in got)
        assert len(ps) == len(ts) == len(ref)
        assert ps.total_size == ts.total_size
        arr = ps.indices()
        assert arr.dtype == np.int64 and arr.tolist() == ref
    assert torch is not None


def test_distributed_sampler_every_rank_partitions():
    # Independent of torch: without drop_last the ranks together cover
    # the permutation padded from its start; with it, a prefix of it.
    n, R = 1003, 4
    perm = pyddp.randperm(n, generator=pyddp.Generator().manual_seed(5 + 2))
    for drop_last in (False, True):
        ranks = []
        for r in range(R):
            s = DistributedSampler(range(n), num_replicas=R, rank=r, seed=5,
                                   drop_last=drop_last)
            s.set_epoch(2)
            ranks.append(s.indices())
        total = sum(len(x) for x in ranks)
        padded = np.concatenate([perm, perm])[:total]
        merged = np.empty(total, np.int64)
        for r in range(R):
            merged[r::R] = ranks[r]
        assert merged.tolist() == padded.tolist()
        assert total == (n // R * R if drop_last else -(-n // R) * R)
    s = DistributedSampler(range(10), num_replicas=3, rank=1, shuffle=False)
    assert list(s) == [1, 4, 7, 0]


def test_distributed_sampler_errors():
    for rank in (4, -1):
        with pytest.raises(ValueError, match=r"Invalid rank %d, rank should "
                           r"be in the interval \[0, 3\]" % rank):
            DistributedSampler(range(10), num_replicas=4, rank=rank)
    with pytest.raises(ValueError, match="Default process group has not "
                       "been initialized"):
        DistributedSampler(range(10))
    s = DistributedSampler(range(10), num_replicas=2, rank=0,
                           seed=2**64 - 1)
    s.set_epoch(1)
    with pytest.raises(ValueError, match="Overflow"):
        list(s)


def test_distributed_sampler_error_messages_match_torch():
    torch = _torch()
    from torch.utils.data.distributed import \
        DistributedSampler as TDistributedSampler
    for kw in (dict(num_replicas=4, rank=4), dict(num_replicas=2, rank=-1),
               dict()):
        with pytest.raises(Exception) as te:
            TDistributedSampler(range(10), **kw)
        with pytest.raises(Exception) as pe:
            DistributedSampler(range(10), **kw)
        assert type(pe.value) is type(te.value)
        assert str(pe.value) == str(te.value)
    assert torch is not None


@pytest.mark.parametrize("replacement,num_samples", [
    (False, None), (False, 7), (False, 20), (False, 45), (True, None),
    (True, 5), (True, 32), (True, 100)])
def test_random_sampler_parity_torch(replacement, num_samples):
    torch = _torch()
    data = range(20)
    for seed in (0, 9, -4):
        g = pyddp.Generator().manual_seed(seed)
        tg = _tgen(torch, seed)
        ps = RandomSampler(data, replacement, num_samples, generator=g)
        ts = torch.utils.data.RandomSampler(data, replacement, num_samples,
                                            generator=tg)
        for _ in range(2):  # the second epoch continues the stream
            assert list(ps) == list(ts)
        assert len(ps) == len(ts)
    # without a generator: a fresh one seeded from the default generator
    pyddp.manual_seed(31)
    torch.manual_seed(31)
    assert list(RandomSampler(data, replacement, num_samples)) == \
        list(torch.utils.data.RandomSampler(data, replacement, num_samples))


def test_random_sampler_errors():
    with pytest.raises(TypeError, match="replacement should be a boolean"):
        RandomSampler(range(3), replacement=1)
    with pytest.raises(ValueError, match="num_samples should be a positive"):
        RandomSampler(range(3), num_samples=0)


def test_subset_and_batch_samplers_parity_torch():
    torch = _torch()
    idx = [3, 9, 27, 81, 5, 6, 1]
    for seed in (1, 2):
        got = list(SubsetRandomSampler(
            idx, generator=pyddp.Generator().manual_seed(seed)))
        ref = list(torch.utils.data.SubsetRandomSampler(
            idx, generator=_tgen(torch, seed)))
        assert got == ref
    for drop_last in (False, True):
        for bs in (1, 3, 7, 10):
            got = list(BatchSampler(SequentialSampler(range(10)), bs,
                                    drop_last))
            ref = list(torch.utils.data.BatchSampler(
                torch.utils.data.SequentialSampler(range(10)), bs, drop_last))
            assert got == ref
            assert len(BatchSampler(range(10), bs, drop_last)) == len(ref)
    with pytest.raises(ValueError, match="batch_size should be a positive"):
        BatchSampler(range(3), 0, False)
    with pytest.raises(ValueError, match="drop_last should be a boolean"):
        BatchSampler(range(3), 2, None)


@pytest.mark.parametrize("replacement,num_samples", [
    (True, 1), (True, 2), (True, 50), (True, 1000), (False, 1), (False, 4),
    (False, 6)])
def test_weighted_random_sampler_parity_torch(replacement, num_samples):
    torch = _torch()
    w = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]
    for seed in (0, 5, 2**40):
        g = pyddp.Generator().manual_seed(seed)
        tg = _tgen(torch, seed)
        ps = WeightedRandomSampler(w, num_samples, replacement, generator=g)
        ts = torch.utils.data.WeightedRandomSampler(w, num_samples,
                                                    replacement, generator=tg)
        for _ in range(2):
            assert list(ps) == list(ts)


def test_weighted_random_sampler_errors_match_torch():
    torch = _torch()
    cases = [([1.0, -1.0], 2, True), ([0.0, 0.0], 2, True),
             ([1.0, float("inf")], 3, True), ([1.0, 2.0], 3, False),
             ([[1.0, 2.0]], 2, True), ([1.0, 2.0], 0, True),
             ([1.0, 2.0], 2, 1)]
    for w, n, rep in cases:
        with pytest.raises(Exception) as te:
            list(torch.utils.data.WeightedRandomSampler(w, n, rep))
        with pytest.raises(Exception) as pe:
            list(WeightedRandomSampler(w, n, rep))
        assert type(pe.value) is type(te.value), (w, n, rep)
        assert str(pe.value) == str(te.value), (w, n, rep)


def test_random_split_parity_torch():
    torch = _torch()
    for lengths in ([3, 7], [0.3, 0.3, 0.4], [0.5, 0.5], [10, 0]):
        got = random_split(range(10), lengths,
                           generator=pyddp.Generator().manual_seed(42))
        ref = torch.utils.data.random_split(range(10), lengths,
                                            generator=_tgen(torch, 42))
        assert [list(s) for s in got] == [list(s) for s in ref]
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(range(10), [3, 3])


@pytest.mark.skipif(os.environ.get("PYDDP_SLOW_TESTS") != "1",
                    reason="needs ~6 GB and a minute: PYDDP_SLOW_TESTS=1")
def test_randperm_and_sampler_at_torch_threshold():
    torch = _torch()
    n = 214748364  # UINT32_MAX // 20: torch's inside-out Fisher-Yates
    ref = torch.randperm(n, generator=_tgen(torch, 3)).numpy()
    got = pyddp.randperm(n, generator=pyddp.Generator().manual_seed(3))
    assert np.array_equal(got, ref)
    del got
    s = DistributedSampler(range(n), num_replicas=4, rank=1, seed=1)
    s.set_epoch(2)
    assert np.array_equal(s.indices(), ref[1::4])
    # one below the threshold still uses the 32-bit forward shuffle
    del ref
    ref = torch.randperm(n - 1, generator=_tgen(torch, 8)).numpy()
    got = pyddp.randperm(n - 1, generator=pyddp.Generator().manual_seed(8))
    assert np.array_equal(got, ref)
