"""Test-session setup shared by every test module.

Multi-rank tests fork their ranks from the pytest process. A multi-threaded OpenMP pool started
here (torch's or BLAS's, used by a reference computation) makes the children's first parallel
region deadlock (GNU libgomp is not fork-safe), so the session runs single-threaded, as CI does.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# Several tests check what Ctrl-C does (SIGINT to a blocking collective, to a launcher). A test
# session started in the background by a non-interactive shell (`cmd &`, nohup) inherits SIGINT
# *ignored*, and an ignored signal stays ignored across exec, so every child would ignore it too.
# Handling it here makes the children start with the default disposition (exec resets handled
# signals), as they would under a terminal or a CI runner.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
