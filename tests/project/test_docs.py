"""The documentation cannot drift from the code: every Python block of README.md and docs/*.md runs, the
API coverage page's list of what is missing is still missing, README's links lead to files, and the site
builds in strict mode (where MkDocs is installed: the `docs` extra).

A block runs as a script of its own (``python block.py``, in an empty directory, importing this
checkout's pyddp) unless an HTML comment on the line above it says otherwise:

    <!-- docs-test: launch 2 -->               under pyddp-run --standalone --nproc-per-node 2
    <!-- docs-test: needs torch -->            skipped where torch cannot be imported
    <!-- docs-test: skip (why it cannot run) -->

(directives combine with commas: ``launch 2, needs torch``).  A block passes when it exits 0: the
blocks assert what they compute."""
import glob
import os
import re
import subprocess
import sys

import pytest

import _paths
from _launch import launcher_env

ROOT = _paths.ROOT
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
BLOCK_TIMEOUT = 180   # the slowest block starts 2 ranks and a DataLoader's workers on a loaded machine


def _blocks():
    """(page, line, directives, code) for every ```python block."""
    out = []
    for page in PAGES:
        lines = open(page, encoding="utf-8").read().split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\S*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            end = i + 1
            while not lines[end].startswith("```"):
                end += 1
            if m.group(1) == "python":
                d = re.match(r"^<!-- docs-test: (.*) -->$", lines[i - 1]) if i else None
                out.append((os.path.relpath(page, ROOT), i + 1, d.group(1) if d else "",
                            "\n".join(lines[i + 1:end]) + "\n"))
            i = end + 1
    return out


BLOCKS = _blocks()


def _directives(text):
    """{'launch': N, 'needs': [modules], 'skip': reason}, from a docs-test comment."""
    found = {"launch": None, "needs": [], "skip": None}
    if text.startswith("skip"):
        reason = text[len("skip"):].strip()
        if not (reason.startswith("(") and reason.endswith(")") and len(reason) > 2):
            raise ValueError(f"'skip' needs a reason in parentheses: {text!r}")
        found["skip"] = reason[1:-1]
        return found
    for part in filter(None, (p.strip() for p in text.split(","))):
        word, _, arg = part.partition(" ")
        if word == "launch" and arg.isdigit():
            found["launch"] = int(arg)
        elif word == "needs" and arg:
            found["needs"].append(arg)
        else:
            raise ValueError(f"unknown docs-test directive {part!r}")
    return found


def test_the_blocks_are_found_and_their_directives_are_known():
    assert len(BLOCKS) >= 10, BLOCKS
    for page, line, text, _ in BLOCKS:
        _directives(text)   # raises on a typo
    # most of them run: a page whose examples are all skipped would drift unseen
    assert sum(1 for *_, text, _ in BLOCKS if not text.startswith("skip")) >= len(BLOCKS) * 2 // 3


@pytest.mark.timeout(BLOCK_TIMEOUT + 30)
@pytest.mark.parametrize("page, line, text, code", BLOCKS, ids=[f"{p}:{n}" for p, n, _, _ in BLOCKS])
def test_code_block_runs(page, line, text, code, tmp_path):
    d = _directives(text)
    if d["skip"]:
        pytest.skip(d["skip"])
    for module in d["needs"]:
        pytest.importorskip(module)
    script = tmp_path / "block.py"
    script.write_text(code)
    if d["launch"]:
        cmd = [sys.executable, "-m", "pyddp.run", "--standalone", "--nproc-per-node", str(d["launch"]),
               str(script)]
    else:
        cmd = [sys.executable, str(script)]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=launcher_env(OMP_NUM_THREADS=1),
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    assert proc.returncode == 0, f"{page}:{line} failed\n{code}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def test_api_coverage_lists_as_missing_only_what_is_missing():
    import pyddp.distributed as dist

    text = open(os.path.join(ROOT, "docs", "api-coverage.md"), encoding="utf-8").read()
    missing = re.search(r"^Not implemented \(.*?\n\n", text, re.S | re.M).group(0)
    names = {n for n in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", missing) if n != "pyddp"}
    assert {"send_object_list", "new_subgroups", "rendezvous"} <= names, names
    there = sorted(n for n in names if hasattr(dist, n) and n not in ("Future", "store"))
    assert not there, f"docs/api-coverage.md lists as not implemented what pyddp.distributed has: {there}"


def test_readme_links_lead_to_files_and_anchors_that_exist():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) >= 20, links
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", text, re.M)}
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        if path:
            assert os.path.exists(os.path.join(ROOT, path)), link
        elif anchor:
            assert anchor in anchors, (link, sorted(anchors))


def test_the_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (the docs extra)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "gpu" / "index.html").exists()
