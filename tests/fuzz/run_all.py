"""Run every fuzz target of tests/fuzz/ in turn: the longer campaign.

    python tests/fuzz/run_all.py --minutes 10            # 10 minutes per target
    python tests/fuzz/run_all.py --runs 20000 --only shm  # a number of inputs, some targets
    python tests/fuzz/run_all.py --minutes 10 --corpus fuzz-corpus   # keep and reuse corpora

Each target runs in its own process (libFuzzer through atheris: coverage of the Python harness
guides the inputs; the C parsers are not instrumented, they run on every input).  Crashing
inputs are written under --artifacts (reproduce one with `python tests/fuzz/fuzz_X.py FILE`).
Prints a table of inputs executed per target and exits nonzero if any target failed.
Run it with the AddressSanitizer build to catch memory errors in C as well (see the README).
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = sorted(os.path.basename(p)[len("fuzz_"):-3]
                 for p in glob.glob(os.path.join(HERE, "fuzz_*.py")))


def run_target(name, runs, seconds, corpus, artifacts, seed, quiet=True, timeout=None):
    """(ok, inputs, wall seconds, output tail) of one target."""
    cmd = [sys.executable, os.path.join(HERE, f"fuzz_{name}.py"),
           f"-artifact_prefix={artifacts}{os.sep}", "-print_final_stats=1"]
    if runs:
        cmd.append(f"-runs={runs}")  # libFuzzer's own exit: fine under ASan, too
    if seconds:
        cmd.append(f"-max_total_time={int(seconds)}")
    if seed is not None:
        cmd.append(f"-seed={seed}")
    if corpus:
        d = os.path.join(corpus, name)
        os.makedirs(d, exist_ok=True)
        cmd.append(d)
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(HERE))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace", timeout=timeout)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        out += f"\n[run_all: {name} killed after {timeout} s]"
        rc = -9
    took = time.monotonic() - t0
    m = re.findall(r"stat::number_of_executed_units:\s*(\d+)", out) or \
        re.findall(r"Done (\d+) (?:runs )?in", out)
    inputs = int(m[-1]) if m else 0
    if not quiet:
        print(out)
    return rc == 0, inputs, took, out[-6000:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=0, help="time per target")
    ap.add_argument("--runs", type=int, default=0, help="inputs per target")
    ap.add_argument("--only", nargs="*", default=None, choices=TARGETS, help="targets to run")
    ap.add_argument("--corpus", default=None, help="directory of corpora to keep and reuse")
    ap.add_argument("--artifacts", default=None, help="where crashing inputs go")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if not a.minutes and not a.runs:
        a.minutes = 1
    artifacts = a.artifacts or tempfile.mkdtemp(prefix="pyddp-fuzz-")
    os.makedirs(artifacts, exist_ok=True)
    failed = []
    print(f"{'target':<22}{'inputs':>10}{'seconds':>10}  result")
    for name in a.only or TARGETS:
        ok, n, took, tail = run_target(name, a.runs, a.minutes * 60, a.corpus, artifacts, a.seed,
                                       quiet=not a.verbose)
        print(f"{name:<22}{n:>10}{took:>10.0f}  {'ok' if ok else 'FAILED'}", flush=True)
        if not ok:
            failed.append(name)
            print(tail)
    print(f"artifacts (crashing inputs, if any): {artifacts}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
