"""One rank of tests/distributed/test_cores.py: binds itself to the CPUs its argument names (this rank's
entry of a ';'-separated list, e.g. '0;0' or '0;1'), then joins a 2-rank group through the
launcher's environment and runs one all_reduce, checked against NumPy."""
import os
import sys

import numpy as np

rank = int(os.environ["RANK"])
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(";")[rank].split(",")})

import pyddp.distributed as dist  # noqa: E402

dist.init_process_group("cpu")
x = np.arange(1000, dtype=np.float32) * (rank + 1)
dist.all_reduce(x)
assert np.array_equal(x, np.arange(1000, dtype=np.float32) * 3), x[:4]
dist.destroy_process_group()
