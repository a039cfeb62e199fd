"""torch CUDA tensors on the "pyddp" torch backend started as ``"cpu:pyddp,cuda:nccl"``: torch's own
API, CPU tensors on pyddp's C core and CUDA tensors on pyddp's NCCL backend in one group, against
NumPy."""
from datetime import timedelta

import numpy as np

from _gpu import machine, need
from _mp import run


def _child(rank, ws, devices):
    import torch
    import torch.distributed as dist

    import pyddp.torch_backend  # noqa: F401  (registers "pyddp")

    dev = torch.device("cuda", rank % devices)
    torch.cuda.set_device(dev)
    dist.init_process_group("cpu:pyddp,cuda:nccl", rank=rank, world_size=ws,
                            timeout=timedelta(seconds=120))
    bad = []

    def check(what, got, want):
        got = got.detach().double().cpu().numpy() if hasattr(got, "cpu") else np.asarray(got)
        if got.shape != np.shape(want) or not np.allclose(got, want, rtol=1e-2, atol=1e-2):
            bad.append(f"rank {rank} {what}: got {got.tolist()} want {np.asarray(want).tolist()}")

    base = [np.arange(8) % 3 + r + 1.0 for r in range(ws)]
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        mine = torch.tensor(base[rank], dtype=dtype, device=dev)
        x = mine.clone()
        dist.all_reduce(x)
        check(f"{dtype} all_reduce", x, sum(base))
        x = mine.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True).wait(timedelta(seconds=60))
        check(f"{dtype} all_reduce MAX async", x, np.max(base, axis=0))
        x = mine.clone()
        dist.broadcast(x, src=ws - 1)
        check(f"{dtype} broadcast", x, base[ws - 1])
        o = torch.zeros(8 * ws, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(o, mine)
        check(f"{dtype} all_gather_into_tensor", o, np.concatenate(base))
        outs = [torch.zeros(8, dtype=dtype, device=dev) for _ in range(ws)]
        dist.all_gather(outs, mine)
        for r in range(ws):
            check(f"{dtype} all_gather[{r}]", outs[r], base[r])
        o = torch.zeros(8, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(o, mine.repeat(ws))
        check(f"{dtype} reduce_scatter_tensor", o, sum(base))
        if dtype.is_floating_point:
            x = mine.clone()
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
            check(f"{dtype} all_reduce PREMUL_SUM", x, sum(base) * 0.5)
    # the CPU side of the same group: pyddp's C core
    t = torch.tensor(base[rank])
    dist.all_reduce(t)
    check("cpu all_reduce", t, sum(base))
    if ws > 1:  # ranks 0 and 1 exchange, in order (NCCL pairs a send with its receive)
        peer = 1 - rank if rank < 2 else None
        if peer is not None:
            mine = torch.tensor(base[rank], device=dev, dtype=torch.float32)
            o = torch.zeros(8, device=dev)
            for sender in (0, 1):
                if rank == sender:
                    dist.send(mine, peer)
                else:
                    dist.recv(o, peer)
            check("send/recv", o, base[peer])
        # torch's batch_isend_irecv: one by one on this group, one NCCL group in pyddp
        right, left = (rank + 1) % ws, (rank - 1) % ws
        big = torch.arange(1 << 20, device=dev, dtype=torch.float32) + rank
        o = torch.zeros(1 << 20, device=dev)
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, big, right),
                                         dist.P2POp(dist.irecv, o, left)]):
            r.wait(timedelta(seconds=60))
        check("batch_isend_irecv", o[:8], np.arange(8) + left)
    torch.cuda.synchronize()
    dist.monitored_barrier(timeout=timedelta(seconds=60))
    kind = type(dist.group.WORLD).__name__
    dist.destroy_process_group()
    return bad, kind


def test_torch_cuda_tensors_on_cpu_pyddp_cuda_nccl():
    m = machine()
    devices = m["torch"] if isinstance(m["torch"], int) else 0
    ws = max(1, min(2, devices))
    need("torch", "nccl", ws)
    for bad, kind in run(_child, ws, devices, init=False, start_method="spawn", timeout=300):
        assert kind == "ProcessGroupPyddp"
        assert not bad, "\n".join(bad)
