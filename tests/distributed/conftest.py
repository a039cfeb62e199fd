"""Tiers (tests/conftest.py) of the collective matrices whose parameters come from two places (the
transport fixture and a test's own parametrize), which a mark on one parameter cannot express."""
from _tiers import FULL


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not item.nodeid.startswith("tests/distributed/test_coll_cpu.py::"):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("transport") != "tcp":
            continue
        name = item.originalname or item.name
        # over TCP the quick tier runs the small arrays of every kind; the large arrays (rings,
        # pipelined chunks), the 3 MiB all_reduce and the monitored barrier's 5 s wait are --full's
        if params.get("which") == "large" or "3mib" in name or "monitored_barrier_names" in name:
            item.add_marker(FULL)
