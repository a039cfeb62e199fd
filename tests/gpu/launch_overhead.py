"""Where the host time of one small NCCL call goes (tests/gpu/verify.sh step 5; a GPU machine only).

One rank on one GPU, float32 all_reduce of 2 elements, back to back: the device work is nil, so the time
per call is the host's.  Prints, each as the median of 5 rounds of N calls: torch.distributed (backend
"nccl"), pyddp.distributed (backend "nccl") on the same torch tensor, and the pieces of pyddp's call
(the caller's stream from torch, the array view, NcclComm.run alone), then cProfile's top functions of
pyddp's loop.  Each library runs in its own process.  Without a CUDA device it says so and exits 0."""
import json
import os
import statistics
import subprocess
import sys
import time

N = 2000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rounds(fn, sync):
    out = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / N * 1e6)
    return statistics.median(out)


def worker(lib, port):
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.cuda.set_device(0)
    x = torch.ones(2, device="cuda")
    sync = torch.cuda.synchronize
    res = {}
    if lib == "torch":
        import torch.distributed as dist

        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
        for _ in range(200):
            dist.all_reduce(x)
        res["torch.distributed all_reduce"] = _rounds(lambda: dist.all_reduce(x), sync)
        dist.destroy_process_group()
        return res
    import cProfile
    import pstats

    import pyddp.cuda
    import pyddp.distributed as dist
    from pyddp import _interop

    pyddp.cuda.set_device(0)
    dist.init_process_group("nccl")
    for _ in range(200):
        dist.all_reduce(x)
    res["pyddp all_reduce"] = _rounds(lambda: dist.all_reduce(x), sync)
    res["pyddp all_reduce async_op + wait"] = _rounds(lambda: dist.all_reduce(x, async_op=True).wait(), sync)
    dev = x.device
    res["  torch.cuda.current_stream(dev).cuda_stream"] = _rounds(
        lambda: torch.cuda.current_stream(dev).cuda_stream, sync)
    res["  _interop._torch_device_view(x)"] = _rounds(lambda: _interop._torch_device_view(x), sync)
    be = dist.distributed_c10d._world.default_pg._backends["cuda"]
    comm = next(iter(be.comms.values()))
    ptr, s = x.data_ptr(), torch.cuda.current_stream(dev).cuda_stream
    from pyddp import _C
    k, f32 = _C.K_ALLREDUCE, _C.DTYPE_CODES["float32"]
    res["  NcclComm.run alone"] = _rounds(lambda: comm.run(k, f32, 0, 0, 2, (), (ptr,), None, None, s, None), sync)
    res["  NcclComm.run, no stream ordering"] = _rounds(
        lambda: comm.run(k, f32, 0, 0, 2, (), (ptr,), None, None, -1, None), sync)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(N):
        dist.all_reduce(x)
    prof.disable()
    sync()
    import io
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    res["profile"] = buf.getvalue()
    dist.destroy_process_group()
    return res


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print("RESULT " + json.dumps(worker(sys.argv[2], int(sys.argv[3]))))
        return 0
    try:
        import torch
        if not torch.cuda.is_available():
            print("launch overhead: skipped: torch sees no CUDA device")
            return 0
    except ImportError:
        print("launch overhead: skipped: no torch")
        return 0
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from _mp import free_port

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = {}
    for lib in ("torch", "pyddp"):
        p = subprocess.run([sys.executable, __file__, "--worker", lib, str(free_port())], capture_output=True,
                           text=True, timeout=240, env=env)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            print(f"{lib}: failed (status {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
            continue
        rows.update(json.loads(line[0][7:]))
    prof = rows.pop("profile", "")
    print(f"host time per call, median of 5 x {N} calls (us), one rank, 2 x float32 all_reduce:")
    for k, v in rows.items():
        print(f"  {k:<50} {v:8.2f}")
    print(prof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
