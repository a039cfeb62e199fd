"""Process lifecycle shared by pyddp's three process starters: the launchers (pyddp.run and
pyddp.launch, in pyddp._launcher), pyddp.multiprocessing.spawn and pyddp.notebook_launcher.

    die_with_parent       in a child: ask the kernel for a signal when the parent dies (Linux
                          PR_SET_PDEATHSIG), and tell whether it died already (orphaned)
    load_prctl            in the parent, before forking: look prctl up so the child only calls it
    signal_group          signal a process group, False when it is gone
    terminate_with_grace  the stop sequence: a signal (SIGTERM), a bounded wait, SIGKILL, a wait
    wait_until_gone       the polling wait the stop sequence of the launcher uses
    signal_name, describe_exit   'SIGKILL', 'exit code 3' / 'signal SIGKILL' for messages

Each caller keeps its own policy (which signal a child gets when its parent dies, grace periods, how a
process is signalled, what it logs); this module holds the mechanics.  Standard library only (ctypes
on first use), nothing from the rest of pyddp.  The launcher's guardian process (_launcher/guardian.py)
runs with ``python -I`` as a script and cannot import it: its one SIGKILL loop stays its own.
"""
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1
_UNSET = object()
_prctl = _UNSET


def fail_groups_for(exc) -> None:
    """A rank's program is ending with ``exc``, uncaught: fail its process groups now (when the
    program used pyddp.distributed), so that peers waiting for this rank in a collective raise at
    once, naming it, instead of when its slow exit ends or at their timeout.  Called by every
    launcher's worker wrapper (pyddp-run's bootstrap, spawn, notebook_launcher) before the
    exception's report."""
    c10d = sys.modules.get("pyddp.distributed.distributed_c10d")
    if c10d is not None:
        try:
            c10d._fail_for_uncaught(exc)
        except Exception:
            pass


def load_prctl():
    """libc's prctl, or None where there is none (not Linux, unusual libc builds).

    Looked up once.  A process that forks children which call die_with_parent before exec (the
    launcher's preexec_fn, notebook_launcher's forked ranks) calls this first, in the parent: the
    forked child then only calls prctl, it does not load anything."""
    global _prctl
    if _prctl is _UNSET:
        _prctl = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _prctl = ctypes.CDLL(None, use_errno=True).prctl
            except Exception:  # no libc symbol: the parent still stops its children itself
                pass
    return _prctl


def die_with_parent(sig, parent_pid=None) -> bool:
    """In a child: have the kernel send ``sig`` to this process when the thread that started it
    exits (Linux; elsewhere nothing).  Returns True when the parent ``parent_pid`` died before that
    took effect: nobody will ever stop or reap this process, and the caller must exit at once."""
    prctl = load_prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    return parent_pid is not None and os.getppid() != parent_pid


def signal_group(pgid, sig) -> bool:
    """Send sig to the process group pgid; False when no process is left in it (or the id now
    belongs to someone else's processes: ours are gone)."""
    try:
        os.killpg(pgid, sig)
        return True
    except OSError:
        return False


def signal_name(signum, unknown="signal {}") -> str:
    """'SIGTERM' for 15; ``unknown`` formatted with the number for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return unknown.format(signum)


def describe_exit(returncode) -> str:
    """'exit code 3' or 'signal SIGKILL' (Popen and multiprocessing report death by signal N as -N)."""
    if returncode < 0:
        return f"signal {signal_name(-returncode)}"
    return f"exit code {returncode}"


def terminate_with_grace(procs, send, still_alive, wait_grace, wait_kill=None, sig=signal.SIGTERM):
    """Stop procs: ``send(p, sig)`` to each one ``still_alive`` reports, ``wait_grace(live)`` for them
    to go, ``send(p, SIGKILL)`` to those left, then ``wait_kill(live)`` when given.

    ``still_alive(procs)`` returns those of procs still running; each wait returns those still
    running when it gives up.  What is a process (a Popen, a multiprocessing.Process, a process
    group id), how it is signalled and how the waits wait (polling while pumping output, joining) is
    the caller's.  Returns what is still alive at the end ([] / empty when all went)."""
    live = still_alive(procs)
    if not live:
        return live
    for p in live:
        send(p, sig)
    live = wait_grace(live)
    for p in live:
        send(p, signal.SIGKILL)
    if wait_kill is not None:
        live = wait_kill(live)
    return live


def wait_until_gone(live, still_alive, seconds, pause=time.sleep, interval=0.05, cut_short=None,
                    on_slow=None, slow_after=2.0):
    """Poll until ``still_alive(live)`` is empty or ``seconds`` have passed: ``pause(interval)``
    between checks (time.sleep, or a call that handles output meanwhile).  ``cut_short()`` true stops
    the wait early; ``on_slow(live)`` is called once, when processes are left after ``slow_after``
    seconds.  Returns those still alive."""
    start = time.monotonic()
    told = False
    while live and time.monotonic() - start < seconds and not (cut_short is not None and cut_short()):
        pause(interval)
        live = still_alive(live)
        if live and on_slow is not None and not told and time.monotonic() - start > slow_after:
            told = True
            on_slow(live)
    return live
