"""Test-session setup shared by every test module.

Multi-rank tests fork their ranks from the pytest process. A multi-threaded OpenMP pool started
here (torch's or BLAS's, used by a reference computation) makes the children's first parallel
region deadlock (GNU libgomp is not fork-safe), so the session runs single-threaded, as CI does.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# The rules file of algorithm choice a developer's own `python -m pyddp.tools.tune` wrote in the per-user
# cache must not change what the tests run (CI has none): every test sees an empty cache and no
# PYDDP_TUNING_FILE unless it sets them itself (tests/distributed/test_tune.py does).
import tempfile  # noqa: E402

import pytest  # noqa: E402

os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="pyddp-test-cache-")
os.environ.pop("PYDDP_TUNING_FILE", None)
os.environ.pop("PYDDP_TUNING", None)
# the first job on a host measures it (PYDDP_TUNING_AUTO): tests run on the built-in constants,
# the same in every worker; tests/distributed/test_tune_first_job.py turns it on
os.environ["PYDDP_TUNING_AUTO"] = "0"

# Several tests check what Ctrl-C does (SIGINT to a blocking collective, to a launcher). A test
# session started in the background by a non-interactive shell (`cmd &`, nohup) inherits SIGINT
# *ignored*, and an ignored signal stays ignored across exec, so every child would ignore it too.
# Handling it here makes the children start with the default disposition (exec resets handled
# signals), as they would under a terminal or a CI runner.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# CI runs the README's test command first in an environment without torch, MPI or MkDocs, then installs
# them and runs again exactly what skipped (.ci/run).  With PYDDP_SKIPPED_FILE set, every skipped test and
# every module skipped as a whole is appended to that file, one pytest node id a line.
_SKIPPED_FILE = os.environ.get("PYDDP_SKIPPED_FILE")


def _record_skip(nodeid):
    with open(_SKIPPED_FILE, "a", encoding="utf-8") as f:
        f.write(nodeid + "\n")


def pytest_runtest_logreport(report):
    if _SKIPPED_FILE and report.skipped and not hasattr(report, "wasxfail"):
        _record_skip(report.nodeid)


def pytest_collectreport(report):
    if _SKIPPED_FILE and report.skipped:
        _record_skip(report.nodeid)


# ------------------------------------------------------------------------------------------ tiers
# `python -m pytest tests` runs the quick tier: every feature, at the sizes and in the variants that
# show it works (a few minutes on 2 cores).  Tests and parameter values marked `full` (the exhaustive
# matrices: every dtype x op x world size, 3- and 4-rank variants, repetitions, the chaos and soak
# files) run with `--full` (what CI runs; docs/testing.md).  `--tier rest` runs only those, for a run
# that already did the quick tier (.ci/run).  PYDDP_TEST_TIER=quick|full|rest sets the default.
# (PYDDP_SLOW_TESTS=1 adds the few tests of an hour or several GB on top of either.)
_TIERS = ("quick", "full", "rest")


def pytest_addoption(parser):
    group = parser.getgroup("pyddp")
    default = os.environ.get("PYDDP_TEST_TIER", "quick")
    group.addoption("--tier", choices=_TIERS, default=default if default in _TIERS else "quick",
                    help="quick (the default): every feature once; full: also the exhaustive "
                         "matrices, chaos and soak (CI); rest: only what quick leaves out")
    group.addoption("--full", action="store_const", const="full", dest="tier",
                    help="the same as --tier full")


# Files whose full-tier tests assert on elapsed times (chaos, failure detection, soak) or interrupt
# the test process itself (which would stop a pytest-xdist worker's session): marked `serial`, so
# that CI runs the rest of the full tier on two workers (-m "not serial") and these in one process
# (-m serial); .ci/run.
SERIAL_FILES = frozenset({
    "tests/distributed/test_chaos.py", "tests/distributed/test_errors_cpu.py",
    "tests/distributed/test_errors_setup.py", "tests/distributed/test_soak.py",
    "tests/distributed/test_interrupt.py", "tests/distributed/test_phases.py",
    "tests/distributed/test_tune.py", "tests/distributed/test_tune_first_job.py",
    "tests/launch/test_elastic.py", "tests/launch/test_lifecycle.py",
    "tests/launch/test_notebook_ranks.py", "tests/launch/test_notebook_ranks_mpi.py",
    "tests/benchmarks/test_benchmarks_smoke.py",
})


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "full: exhaustive variants that run with --full (CI), not in the quick tier")
    config.addinivalue_line(
        "markers", "serial: asserts on elapsed times or interrupts the test process: CI runs it "
                   "in one process (tests/conftest.py SERIAL_FILES)")
    tier = os.environ.get("PYDDP_TEST_TIER")
    if tier is not None and tier not in _TIERS:
        raise pytest.UsageError(f"PYDDP_TEST_TIER={tier!r}: expected one of {', '.join(_TIERS)}")


def pytest_report_header(config):
    tier = config.getoption("tier")
    more = {"quick": "; the exhaustive matrices, chaos and soak run with --full (CI does)",
            "full": " (everything but PYDDP_SLOW_TESTS=1's hour-long repetitions)",
            "rest": " (only what the quick tier leaves out)"}[tier]
    return f"pyddp test tier: {tier}{more}"


@pytest.hookimpl(tryfirst=True)   # before -m selects by marker
def pytest_itemcollected(item):
    rel = os.path.relpath(str(item.path), _ROOT).replace(os.sep, "/")
    if rel in SERIAL_FILES:
        item.add_marker(pytest.mark.serial)


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.hookimpl(trylast=True)   # after the folders' conftests have marked their items
def pytest_collection_modifyitems(config, items):
    tier = config.getoption("tier")
    if tier == "full":
        return
    keep, drop = [], []
    for item in items:
        is_full = item.get_closest_marker("full") is not None
        (drop if is_full == (tier == "quick") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
