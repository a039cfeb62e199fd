"""Test-session setup shared by every test module.

Multi-rank tests fork their ranks from the pytest process. A multi-threaded OpenMP pool started
here (torch's or BLAS's, used by a reference computation) makes the children's first parallel
region deadlock (GNU libgomp is not fork-safe), so the session runs single-threaded, as CI does.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
