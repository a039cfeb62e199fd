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

os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="pyddp-test-cache-")
os.environ.pop("PYDDP_TUNING_FILE", None)
os.environ.pop("PYDDP_TUNING", None)

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
