"""Merge the per-rank timelines (PYDDP_TIMELINE) into one trace that opens in Perfetto
(https://ui.perfetto.dev) or chrome://tracing, with one track group per rank.

    python -m pyddp.tools.timeline merge OUT.json DIR_OR_FILES...

``pyddp-run --timeline DIR`` does this itself at the end of the job (DIR/timeline.json).  A rank's
file may lack its closing bracket (the process was killed): the events written so far are kept.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

_RANK_FILE = re.compile(r"timeline\.rank(\d+)\.json$")


def read_events(path):
    """The events of one rank's file (JSON array format, closing bracket optional)."""
    with open(path) as f:
        text = f.read().strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        # cut short: drop a trailing partial event, close the array
        cut = text.rfind("}")
        data = json.loads(text[:cut + 1].rstrip(",\n ") + "]") if cut > 0 else []
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    return [e for e in data if isinstance(e, dict)]


def rank_files(directory):
    """{rank: path} of the timeline.rank{R}.json files in directory."""
    out = {}
    for p in glob.glob(os.path.join(directory, "timeline.rank*.json")):
        m = _RANK_FILE.search(p)
        if m:
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


def merge(paths, out):
    """Write the events of every path into out (Chrome trace object format); the event count."""
    events = []
    for p in paths:
        events.extend(read_events(p))
    # metadata first, then by time, so viewers order tracks by rank
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0.0)))
    tmp = f"{out}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, out)
    return len(events)


def merge_dir(directory, out=None):
    """Merge DIR's timeline.rank*.json into DIR/timeline.json (or out); (path, ranks, events),
    or None when there is nothing to merge."""
    files = rank_files(directory)
    if not files:
        return None
    out = out or os.path.join(directory, "timeline.json")
    n = merge(list(files.values()), out)
    return out, list(files), n


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pyddp.tools.timeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="merge per-rank timelines into one file")
    m.add_argument("out")
    m.add_argument("inputs", nargs="+", help="rank files, or directories holding "
                                             "timeline.rank*.json")
    args = ap.parse_args(argv)
    paths = []
    for p in args.inputs:
        if os.path.isdir(p):
            found = rank_files(p)
            if not found:
                print(f"timeline: no timeline.rank*.json in {p}", file=sys.stderr)
                return 2
            paths.extend(found.values())
        elif os.path.isfile(p):
            paths.append(p)
        else:
            print(f"timeline: {p}: no such file or directory", file=sys.stderr)
            return 2
    n = merge(paths, args.out)
    print(f"timeline: {n} events from {len(paths)} file(s) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
