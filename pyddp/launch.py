"""pyddp.launch: torch.distributed.launch for pyddp, for the scripts that parse ``--local_rank``.

    python -m pyddp.launch --nproc_per_node 2 train.py --epochs 10
    # each worker runs: python -u train.py --local_rank=<N> --epochs 10

Everything pyddp.run does (same options, environment and failure handling), plus the argument the
deprecated torch launcher passes: ``--local_rank=N`` (the spelling in most scripts written for it),
``--local-rank=N`` with ``--local-rank-style dash`` (what torch >= 2.0 passes), or nothing with
``--use-env`` (read LOCAL_RANK from the environment).  As in torch it goes right after the script,
before the script's own arguments.
"""
import sys

from ._launcher.cli import run_job
from ._launcher.options import _env_flag, build_parser, config_from_args

__all__ = ["get_args_parser", "main"]

PROG = "pyddp.launch"
DESCRIPTION = ("Legacy launcher (torch.distributed.launch): like pyddp.run, and passes --local_rank=N to "
               "each worker's script unless --use-env.")
_STYLES = {"underscore": "--local_rank", "dash": "--local-rank"}


def get_args_parser():
    """The argparse parser of pyddp.launch: pyddp.run's options plus --use-env and --local-rank-
    style."""
    parser = build_parser(PROG, DESCRIPTION)
    parser.add_argument("--use-env", "--use_env", dest="use_env", action="store_true",
                        default=_env_flag("use_env"),
                        help="pass no --local_rank argument; the script reads LOCAL_RANK from the environment")
    parser.add_argument("--local-rank-style", "--local_rank_style", dest="local_rank_style",
                        choices=sorted(_STYLES), default="underscore",
                        help="spelling of the argument passed to the script: underscore (--local_rank=N, "
                             "default) or dash (--local-rank=N)")
    return parser


def main(args=None):
    """Entry point of ``python -m pyddp.launch``: like pyddp.run, passing ``--local_rank=N`` to each
    worker unless --use-env."""
    parser = get_args_parser()
    ns = parser.parse_args(args)
    print(f"{PROG}: warning: pyddp.launch mirrors the deprecated torch.distributed.launch; the modern form "
          "is `python -m pyddp.run` (or pyddp-run), which passes LOCAL_RANK in the environment instead of "
          "--local_rank", file=sys.stderr, flush=True)
    arg = None if ns.use_env else _STYLES[ns.local_rank_style]
    run_job(config_from_args(parser, ns, PROG, local_rank_arg=arg))


if __name__ == "__main__":
    main()
