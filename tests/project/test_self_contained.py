"""Nothing in the repository points at files outside it: no absolute paths into the machine it was
written on and no relative path that climbs out of the checkout (the facts a file needs belong in
the repository's own docs)."""
import os
import re

import _paths

ROOT = _paths.ROOT
SKIP_DIRS = {".git", "build", "__pycache__", ".pytest_cache", "dist"}
TEXT = (".py", ".pyi", ".md", ".c", ".h", ".toml", ".cfg", ".txt", ".ipynb", ".sh", ".mk", ".yml",
        ".yaml", ".json", "Makefile", "run")
# spelled in pieces so that this file does not match itself
FORBIDDEN = [re.compile(p) for p in (
    "/" + "work/",                      # the machine's project directories
    r"\.\./" + "shared",                # a folder beside the checkout
    "shared" + "/reference",
    r"(?<![\w.])(?:\.\./){3,}",         # climbing three or more levels out
)]


def _files():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info")]
        for f in files:
            if f.endswith(TEXT):
                yield os.path.join(d, f)


def test_no_reference_outside_the_repository():
    bad = []
    n = 0
    for path in _files():
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        n += 1
        for lineno, line in enumerate(text.splitlines(), 1):
            for pat in FORBIDDEN:
                if pat.search(line):
                    bad.append(f"{os.path.relpath(path, ROOT)}:{lineno}: {line.strip()[:120]}")
    assert n > 100
    assert not bad, "references outside the repository:\n" + "\n".join(bad)
