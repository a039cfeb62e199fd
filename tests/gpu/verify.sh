#!/usr/bin/env bash
# The GPU path's verification, in one command:
#
#     bash tests/gpu/verify.sh [LOGDIR]          # default LOGDIR: ./gpu-verify-logs
#
# 1. builds the extension in place (no build isolation: the GPU machine reaches no package registry);
# 2. prints the library versions (Python, NumPy, torch, CuPy, JAX, the NCCL and CUDA runtime pyddp loads,
#    torch's NCCL, the driver) and the ABI facts pyddp assumes, checked against the real headers
#    (tests/gpu/abi_facts.c, compiled against nccl.h and cuda_runtime_api.h where they are found);
# 3. runs the GPU tests (tests/gpu, in parallel with pytest-xdist where it is installed: among them the
#    torch-model path, pyddp DDP / amp / fused optimizers / SyncBatchNorm on CUDA tensors against torch, and
#    the seed notes' GPU scripts, tests/gpu/test_gpu_torch_path.py), then the NCCL-path tests on the
#    stand-in libraries (tests/cuda/test_nccl_backend.py, tests/cuda/test_fakecuda.py);
# 4. runs `benchmarks/nccl.py --quick` (pyddp against torch's ProcessGroupNCCL and CuPy in the same run) and
#    `benchmarks/ddp_gpu.py --rounds 5` (one training step, pyddp DDP + amp O1 against torch DDP + torch.amp);
# 5. times the host side of one small NCCL call, pyddp against torch.distributed (tests/gpu/launch_overhead.py);
# 6. with NCCL 2.30+ (below), what only two ranks show: tests/gpu/two_ranks.py.
#
# Two NCCL ranks on one GPU need NCCL 2.30 or later with NCCL_MULTI_RANK_GPU_ENABLE=1 (the GPU machine's own
# NCCL, torch's pin, refuses them). VERIFY_NCCL=PATH (a libnccl.so.2, or the .xz of one; default
# build/nccl/libnccl.so.2.xz when it is there) makes every step use it: pyddp through PYDDP_NCCL_LIBRARY,
# torch's ProcessGroupNCCL (the peer) through LD_PRELOAD; then the tests that need two ranks run instead of
# skipping, benchmarks/nccl.py runs 2 ranks on the GPU against torch, and step 6 runs.
#
# Every step's log goes under LOGDIR (summary.txt holds what this prints). On a machine without a GPU the
# GPU tests and the benchmark report why they skipped and the script still exits 0; any failed step makes
# it exit 1, after the remaining steps have run. Budget: under 10 minutes on the GPU machine (16 cores);
# VERIFY_STEP_TIMEOUT (seconds, default 300) bounds each of steps 3 and 4.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
LOG=$(mkdir -p "${1:-gpu-verify-logs}" && cd "${1:-gpu-verify-logs}" && pwd)
PY=${PYTHON:-python3}
STEP_TIMEOUT=${VERIFY_STEP_TIMEOUT:-300}
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
: >"$LOG/summary.txt"
FAILED=()

say() { echo "$*" | tee -a "$LOG/summary.txt"; }
step() {  # step NAME COMMAND...: run, log to LOG/NAME.log, record the outcome
    local name=$1; shift
    local t0=$SECONDS
    say "== $name: $*"
    "$@" >"$LOG/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-25}" "$LOG/$name.log" | sed 's/^/   /' | tee -a "$LOG/summary.txt"
    if [ $rc -eq 0 ]; then say "== $name: ok ($((SECONDS - t0)) s)"; else
        say "== $name: FAILED (status $rc, $((SECONDS - t0)) s; log $LOG/$name.log)"; FAILED+=("$name"); fi
}

say "pyddp GPU verification, $(date -u '+%Y-%m-%d %H:%M UTC'), host $(hostname), $(nproc) cores"

NCCL2=${VERIFY_NCCL:-}
if [ -z "$NCCL2" ] && [ -f build/nccl/libnccl.so.2.xz ]; then NCCL2=build/nccl/libnccl.so.2.xz; fi
if [ -n "$NCCL2" ]; then
    case "$NCCL2" in
    *.xz)
        mkdir -p build/nccl/lib
        "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
            "$NCCL2" build/nccl/lib/libnccl.so.2 || { say "VERIFY_NCCL=$NCCL2 could not be unpacked"; exit 1; }
        NCCL2="$ROOT/build/nccl/lib/libnccl.so.2" ;;
    *) NCCL2=$(cd "$(dirname "$NCCL2")" && pwd)/$(basename "$NCCL2") ;;
    esac
    export PYDDP_NCCL_LIBRARY="$NCCL2" NCCL_MULTI_RANK_GPU_ENABLE=1 LD_PRELOAD="$NCCL2${LD_PRELOAD:+:$LD_PRELOAD}"
    say "NCCL for two ranks on one GPU: $NCCL2 (PYDDP_NCCL_LIBRARY, LD_PRELOAD, NCCL_MULTI_RANK_GPU_ENABLE=1)"
fi
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"

# 1. build in place
TAIL=5 step build "$PY" setup.py -q build_ext --inplace -j "$(nproc)"

# 2. versions and ABI facts
TAIL=40 step versions "$PY" tests/gpu/versions.py
TAIL=60 step abi "$PY" tests/gpu/abi_facts.py

# 3. the tests
# pyproject's addopts (-n auto, for the quick tier) do not apply here: workers as chosen below, and the
# full tier (--full: every variant of the stand-in tests)
XDIST=(-o "addopts=" --full)
if "$PY" -c "import xdist" 2>/dev/null; then XDIST+=(-n "${VERIFY_WORKERS:-8}"); fi
# -v: every test is logged as it ends (with its worker), so a run the step timeout stops still says which
# tests had not ended; a test's own limit stays under the step's, so a stuck one fails with its stack
TEST_TIMEOUT=$(( STEP_TIMEOUT * 3 / 4 < 240 ? STEP_TIMEOUT * 3 / 4 : 240 ))
TAIL=40 step gpu_tests timeout -k 10 "$STEP_TIMEOUT" "$PY" -m pytest -rs -v --durations 15 "${XDIST[@]}" \
    -p no:cacheprovider --timeout "$TEST_TIMEOUT" --junitxml "$LOG/gpu_tests.xml" tests/gpu
TAIL=10 step stand_in_tests timeout -k 10 "$STEP_TIMEOUT" "$PY" -m pytest -q "${XDIST[@]}" -p no:cacheprovider \
    --timeout 240 tests/cuda/test_nccl_backend.py tests/cuda/test_fakecuda.py

# 4. the benchmark against torch's ProcessGroupNCCL
TAIL=60 step bench_nccl timeout -k 10 "$STEP_TIMEOUT" "$PY" benchmarks/nccl.py --quick --max-bytes 64M \
    --timeout 120 --json "$LOG/bench_nccl.json"
TAIL=20 step bench_ddp_gpu timeout -k 10 "$STEP_TIMEOUT" "$PY" benchmarks/ddp_gpu.py --rounds 5 \
    --json "$LOG/bench_ddp_gpu.json"

# 5. where the host time of a small NCCL call goes (pyddp against torch.distributed)
TAIL=45 step launch_overhead timeout -k 10 "$STEP_TIMEOUT" "$PY" tests/gpu/launch_overhead.py

# 6. two ranks on one GPU (NCCL 2.30+ only; it says why it skips otherwise)
TAIL=30 step two_ranks timeout -k 10 "$STEP_TIMEOUT" "$PY" tests/gpu/two_ranks.py

if [ ${#FAILED[@]} -eq 0 ]; then say "verify: every step passed (logs in $LOG)"; exit 0; fi
say "verify: FAILED steps: ${FAILED[*]} (logs in $LOG)"
exit 1
