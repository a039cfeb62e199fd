"""A short run of every fuzz target of tests/fuzz/ (the longer campaign: tests/fuzz/run_all.py).

Each target runs in its own process for a fixed number of inputs with a fixed seed, capped at
a few seconds (under the sanitizer build of CI it gets through fewer inputs in that time); a
crash, an unclean exception, a hang or an allocation sized by a length field fails it, and the
failure shows the crashing input.  Skips when atheris is not installed."""
import os
import sys

import pytest

import _paths

pytest.importorskip("atheris")

sys.path.insert(0, os.path.join(_paths.TESTS, "fuzz"))
import run_all  # noqa: E402

# inputs per target: each takes a few seconds on a quiet machine
RUNS = {
    "store_server": 3000,
    "store_client": 2000,
    "handshake": 2000,
    "tcp_frames": 1000,
    "shm": 10000,
    "object_envelope": 10000,
    "array_descriptions": 10000,
}
SECONDS = 8


def test_every_target_is_run_here():
    assert sorted(RUNS) == run_all.TARGETS


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_fuzz_target(name, tmp_path, request):
    # the quick tier: a quarter of the inputs, at most 2 s a target; --full the whole short run
    quick = request.config.getoption("tier") == "quick"
    runs, seconds = (max(RUNS[name] // 4, 1), 2) if quick else (RUNS[name], SECONDS)
    ok, inputs, took, tail = run_all.run_target(name, runs, seconds, None, str(tmp_path),
                                                seed=12345, timeout=90)
    assert ok, f"fuzz target {name} failed after {inputs} inputs:\n{tail}"
    assert inputs > 0, tail
