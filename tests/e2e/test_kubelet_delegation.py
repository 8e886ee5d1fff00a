"""The delegating kubelet (kubelet/: the patch series, CRIProbeDelegation) meets the runtime's ProbeService.

The kubelet is 1.37.2 with the series applied (hack/build-kubelet-delegating.sh, built by `make go-binaries`),
standalone as in test_real_kubelet.py. What is asserted is what it logs: with the gate on it asks the CRI endpoint
for the ProbeService (ShimVersion) and says what it found, the shim's instance through the shim, "does not serve"
straight from containerd; with the gate off it never asks. The probing itself is the series' next patches.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from cri_proto import probe_service_pb2 as service_pb
from tests.support import kubelet_env
from tests.support.containerd_env import ContainerdEnv
from tests.support.daemon_env import DaemonProcess
from tests.support.kubelet_env import KubeletProcess

pytestmark = pytest.mark.e2e

GATE = {"CRIProbeDelegation": True}
FOUND = "Probe delegation: the container runtime serves the ProbeService"
NOT_SERVED = "Probe delegation: the container runtime does not serve the ProbeService"
LOG_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def node(containerd: ContainerdEnv):
    reason = kubelet_env.delegation_unavailable_reason(containerd.runtime)
    if reason is not None:
        pytest.skip(reason)
    binary = kubelet_env.delegating_kubelet_binary()
    containerd.remove_all_sandboxes()  # the kubelet kills every sandbox it does not know
    workdir = Path(tempfile.mkdtemp(prefix="delegation-", dir=containerd.session.path()))
    (workdir / "shim").mkdir()
    shim = DaemonProcess(workdir / "shim", ["--runtime-endpoint", containerd.endpoint]).start()
    yield workdir, shim, binary, containerd.endpoint
    assert shim.stop() == 0


def run_kubelet(workdir: Path, endpoint: str, binary: Path, gates: dict) -> KubeletProcess:
    return KubeletProcess(workdir, endpoint, binary=binary, feature_gates=gates).start()


def wait_logged(kubelet: KubeletProcess, text: str) -> str:
    deadline = time.monotonic() + LOG_TIMEOUT_S
    while text not in kubelet.log_text():
        assert time.monotonic() < deadline, f"the kubelet never logged {text!r}:\n{kubelet.log_tail()}"
        time.sleep(kubelet_env.POLL_S)  # a log line has no event to wait on
    return next(line for line in kubelet.log_text().splitlines() if text in line)


def test_with_the_gate_on_the_kubelet_finds_the_shims_probe_service(node):
    workdir, shim, binary, _ = node
    kubelet = run_kubelet(workdir / "through-shim", f"unix://{shim.socket_path}", binary, GATE)
    try:
        line = wait_logged(kubelet, FOUND)
        version = shim.stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=10)
        assert f'instance="{version.instance_id}"' in line and f'apiVersion="{version.api_version}"' in line
        assert NOT_SERVED not in kubelet.log_text()
    finally:
        assert kubelet.stop() == 0


def test_with_the_gate_on_straight_to_containerd_the_kubelet_probes_itself(node):
    workdir, _, binary, containerd_endpoint = node
    kubelet = run_kubelet(workdir / "straight", containerd_endpoint, binary, GATE)
    try:
        wait_logged(kubelet, NOT_SERVED)
        assert FOUND not in kubelet.log_text()
    finally:
        assert kubelet.stop() == 0


def test_with_the_gate_off_the_kubelet_never_asks(node):
    workdir, shim, binary, _ = node
    kubelet = run_kubelet(workdir / "gate-off", f"unix://{shim.socket_path}", binary, {})
    try:
        # Up and syncing (its healthz answered in start()); a discovery would have been logged at once.
        wait_logged(kubelet, "Starting kubelet main sync loop")
        assert "Probe delegation" not in kubelet.log_text()
    finally:
        assert kubelet.stop() == 0

