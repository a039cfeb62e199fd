"""all_to_all on one array in place (output is input, or output blocks that are input blocks):
the peers read a rank's input while it writes its output, so pyddp copies the input first.  Before,
all_to_all_single(x, x) gave a wrong result at the sizes that move by single copies (1 MiB on 2
ranks: one block never arrived) without an error.  Real processes; results against NumPy, equal
and unequal splits, sizes through the banks and by single copies, TCP too."""
import numpy as np
import pytest

from _mp import run
from _tiers import full

pytestmark = pytest.mark.timeout(180)
SIZES = (256, 1 << 16, 1 << 18)   # elements per block: banks, and single copies from 64 KiB
CMA = {"PYDDP_CMA_THRESHOLD": "64K"}   # whatever the host's rules


def _inplace(rank, world_size):
    import pyddp.distributed as dist

    n = world_size
    bad = []
    for m in SIZES:
        # equal splits, output is input
        x = np.arange(m * n, dtype=np.float32) + 1_000_000 * rank
        want = np.concatenate([np.arange(m * n, dtype=np.float32)[rank * m:(rank + 1) * m]
                               + 1_000_000 * p for p in range(n)])
        dist.all_to_all_single(x, x)
        if not np.array_equal(x, want):
            bad.append(f"single {m}")
        # unequal splits in place: rank p sends (p + q + 1) * m rows to rank q; the total a rank
        # sends equals what it receives only for symmetric splits, which these are
        ins = [(rank + q + 1) * m for q in range(n)]
        outs = [(p + rank + 1) * m for p in range(n)]
        y = np.arange(sum(ins), dtype=np.float64) + 1e7 * rank
        src = [np.arange(sum((p + q + 1) * m for q in range(n)), dtype=np.float64) + 1e7 * p
               for p in range(n)]
        want = np.concatenate([src[p][sum((p + q + 1) * m for q in range(rank)):][:outs[p]]
                               for p in range(n)])
        dist.all_to_all_single(y, y, output_split_sizes=outs, input_split_sizes=ins)
        if not np.array_equal(y, want):
            bad.append(f"single split {m}")
        # lists whose output blocks are the input blocks
        blocks = [np.full(m, 100 * rank + q, dtype=np.int32) for q in range(n)]
        dist.all_to_all(blocks, blocks)
        if not all(np.array_equal(blocks[p], np.full(m, 100 * p + rank)) for p in range(n)):
            bad.append(f"list {m}")
    return bad


@pytest.mark.parametrize("n", [2, *full(3)])
def test_all_to_all_in_place_is_exact(n):
    assert run(_inplace, n, timeout=150, env=CMA) == [[]] * n


def test_all_to_all_in_place_over_tcp():
    assert run(_inplace, 2, timeout=150, env={"PYDDP_TRANSPORT": "tcp"}) == [[], []]
