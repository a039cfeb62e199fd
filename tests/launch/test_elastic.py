"""In-process recovery (pyddp.elastic under pyddp-run --elastic): workers killed mid-training, the
job finishes with the same parameters as a fault-free run and every sample seen once per epoch."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np
import pytest

import pyddp

import _paths
from _tiers import FULL

HERE = _paths.TESTS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
SCRIPT = os.path.join(HERE, "_elastic_train.py")
EPOCHS, N = 3, 120


def launch(nproc, *opts, kill="", pause=0.0, timeout=180, script=SCRIPT, env=None):
    out = tempfile.mkdtemp(prefix="pyddp-elastic-test-")
    env = dict(os.environ, ELASTIC_KILL=kill, ELASTIC_STEP_SLEEP=str(pause), ELASTIC_OUT=out,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    env.pop("PYDDP_SECRET", None)
    cmd = [sys.executable, "-m", "pyddp.run", "--elastic", "--standalone", "--nproc-per-node",
           str(nproc), *opts, script]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    records = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            records.append(json.load(f))
    shutil.rmtree(out, ignore_errors=True)
    results = [r for r in records if "id" in r]
    killed = sorted((r for r in records if "killed" in r), key=lambda r: r["at"])
    return p, results, killed


@pytest.fixture(scope="module")
def fault_free():
    p, res, _ = launch(4)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(res) == 4
    return res[0]["w"]


def _check(res, ref, steps=EPOCHS * N // 12):
    for r in res:
        assert r["w"] == ref  # bit-equal: integer gradient sums, the same global batches
        assert r["steps"] == steps  # no step lost beyond the rolled-back ones
        assert r["seen"] == [EPOCHS] * N  # every sample once per epoch in the committed history


def test_fault_free_run_agrees_on_every_rank(fault_free):
    assert len(fault_free) == 5 and any(fault_free)


def test_killed_workers_are_restarted_and_rejoin_at_the_next_commit(fault_free):
    # 0.25 s a step: the replacements (a fresh interpreter each) are ready before the end
    p, res, killed = launch(4, "--max-restarts", "2", kill="4:1,8:2", pause=0.25)
    assert p.returncode == 0, p.stdout + p.stderr
    assert [k["killed"] for k in killed] == ["0.1.1", "0.2.2"]
    assert p.stderr.count("restarted it") == 2, p.stderr
    # node 0's workers: <node>.<local rank>.<spawn>; spawns 4 and 5 are the replacements
    assert sorted(r["id"] for r in res) == ["0.0.0", "0.1.4", "0.2.5", "0.3.3"]
    _check(res, fault_free)
    survivor = next(r for r in res if r["id"] == "0.0.0")
    gens = [e[0][0] for e in survivor["entries"]]
    assert gens[0] == 0 and len(gens) >= 3 and gens == sorted(gens), survivor["entries"]
    joiner = next(r for r in res if r["id"] == "0.1.4")
    assert joiner["entries"][0][1] >= 4  # it started from a peer's commit, not from step 0
    assert joiner["entries"][0][0][2] == 4  # in a generation with the survivors


def test_the_job_goes_on_without_restarts_and_without_rank_0(fault_free):
    p, res, killed = launch(3, "--max-restarts", "0", kill="7:0")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no restart left" in p.stderr and "generation 1: 2 workers" in p.stderr
    assert sorted(r["id"] for r in res) == ["0.1.1", "0.2.2"]
    _check(res, fault_free)


def test_below_min_nproc_the_job_fails_with_the_summary():
    p, res, _ = launch(2, "--max-restarts", "0", "--min-nproc", "2", kill="5:1")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "SIGKILL" in p.stderr


def test_a_worker_declared_dead_is_refused(monkeypatch):
    import pyddp.distributed as dist
    import pyddp.elastic as elastic

    monkeypatch.setenv("PYDDP_SECRET", "s3cret")
    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    server.set("elastic/members/0", json.dumps(["0", "1"]))
    server.set("elastic/dead/7", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv(elastic.ENV_ID, "7")
    state = elastic.State(x=1)
    called = []
    with pytest.raises(elastic.RemovedFromJob, match="worker 7 was declared dead"):
        elastic.run(timeout=10)(lambda s: called.append(1))(state)
    assert called == [] and not dist.is_initialized()


def test_state_commit_restore_and_bad_arguments():
    import pyddp.elastic as elastic

    class Obj:
        def __init__(self):
            self.v = [1]

        def state_dict(self):
            return {"v": self.v}

        def load_state_dict(self, sd):
            self.v = sd["v"]

    s = elastic.State(o=Obj(), epoch=0)
    s.o.v.append(2)
    s.epoch = 3
    s.restore()  # back to the state at construction (deep copies)
    assert s.o.v == [1] and s.epoch == 0
    s.epoch = 5
    s.commit()
    s.epoch = 6
    s.restore()
    assert s.epoch == 5
    with pytest.raises(AttributeError, match="no item 'nope'"):
        s.nope
    with pytest.raises(TypeError, match="must be an elastic.State"):
        elastic.run(lambda st: None)(object())
    with pytest.raises(ValueError, match="batch_size >= 1"):
        elastic.ElasticSampler(10, s, batch_size=0)


def test_sampler_deals_the_rest_of_the_epoch_to_the_current_ranks():
    import pyddp.distributed as dist
    import pyddp.elastic as elastic

    s = elastic.State(epoch=1, batch=0)
    for size in (1,):
        dist.init_process_group("cpu", store=dist.HashStore(), rank=0, world_size=size,
                                timeout=timedelta(seconds=10))
        try:
            smp = elastic.ElasticSampler(25, s, batch_size=10, seed=4)
            out = []
            for idx in smp:
                out.append(idx)
                s.batch += 1
            assert len(smp) == 3 and [len(x) for x in out] == [10, 10, 5]
            assert np.array_equal(np.sort(np.concatenate(out)), np.arange(25))
            assert np.array_equal(np.concatenate(out), np.random.default_rng(5).permutation(25))
        finally:
            dist.destroy_process_group()


def test_options_refuse_what_elastic_does_not_cover(capsys):
    from pyddp import run

    def config(argv):
        return run.config_from_args(run.parse_args(argv))

    with pytest.raises(SystemExit):
        config(["--nnodes", "1:2", "--master-addr", "127.0.0.1", SCRIPT])
    err = capsys.readouterr().err
    assert "a range (1:2) needs --rdzv-backend c10d" in err and "--elastic" in err
    with pytest.raises(SystemExit):
        config(["--elastic", "--nnodes", "3:2", "--master-addr", "127.0.0.1", SCRIPT])
    assert "MAX is below MIN" in capsys.readouterr().err
    cfg = config(["--elastic", "--nnodes", "1:3", "--master-addr", "127.0.0.1", SCRIPT])
    assert (cfg.nnodes, cfg.max_nodes, cfg.node_rank) == (1, 3, 0)
    # torchrun's device counts: 'gpu' needs a visible CUDA device, 'auto' falls back to the CPUs
    import pyddp.cuda

    if pyddp.cuda.device_count() == 0:
        with pytest.raises(SystemExit):
            config(["--nproc-per-node", "gpu", SCRIPT])
        assert "'gpu': no CUDA device is visible" in capsys.readouterr().err
        assert config(["--nproc-per-node", "auto", SCRIPT]).nproc_per_node == len(
            os.sched_getaffinity(0))
    else:
        n = pyddp.cuda.device_count()
        assert config(["--nproc-per-node", "gpu", SCRIPT]).nproc_per_node == n
        assert config(["--nproc-per-node", "auto", SCRIPT]).nproc_per_node == n
    with pytest.raises(SystemExit):
        config(["--elastic", "--nproc-per-node", "2", "--min-nproc", "3", SCRIPT])
    assert "--min-nproc: 3 is more than --nproc-per-node 2" in capsys.readouterr().err
    cfg = config(["--elastic", "--nproc-per-node", "2", "--min-nproc", "2", SCRIPT])
    assert cfg.elastic and cfg.min_nproc == 2


def test_no_generation_from_the_launcher_is_an_error_not_a_wait(monkeypatch):
    import pyddp.distributed as dist
    import pyddp.elastic as elastic

    monkeypatch.setenv("PYDDP_SECRET", "s3cret")
    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv(elastic.ENV_ID, "0")
    t0 = time.monotonic()
    with pytest.raises(elastic.ElasticError, match="no generation 0 from the launcher within 2 s"):
        elastic.run(timeout=2)(lambda s: None)(elastic.State())
    assert time.monotonic() - t0 < 30


@FULL
@pytest.mark.parametrize("framework", ["pyddp", "torch"])
def test_ddp_models_recover_and_end_close_to_a_fault_free_run(framework):
    """DDP re-wrapped at each re-form, SGD with momentum (the optimizer's state rolls back too);
    float sums over other partitions of the batch: close, not bit-equal."""
    if framework == "torch":
        pytest.importorskip("torch")
    script = os.path.join(HERE, "_elastic_ddp.py")
    env = {"ELASTIC_TORCH": "1" if framework == "torch" else "0"}
    p, ref, _ = launch(3, script=script, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    p, res, _ = launch(3, "--max-restarts", "1", kill="1", pause=0.5, script=script, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "restarted it" in p.stderr
    assert sorted(r["id"] for r in res) == ["0.0.0", "0.1.3", "0.2.2"]
    for r in res:
        assert r["steps"] == 32
        assert r["params"] == res[0]["params"]  # every rank the same bits
    np.testing.assert_allclose(res[0]["params"], ref[0]["params"], rtol=1e-4, atol=1e-5)


def test_a_second_ddp_of_a_module_takes_the_hooks_over():
    """What elastic.run relies on when fn wraps the model again: the old wrapper's hooks go (else
    every parameter would be marked ready twice), and the module still pickles."""
    import pickle

    import pyddp as torch
    import pyddp.distributed as dist
    import pyddp.nn as nn
    from pyddp.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("cpu", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=10))
    try:
        model = nn.Linear(3, 2)
        first = DDP(model)
        second = DDP(model)
        assert first._hook_handles == [] and len(second._hook_handles) == 2
        for _ in range(2):
            second(torch.ones(4, 3)).sum().backward()
        assert np.allclose(model.weight.grad.numpy(), 8.0)
        pickle.dumps(model)
    finally:
        dist.destroy_process_group()


def _agents(specs, kill_after=None, timeout=180, nnodes="1:3"):
    """Start one pyddp-run --elastic agent per spec (delay s, nproc, extra options) against one
    rendezvous endpoint; kill_after: (index, seconds) SIGKILLs that agent (and so its workers).
    Returns (the agents' (returncode, stderr), the workers' records)."""
    import socket as _socket
    import time as _time

    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mkdtemp(prefix="pyddp-elastic-nodes-")
    env = dict(os.environ, ELASTIC_KILL="", ELASTIC_STEP_SLEEP="0.2", ELASTIC_OUT=out,
               PYDDP_SECRET="elastic-test-secret", PYDDP_ELASTIC_LAST_CALL="0.5",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = []
    t0 = _time.monotonic()
    for delay, nproc, opts in specs:
        while _time.monotonic() - t0 < delay:
            _time.sleep(0.05)
        cmd = [sys.executable, "-m", "pyddp.run", "--elastic", "--nnodes", nnodes,
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", str(nproc), *opts,
               SCRIPT]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
        if kill_after is not None and kill_after[0] == len(procs) - 1:
            killer = (procs[-1], _time.monotonic() + kill_after[1])
    if kill_after is not None:
        p, when = killer
        while _time.monotonic() < when:
            _time.sleep(0.05)
        p.kill()
    results = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        results.append((p.returncode, err))
    records = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            records.append(json.load(f))
    shutil.rmtree(out, ignore_errors=True)
    return results, [r for r in records if "id" in r]


@FULL
def test_a_node_that_arrives_late_is_admitted_at_a_commit(fault_free):
    agents, res = _agents([(0, 2, []), (1.0, 2, [])])
    assert [rc for rc, _ in agents] == [0, 0], agents
    assert "elastic job started: 1 node(s), 2 workers" in agents[0][1]
    assert "4 workers on 2 node(s)" in agents[0][1], agents[0][1]
    assert sorted(r["id"] for r in res) == ["0.0.0", "0.1.1", "1.0.0", "1.1.1"]
    _check(res, fault_free)
    late = next(r for r in res if r["id"] == "1.0.0")
    assert late["entries"][0][1] > 0  # it got the running job's state, not step 0


@FULL
def test_a_lost_node_costs_the_steps_since_the_commit_not_the_job(fault_free):
    # node 1 (its agent, then its workers by the parent-death signal) is SIGKILLed mid-training
    agents, res = _agents([(0, 2, []), (0.5, 2, [])], kill_after=(1, 2.5))
    assert agents[0][0] == 0, agents[0][1]
    assert "2 workers on 1 node(s)" in agents[0][1], agents[0][1]
    assert sorted(r["id"] for r in res) == ["0.0.0", "0.1.1"]
    _check(res, fault_free)


@FULL
def test_a_node_past_max_is_refused():
    agents, _ = _agents([(0, 1, []), (0.3, 1, []), (0.6, 1, []), (0.9, 1, [])])
    codes = sorted(rc for rc, _ in agents)
    assert codes == [0, 0, 0, 2], agents
    refused = next(err for rc, err in agents if rc == 2)
    assert "the job already has 3 nodes" in refused


@FULL
def test_the_store_survives_the_loss_of_the_node_holding_it(fault_free):
    """The leader (node 0, whose launcher holds the store) is SIGKILLed mid-training: node 1
    takes the store over, the workers of nodes 1 and 2 reconnect and finish the job."""
    agents, res = _agents([(0, 1, []), (0.5, 2, []), (1.0, 1, [])], kill_after=(0, 3.5))
    assert [rc for rc, _ in agents[1:]] == [0, 0], agents
    assert "holds it now" in agents[1][1], agents[1][1]
    assert "the store is now node 1's" in agents[2][1], agents[2][1]
    assert sorted(r["id"] for r in res) == ["1.0.0", "1.1.1", "2.0.0"]
    _check(res, fault_free)


@FULL
def test_chaos_a_worker_killed_every_four_steps(fault_free):
    """4 ranks; every 4 steps a worker (an original or a replacement) is SIGKILLed and replaced."""
    # spawns 4, 5, 6 are the replacements of local ranks 1, 2 and 1 again
    p, res, killed = launch(4, "--max-restarts", "4", kill="4:1,8:2,12:0.1.4,16:3", pause=0.3)
    assert p.returncode == 0, p.stdout + p.stderr
    assert [k["killed"] for k in killed] == ["0.1.1", "0.2.2", "0.1.4", "0.3.3"]
    assert p.stderr.count("restarted it") == 4, p.stderr
    _check(res, fault_free)
    assert len(res) >= 3


def test_what_is_not_covered_says_so():
    import pyddp.elastic as elastic

    with pytest.raises(elastic.ElasticError, match="backend 'nccl' is not covered yet"):
        elastic.run(backend="nccl")(lambda s: None)(elastic.State())

    class ZeroRedundancyOptimizer:
        def state_dict(self):
            return {}

        def load_state_dict(self, sd):
            pass

    with pytest.raises(elastic.ElasticError, match="ZeroRedundancyOptimizer is not covered yet"):
        elastic.State(opt=ZeroRedundancyOptimizer())


@pytest.fixture
def three_hosts():
    """Three network namespaces on one bridge (10.78.0.1-3), each its own host (PYDDP_NODE_ID)."""
    import shutil as _shutil
    import uuid

    def ip(*args):
        return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)

    if _shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 for network namespaces")
    tag = uuid.uuid4().hex[:5]
    br = f"pbr{tag}"
    hosts = [f"pe{i}{tag}" for i in range(3)]
    made = []
    try:
        if ip("link", "add", br, "type", "bridge").returncode != 0:
            pytest.skip("cannot create a bridge here")
        ip("link", "set", br, "up")
        for i, h in enumerate(hosts):
            if ip("netns", "add", h).returncode != 0:
                pytest.skip("cannot create network namespaces here")
            made.append(h)
            a, b = f"pv{i}{tag}", f"pw{i}{tag}"
            for s in (("link", "add", a, "type", "veth", "peer", "name", b),
                      ("link", "set", a, "netns", h), ("link", "set", b, "master", br),
                      ("link", "set", b, "up"),
                      ("-n", h, "addr", "add", f"10.78.0.{i + 1}/24", "dev", a),
                      ("-n", h, "link", "set", a, "up"), ("-n", h, "link", "set", "lo", "up")):
                r = ip(*s)
                if r.returncode != 0:
                    pytest.skip(f"cannot build the network: ip {' '.join(s)}: {r.stderr.strip()}")
        yield hosts
    finally:
        for h in made:
            ip("netns", "del", h)
        ip("link", "del", br)


@FULL
def test_hosts_added_and_removed_in_network_namespaces(three_hosts, fault_free):
    """Host 2 joins a running job, host 1 is SIGKILLed (its launcher and workers): the job
    finishes on hosts 0 and 2 over TCP, with the same bits as a fault-free run."""
    import time as _time

    out = tempfile.mkdtemp(prefix="pyddp-elastic-netns-")
    env = dict(os.environ, ELASTIC_KILL="", ELASTIC_STEP_SLEEP="0.3", ELASTIC_OUT=out,
               PYDDP_SECRET="elastic-netns", PYDDP_ELASTIC_LAST_CALL="0.5",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYDDP_HOST", None)
    procs = []
    t0 = _time.monotonic()
    for i, (h, delay, nproc) in enumerate(zip(three_hosts, (0, 0.5, 3.0), (2, 1, 1))):
        while _time.monotonic() - t0 < delay:
            _time.sleep(0.05)
        cmd = ["ip", "netns", "exec", h, sys.executable, "-m", "pyddp.run", "--elastic",
               "--nnodes", "1:3", "--rdzv-endpoint", "10.78.0.1:29655", "--nproc-per-node",
               str(nproc), SCRIPT]
        procs.append(subprocess.Popen(cmd, env=dict(env, PYDDP_NODE_ID=h),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    while _time.monotonic() - t0 < 5.5:
        _time.sleep(0.05)
    procs[1].kill()
    errs = []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=120)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    records = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            records.append(json.load(f))
    shutil.rmtree(out, ignore_errors=True)
    assert procs[0].returncode == 0 and procs[2].returncode == 0, errs
    res = [r for r in records if "id" in r]
    assert sorted(r["id"] for r in res) == ["0.0.0", "0.1.1", "2.0.0"], (res, errs)
    assert "4 workers on 3 node(s)" in errs[0] and "3 workers on 2 node(s)" in errs[0], errs[0]
    _check(res, fault_free)


def test_checkpoint_to_writes_every_nth_commit_and_a_new_job_resumes_from_it(tmp_path):
    import pyddp.elastic as elastic

    path = tmp_path / "state.pkl"
    s = elastic.State(step=0, w=np.zeros(3))
    s.checkpoint_to(path, every=2)
    assert not path.exists()
    for i in range(1, 6):
        s.step = i
        s.w += 1
        s.commit()
    # commits 2 and 4 were written; 5 was not
    again = elastic.State(step=0, w=np.zeros(3))
    again.checkpoint_to(path, every=2)
    assert again.step == 4 and np.array_equal(again.w, [4.0, 4.0, 4.0])
    again.step = 9
    again.restore()  # the loaded checkpoint is the commit to go back to
    assert again.step == 4
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        s.checkpoint_to(path, every=0)


def test_rdzv_conf_is_checked(capsys):
    from pyddp import run

    def config(argv):
        return run.config_from_args(run.parse_args(argv))

    cfg = config(["--elastic", "--nnodes", "1:2", "--master-addr", "127.0.0.1", "--rdzv-conf",
                  "last_call_timeout=0.5,join_timeout=30", SCRIPT])
    assert cfg.rdzv_conf == {"last_call_timeout": 0.5, "join_timeout": 30.0}
    with pytest.raises(SystemExit):
        config(["--rdzv-conf", "lastcall=1", SCRIPT])
    assert "'lastcall=1': expected key=value with key one of last_call_timeout" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        config(["--rdzv-conf", "join_timeout=-1", SCRIPT])
    assert "join_timeout must be a number of seconds >= 0" in capsys.readouterr().err


def test_too_few_nodes_within_join_timeout_fails_the_job():
    agents, _ = _agents([(0, 1, ["--rdzv-conf", "join_timeout=1"])], nnodes="2:3")
    assert agents[0][0] == 1, agents
    assert "1 of --nnodes MIN 2 nodes joined within join_timeout 1 s" in agents[0][1]
