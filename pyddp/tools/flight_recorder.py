"""Read the flight-recorder files of all ranks and say which rank diverged, on which collective.

    python -m pyddp.tools.flight_recorder DIR [--verbose]

DIR holds the files ranks wrote (PYDDP_FLIGHT_RECORDER_DIR, or flight_recorder.dump()).  For each
group, and within it each backend whose calls the file records (a group on backend "nccl" records
NCCL's calls beside the signature checks and object collectives its host group ran on "cpu"; each
has its own sequence numbers), the collectives are compared by sequence number across ranks:

- ranks that called different collectives at the same sequence number (kind, dtype, op, root or
  count differ): "diverged", naming the odd ranks;
- ranks that never reached a sequence number others entered: "behind" (stuck elsewhere, or
  dead), naming their last collective;
- a collective every rank entered but some did not complete: "stuck in", with its state;
- ranks of the group that wrote no file: named too.

Exit status: 0 when every group agrees and completed, 1 when something was found, 2 when DIR
holds no readable file.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys


def load(directory):
    """(files, errors): the parsed files of DIR, and the ones that could not be read."""
    files, errors = [], []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
            if not isinstance(data, dict) or "entries" not in data or "meta" not in data:
                raise ValueError("not a pyddp flight-recorder file")
            data["_path"] = path
            files.append(data)
        except (OSError, ValueError) as e:
            errors.append(f"{path}: {e}")
    return files, errors


def _sig(e):
    return (e["kind"], e["dtype"], e["op"] if e["kind"] in _REDUCING else "", e["root"]
            if e["kind"] in _ROOTED else -1, e["count"])


_REDUCING = {"all_reduce", "reduce", "reduce_scatter"}
_ROOTED = {"broadcast", "reduce", "gather", "scatter"}


def _desc(e):
    parts = [e["dtype"], f"count {e['count']}"]
    if e["kind"] in _REDUCING:
        parts.append(e["op"])
    if e["kind"] in _ROOTED:
        parts.append(f"root {e['root']}")
    return f"{e['name']}({', '.join(parts)})"


def _path(e):
    """' [shm, cma]': the transport and algorithm it ran with (files of older versions, and
    operations still running, have none); a device backend's calls name the backend too
    (' [nccl, nccl, auto]')."""
    algo = e.get("algorithm")
    if not algo or algo == "none":
        return ""
    backend = e.get("backend", "cpu")
    if backend != "cpu":
        return f" [{backend}, {e.get('transport')}, {algo}]"
    return f" [{e.get('transport')}, {algo}]"


def _ranks(rs):
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def analyse_group(files):
    """Lines describing one group's files (all with the same group id); (lines, problem)."""
    meta0 = files[0]["meta"]
    size = int(meta0.get("group_size", len(files)))
    label = meta0.get("group", "?")
    # group rank -> global rank, and the rank's collectives by sequence number
    by_rank, glob_of = {}, {}
    for f in files:
        r = int(f["meta"].get("group_rank", 0))
        glob_of[r] = f["meta"].get("global_rank", r)
        by_rank[r] = {e["seq"]: e for e in f["entries"] if e.get("seq", 0) > 0}
    lines = [f"group {label} (id {meta0.get('group_id', '?')}, {size} ranks, backend "
             f"{meta0.get('backend', '?')}):"]
    for f in files:
        lines.append(f"  rank {f['meta'].get('group_rank')} (global {f['meta'].get('global_rank')}"
                     f", pid {f['meta'].get('pid')}): {f.get('reason', '')}")
    problem = False

    def name(r):
        return f"{r}" if glob_of.get(r, r) == r else f"{r} (global {glob_of[r]})"

    missing = [r for r in range(size) if r not in by_rank]
    if missing:
        problem = True
        lines.append(f"  no file from {_ranks(missing)}: dead, or killed before writing one")
    if not by_rank:
        return lines, problem
    # the window every rank still holds (rings may have wrapped)
    lows = [min(s) for s in by_rank.values() if s]
    start = max(lows) if lows else 1
    last = {r: max(s) if s else 0 for r, s in by_rank.items()}
    top = max(last.values())
    for seq in range(start, top + 1):
        have = {r: s[seq] for r, s in by_rank.items() if seq in s}
        groups = collections.defaultdict(list)
        for r, e in have.items():
            groups[_sig(e)].append(r)
        if len(groups) > 1:
            problem = True
            ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
            lines.append(f"  DIVERGED at collective #{seq}:")
            for sig, rs in ranked:
                lines.append(f"    {_ranks(rs)} called {_desc(have[rs[0]])}")
            if len(ranked[0][1]) > len(ranked[1][1]):
                odd = sorted(r for _, rs in ranked[1:] for r in rs)
                lines.append(f"  -> {_ranks([name(r) for r in odd])} diverged from the others")
            return lines, problem
    behind = [r for r, s in last.items() if s < top]
    if behind:
        problem = True
        ahead = [r for r in by_rank if last[r] == top]
        e_top = by_rank[ahead[0]][top]
        lines.append(f"  {_ranks(ahead)} entered collective #{top} {_desc(e_top)} "
                     f"({e_top['state']})")
        for r in sorted(behind):
            if last[r]:
                e = by_rank[r][last[r]]
                lines.append(f"  -> rank {name(r)} is BEHIND: its last collective is "
                             f"#{last[r]} {_desc(e)} ({e['state']}); it never called #{top}")
            else:
                lines.append(f"  -> rank {name(r)} is BEHIND: it recorded no collective")
        return lines, problem
    stuck = {r: s[top] for r, s in by_rank.items() if s and s[top]["state"] != "completed"}
    if stuck:
        problem = True
        e = next(iter(stuck.values()))
        states = ", ".join(f"rank {name(r)} {x['state']}" + (f" ({x['status']})" if x['status']
                                                             else "") + _path(x)
                           for r, x in sorted(stuck.items()))
        who = "every rank" if not missing else _ranks(by_rank)
        lines.append(f"  {who} entered collective #{top} {_desc(e)}; not completed: {states}")
        if missing:
            lines.append(f"  -> {_ranks([name(r) for r in missing])} wrote no record: look there "
                         "first (it died, or left the group)")
        return lines, problem
    if top:
        lines.append(f"  every rank completed collectives up to #{top}; no divergence")
    else:
        lines.append("  no collective recorded")
    return lines, problem


def _by_backend(files):
    """The files of one group, split by the backend of their records: [(backend, files)], each
    file's entries only that backend's (files of older versions name none: 'cpu'); one backend
    keeps the files as they are."""
    names = []
    for f in files:
        for e in f["entries"]:
            b = e.get("backend", "cpu")
            if b not in names:
                names.append(b)
    if len(names) <= 1:
        return [(names[0] if names else None, files)]
    # the device backend's calls first: what a job on it is about
    names.sort(key=lambda b: b == "cpu")
    out = []
    for b in names:
        out.append((b, [dict(f, entries=[e for e in f["entries"] if e.get("backend", "cpu") == b])
                        for f in files]))
    return out


def analyse(files):
    """(lines, problem): the report on every group found in files (load()'s result), and whether
    it found a divergence, a rank behind, a missing rank or a collective that did not complete."""
    groups = collections.OrderedDict()
    for f in files:
        key = (f["meta"].get("group_id"), f["meta"].get("group"))
        groups.setdefault(key, []).append(f)
    out, problem = [], False
    for fs in groups.values():
        split = _by_backend(fs)
        for backend, part in split:
            lines, p = analyse_group(part)
            if len(split) > 1 or backend not in (None, fs[0]["meta"].get("backend", backend)):
                lines[0] = lines[0][:-2] + f", its {backend} calls):"
            out.extend(lines)
            problem = problem or p
    return out, problem


def main(argv=None):
    """The command line (see the module's docstring); returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m pyddp.tools.flight_recorder",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", help="the directory the ranks wrote their files to")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="also print each rank's last records")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.directory):
        print(f"flight_recorder: {args.directory}: not a directory", file=sys.stderr)
        return 2
    files, errors = load(args.directory)
    for e in errors:
        print(f"flight_recorder: skipped {e}", file=sys.stderr)
    if not files:
        print(f"flight_recorder: no flight-recorder files in {args.directory}", file=sys.stderr)
        return 2
    lines, problem = analyse(files)
    print("\n".join(lines))
    if args.verbose:
        for f in files:
            print(f"\n{f['_path']}:")
            for e in f["entries"][-10:]:
                print(f"  #{e['seq']} {_desc(e)} {e['state']} {e['status']}{_path(e)}")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
