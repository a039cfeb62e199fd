"""Helper of tests/distributed/test_threads_ranks.py: two ranks started by plain multiprocessing (no launcher)
or by pyddp.multiprocessing.spawn / start_processes, each reporting its BLAS thread count before
and after init_process_group.  Usage: _threads_script.py {plain|spawn|fork|plain-nothreadpoolctl} PORT"""
import multiprocessing as mp
import os
import sys

import numpy as np  # noqa: F401  (BLAS loaded in the parent, as in a script that imports numpy)


def blas():
    from threadpoolctl import threadpool_info
    return max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


def child(rank, port, q, block):
    if block:
        sys.modules["threadpoolctl"] = None   # as if it were not installed
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import pyddp.distributed as dist
    before = None if block else blas()
    dist.init_process_group("gloo")
    after = None if block else blas()
    dist.destroy_process_group()
    q.put((rank, before, after, os.environ.get("OMP_NUM_THREADS"), os.environ.get("THP_MEM_ALLOC_ENABLE")))


def spawned(rank, port, q):
    child(rank, port, q, False)


if __name__ == "__main__":
    how, port = sys.argv[1], int(sys.argv[2])
    if how.startswith("plain"):
        q = mp.get_context("fork").Queue()
        ps = [mp.get_context("fork").Process(target=child, args=(r, port, q, "nothreadpoolctl" in how))
              for r in range(2)]
        for p in ps:
            p.start()
        res = sorted(q.get(timeout=60) for _ in ps)
        for p in ps:
            p.join(30)
    else:
        import pyddp.multiprocessing as pmp
        ctx = mp.get_context("spawn" if how == "spawn" else "fork")
        q = ctx.Manager().Queue() if how == "spawn" else ctx.Queue()
        pmp.start_processes(spawned, args=(port, q), nprocs=2, start_method=how)
        res = sorted(q.get(timeout=60) for _ in range(2))
    print("parent", os.environ.get("OMP_NUM_THREADS"))
    print("parent_thp", os.environ.get("THP_MEM_ALLOC_ENABLE"))
    print("cores", len(os.sched_getaffinity(0)))
    print("result", res, flush=True)
