"""pyddp.run (torchrun) with real processes: environment, output, failures, restarts, signals, two nodes.

Each test starts ``python -m pyddp.run`` and reads what the workers wrote into files; every wait has a
deadline (tests/_launch.py) and every test checks that no worker (or worker's child) outlives it.
"""
import os
import re
import signal
import socket
import time

import pytest

from _launch import (alive, assert_all_gone, finish, launcher_env, read_json_files, run, start,
                     wait_for, write_script)

pytestmark = pytest.mark.timeout(120)

ENV_KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_ERROR_FILE", "PYDDP_SECRET", "OMP_NUM_THREADS", "PYDDP_NODE_ID",
            "THP_MEM_ALLOC_ENABLE"]

ENV_SCRIPT = f"""
import json, os, sys
d = {{k: os.environ.get(k) for k in {ENV_KEYS!r}}}
d.update(argv=sys.argv, path0=sys.path[0], name=__name__, file=__file__)
with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(d, f)
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_every_worker_gets_torchruns_environment(tmp_path):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    port = _free_port()
    cache = tmp_path / "cache"   # the user's cache directory, where the OMP note's stamp goes
    rc, _, err = run(["--nproc-per-node", 3, "--rdzv-endpoint", f"127.0.0.1:{port}", "--role", "trainer",
                      "--max_restarts", 2, script, out, "--lr", "0.1"], env=launcher_env(XDG_CACHE_HOME=cache))
    assert rc == 0, err
    seen = read_json_files(out, n=3)
    secrets = {d["PYDDP_SECRET"] for d in seen.values()}
    assert len(secrets) == 1 and re.fullmatch(r"[0-9a-f]{64}", secrets.pop())
    for rank, d in seen.items():
        assert d["RANK"] == d["LOCAL_RANK"] == d["ROLE_RANK"] == str(rank)
        assert d["WORLD_SIZE"] == d["LOCAL_WORLD_SIZE"] == d["ROLE_WORLD_SIZE"] == "3"
        assert (d["GROUP_RANK"], d["GROUP_WORLD_SIZE"], d["ROLE_NAME"]) == ("0", "1", "trainer")
        assert (d["MASTER_ADDR"], d["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert (d["TORCHELASTIC_RESTART_COUNT"], d["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "2")
        assert d["TORCHELASTIC_RUN_ID"] == "none"
        assert d["TORCHELASTIC_ERROR_FILE"].endswith(os.path.join(str(rank), "error.json"))
        assert d["OMP_NUM_THREADS"] == "1"
        assert d["THP_MEM_ALLOC_ENABLE"] == "1"   # torch's large tensors on huge pages
        # As `python -u env.py OUT --lr 0.1` would see it.
        assert d["argv"] == [script, str(out), "--lr", "0.1"]
        assert (d["name"], d["file"], d["path0"]) == ("__main__", script, str(tmp_path))
    assert err.count("OMP_NUM_THREADS=1") == 1, err

    # The note is said once per machine: the next launch sets the variable without a word.
    for f in out.iterdir():
        f.unlink()
    rc, _, err = run(["--standalone", "--nproc_per_node", 2, script, out], env=launcher_env(XDG_CACHE_HOME=cache))
    assert rc == 0, err
    assert [d["OMP_NUM_THREADS"] for d in read_json_files(out, n=2).values()] == ["1", "1"]
    assert "OMP_NUM_THREADS" not in err, err

    # A second job gets another secret; a secret and OMP_NUM_THREADS given by the user are kept;
    # --standalone picks a free port and a run id.
    for f in out.iterdir():
        f.unlink()
    rc, _, err = run(["--standalone", "--nproc_per_node", 2, script, out],
                     env=launcher_env(PYDDP_SECRET="s3cret", OMP_NUM_THREADS=3, THP_MEM_ALLOC_ENABLE=0))
    assert rc == 0, err
    seen = read_json_files(out, n=2)
    for d in seen.values():
        assert (d["PYDDP_SECRET"], d["OMP_NUM_THREADS"], d["THP_MEM_ALLOC_ENABLE"]) == ("s3cret", "3", "0")
        assert d["MASTER_ADDR"] == "127.0.0.1" and d["MASTER_PORT"] != "29500"
        assert re.fullmatch(r"[0-9a-f-]{36}", d["TORCHELASTIC_RUN_ID"])
    assert "OMP_NUM_THREADS" not in err


TEE_SCRIPT = r"""
import os, sys
r = os.environ["RANK"]
for i in range(200):
    print(f"{r}-{i}-" + r * 4000)
    print(f"{r}-{i}-" + r * 2500, file=sys.stderr)
sys.stdout.write("unfinished-" + r)
"""


def test_tee_prefixes_whole_lines_that_never_interleave(tmp_path):
    script = write_script(tmp_path, "tee.py", TEE_SCRIPT)
    logs = tmp_path / "logs"
    rc, out, err = run(["--nproc-per-node", 3, "--tee", 3, "--log-dir", logs, script])
    assert rc == 0, err[-2000:]
    for text, width in ((out, 4000), (err, 2500)):
        counts = {}
        for line in text.splitlines():
            if line.startswith("pyddp.run:"):
                continue
            m = re.fullmatch(r"\[rank(\d)\]: (?:(\d)-(\d+)-(\d+)|unfinished-(\d))", line)
            assert m, f"garbled line: {line[:120]!r}..."
            r = m.group(1)
            if m.group(5) is not None:
                assert m.group(5) == r
                continue
            assert m.group(2) == r and m.group(4) == r * width, f"mixed line from rank {r}: {line[:120]!r}"
            counts[r] = counts.get(r, 0) + 1
        assert counts == {"0": 200, "1": 200, "2": 200}
    assert "[rank2]: unfinished-2\n" in out
    # The log files hold each rank's output as it was written, without prefixes.
    (run_dir,) = logs.iterdir()
    text = (run_dir / "attempt_0" / "1" / "stdout.log").read_text()
    assert text.startswith("1-0-1111") and text.endswith("unfinished-1")


def test_redirects_and_local_ranks_filter(tmp_path):
    script = write_script(tmp_path, "say.py", "import os, sys\nr = os.environ['RANK']\n"
                                              "print('out-' + r)\nprint('err-' + r, file=sys.stderr)\n")
    logs = tmp_path / "logs"
    rc, out, err = run(["--nproc-per-node", 2, "-r", 1, "--log-dir", logs, script])
    assert rc == 0, err
    assert "out-" not in out and "err-0" in err and "err-1" in err
    (run_dir,) = logs.iterdir()
    assert (run_dir / "attempt_0" / "1" / "stdout.log").read_text() == "out-1\n"

    rc, out, err = run(["--nproc-per-node", 2, "--tee", 3, "--local-ranks-filter", 0, script])
    assert rc == 0, err
    assert out.splitlines() == ["[rank0]: out-0"], out
    assert "err-1" not in err and "[rank0]: err-0" in err
    # Rank 1's output is kept in an announced log directory.
    m = re.search(r"worker logs are written to (\S+)", err)
    assert m, err
    try:
        assert open(os.path.join(m.group(1), "attempt_0", "1", "stdout.log")).read() == "out-1\n"
    finally:
        import shutil
        shutil.rmtree(m.group(1), ignore_errors=True)


def test_module_and_no_python(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # one write per line: under `python -u` print's pieces are separate writes, which two ranks
    # sharing the pipe can interleave mid-line
    (pkg / "job.py").write_text("import os, sys\nsys.stdout.write(f\"module {os.environ['RANK']} "
                                "{sys.argv[1:]} {__name__}\\n\")\n")
    rc, out, err = run(["--nproc-per-node", 2, "-m", "pkg.job", "x"], cwd=tmp_path)
    assert rc == 0, err
    assert sorted(out.splitlines()) == ["module 0 ['x'] __main__", "module 1 ['x'] __main__"]
    rc, out, err = run(["--nproc-per-node", 2, "--no-python", "sh", "-c", 'echo "sh $RANK/$WORLD_SIZE"'])
    assert rc == 0, err
    assert sorted(out.splitlines()) == ["sh 0/2", "sh 1/2"]


FAIL_SCRIPT = r"""
import os, signal, subprocess, sys, time
rank = int(os.environ["RANK"])
child = subprocess.Popen(["sleep", "60"])
with open(os.path.join(sys.argv[1], f"pid{rank}"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
if rank == 1:
    while len([n for n in os.listdir(sys.argv[1]) if n.startswith("pid")]) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.01)
    mode = sys.argv[2]
    if mode == "raise":
        def inner():
            raise ValueError("boom from rank 1")
        inner()
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "exit":
        sys.exit(3)
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if rank == 1:
        sys.exit(5)
time.sleep(60)
"""


def _pids(directory):
    pids = []
    for name in os.listdir(directory):
        if name.startswith("pid"):
            pids += [int(p) for p in open(os.path.join(directory, name)).read().split()]
    return pids


@pytest.mark.parametrize("mode", ["raise", "sigkill", "exit"])
def test_failure_stops_the_others_and_names_the_first_failed_rank(tmp_path, mode):
    script = write_script(tmp_path, "fail.py", FAIL_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    rc, _, err = run(["--nproc-per-node", 3, script, out, mode])
    assert time.monotonic() - t0 < 30, "the other workers were not stopped"
    assert rc == 1, err
    summary = err[err.index("=" * 20):]
    assert f"{script} FAILED" in summary
    assert "rank      : 1 (local_rank: 1)" in summary
    if mode == "raise":
        assert "exitcode  : 1 (pid:" in summary
        assert "ValueError: boom from rank 1" in summary
        assert re.search(r'File ".*fail\.py", line \d+, in inner', summary), summary
        assert "bootstrap.py" not in summary and "runpy" not in summary
        # The worker's own stderr shows the same trimmed traceback, as `python fail.py` would.
        assert "bootstrap.py" not in err
    elif mode == "sigkill":
        assert "exitcode  : -9" in summary and "signal    : SIGKILL" in summary
    else:
        assert "exitcode  : 3 (pid:" in summary and "SystemExit: 3" in summary
    assert "<NO_OTHER_FAILURES>" in summary
    assert_all_gone(_pids(out))


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    script = write_script(tmp_path, "fail.py", FAIL_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    rc, _, err = run(["--nproc-per-node", 2, script, out, "stubborn"], env=launcher_env(PYDDP_RUN_GRACE=1))
    elapsed = time.monotonic() - t0
    assert rc == 1 and "exitcode  : 5" in err, err
    assert 1.0 <= elapsed < 20, elapsed
    assert_all_gone(_pids(out))


COLLECTIVE_FAIL = r"""
import os
import numpy as np
import pyddp.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise RuntimeError("rank 1 gives up")
x = np.ones(4)
dist.all_reduce(x)      # rank 0 learns that rank 1 is gone and raises in turn
"""


def test_root_cause_is_the_rank_that_failed_not_the_ranks_it_broke(tmp_path):
    script = write_script(tmp_path, "coll.py", COLLECTIVE_FAIL)
    rc, _, err = run(["--standalone", "--nproc-per-node", 2, script])
    assert rc == 1, err
    root = err[err.index("Root Cause"):err.index("Other Failures")]
    assert "rank      : 1 (local_rank: 1)" in root and "RuntimeError: rank 1 gives up" in root, err


SLOW_EXIT_FAIL = r"""
import atexit, time
import numpy as np
import pyddp.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    atexit.register(time.sleep, 60)     # still exiting when the launcher stops the job
    raise RuntimeError("rank 1 gives up")
x = np.ones(4)
dist.all_reduce(x)
"""


def test_a_rank_that_raised_and_was_stopped_while_exiting_is_reported_by_its_exception(tmp_path):
    # The launcher waits a few seconds for a rank that recorded an exception, then stops it with
    # SIGTERM: the headline names the exception it raised, not the launcher's signal.
    script = write_script(tmp_path, "slow.py", SLOW_EXIT_FAIL)
    rc, _, err = run(["--standalone", "--nproc-per-node", 2, script])
    assert rc == 1, err
    head = [line for line in err.splitlines() if "FAILED: rank" in line]
    assert head and "rank 1 first, raising RuntimeError: rank 1 gives up (then stopped by the " \
        "launcher with SIGTERM while it was still exiting)" in head[0], err


RESTART_SCRIPT = r"""
import os, sys, time
count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = os.environ["RANK"]
open(os.path.join(sys.argv[1], f"attempt{count}-rank{rank}"), "w").write(os.environ["PYDDP_SECRET"])
if rank == "1" and count < int(sys.argv[2]):
    while not os.path.exists(os.path.join(sys.argv[1], f"attempt{count}-rank0")):
        time.sleep(0.01)
    raise RuntimeError(f"failing at restart {count}")
"""


def test_restarts_count_up_to_max_restarts(tmp_path):
    script = write_script(tmp_path, "restart.py", RESTART_SCRIPT)
    out = tmp_path / "ok"
    out.mkdir()
    rc, _, err = run(["--nproc-per-node", 2, "--max-restarts", 3, script, out, 2])
    assert rc == 0, err
    assert sorted(os.listdir(out)) == [f"attempt{a}-rank{r}" for a in range(3) for r in range(2)]
    assert err.count("restarting all 2 workers") == 2, err
    assert len({(out / n).read_text() for n in os.listdir(out)}) == 1, "one secret per job"

    out = tmp_path / "fail"
    out.mkdir()
    rc, _, err = run(["--nproc-per-node", 2, "--max-restarts", 1, script, out, 99])
    assert rc == 1, err
    assert sorted(os.listdir(out)) == [f"attempt{a}-rank{r}" for a in range(2) for r in range(2)]
    assert "after 1 restart, --max-restarts 1" in err
    assert "RuntimeError: failing at restart 1" in err[err.index("Root Cause"):]


SLEEP_SCRIPT = r"""
import os, signal, subprocess, sys, time
rank = os.environ["RANK"]
child = subprocess.Popen(["sleep", "60"])
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
with open(os.path.join(sys.argv[1], f"errorfile{rank}"), "w") as f:
    f.write(os.environ["TORCHELASTIC_ERROR_FILE"])
with open(os.path.join(sys.argv[1], f"pid{rank}"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
try:
    time.sleep(60)
except KeyboardInterrupt:
    open(os.path.join(sys.argv[1], f"interrupted{rank}"), "w").close()
    raise
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_the_launcher_leaves_no_process_behind(tmp_path, sig):
    script = write_script(tmp_path, "sleep.py", SLEEP_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = start(["--nproc-per-node", 2, script, out, "plain"])
    try:
        wait_for(lambda: len(_pids(out)) == 4, 30, "the workers to start")
        pids = _pids(out)
        proc.send_signal(sig)
        rc, _, err = finish(proc, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == -sig, err                  # the launcher dies of the signal, as a shell expects
    assert_all_gone(pids)
    if sig == signal.SIGINT:
        # Ctrl-C reached the scripts as KeyboardInterrupt (they may clean up), not as a kill.
        assert sorted(n for n in os.listdir(out) if n.startswith("interrupted")) == ["interrupted0",
                                                                                     "interrupted1"]
    if sig != signal.SIGKILL:
        assert f"received {sig.name}" in err
    # The launcher's private directory of error files goes too (without --log-dir), even after SIGKILL.
    private = os.path.dirname(os.path.dirname(os.path.dirname((out / "errorfile0").read_text())))
    wait_for(lambda: not os.path.exists(private), 10, f"{private} to be removed")


def test_a_second_ctrl_c_kills_at_once(tmp_path):
    script = write_script(tmp_path, "sleep.py", SLEEP_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = start(["--nproc-per-node", 2, script, out, "stubborn"])   # PYDDP_RUN_GRACE: 30 s
    try:
        wait_for(lambda: len(_pids(out)) == 4, 30, "the workers to start")
        pids = _pids(out)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None and all(alive(p) for p in pids[::2]), "SIGINT-ignoring workers stopped?"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc, _, err = finish(proc, timeout=20)
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == -signal.SIGINT, err
    assert_all_gone(pids)


NODE_SCRIPT = r"""
import json, os, sys
import numpy as np
import pyddp.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
x = np.full(1 << 16, rank + 1.0, dtype=np.float32)
dist.all_reduce(x)
dist.destroy_process_group()
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "PYDDP_NODE_ID", "PYDDP_SECRET"]
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(dict({k: os.environ[k] for k in keys}, sum=float(x[0]), ok=bool((x == x[0]).all())), f)
"""


def test_two_launchers_as_two_nodes_run_an_all_reduce(tmp_path):
    script = write_script(tmp_path, "node.py", NODE_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    port = _free_port()
    procs = [start(["--nnodes", 2, "--node-rank", node, "--nproc-per-node", 2, "--master-addr", "127.0.0.1",
                    "--master-port", port, script, out],
                   env=launcher_env(PYDDP_NODE_ID=f"node{'AB'[node]}", PYDDP_SECRET="shared-by-both-nodes",
                                    XDG_CACHE_HOME=tmp_path / f"cache{node}"))
             for node in (0, 1)]
    try:
        results = [finish(p, timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rc, _, err in results:
        assert rc == 0, err
    # the OMP_NUM_THREADS note once per job: node 0 says it, node 1 (a fresh machine too) does not
    assert [err.count("OMP_NUM_THREADS=1") for _, _, err in results] == [1, 0], results
    seen = read_json_files(out, n=4)
    for rank, d in seen.items():
        node = rank // 2
        assert d["sum"] == 1 + 2 + 3 + 4 and d["ok"]
        assert (d["RANK"], d["LOCAL_RANK"], d["WORLD_SIZE"], d["LOCAL_WORLD_SIZE"]) == (
            str(rank), str(rank % 2), "4", "2")
        assert (d["GROUP_RANK"], d["GROUP_WORLD_SIZE"], d["PYDDP_NODE_ID"]) == (str(node), "2", f"node{'AB'[node]}")
        assert d["PYDDP_SECRET"] == "shared-by-both-nodes"


def test_several_nodes_need_a_shared_secret(tmp_path):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    rc, _, err = run(["--nnodes", 2, "--node-rank", 0, script, tmp_path])
    assert rc == 2, err
    assert "PYDDP_SECRET" in err and "export PYDDP_SECRET=" in err and "every node" in err
    assert not list(tmp_path.glob("rank*.json"))


def test_a_port_in_use_is_named_with_a_way_out(tmp_path):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, _, err = run(["--nproc-per-node", 2, "--master-port", port, script, tmp_path])
    assert rc == 1, err
    assert f"127.0.0.1:{port}" in err and "already in use" in err
    assert "--standalone" in err and "--master-port" in err
    assert not list(tmp_path.glob("rank*.json")), "no worker may start"


ABORT_SCRIPT = r"""
import os, sys
if os.environ["RANK"] == sys.argv[1]:
    def deep_in_the_script():
        os.abort()
    deep_in_the_script()
print("rank", os.environ["RANK"], "done")
"""


def test_workers_leave_no_resource_warning_and_a_crash_shows_its_stack(tmp_path):
    # With warnings shown (-W default, -X dev) Python reports every file object left open at exit; the
    # bootstrap keeps faulthandler's file open for the whole run, so it must not be a file object.
    # (Not -X dev itself in the workers: it turns faulthandler on, and then the bootstrap opens no file.)
    script = write_script(tmp_path, "abort.py", ABORT_SCRIPT)
    env = launcher_env(PYTHONWARNINGS="default")
    rc, out, err = run(["--nproc-per-node", 2, script, "-1"], env=env)
    assert rc == 0, err
    assert sorted(out.splitlines()) == ["rank 0 done", "rank 1 done"]
    assert "ResourceWarning" not in err, err
    # ... and the file still serves its purpose: a rank killed by SIGABRT shows its Python stack.
    rc, out, err = run(["--nproc-per-node", 2, script, "1"], env=env)
    assert rc == 1
    assert "SIGABRT" in err and "deep_in_the_script" in err, err
    assert "ResourceWarning" not in err, err
