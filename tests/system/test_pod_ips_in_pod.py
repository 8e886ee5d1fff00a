"""Pod IP discovery in a real pod netns, checked against pyroute2 (the parsing itself: tests/unit/test_pod_ips.py)."""

from __future__ import annotations

import pytest

# Cross-check with pyroute2 (the well-kept netlink library the worker no longer loads: it cost every embedded-mode
# worker 5.8 MiB): in a real netns, our one-dump answer must equal what pyroute2 reads for the same filter.
_BOTH_VIEWS = """
import json
from pyroute2 import IPRoute
from probe_worker.pod_ips import discover_pod_ips
with IPRoute() as ipr:
    theirs = [a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS") for a in ipr.get_addr()
              if a["scope"] == 0 and a.get_attr("IFA_LABEL") != "lo"]
print(json.dumps({"ours": discover_pod_ips(), "pyroute2": theirs}))
"""


@pytest.mark.netns
def test_discovery_agrees_with_pyroute2_in_a_real_netns(pod_netns):
    import json
    import subprocess
    import sys

    from tests.support.netns_env import REPO_ROOT

    out = subprocess.run(["ip", "netns", "exec", pod_netns.name, sys.executable, "-c", _BOTH_VIEWS],
                         capture_output=True, text=True, timeout=30, cwd=REPO_ROOT, check=True).stdout
    views = json.loads(out)
    assert views["ours"] == [pod_netns.ipv4, pod_netns.ipv6]
    assert sorted(views["ours"]) == sorted(views["pyroute2"])
