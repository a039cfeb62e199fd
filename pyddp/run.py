"""pyddp.run: torchrun for pyddp.  Starts one process per rank on this node and keeps the job honest.

    python -m pyddp.run --nproc-per-node 4 train.py --lr 0.1        # or: pyddp-run ...
    python -m pyddp.run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 train.py

torchrun's options, defaults and environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), so
``pyddp.distributed.init_process_group()`` (env://) and scripts written for torchrun work unchanged.  What
pyddp adds: a fresh PYDDP_SECRET per job (ranks and store authenticate with it), the failing rank's
Python traceback in the failure summary without decorating the script, and no worker outliving the
launcher (Ctrl-C, SIGTERM, a failed rank, or the launcher killed).  See ``--help``.

Functions mirror torch.distributed.run: get_args_parser, parse_args, config_from_args, run, main.
"""
import os
import sys

from ._launcher.agent import launch
from ._launcher.cli import run_job
from ._launcher.options import LaunchConfig, build_parser
from ._launcher.options import config_from_args as _config_from_args

__all__ = ["get_args_parser", "parse_args", "config_from_args", "run", "main"]

DESCRIPTION = ("Start a pyddp job: NPROC_PER_NODE worker processes on this node, each running "
               "training_script with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, "
               "MASTER_PORT, ...). Options accept dash and underscore spellings.")


def _prog():
    return "pyddp-run" if os.path.basename(sys.argv[0] or "") == "pyddp-run" else "pyddp.run"


def get_args_parser():
    """The argparse parser of pyddp.run (torchrun's options)."""
    return build_parser(_prog(), DESCRIPTION)


def parse_args(args):
    """Parse a pyddp.run command line (a list of strings) into a namespace."""
    return get_args_parser().parse_args(args)


def config_from_args(args) -> LaunchConfig:
    """Check a parsed namespace (from parse_args) into a LaunchConfig."""
    return _config_from_args(get_args_parser(), args, _prog())


def run(args) -> int:
    """Run the job described by a parsed namespace; returns the exit code (raises on a signal)."""
    return launch(config_from_args(args))


def main(args=None):
    """Entry point of ``python -m pyddp.run`` / ``pyddp-run``: parse ``args`` (default sys.argv),
    start the workers, exit with the job's status."""
    parser = get_args_parser()
    ns = parser.parse_args(args)
    run_job(_config_from_args(parser, ns, parser.prog))


if __name__ == "__main__":
    main()
