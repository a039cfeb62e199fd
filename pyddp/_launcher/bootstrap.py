"""Runs inside every Python worker: the user's script as ``python -u script args`` would, plus a record
of how it failed.

    python -u .../pyddp/_launcher/bootstrap.py --script train.py --lr 0.1
    python -u .../pyddp/_launcher/bootstrap.py --module pkg.train --lr 0.1

Why a bootstrap: the launcher's failure summary should show the failing rank's Python traceback without
asking users to decorate their entry point (torchelastic's ``@record``).  So the script runs through
``runpy`` here, and an exception that ends it (a non-zero ``sys.exit`` too) is written to the file named by
``TORCHELASTIC_ERROR_FILE``, in torchelastic's JSON layout, before Python reports it as usual.  Fatal
signals (SIGSEGV, SIGABRT, ...) dump the Python stacks into ``fault.txt`` beside it (faulthandler).

The script sees what it would see when run directly: ``sys.argv``, ``sys.path[0]`` (the script's
directory, or the working directory for ``-m``), ``__name__ == "__main__"``, ``__file__``; the traceback
printed on stderr and recorded starts at the script's own frames.  This file imports only the standard
library and is run by path, so its own directory must not stay on ``sys.path``.
"""
import sys

if not getattr(sys.flags, "safe_path", False):   # python -P puts no script directory there
    del sys.path[0]   # pyddp/_launcher/: nothing in it may shadow the script's imports

import faulthandler  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

# Frames of these files lead into the user's code (runpy is "<frozen runpy>" from Python 3.11 on).
_SKIP_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
_fault_fd = None   # kept open for faulthandler for the life of the process


def _user_traceback(tb):
    """Drop the leading frames of this file and runpy: the traceback starts in the user's code."""
    def skipped(filename):
        return filename in _SKIP_FILES or os.path.abspath(filename) in _SKIP_FILES

    while tb is not None and skipped(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _record(error_file, exc, tb):
    """Write the error in torchelastic's layout; keep a file the script wrote itself (torch's @record)."""
    if not error_file or os.path.exists(error_file):
        return
    now = time.time()
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    head = traceback.format_exception_only(type(exc), exc)[-1].strip()
    data = {
        "message": {
            "message": head,
            "extraInfo": {"py_callstack": text, "timestamp": str(int(now))},
        },
        "pyddp": {"time": now, "pid": os.getpid()},
    }
    tmp = f"{error_file}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, error_file)   # the launcher never reads half a file
    except OSError:
        pass


def _enable_faulthandler(error_file):
    # A bare descriptor, not a file object: faulthandler needs it open until the process ends, and a file
    # object left open then is reported as "ResourceWarning: unclosed file" under -X dev.
    global _fault_fd
    if not error_file or faulthandler.is_enabled():   # -X faulthandler / PYTHONFAULTHANDLER win
        return
    try:
        _fault_fd = os.open(os.path.join(os.path.dirname(error_file), "fault.txt"),
                            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        faulthandler.enable(file=_fault_fd, all_threads=True)
    except OSError:
        _fault_fd = None


def _failing():
    """This rank is failing: pyddp's exit-time goodbye (destroy_process_group waits up to
    PYDDP_EXIT_TIMEOUT, 5 s, for the other ranks to check out of the store) would only delay the moment
    the launcher sees the failure, since peers blocked in a collective cannot check out.  So keep it
    short, unless the user chose a value."""
    os.environ.setdefault("PYDDP_EXIT_TIMEOUT", "0.2")


def _fail_groups_for(exc):
    """pyddp._lifecycle.fail_groups_for (this file imports only the standard library): fail this
    rank's process groups with ``exc`` now, so that peers waiting for it raise at once, naming it."""
    c10d = sys.modules.get("pyddp.distributed.distributed_c10d")
    if c10d is not None:
        try:
            c10d._fail_for_uncaught(exc)
        except Exception:
            pass


def _exit_code_is_failure(code):
    return code is not None and code != 0


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("--script", "--module"):
        sys.exit("usage: bootstrap.py (--script PATH | --module NAME) [ARGS...]  (started by pyddp.run)")
    mode, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    _enable_faulthandler(error_file)
    sys.argv = [target] + args
    if mode == "--script":
        # As `python script.py`: the script's (symlink-resolved) directory first on the path.
        sys.path.insert(0, os.path.dirname(os.path.realpath(target)))
        def run():
            runpy.run_path(target, run_name="__main__")
    else:
        # As `python -m module`: the working directory first; runpy sets argv[0] to the module's file.
        sys.path.insert(0, os.getcwd())
        def run():
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    try:
        run()
    except SystemExit as e:
        if _exit_code_is_failure(e.code):
            _failing()
            _record(error_file, e, _user_traceback(e.__traceback__))
            _fail_groups_for(e)
        raise
    except BaseException as e:
        # Python prints an exception's own __traceback__ (the tb argument of excepthook is ignored
        # when it is set), so trim it on the exception itself.
        e.with_traceback(_user_traceback(e.__traceback__))
        _failing()
        _record(error_file, e, e.__traceback__)
        if not isinstance(e, KeyboardInterrupt):
            _fail_groups_for(e)
        if isinstance(e, KeyboardInterrupt):
            # Re-raised so that Python exits by SIGINT, as a plain script would; propagating adds this
            # file's frames again, so the report trims once more.
            hook = sys.excepthook

            def trimmed_hook(etype, value, tb):
                value.with_traceback(_user_traceback(tb))
                hook(etype, value, value.__traceback__)

            sys.excepthook = trimmed_hook
            raise
        sys.excepthook(type(e), e, e.__traceback__)   # the usual report (or the script's own hook)
        sys.exit(1)


if __name__ == "__main__":
    main()
