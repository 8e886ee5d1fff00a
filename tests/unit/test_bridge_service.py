"""The kubelet bridge's one call (shim/bridge/service.py) with its real results manager, board and metrics, and
fakes for what it asks of the runtime and the workers; and what it keeps between calls (shim/bridge/call_cache.py).

The kubelet sends the same ExecSync every period: the bridge derives the call, the worker's request and the row's
fixed fields once per handler and container resolution, and every call still answers, counts and records exactly
as the first."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.bridge_command import command_for
from shim.bridge import service
from shim.bridge.call_cache import CallCache, Handler, handler_key
from shim.bridge.containers import ContainerInfo
from shim.bridge.service import KubeletBridge, row_id
from shim.observe.metrics import ShimMetrics
from shim.observe.tracing import AttemptTracer
from shim.sandboxes.directory import SandboxDirectory
from shim.sandboxes.resolver import SandboxInfo
from shim.state.board import StatusBoard
from shim.state.results import ResultsManager
from shim.workers.records import WorkerRejected

PORTS = (spec_pb.ContainerPort(name="http", container_port=8080, protocol="TCP"),)
CONTAINER = ContainerInfo(id="c-1", sandbox_id="sb-1", name="app", pod_name="web-0", pod_namespace="shop",
                          pod_uid="uid-1", ports=PORTS, labels=(("io.kubernetes.pod.name", "web-0"),))
SANDBOX = SandboxInfo(id="sb-1", netns_path="/var/run/netns/a", pod_ips=("10.1.0.5",), name="web-0",
                      namespace="shop", uid="uid-1", pid=42)
READINESS = command_for("readiness", {"httpGet": {"path": "/healthz", "port": "http"}})
RUNNING = service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=4242, group="shop")


class Containers:
    def __init__(self) -> None:
        self.info = {CONTAINER.id: CONTAINER}

    async def resolve(self, container_id: str) -> ContainerInfo:
        return self.info[container_id]

    def forget_sandbox(self, sandbox_id: str) -> None:
        pass


class Sandboxes:
    """The sandbox cache: answers what `info` holds now."""

    def __init__(self) -> None:
        self.info = SANDBOX

    async def resolve(self, sandbox_id: str) -> SandboxInfo:
        return self.info

    def forget(self, sandbox_id: str) -> None:
        pass


class Supervisor:
    """Runs every attempt as `result`, or rejects it while `reject` holds errors; records what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.reject: list[str] = []
        self.result = spec_pb.RESULT_SUCCESS

    async def run_checked(self, target, run, timeout_s, *, keep_warm=False) -> spec_pb.Attempt:
        if self.reject:
            raise WorkerRejected(self.reject)
        sent = worker_pb.RunOnce()
        sent.CopyFrom(run)
        self.sent.append((target, sent, timeout_s, keep_warm))
        return spec_pb.Attempt(result=self.result, output=f"attempt {len(self.sent)}", started_at_unix_ns=1,
                               duration_ns=2_000_000)

    def reported_status(self, sandbox_id: str) -> service_pb.WorkerStatus:
        return RUNNING


class Rig:
    def __init__(self) -> None:
        self.containers, self.sandboxes, self.supervisor = Containers(), Sandboxes(), Supervisor()
        self.board, self.metrics = StatusBoard(), ShimMetrics()
        directory = SandboxDirectory(source=None, cache=self.sandboxes)
        results = ResultsManager(board=self.board, tracer=AttemptTracer("none"), metrics=self.metrics,
                                 sandboxes=directory)
        self.bridge = KubeletBridge(containers=self.containers, sandboxes=directory, supervisor=self.supervisor,
                                    results=results, metrics=self.metrics, allow_host_field=False, hook_timeout_s=30)

    def call(self, cmd=READINESS, container_id=CONTAINER.id, timeout=1):
        request = cri_pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout)
        return asyncio.run(self.bridge.exec_sync(request, None))

    def sample(self, name: str, **labels) -> float | None:
        for family in text_string_to_metric_families(self.metrics.render().decode()):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return None


@pytest.fixture
def parses(monkeypatch) -> list:
    """Every parse of a marker command the bridge makes."""
    made: list = []
    real = service.parse_command

    def counted(cmd, **kw):
        made.append(list(cmd))
        return real(cmd, **kw)

    monkeypatch.setattr(service, "parse_command", counted)
    return made


def test_every_call_answers_counts_and_records_while_the_command_is_parsed_once(parses):
    rig = Rig()
    answers = [rig.call() for _ in range(3)]
    assert [(a.exit_code, a.stdout) for a in answers] == [(0, b"attempt 1"), (0, b"attempt 2"), (0, b"attempt 3")]
    assert len(parses) == 1
    row = rig.board.get(row_id("sb-1", "c-1", "readiness"))
    assert (row.status.totals.success, row.status.last_attempt.output, row.status.worker) == (3, "attempt 3", RUNNING)
    assert (row.container_name, row.type, row.bridged.role, dict(row.labels)) == (
        "app", spec_pb.READINESS, "readiness", {"io.kubernetes.pod.name": "web-0"})
    assert row.spec.http_get.port.name == "http" and row.spec.timeout_ms == 1000
    assert row.created_at <= row.bridged.last_exec_at
    assert rig.sample("prober_probe_total", pod="web-0", namespace="shop", pod_uid="uid-1", container="app",
                      probe_type="Readiness", result="successful") == 3
    assert rig.sample("probe_shim_bridged_execs_total", role="readiness", answer="0") == 3


def test_each_call_sends_the_same_request_and_the_row_keeps_its_creation():
    rig = Rig()
    rig.call()
    created = rig.board.get(row_id("sb-1", "c-1", "readiness")).created_at
    rig.call()
    (target, first, budget, warm), (_, second, _, _) = rig.supervisor.sent
    assert first == second and first.max_tries == 1 and not first.lifecycle_hook and warm
    assert (first.probe.container.id, first.probe.container.name, list(first.probe.container.ports)) == (
        "c-1", "app", list(PORTS))
    assert (target.sandbox_id, target.netns_path, target.pod_ips, target.tenancy) == (
        "sb-1", "/var/run/netns/a", ["10.1.0.5"], "shop")
    assert budget == 1 + service.ANSWER_GRACE_S
    row = rig.board.get(row_id("sb-1", "c-1", "readiness"))
    assert row.created_at == created and row.bridged.last_exec_at >= created


def test_another_command_or_timeout_of_the_same_container_is_its_own_handler(parses):
    rig = Rig()
    rig.call()
    rig.call(timeout=3)
    rig.call(cmd=command_for("liveness", {"tcpSocket": {"port": 8080}}))
    rig.call()
    assert len(parses) == 3
    assert [sent.probe.spec.timeout_ms for _, sent, _, _ in rig.supervisor.sent] == [1000, 3000, 1000, 1000]


def test_a_refused_command_is_answered_and_logged_at_every_call(parses, caplog):
    rig = Rig()
    bad = command_for("readiness", {"httpGet": {"path": "/", "port": "metrics"}})
    with caplog.at_level(logging.WARNING, logger="shim.bridge.service"):
        answers = [rig.call(cmd=bad) for _ in range(2)]
    assert {a.exit_code for a in answers} == {2} and answers[0] == answers[1]
    assert b'unknown named port "metrics"' in answers[0].stderr
    assert len(parses) == 1 and len([r for r in caplog.records if "refused" in r.message]) == 2
    assert rig.supervisor.sent == [] and len(rig.board) == 0
    assert rig.sample("probe_shim_bridged_execs_total", role="readiness", answer="2") == 2


def test_a_new_resolution_of_the_container_is_read_again(parses):
    rig = Rig()
    bad = command_for("readiness", {"httpGet": {"path": "/", "port": "metrics"}})
    assert rig.call(cmd=bad).exit_code == 2
    rig.containers.info[CONTAINER.id] = dataclasses.replace(
        CONTAINER, ports=(*PORTS, spec_pb.ContainerPort(name="metrics", container_port=9090, protocol="TCP")))
    assert rig.call(cmd=bad).exit_code == 0
    assert len(parses) == 2


def test_a_forgotten_sandbox_takes_its_handlers_along(parses):
    rig = Rig()
    rig.call()
    rig.bridge.forget_sandbox("sb-1")
    rig.call()
    assert len(parses) == 2


def test_a_sandbox_resolved_anew_gets_a_new_target_and_an_equal_one_the_same():
    rig = Rig()
    rig.call()
    rig.sandboxes.info = dataclasses.replace(SANDBOX)  # the cache resolved it again: equal
    rig.call()
    rig.sandboxes.info = dataclasses.replace(SANDBOX, netns_path="/var/run/netns/b")
    rig.call()
    targets = [target for target, _, _, _ in rig.supervisor.sent]
    assert targets[0] is targets[1] and targets[2].netns_path == "/var/run/netns/b"


def test_a_worker_rejection_is_not_kept(monkeypatch):
    rig = Rig()
    rig.supervisor.reject = ["probe.spec: from another version"]
    first = rig.call()
    rig.supervisor.reject = []
    second = rig.call()
    assert (first.exit_code, second.exit_code) == (2, 0)
    assert b"from another version" in first.stderr


def test_a_hook_has_a_row_without_probe_series():
    rig = Rig()
    hook = command_for("preStop", {"httpGet": {"path": "/bye", "port": 8080}})
    rig.call(cmd=hook, timeout=0)
    rig.call(cmd=hook, timeout=0)
    row = rig.board.get(row_id("sb-1", "c-1", "preStop"))
    assert (row.type, row.status.totals.success, row.spec.timeout_ms) == (spec_pb.PROBE_TYPE_UNSPECIFIED, 2, 30_000)
    assert rig.supervisor.sent[0][1].lifecycle_hook
    assert rig.sample("prober_probe_total") is None
    assert rig.sample("probe_shim_bridged_execs_total", role="preStop", answer="0") == 2


# --- the memory itself ------------------------------------------------------------------------------------------

def test_a_kept_handler_answers_only_for_the_resolution_it_came_from():
    handlers = CallCache()
    key = handler_key("c-1", READINESS, 1)
    handlers.keep(key, Handler(CONTAINER, None, refusal="no"))
    assert handlers.get(handler_key("c-1", list(READINESS), 1), CONTAINER).refusal == "no"
    assert handlers.get(key, dataclasses.replace(CONTAINER)) is None  # equal, but resolved anew
    assert handlers.get(handler_key("c-1", READINESS, 2), CONTAINER) is None


def test_the_oldest_handler_goes_first_and_a_sandbox_takes_its_own():
    handlers = CallCache(max_kept=2)
    other = dataclasses.replace(CONTAINER, id="c-2", sandbox_id="sb-2")
    keys = [handler_key(c, READINESS, 1) for c in ("c-1", "c-2", "c-3")]
    handlers.keep(keys[0], Handler(CONTAINER, None))
    handlers.keep(keys[1], Handler(other, None))
    handlers.keep(keys[2], Handler(CONTAINER, None))
    assert len(handlers) == 2 and handlers.get(keys[0], CONTAINER) is None
    handlers.forget_sandbox("sb-1")
    assert len(handlers) == 1 and handlers.get(keys[1], other) is not None
