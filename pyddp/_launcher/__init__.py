"""Machinery behind ``pyddp.run`` and ``pyddp.launch`` (torchrun and torch.distributed.launch).

    options.py    the command line: torchrun's options, defaults and spellings -> LaunchConfig
    cli.py        run a LaunchConfig and turn the outcome into the process's exit status
    agent.py      one node's job: start the workers, watch them, stop them, restart, summarise
    workers.py    one worker process: its environment, its command, its own process group
    output.py     captured worker output: whole lines to the console (prefixed) and to log files
    errors.py     per-rank error files and the failure summary
    guardian.py   a helper process that cleans up if the launcher itself is killed
    bootstrap.py  runs inside each Python worker: the user's script through runpy, traceback recorded

The standard library and pyddp._lifecycle (the process lifecycle it shares with
pyddp.multiprocessing.spawn and pyddp.notebook_launcher: parent-death signal, stopping with a grace
period, signal names), nothing from pyddp.distributed: the launcher never joins the job, it only
starts, watches and stops the processes that do.
"""
