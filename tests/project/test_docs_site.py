"""The built user guide reads well offline and at a laptop's width: the site's code is highlighted when it
is built (no script from a CDN), nothing is loaded from the internet, and no page is wider than a
1280-pixel window (wide tables and code scroll inside their own box).

Needs MkDocs with Material (the `docs` extra); the width check also needs Playwright's Python package and
a Chromium (Debian's `chromium-headless-shell` or `chromium`, or PYDDP_DOCS_BROWSER=/path/to/chrome), and
skips without them."""
import functools
import glob
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

import _paths

ROOT = _paths.ROOT
WIDTH = 1280


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (the docs extra)")
    pytest.importorskip("material", reason="Material for MkDocs is not installed (the docs extra)")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(out)


def _pages(site):
    return sorted(os.path.relpath(p, site) for p in glob.glob(os.path.join(site, "**", "index.html"),
                                                               recursive=True)
                  if not os.path.relpath(p, site).startswith(("search", "404")))


def test_the_site_highlights_code_at_build_time_and_loads_nothing_from_the_internet(site):
    pages = _pages(site)
    assert len(pages) >= 20, pages
    highlighted = 0
    for rel in pages:
        html = open(os.path.join(site, rel), encoding="utf-8").read()
        loaded = []
        for tag in re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", html):
            url = re.search(r'\b(?:src|href)="((?:https?:)?//[^"]+)"', tag)
            # <link rel="canonical"> and the like name a page without loading it
            if url and not re.search(r'\brel="(?:canonical|alternate|prev|next)"', tag):
                loaded.append(url.group(1))
        assert not loaded, (rel, loaded)
        assert "highlight.js" not in html and "hljs" not in html, rel
        highlighted += '<span class="k">' in html or '<span class="kn">' in html
    assert highlighted >= 5, "Pygments spans are missing: code is not highlighted at build time"


def _browser():
    exe = os.environ.get("PYDDP_DOCS_BROWSER")
    if exe:
        return exe
    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None   # Playwright's own download, if it has one


def test_no_page_is_wider_than_a_1280_pixel_window(site):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def handle(self):
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=site))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_api.sync_playwright() as pw:
            exe = _browser()
            try:
                browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"]) if exe \
                    else pw.chromium.launch()
            except Exception as e:  # no browser build: Playwright's error says how to get one
                pytest.skip(f"no Chromium to drive: {str(e).splitlines()[0]}")
            try:
                page = browser.new_page(viewport={"width": WIDTH, "height": 900})
                wide = {}
                for rel in _pages(site):
                    page.goto(f"http://127.0.0.1:{server.server_address[1]}/{rel}")
                    width = page.evaluate("Math.max(document.documentElement.scrollWidth,"
                                          " document.body.scrollWidth)")
                    if width > WIDTH:
                        wide[rel] = width
                assert not wide, f"pages wider than a {WIDTH}-pixel window (px): {wide}"
            finally:
                browser.close()
    finally:
        server.shutdown()
