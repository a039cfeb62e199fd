"""Functions that spawn / start_processes / notebook_launcher run in child processes.

They live in a module (not in a test file) so that the 'spawn' start method can import them by name.
Every wait has a deadline, so a broken launcher shows as a test failure, not a hang.
"""
import json
import os
import signal
import sys
import time

import numpy as np

DEADLINE = 60.0


def write_pid(piddir, i):
    path = os.path.join(piddir, f"{i}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def wait_for_pids(piddir, n, timeout=DEADLINE):
    deadline = time.monotonic() + timeout
    while True:
        if len([f for f in os.listdir(piddir) if f.endswith(".pid")]) >= n:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    raise TimeoutError(f"only some of {n} processes wrote their pid to {piddir}")


def record(i, outdir, *extra):
    """Write what this process got: its index, the extra arguments, its pid and parent's pid."""
    with open(os.path.join(outdir, f"{i}.json"), "w") as f:
        json.dump({"i": i, "extra": list(extra), "pid": os.getpid(), "ppid": os.getppid()}, f)


def allreduce_job(i, n, port, outdir):
    import pyddp.distributed as dist

    dist.init_process_group("cpu", init_method=f"tcp://127.0.0.1:{port}", rank=i, world_size=n)
    try:
        a = np.arange(8, dtype=np.float64) * (i + 1)
        dist.all_reduce(a)
    finally:
        dist.destroy_process_group()
    np.save(os.path.join(outdir, f"{i}.npy"), a)


def fail_when_all_started(i, n, bad, how, piddir):
    """Process `bad` fails (how: raise, exit3, sigkill) once all n processes run; the others sleep."""
    write_pid(piddir, i)
    wait_for_pids(piddir, n)
    if i == bad:
        if how == "raise":
            raise ValueError(f"boom {i}")
        if how == "exit3":
            sys.exit(3)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(DEADLINE)


def sleeper(i, piddir, seconds, ignore_sigint=False):
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    write_pid(piddir, i)
    time.sleep(seconds)


def root_cause_then_consequence(i, port, bad):
    """Rank `bad` raises at once; the other rank is in an all_reduce with it and fails because of it."""
    import pyddp.distributed as dist

    dist.init_process_group("cpu", init_method=f"tcp://127.0.0.1:{port}", rank=i, world_size=2,
                            timeout=30)
    if i == bad:
        raise ValueError(f"root cause on process {i}")
    dist.all_reduce(np.ones(4))  # DistNetworkError once `bad` is gone
    dist.all_reduce(np.ones(4))


def fail_or_finish(i, piddir, finish_after):
    """Process 1 raises once process 0 runs; process 0 returns by itself finish_after seconds later."""
    write_pid(piddir, i)
    wait_for_pids(piddir, 2)
    if i == 1:
        raise ValueError("boom 1")
    time.sleep(finish_after)


def collate_fails_in_worker0(batch):
    """A DataLoader collate_fn that raises TypeError in worker 0 (worker 1 stacks the batch)."""
    from pyddp.utils.data import get_worker_info

    if get_worker_info().id == 0:
        raise TypeError("collate cannot batch these")
    return np.stack(batch)


def record_worker_pid(piddir, rank, worker_id):
    """A DataLoader worker_init_fn (with functools.partial): the worker's pid, to check it ends."""
    path = os.path.join(piddir, f"worker-{rank}-{worker_id}.wpid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def loader_fails(i, n, port, piddir):
    """A training loop whose DataLoader worker 0 raises in collate on every rank.

    Each rank gets one batch (DistributedSampler over 8 samples, batch_size 4), so worker 1 is sent
    no index before the error; the iterator is a local of this frame, which the uncaught exception's
    traceback keeps until the interpreter finalises (a step-based loop's ``iter(loader)``).  That
    is what left the ranks of issue 50 (item 5) waiting forever at exit.  ``port`` None: the
    launcher's environment gives the rendezvous, and the rank."""
    import functools

    import pyddp.distributed as dist
    from pyddp.utils.data import DataLoader, DistributedSampler

    write_pid(piddir, i)
    if port is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=i, world_size=n)
    rank = dist.get_rank()
    ds = [np.full(3, k, np.float32) for k in range(8)]
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_fails_in_worker0,
                        worker_init_fn=functools.partial(record_worker_pid, piddir, rank),
                        sampler=DistributedSampler(ds))
    batches = iter(loader)
    dist.barrier()   # both ranks have started their workers: they raise at about the same time
    for _ in range(4):
        dist.all_reduce(next(batches))


def loader_fails_env(n, piddir):
    """loader_fails under a launcher that passes no index (pyddp.run, notebook_launcher): RANK."""
    loader_fails(int(os.environ["RANK"]), n, None, piddir)
