"""The measured setup of the containerd comparisons: a private containerd with pod sandboxes, a server in the
first pod, and shim daemons in front of containerd (bench/proxy_latency.py, the suite's exec and proxy scenarios).

Owned here so that the standalone proxy benchmark and the suite start containerd, the pods and the shims the same
way; everything started is stopped on the way out, also when starting fails half way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.children import start_server, stop_server
from bench.cri_calls import SERVER_PATH, http_probe_spec
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from cri_proto import probe_spec_pb2 as spec_pb

FILLER_LABEL = "bench-filler"
WARM_PROBE_PERIOD_MS = 10_000  # the probe that keeps the worker up: rare enough not to disturb the measurement


@dataclass
class ContainerdRig:
    """A private containerd with `pod_count` pod sandboxes (busybox httpd on the pod's 127.0.0.1:8080 in each),
    tests/support/servers/http_server.py on 127.0.0.1:`server_port` in the first pod's netns, and a shim daemon in front
    of containerd with one probe registered in the first pod (its worker stays up), started with `shim_env`
    added to the environment. `shim_envs`: more shims, each with its own extra environment (`others`, by name);
    `shim_roots`: more shims, each run from another checkout's code (e.g. the code before a change, for an A/B in
    one run). `filler_containers`: that many more containers (created, not started: a listing shows them, and
    creating one takes no runc), spread over the pods, FILLER_LABEL on each, `filler_marked` of them with the
    value "marked" (the others "plain"), so that ListContainers can be asked for a small and a large answer."""
    pod_count: int = 3
    shim_env: dict[str, str] = field(default_factory=dict)
    shim_envs: dict[str, dict[str, str]] = field(default_factory=dict)
    shim_roots: dict[str, Path] = field(default_factory=dict)
    filler_containers: int = 0
    filler_marked: int = 0
    env: object = None
    shim: object = None
    others: dict = field(default_factory=dict)
    pods: list = field(default_factory=list)
    direct: grpc.Channel | None = None
    busybox: str = ""
    http_port: int = 0     # busybox httpd in the "http" container of every pod
    server_port: int = 0   # tests/support/servers/http_server.py in the first pod's netns
    _server: subprocess.Popen | None = None
    _workdirs: list[Path] = field(default_factory=list)

    def __enter__(self) -> "ContainerdRig":
        from tests.support.containerd_env import (
            HTTP_PORT,
            ContainerdEnv,
            CriClient,
            Kubelet,
            cri_channel,
            default_runtime,
            sweep_stale_sessions,
            unavailable_reason,
        )

        runtime = default_runtime()  # the tests' first: containerd 2.4.2 unless CONTAINERD_VERSIONS says otherwise
        reason = unavailable_reason(runtime)
        if reason is not None:
            raise SystemExit(f"containerd benchmark unavailable: {reason}")
        sweep_stale_sessions()
        self.http_port = HTTP_PORT
        self.env = ContainerdEnv.create(runtime)
        try:
            self.env.start()
            self.busybox = self.env.busybox
            self.direct = cri_channel(self.env.endpoint)
            kubelet = Kubelet(CriClient(self.direct), self.env)
            for n in range(self.pod_count):
                pod = kubelet.run_pod(f"bench-{n}")
                kubelet.start_container(pod, "http", self.env.images.http)
                self.pods.append(pod)
            self._create_fillers(kubelet)
            self._server, ready = start_server(["nsenter", f"--net={self.pods[0].netns_path}", sys.executable,
                                                "tests/support/servers/http_server.py", "--host", "127.0.0.1",
                                                "--port", "0"])
            self.server_port = int(ready.split()[1])
            self.shim = self._start_shim(self.shim_env)
            for name, extra in self.shim_envs.items():
                self.others[name] = self._start_shim(extra)
            for name, code_root in self.shim_roots.items():
                self.others[name] = self._start_shim({}, code_root)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _create_fillers(self, kubelet) -> None:
        from cri_proto import cri_runtime_v1_pb2 as cri_pb

        for n in range(self.filler_containers):
            pod = self.pods[n % len(self.pods)]
            config = self.env.container_config(f"filler-{n:03d}", self.env.images.http, pod_config=pod.config)
            config.labels[FILLER_LABEL] = "marked" if n < self.filler_marked else "plain"
            kubelet.cri.call("CreateContainer", cri_pb.CreateContainerRequest(
                pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config))

    def _start_shim(self, extra_env: dict[str, str], code_root: Path | None = None):
        from tests.support.daemon_env import DaemonProcess

        workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
        self._workdirs.append(workdir)
        daemon = DaemonProcess(workdir, ["--runtime-endpoint", self.env.endpoint])
        if code_root is not None:
            daemon.code_root = code_root
        with patched_environ(extra_env):  # DaemonProcess passes this process's environment on
            daemon.start()
        spec = http_probe_spec(self.server_port, SERVER_PATH)
        spec.period_ms = WARM_PROBE_PERIOD_MS
        service_grpc.ProbeServiceStub(daemon.channel).RunProbe(service_pb.RunProbeRequest(
            pod_sandbox_id=self.pods[0].id, container_name="http", type=spec_pb.READINESS, spec=spec), timeout=60)
        return daemon

    def __exit__(self, *exc_info: object) -> None:
        for daemon in [self.shim, *self.others.values()]:
            if daemon is not None and daemon.proc is not None:
                daemon.stop()
        if self._server is not None:
            stop_server(self._server)
        if self.direct is not None:
            self.direct.close()
        if self.env is not None:
            errors = self.env.stop()
            if errors:
                print(f"containerd teardown: {errors}", file=sys.stderr)
        for workdir in self._workdirs:
            shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def patched_environ(extra: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
