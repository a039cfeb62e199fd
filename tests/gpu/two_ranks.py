"""Two NCCL ranks on one GPU (tests/gpu/verify.sh, given NCCL 2.30+; a GPU machine only).

What only several ranks show (NCCL answers ncclInProgress and runs each call as a group job on a thread
of its own; with one rank it runs the call inline), each on 2 ranks sharing GPU 0
(NCCL_MULTI_RANK_GPU_ENABLE=1), each rank a process of its own:

- entries: 20,000 small all_reduces with the watchdog polling every millisecond; pyddp's count of calls into
  a communicator made while another thread was inside one (NcclComm.overlapping_entries) must be 0;
- overhead: host time per small all_reduce, pyddp against torch.distributed (median of 5 x 2,000 calls, launch_overhead's rounds);
- barrier: a script's tensors put on cuda:<rank % GPUs> without set_device, then a long kernel on the
  current stream and barrier(): the kernel must be done when barrier returns (torch's barrier);
- p2p: rank 0 isend(x, 1) then all_reduce(y), rank 1 all_reduce(y) then recv(x, 0) (torch gives each
  pair its own communicator): said as it comes out, ok or the error (issue 51 item 4 is open).

Exit status 1 when entries or barrier fail (a result in a table, not an exception, for the others).
Without torch or a CUDA device, or when pyddp's libnccl is older than 2.30, it says so and exits 0."""
import json
import os
import subprocess
import sys
import time

from launch_overhead import _rounds  # median of 5 rounds of N calls (this folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CALLS = 20000


def worker(case, lib, rank):
    import torch

    res = {}
    ngpu = torch.cuda.device_count()
    if lib == "torch":
        import torch.distributed as dist

        torch.cuda.set_device(rank % ngpu)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank % ngpu))
        x = torch.ones(2, device="cuda")
        for _ in range(200):
            dist.all_reduce(x)
        res["torch.distributed all_reduce (us)"] = _rounds(lambda: dist.all_reduce(x), torch.cuda.synchronize)
        dist.destroy_process_group()
        return res
    import pyddp.cuda
    import pyddp.distributed as dist

    if case == "barrier":
        # no set_device, no device_id: the tensors go where the script puts them
        dist.init_process_group("nccl")
        dev = torch.device("cuda", rank % ngpu)
        x = torch.full((4,), rank + 1.0).to(dev)
        dist.all_reduce(x)
        with torch.cuda.device(dev):
            torch.cuda._sleep(int(2e9))   # about a second on an H100/H200
            t0 = time.monotonic()
            dist.barrier()
            res["barrier waited (s)"] = time.monotonic() - t0
            res["kernel done when barrier returned"] = bool(torch.cuda.current_stream().query())
        res["all_reduce"] = x.tolist()
        dist.destroy_process_group()
        return res
    pyddp.cuda.set_device(rank % ngpu)
    from datetime import timedelta

    dist.init_process_group("nccl", timeout=timedelta(seconds=30 if case == "p2p" else 300))
    x = torch.ones(2, device="cuda")
    if case == "entries":
        x.fill_(rank + 1.0)
        for _ in range(CALLS):
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
        torch.cuda.synchronize()
        res["all_reduce"] = x.tolist()
        be = dist.group.WORLD._backends["cuda"]
        res["overlapping entries"] = sum(c.overlapping_entries for c in be.comms.values())
    elif case == "overhead":
        for _ in range(200):
            dist.all_reduce(x)
        res["pyddp all_reduce (us)"] = _rounds(lambda: dist.all_reduce(x), torch.cuda.synchronize)
    elif case == "p2p":
        big = torch.full((1 << 22,), float(rank), device="cuda")
        y = torch.ones(2, device="cuda")
        t0 = time.monotonic()
        try:
            if rank == 0:
                w = dist.isend(big, 1)
                dist.all_reduce(y)
                w.wait(timeout=60)
            else:
                dist.all_reduce(y)
                dist.recv(big, 0)
            torch.cuda.synchronize()
            res["p2p"] = f"ok in {time.monotonic() - t0:.2f} s" + (
                "" if rank == 0 or big[0].item() == 0.0 else f" but received {big[0].item()}")
        except Exception as e:  # noqa: BLE001 - reported, not raised
            res["p2p"] = f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {str(e)[:300]}"
    dist.destroy_process_group()
    return res


def _run(case, lib, timeout, extra_env=None):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from _mp import free_port

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
               **(extra_env or {}))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", case, lib, str(r)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(2)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            outs.append({"error": f"did not finish within {timeout} s: {err[-800:]}"})
            continue
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        outs.append(json.loads(line[0][7:]) if line else
                    {"error": f"status {p.returncode}: {err[-1500:]}"})
    return outs


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print("RESULT " + json.dumps(worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return 0
    try:
        import torch
        if not torch.cuda.is_available():
            print("two ranks: skipped: torch sees no CUDA device")
            return 0
    except ImportError:
        print("two ranks: skipped: no torch")
        return 0
    sys.path.insert(0, ROOT)
    import pyddp.cuda

    v = pyddp.cuda.nccl.version()
    if tuple(v)[:2] < (2, 30) or os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") != "1":
        print(f"two ranks: skipped: pyddp loads NCCL {v}; two ranks on one GPU need NCCL 2.30+ with "
              "NCCL_MULTI_RANK_GPU_ENABLE=1 (verify.sh sets both when given the library)")
        return 0
    print(f"two NCCL ranks on {torch.cuda.get_device_name(0)}, NCCL {v}")
    bad = []
    outs = _run("entries", "pyddp", 600, {"PYDDP_NCCL_WATCHDOG_INTERVAL": "0.001"})
    for r, o in enumerate(outs):
        print(f"  entries rank {r}: {o}")
        if o.get("overlapping entries") != 0 or o.get("all_reduce") != [2.0, 2.0]:
            bad.append(f"entries rank {r}")
    rows = {}
    for lib in ("torch", "pyddp"):
        outs = _run("overhead", lib, 300)
        for r, o in enumerate(outs):
            for k, val in o.items():
                rows[f"{k} rank {r}"] = val
    print("  host time per 2 x float32 all_reduce, median of 5 x 2,000 calls, 2 ranks on one GPU:")
    for k, val in rows.items():
        print(f"    {k:<45} {val if isinstance(val, str) else f'{val:8.2f}'}")
    outs = _run("barrier", "pyddp", 300)
    for r, o in enumerate(outs):
        print(f"  barrier rank {r}: {o}")
        if not o.get("kernel done when barrier returned") or o.get("all_reduce") != [3.0] * 4:
            bad.append(f"barrier rank {r}")
    outs = _run("p2p", "pyddp", 120)
    for r, o in enumerate(outs):
        print(f"  p2p (isend + all_reduce / all_reduce + recv) rank {r}: {o.get('p2p', o)}")
    print("two ranks: " + ("every check passed" if not bad else f"FAILED: {', '.join(bad)}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
