"""The end of a launcher's command line: run the job, and turn its outcome into an exit status."""
import os
import signal
import sys
import time

from .agent import LaunchError, LauncherInterrupted, launch


def exit_by_signal(signum):
    """Die of the signal that stopped the job, as the shell expects (Ctrl-C stops an enclosing script too)."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(1.0)          # delivery is asynchronous; if it somehow did not kill us:
    sys.exit(128 + signum)


def run_job(cfg):
    """Launch cfg's job and exit the process with its status (0, 1 on failure, 2 on bad setup)."""
    try:
        code = launch(cfg)
    except LaunchError as e:
        print(f"{cfg.prog}: error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except LauncherInterrupted as e:
        exit_by_signal(e.signum)
    sys.exit(code)
