"""The launchers' command lines, checked in-process: torchrun's spellings and defaults, and errors
that name the option at fault before any worker starts."""
import os
import sys

import pytest

from pyddp import launch as pyddp_launch
from pyddp import run as pyddp_run
from pyddp._launcher.options import config_from_args, cpu_count

import _paths

ROOT = _paths.ROOT


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "train.py"
    p.write_text("pass\n")
    return str(p)


def _config(argv, module=pyddp_run):
    parser = module.get_args_parser()
    return config_from_args(parser, parser.parse_args(argv), "pyddp.run")


def _error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        _config(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_torchrun_defaults(script, monkeypatch):
    for k in list(os.environ):
        if k.startswith("PET_"):
            monkeypatch.delenv(k)
    c = _config([script, "--x", "1"])
    assert (c.nnodes, c.nproc_per_node, c.node_rank) == (1, 1, 0)
    assert (c.master_addr, c.master_port, c.run_id, c.role) == ("127.0.0.1", 29500, "none", "default")
    assert (c.max_restarts, c.monitor_interval, c.log_dir) == (0, 0.1, None)
    assert c.redirects == {0: 0} and c.tee == {0: 0} and c.local_ranks_filter is None
    assert (c.kind, c.target, c.script_args) == ("script", script, ["--x", "1"])


def test_dash_and_underscore_spellings_mean_the_same(script):
    dash = _config(["--nproc-per-node", "3", "--node-rank", "1", "--nnodes", "2", "--master-addr", "h",
                    "--master-port", "1234", "--max-restarts", "2", "--monitor-interval", "0.5",
                    "--local-ranks-filter", "0,2", "--rdzv-id", "job", script])
    under = _config(["--nproc_per_node", "3", "--node_rank", "1", "--nnodes", "2", "--master_addr", "h",
                     "--master_port", "1234", "--max_restarts", "2", "--monitor_interval", "0.5",
                     "--local_ranks_filter", "0,2", "--rdzv_id", "job", script])
    assert dash == under
    assert (dash.nproc_per_node, dash.node_rank, dash.master_addr, dash.master_port) == (3, 1, "h", 1234)
    assert dash.local_ranks_filter == {0, 2} and dash.run_id == "job"


def test_c10d_rendezvous_numbers_the_nodes(script, capsys):
    """torchrun's c10d: a range of nodes, or a fixed count without --node-rank, is the dynamic
    rendezvous (every membership change restarts every worker); a --node-rank keeps the static one;
    --elastic keeps its own."""
    c = _config(["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:5", script])
    assert c.dynamic and (c.nnodes, c.max_nodes, c.master_addr, c.master_port) == (1, 2, "h", 5)
    c = _config(["--nnodes", "2", "--rdzv-backend", "c10d", script])
    assert c.dynamic and c.node_rank == 0
    c = _config(["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", script])
    assert not c.dynamic and c.node_rank == 1
    c = _config(["--nnodes", "1:2", "--rdzv-backend", "c10d", "--node-rank", "1", script])
    assert c.dynamic and c.node_rank == 0 and "ignoring --node-rank" in capsys.readouterr().err
    assert not _config(["--nnodes", "1:2", "--elastic", script]).dynamic
    assert not _config(["--rdzv-backend", "c10d", script]).dynamic


def test_values_from_torchrun_forms(script, monkeypatch):
    assert _config(["--nproc-per-node", "auto", script]).nproc_per_node == cpu_count()
    assert _config(["--nnodes", "2:2", "--node-rank", "1", script]).nnodes == 2
    c = _config(["--nproc-per-node", "2", "-r", "0:1,1:3", "-t", "2", script])
    assert c.redirects == {0: 1, 1: 3} and c.tee == {0: 2, 1: 2}
    c = _config(["--rdzv-endpoint", "node0:1234", script])
    assert (c.master_addr, c.master_port) == ("node0", 1234)
    assert _config(["--rdzv_endpoint", "node0", script]).master_port == 29400
    assert _config(["-m", "pkg.train"]).kind == "module"
    assert _config(["--no-python", "true"]).kind == "exec"
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")   # torchrun reads PET_<OPTION> defaults
    assert _config([script]).nproc_per_node == 4


@pytest.mark.parametrize("argv, names", [
    (["--nproc-per-node", "0"], ["--nproc-per-node", "'0'"]),
    (["--nproc-per-node", "many"], ["--nproc-per-node", "'many'"]),
    (["--nnodes", "2", "--node-rank", "2"], ["--node-rank", "0..1"]),
    (["--node-rank", "-1"], ["--node-rank"]),
    (["--nnodes", "1:4"], ["--nnodes", "elastic"]),
    (["--nnodes", "0"], ["--nnodes"]),
    (["--master-port", "70000"], ["--master-port"]),
    (["--master-port", "0"], ["--master-port", "--standalone"]),
    (["--standalone", "--nnodes", "2", "--node-rank", "0"], ["--standalone"]),
    (["--max-restarts", "-1"], ["--max-restarts"]),
    (["--monitor-interval", "0"], ["--monitor-interval"]),
    (["--redirects", "5"], ["--redirects"]),
    (["--nproc-per-node", "2", "--tee", "2:1"], ["--tee"]),
    (["--nproc-per-node", "2", "--local-ranks-filter", "3"], ["--local-ranks-filter", "[3]"]),
    (["--rdzv-backend", "etcd"], ["--rdzv-backend", "static"]),
    (["-m", "--no-python"], ["--no-python", "--module"]),
])
def test_bad_values_name_the_option(capsys, script, argv, names):
    err = _error(capsys, argv + [script])
    for n in names:
        assert n in err, err


def test_a_missing_script_is_named(capsys, tmp_path):
    err = _error(capsys, [str(tmp_path / "nope.py")])
    assert "training_script" in err and "nope.py" in err
    err = _error(capsys, ["--no-python", "no-such-program-xyz"])
    assert "training_script" in err and "no-such-program-xyz" in err


def test_launch_options(script):
    parser = pyddp_launch.get_args_parser()
    ns = parser.parse_args(["--use_env", "--local_rank_style", "dash", script])
    assert ns.use_env and ns.local_rank_style == "dash"
    assert not parser.parse_args([script]).use_env


def test_console_script_is_declared():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    if sys.version_info >= (3, 11):
        import tomllib

        scripts = tomllib.loads(text)["project"]["scripts"]
        assert scripts["pyddp-run"] == "pyddp.run:main"
        from setuptools import find_packages

        include = tomllib.loads(text)["tool"]["setuptools"]["packages"]["find"]["include"]
        assert "pyddp._launcher" in find_packages(ROOT, include=include)
    else:
        assert 'pyddp-run = "pyddp.run:main"' in text
    assert callable(pyddp_run.main)
