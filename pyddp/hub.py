"""``pyddp.hub``: torch.hub's checkpoint cache and local hub repositories.

* ``load_state_dict_from_url(url, model_dir=None, map_location=None, progress=True,
  check_hash=False, file_name=None, weights_only=False)`` as torch's: the file goes to
  ``<hub dir>/checkpoints/<file name>`` (the URL's last path segment, or ``file_name``), is
  downloaded only when it is not there yet (urllib, into a ``.partial`` file moved in place when
  complete), and is read with :func:`pyddp.load` (pyddp's format and torch's zip format, so torch's
  published checkpoints load as pyddp Tensors; the legacy single-file zip too).  ``check_hash``
  compares the SHA-256 of a download with the hex prefix in the file name (``name-<hash>.pth``,
  torch's rule ``-([a-f0-9]*)\\.``).  ``progress`` shows a tqdm bar when tqdm is installed.
  A download that fails (no network, a refused connection, an HTTP error) raises ``OSError``
  naming the file, the URL and the exact path to copy the file to by hand.
* ``get_dir()`` / ``set_dir(d)``: the hub directory: ``set_dir``'s, else ``$TORCH_HOME/hub``,
  else ``$XDG_CACHE_HOME/torch/hub``, else ``~/.cache/torch/hub`` (torch's order), so pyddp and
  torch share one cache.
* ``download_url_to_file(url, dst, hash_prefix=None, progress=True)`` as torch's.
* ``list`` / ``help`` / ``load`` of a hub repository: with ``source='local'`` (a directory with a
  ``hubconf.py``) as torch's: the public callables of hubconf are the entrypoints, its
  ``dependencies`` are checked.  pyddp does not fetch repositories from GitHub: ``'owner/repo'``
  is served from torch's cache directory (``<hub dir>/owner_repo_<ref>``) when a clone is already
  there, else a RuntimeError says how to get it (git clone, then ``source='local'``).
"""
from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import uuid
import warnings
from urllib.parse import urlparse

__all__ = ["get_dir", "set_dir", "load_state_dict_from_url", "download_url_to_file", "list",
           "help", "load"]

ENV_TORCH_HOME = "TORCH_HOME"
ENV_XDG_CACHE_HOME = "XDG_CACHE_HOME"
DEFAULT_CACHE_DIR = "~/.cache"
VAR_DEPENDENCY = "dependencies"
MODULE_HUBCONF = "hubconf.py"
READ_DATA_CHUNK = 128 * 1024
# torch's rule: the hash prefix is what follows the last '-' before a '.' in the file name
HASH_REGEX = re.compile(r"-([a-f0-9]*)\.")

_hub_dir = None


def _get_torch_home():
    from . import _config
    home = _config.get(ENV_TORCH_HOME)
    if home is None:
        home = os.path.join(os.getenv(ENV_XDG_CACHE_HOME, DEFAULT_CACHE_DIR), "torch")
    return os.path.expanduser(home)


def get_dir():
    """The hub directory: set_dir's, else ``$TORCH_HOME/hub``, else
    ``$XDG_CACHE_HOME/torch/hub``, else ``~/.cache/torch/hub`` (torch's)."""
    from . import _config
    if _config.get("TORCH_HUB"):
        warnings.warn("TORCH_HUB is deprecated, please use env TORCH_HOME instead")
    if _hub_dir is not None:
        return _hub_dir
    return os.path.join(_get_torch_home(), "hub")


def set_dir(d):
    """Use ``d`` as the hub directory (checkpoints under ``d/checkpoints``)."""
    global _hub_dir
    _hub_dir = os.path.expanduser(os.fspath(d))


class _Progress:
    """tqdm's bar when tqdm is installed, else nothing shown."""

    def __init__(self, total, disable):
        self._bar = None
        if not disable:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024)

    def update(self, n):
        if self._bar is not None:
            self._bar.update(n)

    def close(self):
        if self._bar is not None:
            self._bar.close()


def _by_hand(url, dst, why):
    return OSError(
        f"pyddp.hub: could not download {os.path.basename(dst)!r} from {url} ({why}). Without a "
        f"network, fetch the file elsewhere and copy it to {dst} (the hub cache: "
        "pyddp.hub.get_dir()/checkpoints, set by $TORCH_HOME or pyddp.hub.set_dir); it is read "
        "from there without a download.")


def download_url_to_file(url, dst, hash_prefix=None, progress=True):
    """Download ``url`` to ``dst`` (through a temporary ``.partial`` file); with ``hash_prefix``,
    the SHA-256 of the bytes must start with it (RuntimeError otherwise, nothing left behind)."""
    from urllib.error import URLError
    from urllib.request import Request, urlopen

    dst = os.path.expanduser(os.fspath(dst))
    try:
        u = urlopen(Request(url, headers={"User-Agent": "torch.hub"}), timeout=60)
    except (URLError, OSError, ValueError) as e:
        raise _by_hand(url, dst, getattr(e, "reason", None) or e) from e
    with u:
        length = u.info().get_all("Content-Length")
        file_size = int(length[0]) if length else None
        for _ in range(tempfile.TMP_MAX):
            tmp_dst = dst + "." + uuid.uuid4().hex + ".partial"
            try:
                f = open(tmp_dst, "x+b")
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(errno.EEXIST, "No usable temporary file name found")
        try:
            sha256 = hashlib.sha256() if hash_prefix is not None else None
            bar = _Progress(file_size, not progress)
            try:
                while True:
                    try:
                        buffer = u.read(READ_DATA_CHUNK)
                    except OSError as e:
                        raise _by_hand(url, dst, f"the connection broke: {e}") from e
                    if not buffer:
                        break
                    f.write(buffer)
                    if sha256 is not None:
                        sha256.update(buffer)
                    bar.update(len(buffer))
            finally:
                bar.close()
            f.close()
            if sha256 is not None:
                digest = sha256.hexdigest()
                if digest[:len(hash_prefix)] != hash_prefix:
                    raise RuntimeError(
                        f'invalid hash value (expected "{hash_prefix}", got "{digest}")')
            shutil.move(f.name, dst)
        finally:
            f.close()
            if os.path.exists(f.name):
                os.remove(f.name)


def _is_legacy_zip_format(filename):
    import zipfile
    if zipfile.is_zipfile(filename):
        infolist = zipfile.ZipFile(filename).infolist()
        return len(infolist) == 1 and not infolist[0].is_dir()
    return False


def _legacy_zip_load(filename, model_dir, map_location, weights_only):
    import zipfile

    from .serialization import load
    with zipfile.ZipFile(filename) as f:
        members = f.infolist()
        if len(members) != 1:
            raise RuntimeError("Only one file(not dir) is allowed in the zipfile")
        f.extractall(model_dir)
        extracted_name = members[0].filename
        extracted_file = os.path.join(model_dir, extracted_name)
    return load(extracted_file, map_location=map_location, weights_only=weights_only)


def load_state_dict_from_url(url, model_dir=None, map_location=None, progress=True,
                             check_hash=False, file_name=None, weights_only=False):
    """torch.hub.load_state_dict_from_url: the object saved at ``url``, cached in
    ``model_dir`` (default ``get_dir()/checkpoints``) and read with pyddp.load."""
    from .serialization import load

    from . import _config
    if _config.get("TORCH_MODEL_ZOO"):
        warnings.warn("TORCH_MODEL_ZOO is deprecated, please use env TORCH_HOME instead")
    if model_dir is None:
        model_dir = os.path.join(get_dir(), "checkpoints")
    os.makedirs(model_dir, exist_ok=True)
    filename = os.path.basename(urlparse(url).path)
    if file_name is not None:
        filename = file_name
    cached_file = os.path.join(model_dir, filename)
    if not os.path.exists(cached_file):
        sys.stderr.write(f'Downloading: "{url}" to {cached_file}\n')
        hash_prefix = None
        if check_hash:
            r = HASH_REGEX.search(filename)
            hash_prefix = r.group(1) if r else None
        download_url_to_file(url, cached_file, hash_prefix, progress=progress)
    if _is_legacy_zip_format(cached_file) and not _is_torch_zip(cached_file):
        return _legacy_zip_load(cached_file, model_dir, map_location, weights_only)
    return load(cached_file, map_location=map_location, weights_only=weights_only)


def _is_torch_zip(filename):
    import zipfile
    with zipfile.ZipFile(filename) as f:
        return any(n.endswith("data.pkl") for n in f.namelist())


# ------------------------------------------------------------------------ hub repositories

def _parse_repo_info(github):
    if ":" in github:
        repo_info, ref = github.split(":", 1)
    else:
        repo_info, ref = github, None
    owner, _, name = repo_info.partition("/")
    return owner, name, ref


def _repo_dir(github, source):
    """The directory of a hub repository: ``github`` itself for source='local'; for 'github',
    a clone already in torch's cache, else a RuntimeError saying what to do."""
    if source not in ("github", "local"):
        raise ValueError(f'Unknown source: "{source}". Allowed values: "github" | "local".')
    if source == "local":
        return github
    owner, name, ref = _parse_repo_info(github)
    hub_dir = get_dir()
    refs = [ref] if ref else ["main", "master"]
    for r in refs:
        d = os.path.join(hub_dir, "_".join([owner, name, r.replace("/", "_")]))
        if os.path.isfile(os.path.join(d, MODULE_HUBCONF)):
            return d
    where = os.path.join(hub_dir, "_".join([owner, name, (ref or "main").replace("/", "_")]))
    raise RuntimeError(
        f"pyddp.hub does not fetch hub repositories from GitHub ({github!r}). Clone it yourself "
        f"(git clone https://github.com/{owner}/{name}" + (f" -b {ref}" if ref else "") + ") and "
        f"pass its directory with source='local', or put the clone at {where} (torch.hub's "
        "cache, which pyddp reads). For published weights alone, "
        "pyddp.hub.load_state_dict_from_url(url) downloads and caches the checkpoint.")


def _import_hubconf(repo_dir):
    path = os.path.join(repo_dir, MODULE_HUBCONF)
    if not os.path.isfile(path):
        raise ValueError(f"{path} does not exist (a hub repository has a {MODULE_HUBCONF})")
    sys.path.insert(0, repo_dir)
    try:
        spec = importlib.util.spec_from_file_location("hubconf", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        try:
            sys.path.remove(repo_dir)
        except ValueError:
            pass
    deps = getattr(module, VAR_DEPENDENCY, None)
    if deps is not None:
        missing = [pkg for pkg in deps if importlib.util.find_spec(pkg) is None]
        if missing:
            raise RuntimeError(f"Missing dependencies: {', '.join(missing)}")
    return module


def _entry(module, model):
    if not isinstance(model, str):
        raise ValueError("Invalid input: model should be a string of function name")
    func = getattr(module, model, None)
    if func is None or not callable(func):
        raise RuntimeError(f"Cannot find callable {model} in hubconf")
    return func


def list(github, force_reload=False, skip_validation=False, trust_repo=None, verbose=True,
         source="github"):  # noqa: A001  (torch.hub.list's name)
    """The entrypoints of a hub repository (hubconf.py's public callables); ``source='local'``
    (a pyddp extension: torch's list has only GitHub) reads a directory."""
    module = _import_hubconf(_repo_dir(github, source))
    return [f for f in dir(module) if callable(getattr(module, f)) and not f.startswith("_")]


def help(github, model, force_reload=False, skip_validation=False, trust_repo=None,
         source="github"):  # noqa: A001  (torch.hub.help's name)
    """The docstring of entrypoint ``model``."""
    return _entry(_import_hubconf(_repo_dir(github, source)), model).__doc__


def load(repo_or_dir, model, *args, source="github", trust_repo=None, force_reload=False,
         verbose=True, skip_validation=False, **kwargs):
    """``model(*args, **kwargs)`` of a hub repository's hubconf (``source='local'``: a
    directory)."""
    source = source.lower()
    return _entry(_import_hubconf(_repo_dir(repo_or_dir, source)), model)(*args, **kwargs)
