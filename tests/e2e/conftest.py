"""Fixtures of the end-to-end suite: one real containerd for the suite, one real shim per test in front of it.

Run alone with `make e2e` (`pytest -m e2e tests/e2e`); it also runs in `make test`. Every test runs once per
containerd release (CONTAINERD_VERSIONS: the newest 2.x that `make containerd` builds, then Debian's 1.6; ids
`[containerd2.4.2]`, `[containerd1.6]`). Skips with the reason when not root or when containerd, runc, the CNI
plugins or busybox-static are missing.
"""

from __future__ import annotations

import select
import subprocess

import pytest

from tests.support.containerd_env import RECONCILE_INTERVAL_S, running_containerd, runtimes
from tests.support.cri_client import CriClient, Kubelet, Pod
from tests.support.daemon_env import DaemonProcess
from tests.support.netns_env import REPO_ROOT

SERVER_READY_TIMEOUT_S = 30


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: end-to-end tests against a real containerd (root; `make e2e`)")


# Package scope: one containerd per release for the whole e2e suite (pytest runs every test on the first before
# starting the second), stopped as soon as its last test is done (in `make test` the rest of the suite then runs
# without it).
@pytest.fixture(scope="package", params=runtimes(), ids=lambda runtime: f"containerd{runtime.version}")
def containerd(request):
    """containerd with a private config, root, state, sockets, CNI network and the test images."""
    with running_containerd(unavailable=pytest.skip, runtime=request.param) as env:
        yield env


@pytest.fixture
def make_shim(tmp_path, containerd):
    """Starts `probe-shim serve --runtime-endpoint unix://<containerd>` (`.cri` talks CRI through its socket);
    stops it at teardown, then removes whatever pod sandbox the test left (it may have failed half-way)."""
    daemons: list[DaemonProcess] = []

    def start(reconcile_interval_s: float = RECONCILE_INTERVAL_S, extra_args: tuple[str, ...] = ()) -> DaemonProcess:
        daemon = DaemonProcess(tmp_path / f"shim{len(daemons)}", ["--runtime-endpoint", containerd.endpoint,
                                                                   "--reconcile-interval", str(reconcile_interval_s),
                                                                   *extra_args])
        daemon.workdir.mkdir()
        daemons.append(daemon)
        daemon.start()
        daemon.cri = CriClient(daemon.channel)
        return daemon

    try:
        yield start
    finally:
        codes = [(d, d.stop()) for d in daemons if d.proc is not None]
        containerd.remove_all_sandboxes()
    for daemon, code in codes:
        assert code == 0, f"the shim did not stop cleanly (exit {code}):\n{daemon.logs()[-4000:]}"


@pytest.fixture
def shim(make_shim) -> DaemonProcess:
    """The shim with `--reconcile-interval 0.5`."""
    return make_shim()


@pytest.fixture
def kubelet(shim, containerd) -> Kubelet:
    """A kubelet-like CRI client whose calls all go through the shim's socket."""
    return Kubelet(shim.cri, containerd)


@pytest.fixture
def in_pod():
    """Starts a host program inside a pod's network namespace (nsenter); stopped at teardown."""
    procs: list[subprocess.Popen] = []

    def start(pod: Pod, argv: list[str]) -> int:
        proc = subprocess.Popen(["nsenter", f"--net={pod.netns_path}", *argv], cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], SERVER_READY_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("READY "):
            proc.kill()
            raise AssertionError(f"{argv} in {pod.netns_path} did not print READY: {line!r} {proc.stderr.read()}")
        return int(line.split()[1])

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
