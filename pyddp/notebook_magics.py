"""IPython magics for persistent ranks: ``%load_ext pyddp``, then

    %ddp start -n 2 [--backend cpu|nccl|mpi] [--timeout 120] [--cuda-on-cpu]
                                        start the ranks (pyddp.notebook.Ranks; backend mpi: under
                                        one mpirun); fails when they are not all up within the
                                        timeout (seconds)
    %%ddp [--ranks 0,1] [--quiet-others] [--figures 0|0,1|all|none]
    <code>                              run the cell on every rank (or the listed ones); the
                                        figures of rank 0 (or those listed) show in the cell
    %ddp push NAME [NAME ...]           send kernel objects to the ranks
    %ddp pull NAME [--rank R|all]       bring a value back into the kernel (rank 0 by default)
    %ddp status | stop | restart

This is the only module of pyddp that imports IPython.
"""
import argparse
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ._notebook_ranks import Ranks

__all__ = ["DDPMagics", "load_ipython_extension", "unload_ipython_extension"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def _line_parser():
    p = _Parser(prog="%ddp", add_help=False)
    sub = p.add_subparsers(dest="cmd")
    start = sub.add_parser("start", add_help=False)
    start.add_argument("-n", "--nprocs", type=int, default=2)
    start.add_argument("--backend", default="cpu")
    start.add_argument("--timeout", type=float, default=120.0)
    start.add_argument("--cuda-on-cpu", action="store_true")
    for name in ("stop", "restart", "status"):
        sub.add_parser(name, add_help=False)
    push = sub.add_parser("push", add_help=False)
    push.add_argument("names", nargs="+")
    pull = sub.add_parser("pull", add_help=False)
    pull.add_argument("name")
    pull.add_argument("--rank", default="0")
    return p


def _cell_parser():
    p = _Parser(prog="%%ddp", add_help=False)
    p.add_argument("--ranks", default=None)
    p.add_argument("--quiet-others", action="store_true")
    p.add_argument("--figures", default=None)
    return p


def _figures(text):
    if text in ("all", "none"):
        return "all" if text == "all" else None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--figures takes rank numbers separated by commas, 'all' or 'none', "
                         f"not {text!r}") from None


@magics_class
class DDPMagics(Magics):
    """``%ddp`` (start, stop, restart, status, push, pull) and ``%%ddp`` (run a cell on the ranks)."""

    def __init__(self, shell=None):
        super().__init__(shell)
        self.ranks = None

    def _running(self):
        if self.ranks is None or not self.ranks.running:
            raise UsageError("no ranks are running: start them first with  %ddp start -n 2")
        return self.ranks

    @line_magic
    def ddp(self, line):
        """%ddp start -n N [--backend B] | stop | restart | status | push NAME... |
        pull NAME [--rank R|all]"""
        args = _line_parser().parse_args(shlex.split(line) or ["status"])
        if args.cmd == "start":
            if self.ranks is not None and self.ranks.running:
                print(f"{self.ranks.nprocs} ranks are running already (backend "
                      f"{self.ranks.backend!r}): %ddp restart or %ddp stop first")
                return None
            if not args.timeout > 0:
                raise UsageError(f"--timeout must be a positive number of seconds, not {args.timeout}")
            self.ranks = Ranks(nprocs=args.nprocs, backend=args.backend,
                               start_timeout=args.timeout, cuda_on_cpu=args.cuda_on_cpu).start()
            print(f"{args.nprocs} ranks started (backend {args.backend!r}"
                  f"{', CUDA on the CPU' if args.cuda_on_cpu else ''})")
        elif args.cmd == "stop":
            if self.ranks is None or not self.ranks.running:
                print("no ranks are running")
                return None
            self.ranks.stop()
            print("ranks stopped")
        elif args.cmd == "restart":
            if self.ranks is None:
                raise UsageError("no ranks were started: %ddp start -n 2")
            self.ranks.restart()
            print(f"{self.ranks.nprocs} ranks restarted")
        elif args.cmd == "status":
            if self.ranks is None or not self.ranks.running:
                print("no ranks are running")
                return None
            for s in self.ranks.status():
                state = ("busy" if s["busy"] else "idle") if s["alive"] else f"dead ({s['exit']})"
                err = s["last_error"].strip().splitlines()[-1] if s["last_error"] else "-"
                print(f"rank {s['rank']}: pid {s['pid']}, {state}, last error: {err}")
        elif args.cmd == "push":
            ranks = self._running()
            ranks.push(*args.names, namespace=self.shell.user_ns)
        elif args.cmd == "pull":
            ranks = self._running()
            if args.rank == "all":
                value = ranks.pull(args.name)
            else:
                try:
                    rank = int(args.rank)
                except ValueError:
                    raise UsageError(f"--rank takes a rank number or 'all', not {args.rank!r}") from None
                value = ranks.pull(args.name, rank=rank)
            self.shell.user_ns[args.name] = value
            return value
        return None

    @cell_magic("ddp")
    def ddp_cell(self, line, cell):
        """%%ddp [--ranks 0,1] [--quiet-others] [--figures 0|0,1|all|none]: run the cell on the
        ranks."""
        args = _cell_parser().parse_args(shlex.split(line))
        ranks = self._running()
        which = None
        if args.ranks is not None:
            try:
                which = [int(x) for x in args.ranks.split(",") if x.strip()]
            except ValueError:
                raise UsageError(f"--ranks takes numbers separated by commas, not {args.ranks!r}") \
                    from None
        figures = ranks.figures if args.figures is None else _figures(args.figures)
        saved = ranks.figures
        ranks.quiet_others = args.quiet_others
        ranks.figures = figures
        try:
            result = ranks.run(cell, ranks=which)
        except SyntaxError as e:   # shown once, without the frames of Ranks
            raise e.with_traceback(None) from None
        except ValueError as e:    # a rank or a figures value out of range
            raise UsageError(str(e)) from None
        finally:
            ranks.quiet_others = False
            ranks.figures = saved
        return result if result else None


def load_ipython_extension(ipython):
    """Register %ddp and %%ddp in ``ipython`` (what ``%load_ext pyddp`` calls)."""
    ipython.register_magics(DDPMagics)


def unload_ipython_extension(ipython):
    """Stop the ranks started by %ddp (``%unload_ext pyddp``)."""
    magics = ipython.magics_manager.registry.get("DDPMagics")
    if magics is not None and magics.ranks is not None:
        magics.ranks.stop()
