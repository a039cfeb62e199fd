"""The GPU tests run only where a CUDA device is usable (seen by torch or CuPy, asked in a child process:
see _gpu.machine); elsewhere every test here is skipped, saying why. Nothing here imports torch, CuPy or
JAX, so collection works without them."""
import os

import pytest

from _gpu import machine

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if os.path.dirname(str(item.path)) == HERE]
    if not mine:
        return  # no GPU test selected: no probe
    why = machine()["why"]
    if why:
        skip = pytest.mark.skip(reason=f"GPU tests: {why}")
        for item in mine:
            item.add_marker(skip)
