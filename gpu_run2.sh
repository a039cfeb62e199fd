#!/bin/bash
# second device call of the session (not committed)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/v2
python3 setup.py -q build_ext --inplace -j 16 >/tmp/v2/build0.log 2>&1 || { tail -20 /tmp/v2/build0.log; }
python3 - >/tmp/v2/lazy.log 2>&1 <<'P'
import os, time, torch
print("CUDA_MODULE_LOADING", os.environ.get("CUDA_MODULE_LOADING"))
torch.cuda.set_device(0)
x = torch.arange(1 << 22, dtype=torch.float64, device="cuda"); torch.cuda.synchronize()
t = time.monotonic(); torch.cuda._sleep(1000); torch.cuda.synchronize(); print("first tiny sleep %.4f s" % (time.monotonic() - t))
for k in range(2):
    t = time.monotonic(); torch.cuda._sleep(400_000_000); t1 = time.monotonic(); x.add_(1); t2 = time.monotonic()
    torch.cuda.synchronize(); t3 = time.monotonic()
    print("round %d: sleep launch %.4f s, add_ launch %.4f s, then synchronize %.4f s" % (k, t1 - t, t2 - t1, t3 - t2))
P
cat /tmp/v2/lazy.log
timeout -k 5 120 python3 benchmarks/ddp_gpu.py --rounds 9 --steps 20 --profile 20 --json /tmp/v2/ddp_gpu.json >/tmp/v2/ddp_gpu_profile.log 2>&1
grep -A8 "^| model" /tmp/v2/ddp_gpu_profile.log; grep "^# profile" /tmp/v2/ddp_gpu_profile.log
VERIFY_STEP_TIMEOUT=110 timeout -k 5 330 bash tests/gpu/verify.sh /tmp/v2/verify; echo "verify rc $?"
tar czf $OUT/v2.tgz -C /tmp v2
grep -E "^== |verify:|passed|failed" /tmp/v2/verify/summary.txt | tail -30
