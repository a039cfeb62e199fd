"""Merge the per-rank timelines (PYDDP_TIMELINE) into one trace that opens in Perfetto
(https://ui.perfetto.dev) or chrome://tracing, with one track group per rank.

    python -m pyddp.tools.timeline merge OUT.json DIR_OR_FILES...
    python -m pyddp.tools.timeline plot OUT.json OUT.png [--start-ms A --span-ms B]

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


def plot(trace, out, start_ms=None, span_ms=None):
    """Draw a merged trace as a PNG (one row per rank and track, a bar per span): the picture of
    a timeline without a browser.  matplotlib is needed (the ``plot`` extra of the examples)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = read_events(trace)
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e.get("args", {}).get("name", str(e["tid"]))
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise ValueError(f"{trace}: no spans to draw")
    t0 = min(e["ts"] for e in spans) / 1e3 + (start_ms or 0.0)
    t1 = t0 + span_ms if span_ms else max(e["ts"] + e.get("dur", 0) for e in spans) / 1e3
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    colors = {"collective": "tab:blue", "queued": "tab:gray", "ddp": "tab:orange",
              "backward": "tab:green"}
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(rows) + 1.2))
    for y, key in enumerate(rows):
        for e in spans:
            if (e["pid"], e["tid"]) != key:
                continue
            a, d = e["ts"] / 1e3 - t0, e.get("dur", 0) / 1e3
            if a + d < 0 or a > t1 - t0:
                continue
            ax.barh(y, max(d, (t1 - t0) * 1e-3), left=a, height=0.6,
                    color=colors.get(e.get("cat"), "tab:purple"), edgecolor="none")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {p}: {names.get((p, t), t)}" for p, t in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, t1 - t0)
    ax.set_xlabel("ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), loc="upper right", fontsize=8, ncol=len(colors))
    ax.set_title(f"{os.path.basename(trace)}: pyddp timeline", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None):
    """The command line: ``merge`` and ``plot`` (see the module's docstring); the exit status."""
    ap = argparse.ArgumentParser(prog="python -m pyddp.tools.timeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="merge per-rank timelines into one file")
    m.add_argument("out")
    m.add_argument("inputs", nargs="+", help="rank files, or directories holding "
                                             "timeline.rank*.json")
    pl = sub.add_parser("plot", help="draw a (merged) timeline as a PNG")
    pl.add_argument("trace")
    pl.add_argument("out")
    pl.add_argument("--start-ms", type=float, default=None, help="skip this much of the start")
    pl.add_argument("--span-ms", type=float, default=None, help="draw this much time")
    args = ap.parse_args(argv)
    if args.cmd == "plot":
        plot(args.trace, args.out, args.start_ms, args.span_ms)
        print(f"timeline: {args.out}")
        return 0
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
