"""Two "hosts" on one machine for multi-host tests: two network namespaces joined by a veth pair
(10.77.0.1 and 10.77.0.2). Needs root and iproute2; the fixture skips otherwise."""
import os
import shutil
import subprocess
import uuid

import pytest


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def two_hosts():
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 for network namespaces")
    tag = uuid.uuid4().hex[:6]
    h1, h2, v1, v2 = f"pd1{tag}", f"pd2{tag}", f"pa{tag}", f"pb{tag}"
    if _ip("netns", "add", h1).returncode != 0:
        pytest.skip("cannot create network namespaces here")
    try:
        steps = [("netns", "add", h2), ("link", "add", v1, "type", "veth", "peer", "name", v2),
                 ("link", "set", v1, "netns", h1), ("link", "set", v2, "netns", h2),
                 ("-n", h1, "addr", "add", "10.77.0.1/24", "dev", v1),
                 ("-n", h2, "addr", "add", "10.77.0.2/24", "dev", v2),
                 ("-n", h1, "link", "set", v1, "up"), ("-n", h2, "link", "set", v2, "up"),
                 ("-n", h1, "link", "set", "lo", "up"), ("-n", h2, "link", "set", "lo", "up")]
        for s in steps:
            res = _ip(*s)
            if res.returncode != 0:
                pytest.skip(f"cannot build the veth pair: ip {' '.join(s)}: {res.stderr.strip()}")
        yield h1, h2
    finally:
        _ip("netns", "del", h1)
        _ip("netns", "del", h2)
