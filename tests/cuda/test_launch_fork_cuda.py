"""Fork after CUDA was used: the CUDA runtime refuses every call in a child forked after its parent
initialised CUDA (cudaErrorInitializationError), far from the cause.  pyddp's launchers that fork ranks
(start_processes with start_method='fork', notebook_launcher) refuse up front once this process used
CUDA; in a child forked anyway (DataLoader workers, os.fork) pyddp's CUDA functions raise saying why and
what to do, as torch's "Cannot re-initialize CUDA in forked subprocess".  Each case runs in a fresh
interpreter on the test-only stand-in for libcudart (tests/fakecuda), which fails in such a child as
the real runtime does."""
import os
import subprocess
import sys
import textwrap

import pytest

import fakecuda

REPO = os.path.dirname(fakecuda.TESTS_DIR)
WAIT = 60
pytestmark = pytest.mark.timeout(120)
AFTER_FORK = "it was forked after its parent had used CUDA"


def _run(code, cwd=None):
    env = {**os.environ, **fakecuda.env(devices=2)}
    env["PYTHONPATH"] = os.pathsep.join([REPO, fakecuda.TESTS_DIR, cwd or REPO])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                       text=True, timeout=WAIT, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def test_a_child_forked_after_cuda_use_gets_a_clear_error():
    out = _run("""
        import pyddp, pyddp.cuda as cuda
        from pyddp import _C
        from _mp import in_forked_child as child

        print(_C.cuda_fork_state(), child(lambda: (cuda.is_available(), _C.cuda_fork_state())))
        print(cuda.is_available(), _C.cuda_fork_state())  # is_available() asks the runtime
        print(child(lambda: (cuda.is_available(), cuda.device_count(), _C.cuda_fork_state())))
        print(child(cuda.current_device))
        print(child(lambda: _C.cuda_host_alloc(8)))
        print(child(lambda: cuda._why_unavailable() == _C.CUDA_AFTER_FORK))
    """)
    assert out[0] == "0 (True, 1)"  # forked before any CUDA use: the child may use it
    assert out[1] == "True 1"
    assert out[2] == "(False, 0, 2)"
    for line in out[3:5]:
        assert line.startswith(("CudaUnavailableError: pyddp.cuda: CUDA is not available: CUDA "
                                "cannot be used in this process", "RuntimeError: CUDA cannot be used"))
        assert AFTER_FORK in line and "'spawn' start method" in line
    assert out[5] == "True"


@pytest.mark.parametrize("first", ["pyddp.cuda.is_available()", "pyddp.cuda.set_device(1)"])
def test_start_processes_with_fork_refuses_after_cuda_use(first):
    out = _run(f"""
        import pyddp, pyddp.cuda, pyddp.multiprocessing as mp
        mp.start_processes(print, nprocs=1, start_method="fork")  # before: forking is fine
        {first}
        try:
            mp.start_processes(print, nprocs=1, start_method="fork")
        except RuntimeError as e:
            print("REFUSED", e)
    """)
    assert out[0] == "0"
    assert out[1].startswith("REFUSED start_method='fork' after pyddp used CUDA in this process")
    assert "cudaErrorInitializationError" in out[1] and "start_method='spawn'" in out[1]


def test_notebook_launcher_refuses_after_cuda_use():
    out = _run("""
        import pyddp, pyddp.cuda
        assert pyddp.notebook_launcher(len, args=("ab",), nprocs=1) == 2
        pyddp.cuda.is_available()
        try:
            pyddp.notebook_launcher(len, args=("ab",), nprocs=1)
        except RuntimeError as e:
            print("REFUSED", e)
    """)
    assert out[-1].startswith("REFUSED notebook_launcher (it forks the ranks) after pyddp used CUDA")
    assert "restart the kernel" in out[-1]


_DATASET = """
import pyddp.cuda


class CudaDataset:
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return pyddp.cuda.current_device() + i
"""


def test_data_loader_workers_that_use_cuda_need_spawn(tmp_path):
    (tmp_path / "cuda_dataset.py").write_text(_DATASET)
    out = _run("""
        import pyddp.cuda
        from pyddp.utils.data import DataLoader
        from cuda_dataset import CudaDataset

        if __name__ == "__main__":
            pyddp.cuda.is_available()
            try:  # forked workers (the default): the worker's error, saying what to do
                list(DataLoader(CudaDataset(), num_workers=1, timeout=30))
            except RuntimeError as e:
                print("FORK", " ".join(str(e).split()))
            batches = DataLoader(CudaDataset(), num_workers=1, timeout=30,
                                 multiprocessing_context="spawn")
            print("SPAWN", [b.tolist() for b in batches])
    """, cwd=str(tmp_path))
    fork = next(line for line in out if line.startswith("FORK"))
    assert AFTER_FORK in fork and "multiprocessing_context='spawn'" in fork
    assert out[-1] == "SPAWN [[0], [1]]"


def test_cuda_calls_without_a_device_leave_fork_allowed():
    """Without a device the runtime initialises nothing, so a later fork loses nothing: calls that go
    through the runtime (a pointer query for an array that names no device, say) must not make the
    fork-based launchers refuse (CI's run of the torch comparisons forked after such a call)."""
    out = _run("""
        import os
        os.environ["FAKECUDA_DEVICES"] = "0"  # the stand-in's machine without a GPU
        import pyddp.cuda as cuda
        from pyddp import _C
        cuda._lib.load_cudart()
        try:
            _C.cuda_pointer_attributes(4096)
        except Exception as e:
            print(type(e).__name__)
        print(cuda.is_available(), _C.cuda_fork_state())
    """)
    assert out[-1] == "False 0", out
