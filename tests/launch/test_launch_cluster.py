"""init_process_group() under cluster launchers: Slurm host lists, the launcher variables env:// reads,
and real jobs started the way Slurm, Open MPI and Hydra start them (and by a real mpirun when one is
installed)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import pyddp.distributed as dist
from pyddp.distributed import _cluster
from pyddp.distributed._cluster import expand_hostlist, first_host, mpi_port, resolve, slurm_port
import _paths
from _launch import alive
from _mp import run

pytestmark = pytest.mark.timeout(180)

REPO = _paths.ROOT


# ------------------------------------------------------------------------------ Slurm host lists

@pytest.mark.parametrize("text, hosts", [
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("gpu5", ["gpu5"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("login1,c[1-2],d[5]", ["login1", "c1", "c2", "d5"]),
    ("x[3],y[1-2,5-6]", ["x3", "y1", "y2", "y5", "y6"]),
    (" node[1-2] ", ["node1", "node2"]),
    ("nid[00010-00011]", ["nid00010", "nid00011"]),
    ("host-1.example.com,host-2.example.com", ["host-1.example.com", "host-2.example.com"]),
])
def test_slurm_host_list_expands_like_scontrol(text, hosts):
    assert list(expand_hostlist(text)) == hosts
    assert first_host(text) == hosts[0]


def test_slurm_host_list_expands_lazily():
    t0 = time.monotonic()
    assert first_host("n[1-100000000]") == "n1"
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("text", ["node[01-03", "node]1[", "n[a-b]", "n[3-1]", "", "a,,b", "n[[1]]",
                                  "n[1-]", "n[]", ","])
def test_malformed_slurm_host_list_raises_naming_the_variable(text):
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        list(expand_hostlist(text))


def test_scontrol_agrees_when_installed():
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol (Slurm) is not installed")
    text = "node[01-03,07],gpu5,rack[1-2]-n[8-10]"
    r = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True,
                       timeout=30)
    if r.returncode != 0:
        pytest.skip(f"scontrol failed: {r.stderr.strip()}")
    assert list(expand_hostlist(text)) == r.stdout.split()


# ---------------------------------------------------------------------- which variables env:// reads

SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456",
         "SLURM_JOB_NODELIST": "node[01-04]"}
OMPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_MCA_ess_base_jobid": "459407361",
        "PMIX_NAMESPACE": "459407361"}
HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}


def test_torchrun_variables_come_first_and_nothing_is_derived():
    env = dict(SLURM, **OMPI, RANK="1", WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="29500")
    r = resolve(env)
    assert (r.rank, r.world_size, r.master_addr, r.master_port, r.launcher) == (1, 2, "h", 29500,
                                                                                "torchrun")
    assert r.derived == {}


def test_slurm():
    r = resolve(dict(SLURM))
    assert (r.rank, r.world_size, r.launcher) == (3, 8, "Slurm")
    assert r.master_addr == "node01"
    assert r.master_port == 15000 + 123456 % 10000 == slurm_port("123456") == 18456
    assert r.derived == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node01",
                         "MASTER_PORT": "18456"}


def test_slurm_prefers_the_step_node_list_and_explicit_master_variables():
    env = dict(SLURM, SLURM_STEP_NODELIST="node[03-04]")
    assert resolve(env).master_addr == "node03"
    env.update(MASTER_ADDR="head", MASTER_PORT="4000")
    r = resolve(env)
    assert (r.master_addr, r.master_port) == ("head", 4000)
    assert "MASTER_ADDR" not in r.derived and "MASTER_PORT" not in r.derived


def test_slurm_without_job_id_or_node_list_names_what_is_missing():
    env = dict(SLURM)
    del env["SLURM_JOB_ID"]
    with pytest.raises(ValueError, match="MASTER_PORT.*SLURM_JOB_ID"):
        resolve(env)
    env = dict(SLURM)
    del env["SLURM_JOB_NODELIST"]
    with pytest.raises(ValueError, match="MASTER_ADDR.*SLURM_JOB_NODELIST"):
        resolve(env)
    with pytest.raises(ValueError, match="SLURM_NTASKS"):
        resolve({"SLURM_PROCID": "0"})
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        resolve(dict(SLURM, SLURM_JOB_NODELIST="node[1-"))


def test_open_mpi_on_one_host():
    r = resolve(dict(OMPI))
    assert (r.rank, r.world_size, r.launcher) == (2, 4, "Open MPI")
    assert r.master_addr == "127.0.0.1"
    assert r.master_port == mpi_port("459407361")
    assert 20000 <= r.master_port < 30000
    assert r.derived["LOCAL_RANK"] == "2" and r.derived["LOCAL_WORLD_SIZE"] == "4"


def test_open_mpi_port_falls_back_to_the_pmix_namespace():
    env = dict(OMPI)
    del env["OMPI_MCA_ess_base_jobid"]
    env["PMIX_NAMESPACE"] = "prterun-vm-1234@1"
    assert resolve(env).master_port == mpi_port("prterun-vm-1234@1")
    del env["PMIX_NAMESPACE"]
    with pytest.raises(ValueError, match="MASTER_PORT"):
        resolve(env)


def test_open_mpi_across_hosts_needs_master_addr():
    env = dict(OMPI, OMPI_COMM_WORLD_LOCAL_SIZE="2")
    with pytest.raises(ValueError, match="MASTER_ADDR.*mpirun -x MASTER_ADDR"):
        resolve(env)
    assert resolve(dict(env, MASTER_ADDR="node7")).master_addr == "node7"


def test_open_mpi_inside_a_slurm_allocation_uses_open_mpi_variables():
    # mpirun in an sbatch script: its ranks inherit SLURM_PROCID/SLURM_NTASKS of the batch step or of
    # the daemon srun started, which do not count MPI ranks.
    r = resolve(dict(SLURM, **OMPI))
    assert (r.rank, r.world_size, r.launcher) == (2, 4, "Open MPI")


def test_hydra_before_slurm_and_slurm_before_a_bare_pmi():
    r = resolve(dict(SLURM, **HYDRA, MASTER_PORT="29999"))
    assert (r.rank, r.world_size, r.launcher, r.master_addr) == (1, 2, "MPICH/Hydra", "127.0.0.1")
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE equal to Slurm's: Slurm's rules (node list, port) apply
    r = resolve(dict(SLURM, PMI_RANK="3", PMI_SIZE="8"))
    assert r.launcher == "Slurm" and r.master_addr == "node01"
    # Hydra sets no job id: MASTER_PORT must be given
    with pytest.raises(ValueError, match="MASTER_PORT.*-genv MASTER_PORT"):
        resolve(dict(HYDRA))


def test_bare_pmi():
    r = resolve({"PMI_RANK": "0", "PMI_SIZE": "2", "PMI_LOCAL_SIZE": "2", "MASTER_PORT": "5000"})
    assert (r.rank, r.world_size, r.launcher, r.master_addr) == (0, 2, "PMI", "127.0.0.1")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        resolve({"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_PORT": "5000"})


def test_nothing_set_names_rank_and_arguments_take_precedence():
    # a script run with plain `python`: the variable, and how to start it (pyddp's launcher)
    with pytest.raises(ValueError, match=r"environment variable RANK is not set; .*pyddp-run "
                                         r"--standalone --nproc-per-node N script\.py"):
        resolve({})
    r = resolve({"MASTER_ADDR": "a", "MASTER_PORT": "1"}, rank=0, world_size=1)
    assert (r.rank, r.world_size, r.launcher) == (0, 1, None)
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        resolve({"MASTER_ADDR": "a", "MASTER_PORT": "1"}, rank=0)
    r = resolve(dict(SLURM), rank=5, world_size=6)
    assert (r.rank, r.world_size) == (5, 6)
    assert "RANK" not in r.derived and "WORLD_SIZE" not in r.derived


@pytest.mark.parametrize("var", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"])
def test_malformed_integers_name_the_variable(var):
    with pytest.raises(ValueError, match=var):
        resolve(dict(SLURM, **{var: "x1"}))


def test_open_mpi_job_key_becomes_the_secret_unless_one_is_set():
    env = dict(OMPI, OMPI_MCA_orte_precondition_transports="e601b58f3a0e1269-5131dfd735c0d6c4")
    s = resolve(env).derived["PYDDP_SECRET"]
    assert len(s) == 64 and s == resolve(dict(env, OMPI_COMM_WORLD_RANK="0")).derived["PYDDP_SECRET"]
    assert "PYDDP_SECRET" not in resolve(dict(env, PYDDP_SECRET="mine")).derived
    assert "PYDDP_SECRET" not in resolve(dict(OMPI)).derived


# ------------------------------------------------------------------ real jobs, launcher variables

_CLEAR = {k: None for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                            "MASTER_PORT")}


def _port_is_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _free_slurm_job_id():
    for job in range(424242, 424242 + 10000, 7):
        if _port_is_free(slurm_port(job)):
            return job
    pytest.skip("no free port in Slurm's derived range")


def _free_mpi_job_id():
    for n in range(1000):
        job = str(459407361 + 65536 * n)
        if _port_is_free(mpi_port(job)):
            return job
    pytest.skip("no free port in the MPI derived range")


def _init_and_report(rank, ws):
    dist.init_process_group()   # no arguments: everything from the launcher's variables
    try:
        a = np.arange(6, dtype=np.float64) * (dist.get_rank() + 1)
        dist.all_reduce(a)
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "PYDDP_SECRET")
        return {"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": a.tolist(),
                "env": {k: os.environ.get(k) for k in keys}}
    finally:
        dist.destroy_process_group()


def _check_sums(res, n):
    want = (np.arange(6, dtype=np.float64) * n * (n + 1) / 2).tolist()
    assert [r["rank"] for r in res] == list(range(n))
    assert all(r["size"] == n and r["sum"] == want for r in res)


def test_slurm_job_initializes_from_srun_variables():
    job = _free_slurm_job_id()
    rank_env = {r: {"SLURM_PROCID": r, "SLURM_NTASKS": 3, "SLURM_LOCALID": r, "SLURM_JOB_ID": job,
                    "SLURM_JOB_NODELIST": "localhost,node[2-3]"} for r in range(3)}
    res = run(_init_and_report, 3, init=False, env=_CLEAR, rank_env=rank_env, timeout=60)
    _check_sums(res, 3)
    for r in res:   # derived values are exported for code written for torchrun
        assert r["env"]["MASTER_ADDR"] == "localhost"
        assert r["env"]["MASTER_PORT"] == str(slurm_port(job))
        assert r["env"]["RANK"] == str(r["rank"]) and r["env"]["LOCAL_RANK"] == str(r["rank"])
        assert r["env"]["WORLD_SIZE"] == "3"


def test_open_mpi_job_initializes_from_mpirun_variables():
    job = _free_mpi_job_id()
    rank_env = {r: {"OMPI_COMM_WORLD_RANK": r, "OMPI_COMM_WORLD_SIZE": 2,
                    "OMPI_COMM_WORLD_LOCAL_RANK": r, "OMPI_COMM_WORLD_LOCAL_SIZE": 2,
                    "OMPI_MCA_ess_base_jobid": job,
                    "OMPI_MCA_orte_precondition_transports": "0123456789abcdef-fedcba9876543210",
                    # an enclosing Slurm allocation's variables must not be taken for the ranks'
                    "SLURM_PROCID": 0, "SLURM_NTASKS": 1, "SLURM_JOB_ID": 1,
                    "SLURM_JOB_NODELIST": "elsewhere"} for r in range(2)}
    res = run(_init_and_report, 2, init=False, env=_CLEAR, rank_env=rank_env, timeout=60)
    _check_sums(res, 2)
    assert all(r["env"]["MASTER_ADDR"] == "127.0.0.1" for r in res)
    assert all(r["env"]["MASTER_PORT"] == str(mpi_port(job)) for r in res)
    secrets_ = {r["env"]["PYDDP_SECRET"] for r in res}
    assert len(secrets_) == 1 and None not in secrets_


def test_hydra_job_initializes_from_mpiexec_variables():
    from _mp import free_port

    port = free_port()
    rank_env = {r: {"PMI_RANK": r, "PMI_SIZE": 2, "MPI_LOCALRANKID": r, "MPI_LOCALNRANKS": 2,
                    "MASTER_PORT": port} for r in range(2)}
    res = run(_init_and_report, 2, init=False, env=_CLEAR, rank_env=rank_env, timeout=60)
    _check_sums(res, 2)


# ------------------------------------------------------------------------------------- real mpirun

_MPI_SCRIPT = r'''
import json, os, sys
import numpy as np
import pyddp.distributed as dist

with open(os.path.join(sys.argv[1], f"{os.getpid()}.pid"), "w"):
    pass
dist.init_process_group()          # no arguments
r, n = dist.get_rank(), dist.get_world_size()
x = np.random.default_rng(r).standard_normal(1000)
y = x.copy()
dist.all_reduce(y)
everyone = np.sum([np.random.default_rng(i).standard_normal(1000) for i in range(n)], axis=0)
np.testing.assert_allclose(y, everyone, rtol=1e-12, atol=1e-12)
m = np.array([r], dtype=np.int64)
dist.all_reduce(m, op=dist.ReduceOp.MAX)
assert m[0] == n - 1
with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump({"rank": r, "size": n, "addr": os.environ["MASTER_ADDR"],
               "port": os.environ["MASTER_PORT"], "local_rank": os.environ.get("LOCAL_RANK"),
               "jobid": os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMIX_NAMESPACE"),
               "secret": bool(os.environ.get("PYDDP_SECRET"))}, f)
dist.destroy_process_group()
'''


def _mpirun_command(n):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed")
    try:
        version = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("mpirun --version failed")
    cmd = [mpirun, "-n", str(n)]
    if "Open MPI" in version or "OpenRTE" in version:
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd.append("--oversubscribe")
    return cmd



@pytest.mark.parametrize("n", [2, 3])
def test_mpirun_starts_a_pyddp_job(tmp_path, n):
    cmd = _mpirun_command(n)
    script = tmp_path / "job.py"
    script.write_text(_MPI_SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in _CLEAR and not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL"))
           and k != "PYDDP_SECRET"}
    env["PYTHONPATH"] = os.pathsep.join([REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for attempt in range(2):
        out = tmp_path / f"out{attempt}"
        out.mkdir()
        proc = subprocess.Popen(cmd + [sys.executable, str(script), str(out)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=30)
            pytest.fail(f"mpirun did not finish in 120 s:\n{stdout}\n{stderr}")
        finally:
            pids = [int(p.split(".")[0]) for p in os.listdir(out) if p.endswith(".pid")]
            deadline = time.monotonic() + 30
            while any(alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = [p for p in pids if alive(p)]
            for p in left:
                os.kill(p, signal.SIGKILL)
            assert not left, f"ranks {left} outlived mpirun"
        # The derived port may be taken by something else on a shared machine: try once more.
        if proc.returncode != 0 and "EADDRINUSE" in stderr and attempt == 0:
            continue
        break
    assert proc.returncode == 0, f"mpirun failed ({proc.returncode}):\n{stdout}\n{stderr}"
    res = [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]
    assert [r["rank"] for r in res] == list(range(n)) and all(r["size"] == n for r in res)
    assert all(r["addr"] == "127.0.0.1" for r in res)
    assert len({r["port"] for r in res}) == 1
    if res[0]["jobid"]:
        assert res[0]["port"] == str(mpi_port(res[0]["jobid"]))
    assert [r["local_rank"] for r in res] == [str(i) for i in range(n)]
    assert len(pids) == n


def test_cluster_module_documents_its_order():
    names = [launcher.name for launcher in _cluster.LAUNCHERS]
    assert names == ["torchrun", "Open MPI", "MPICH/Hydra", "Slurm", "PMI"]
