"""Environment variables (issue 35, item 8): every PYDDP_*/TORCH_* variable pyddp reads is parsed in
one place (pyddp/_config.py); a bad value makes init_process_group raise ValueError naming the
variable and what it expects, instead of being taken silently (PYDDP_SHM_CHUNK=abc once ran with
the default; PYDDP_CMA_THRESHOLD=-5 with a huge threshold)."""
import os
import re
import warnings

import pytest

import pyddp.distributed as dist
from pyddp import _config

import _paths

ROOT = _paths.ROOT

# (variable, bad value, words the message must contain besides the name)
BAD = [
    ("PYDDP_SHM_CHUNK", "abc", ["byte count"]),
    ("PYDDP_SHM_CHUNK", "1", ["4K"]),
    ("PYDDP_SHM_CHUNK", "128M", ["64M"]),
    ("PYDDP_SHM_CHUNK", "256KB", ["byte count"]),
    ("PYDDP_SHM_STREAM", "0", ["at least 1"]),
    ("PYDDP_CMA_THRESHOLD", "-5", ["byte count"]),
    ("PYDDP_CMA_THRESHOLD", "1T", ["byte count"]),
    ("PYDDP_CMA_THRESHOLD", "1.5M", ["byte count"]),
    ("PYDDP_CMA", "yes please", ["0", "1"]),
    ("PYDDP_FLIGHT_RECORDER_SIZE", "abc", ["whole number"]),
    ("PYDDP_FLIGHT_RECORDER_SIZE", "-1", ["whole number"]),
    ("PYDDP_FLIGHT_RECORDER_SIZE", "2.5", ["whole number"]),
    ("TORCH_FR_BUFFER_SIZE", "lots", ["whole number"]),
    ("PYDDP_PROGRESS_SPIN", "2", ["0", "1"]),
    ("PYDDP_DDP_OVERLAP", "maybe", ["0 or 1"]),
    ("PYDDP_TRANSPORT", "ib", ["tcp", "shm"]),
    ("PYDDP_DEBUG", "verbose", ["INFO"]),
    ("TORCH_DISTRIBUTED_DEBUG", "LOUD", ["DETAIL"]),
    ("PYDDP_EXIT_TIMEOUT", "-3", ["seconds"]),
    ("PYDDP_NCCL_WATCHDOG_INTERVAL", "0", ["seconds > 0"]),
    ("PYDDP_NCCL_CHECK", "2", ["0 or 1"]),
    ("TORCH_NCCL_BLOCKING_WAIT", "sometimes", ["0 or 1"]),
    ("PYDDP_MPI_CUDA_AWARE", "perhaps", ["0 or 1"]),
    ("PYDDP_RUN_GRACE", "soon", ["seconds"]),
]

# (variable, good value, parsed value): an independent reading of each rule
GOOD = [
    ("PYDDP_SHM_CHUNK", "262144", 262144),
    ("PYDDP_SHM_CHUNK", "256K", 256 << 10),
    ("PYDDP_SHM_CHUNK", "1m", 1 << 20),
    ("PYDDP_SHM_CHUNK", "4096", 4096),
    ("PYDDP_SHM_CHUNK", "64M", 64 << 20),
    ("PYDDP_CMA_THRESHOLD", "0", 0),
    ("PYDDP_CMA_THRESHOLD", "1M", 1 << 20),
    ("PYDDP_CMA_THRESHOLD", "1G", 1 << 30),
    ("PYDDP_CMA_THRESHOLD", " 256 K ", 256 << 10),
    ("PYDDP_FLIGHT_RECORDER_SIZE", "0", 0),
    ("PYDDP_FLIGHT_RECORDER_SIZE", "500", 500),
    ("PYDDP_CMA", "0", False),
    ("PYDDP_DDP_OVERLAP", "off", False),
    ("PYDDP_DDP_OVERLAP", "Yes", True),
    ("PYDDP_TRANSPORT", "TCP", "tcp"),
    ("PYDDP_DEBUG", "info", "INFO"),
    ("PYDDP_EXIT_TIMEOUT", "0.2", 0.2),
    ("PYDDP_RUN_GRACE", "5", 5.0),
]


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("PYDDP_") or name in _config.VARIABLES:
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("var,value,words", BAD, ids=[f"{v}={x}" for v, x, _ in BAD])
def test_bad_value_makes_init_raise_naming_the_variable(clean_env, var, value, words):
    clean_env.setenv(var, value)
    with pytest.raises(ValueError) as info:
        dist.init_process_group("cpu", store=dist.HashStore(), rank=0, world_size=1)
    msg = str(info.value)
    assert var in msg and repr(value) in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    assert not dist.is_initialized()


@pytest.mark.parametrize("var,value,want", GOOD, ids=[f"{v}={x}" for v, x, _ in GOOD])
def test_good_values_parse_as_documented(var, value, want):
    assert _config.get(var, {var: value}) == want


def test_unset_or_empty_gives_the_default():
    # (unset, the C core picks the banks' size from the cores: 1M or 256K)
    assert _config.get("PYDDP_SHM_CHUNK", {}) is None
    assert _config.get("PYDDP_SHM_CHUNK", {"PYDDP_SHM_CHUNK": ""}) is None
    # (unset, the C core takes a quarter of the shared last-level cache)
    assert _config.get("PYDDP_SHM_STREAM", {}) is None
    assert _config.get("PYDDP_FLIGHT_RECORDER_SIZE", {}) == 2000


def test_good_values_let_a_job_start(clean_env):
    for var, value, _ in GOOD:
        if var not in ("PYDDP_TRANSPORT", "PYDDP_DEBUG"):
            clean_env.setenv(var, value)
    dist.init_process_group("cpu", store=dist.HashStore(), rank=0, world_size=1)
    try:
        import numpy as np

        a = np.arange(4.0)
        dist.all_reduce(a)
        assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        dist.destroy_process_group()


def test_a_misspelt_variable_is_warned_about_once(clean_env):
    clean_env.setenv("PYDDP_SHM_CHUNKS", "1M")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _config.check()
        _config.check()
    texts = [str(w.message) for w in seen if "PYDDP_SHM_CHUNKS" in str(w.message)]
    assert len(texts) == 1 and "PYDDP_SHM_CHUNK?" in texts[0], texts


def _sources(top, exts):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
        for f in files:
            if f.endswith(exts):
                path = os.path.join(d, f)
                with open(path, encoding="utf-8") as fh:
                    yield os.path.relpath(path, ROOT), fh.read()


def test_every_variable_read_is_in_the_one_table():
    read = {}
    for rel, text in _sources("csrc", (".c", ".h")):
        for name in re.findall(r'"((?:PYDDP|TORCH)_[A-Z0-9_]+)"', text):  # getenv and helpers
            read.setdefault(name, rel)
    for rel, text in _sources("pyddp", (".py",)):
        if rel.endswith("_config.py"):
            continue
        for name in re.findall(r'"((?:PYDDP|TORCH)_[A-Z0-9_]+)"', text):
            read.setdefault(name, rel)
        # the Python package reads none itself: _config.get does
        bad = re.findall(r'(?:environ\.get\(|getenv\()\s*"((?:PYDDP|TORCH)_[A-Z0-9_]+)"', text)
        bad += re.findall(r'environ\[\s*"((?:PYDDP|TORCH)_[A-Z0-9_]+)"\s*\](?!\s*=[^=])', text)  # not a write
        assert not bad, f"{rel} reads {bad} without pyddp._config"
    missing = {n: r for n, r in read.items() if n not in _config.VARIABLES}
    assert not missing, f"read but not in pyddp/_config.py: {missing}"
    assert {"PYDDP_SHM_CHUNK", "PYDDP_CMA_THRESHOLD", "PYDDP_FLIGHT_RECORDER_SIZE"} <= set(read)


def test_configuration_page_documents_every_variable():
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as fh:
        page = fh.read()
    undocumented = [n for n in _config.VARIABLES if n not in page]
    assert not undocumented, undocumented
