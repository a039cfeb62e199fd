"""pyddp.hub / pyddp.utils.model_zoo: torch.hub's checkpoint cache, against torch 2.13's rules.

A local HTTP server (http.server on 127.0.0.1, in a thread, stopped by each test) serves
checkpoints written by pyddp.save and torch.save; with no server the error names the file, the URL
and the exact cache path to copy it to.  Hub repositories: source='local' with a hubconf.py;
GitHub repositories raise a clear error unless a clone is in torch's cache directory.
"""
import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import pyddp
import pyddp.hub as hub
from pyddp.utils import model_zoo


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh TORCH_HOME (and no set_dir) for each test."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(hub, "_hub_dir", None)
    return tmp_path / "torch_home"


class _Server:
    """http.server on 127.0.0.1 serving a directory; counts the GET requests."""

    def __init__(self, root):
        server = self
        self.gets = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                server.gets.append(self.path)
                return super().do_GET()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "www"
    (root / "models").mkdir(parents=True)
    srv = _Server(root)
    yield root / "models", srv
    srv.close()


def _state():
    return {"w": pyddp.tensor(np.arange(6.0).reshape(2, 3)), "b": np.ones(3, dtype=np.float32)}


def test_get_dir_follows_torch_home_xdg_and_set_dir(monkeypatch, tmp_path):
    """Same answers as torch.hub.get_dir under the same variables."""
    cases = [{"TORCH_HOME": str(tmp_path / "th")},
             {"XDG_CACHE_HOME": str(tmp_path / "xdg")},
             {"TORCH_HOME": "~/somewhere", "XDG_CACHE_HOME": str(tmp_path / "xdg")},
             {}]
    for env in cases:
        for k in ("TORCH_HOME", "XDG_CACHE_HOME"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(hub, "_hub_dir", None)
        mine = hub.get_dir()
        try:
            import torch.hub  # noqa: F401
        except ImportError:
            want = None
        else:
            want = subprocess.run(
                [sys.executable, "-c", "import torch.hub; print(torch.hub.get_dir())"],
                capture_output=True, text=True, timeout=120, env=dict(os.environ)).stdout.strip()
        if want is not None:
            assert mine == want, env
    assert hub.get_dir() == os.path.expanduser("~/.cache/torch/hub")
    hub.set_dir("~/elsewhere")
    assert hub.get_dir() == os.path.expanduser("~/elsewhere")
    monkeypatch.setattr(hub, "_hub_dir", None)


def test_download_cache_and_load(home, served):
    models, srv = served
    pyddp.save(_state(), models / "tiny.pth")
    url = f"{srv.url}/models/tiny.pth?raw=1"
    sd = hub.load_state_dict_from_url(url, progress=False, map_location="cpu")
    cached = home / "hub" / "checkpoints" / "tiny.pth"        # named after the URL's path
    assert cached.is_file()
    assert np.array_equal(sd["w"].numpy(), np.arange(6.0).reshape(2, 3))
    assert sd["b"].dtype == np.float32
    assert len(srv.gets) == 1
    # cached: no second download; model_zoo.load_url is the same function
    sd2 = model_zoo.load_url(url, progress=False)
    assert len(srv.gets) == 1 and np.array_equal(sd2["w"].numpy(), sd["w"].numpy())
    assert not [p for p in cached.parent.iterdir() if p.name.endswith(".partial")]
    # file_name= and model_dir=
    sd3 = hub.load_state_dict_from_url(url, model_dir=str(home / "mine"), file_name="other.pt",
                                       progress=True)
    assert (home / "mine" / "other.pt").is_file() and len(srv.gets) == 2
    assert sorted(sd3) == ["b", "w"]


def test_torch_zip_checkpoint_loads(home, served):
    torch = pytest.importorskip("torch")
    models, srv = served
    torch.save({"fc.weight": torch.arange(4.0).reshape(2, 2), "fc.bias": torch.zeros(2)},
               models / "resnet-tiny.pth")
    sd = hub.load_state_dict_from_url(f"{srv.url}/models/resnet-tiny.pth", progress=False)
    assert isinstance(sd["fc.weight"], pyddp.Tensor)
    assert sd["fc.weight"].numpy().tolist() == [[0.0, 1.0], [2.0, 3.0]]
    m = pyddp.nn.Linear(2, 2)
    m.load_state_dict({"weight": sd["fc.weight"], "bias": sd["fc.bias"]})


def test_check_hash_prefix_rule(home, served):
    models, srv = served
    pyddp.save(_state(), models / "x.pth")
    data = (models / "x.pth").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    good = f"net-{digest[:8]}.pth"
    bad = "net-deadbeef.pth"
    (models / good).write_bytes(data)
    (models / bad).write_bytes(data)
    assert hub.HASH_REGEX.search(good).group(1) == digest[:8]
    sd = hub.load_state_dict_from_url(f"{srv.url}/models/{good}", check_hash=True, progress=False)
    assert sorted(sd) == ["b", "w"]
    with pytest.raises(RuntimeError, match=f'invalid hash value \\(expected "deadbeef", got '
                                           f'"{digest}"\\)'):
        hub.load_state_dict_from_url(f"{srv.url}/models/{bad}", check_hash=True, progress=False)
    ck = home / "hub" / "checkpoints"
    assert not (ck / bad).exists() and not [p for p in ck.iterdir() if ".partial" in p.name]
    # without check_hash the same file is taken as it is
    hub.load_state_dict_from_url(f"{srv.url}/models/{bad}", progress=False)
    assert (ck / bad).exists()
    # torch's regex on the same names
    try:
        from torch.hub import HASH_REGEX
    except ImportError:
        return
    for name in (good, bad, "resnet18-f37072fd.pth", "plain.pth", "a-b-c0ffee.tar.gz"):
        r1, r2 = hub.HASH_REGEX.search(name), HASH_REGEX.search(name)
        assert (r1 and r1.group(1)) == (r2 and r2.group(1))


def test_no_server_error_names_file_url_and_cache_path(home, served):
    models, srv = served
    srv.close()          # nothing listens there any more
    url = f"{srv.url}/models/resnet18-f37072fd.pth"
    with pytest.raises(OSError) as ei:
        hub.load_state_dict_from_url(url, progress=False)
    msg = str(ei.value)
    dst = str(home / "hub" / "checkpoints" / "resnet18-f37072fd.pth")
    assert "'resnet18-f37072fd.pth'" in msg and url in msg and dst in msg
    assert "copy it to" in msg
    # an HTTP error (404) says the same
    srv2 = _Server(models)
    try:
        with pytest.raises(OSError, match="could not download 'missing.pth'.*copy it to"):
            hub.load_state_dict_from_url(f"{srv2.url}/missing.pth", progress=False)
    finally:
        srv2.close()
    # the file copied there by hand is read without a network
    pyddp.save(_state(), dst)
    assert sorted(hub.load_state_dict_from_url(url)) == ["b", "w"]


_HUBCONF = '''
dependencies = ["numpy"]
import pyddp.nn as nn


def tiny(out_features=2, pretrained=False):
    """A tiny linear model."""
    return nn.Linear(3, out_features)


def _private():
    pass

CONSTANT = 3
'''


def test_local_hub_repo_list_help_load(tmp_path, home):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hubconf.py").write_text(_HUBCONF)
    assert hub.list(str(repo), source="local") == ["tiny"]
    assert hub.help(str(repo), "tiny", source="local").strip() == "A tiny linear model."
    m = hub.load(str(repo), "tiny", source="local", out_features=4)
    assert isinstance(m, pyddp.nn.Linear) and m.out_features == 4
    with pytest.raises(RuntimeError, match="Cannot find callable nope in hubconf"):
        hub.load(str(repo), "nope", source="local")
    (repo / "hubconf.py").write_text('dependencies = ["no_such_pkg_xyz"]\n')
    with pytest.raises(RuntimeError, match="Missing dependencies: no_such_pkg_xyz"):
        hub.list(str(repo), source="local")
    with pytest.raises(ValueError, match="Unknown source"):
        hub.load(str(repo), "tiny", source="ftp")


def test_github_repos_clear_error_or_cached_clone(home, tmp_path):
    with pytest.raises(RuntimeError) as ei:
        hub.list("pytorch/vision")
    msg = str(ei.value)
    assert "does not fetch hub repositories from GitHub" in msg
    assert "git clone https://github.com/pytorch/vision" in msg and "source='local'" in msg
    with pytest.raises(RuntimeError, match="vision.*-b v0.15"):
        hub.load("pytorch/vision:v0.15", "resnet18")
    # a clone already in torch's cache directory is used
    clone = home / "hub" / "pytorch_vision_main"
    clone.mkdir(parents=True)
    (clone / "hubconf.py").write_text(_HUBCONF)
    assert hub.list("pytorch/vision") == ["tiny"]
    assert isinstance(hub.load("pytorch/vision", "tiny"), pyddp.nn.Linear)
