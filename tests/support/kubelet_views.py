"""What a real kubelet says of its pods, read as data: its /pods, its probe counters, its log; and a recorder that
samples them while a scenario runs.

Owns: PodView and ContainerView (the read-only port's /pods, a core/v1 PodList, by pod name), the kubelet's
prober_probe_total by (pod, container, probe type, result), the `SyncLoop (probe)` readiness changes of its log, its
log's structured records (`log_records`: "Probe failed", "Event occurred", ... with their values unquoted), and
`ReadinessRecorder` (every readiness and restart count seen, sampled every POLL_S). Pure but the recorder's thread;
tests/unit/test_kubelet_env.py tests the readings without a kubelet. The process is tests/support/kubelet_env.py.
Free of pytest (the benchmark imports it).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from tests.support.kubelet_env import KubeletProcess

POLL_S = 0.1                     # the read-only port has no watch: status is polled this often


@dataclass(frozen=True)
class ContainerView:
    name: str
    ready: bool
    started: bool
    restart_count: int
    running: bool


@dataclass(frozen=True)
class PodView:
    name: str                       # as the kubelet names a static pod: NAME-node1
    uid: str
    ready: bool                     # the Ready condition
    pod_ip: str
    containers: dict[str, ContainerView]
    init_containers: dict[str, ContainerView]

    @property
    def restarts(self) -> int:
        return sum(c.restart_count for c in (*self.containers.values(), *self.init_containers.values()))


def _container_view(raw: Mapping) -> ContainerView:
    return ContainerView(name=raw["name"], ready=bool(raw.get("ready")), started=bool(raw.get("started")),
                         restart_count=int(raw.get("restartCount", 0)), running="running" in raw.get("state", {}))


def pod_views(pod_list: Mapping) -> dict[str, PodView]:
    """The read-only port's /pods (a core/v1 PodList) -> PodView by pod name."""
    views = {}
    for item in pod_list.get("items") or []:
        status = item.get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        views[item["metadata"]["name"]] = PodView(
            name=item["metadata"]["name"], uid=item["metadata"].get("uid", ""),
            ready=conditions.get("Ready") == "True", pod_ip=status.get("podIP", ""),
            containers={c["name"]: _container_view(c) for c in status.get("containerStatuses", [])},
            init_containers={c["name"]: _container_view(c) for c in status.get("initContainerStatuses", [])},
        )
    return views


def probe_counts(metrics_text: str) -> dict[tuple[str, str, str, str], float]:
    """The kubelet's prober_probe_total by (pod, container, probe_type, result), e.g. ("web-node1", "web",
    "Readiness", "successful"): what the kubelet's own prober counted."""
    counts: dict[tuple[str, str, str, str], float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "prober_probe_total":
                labels = sample.labels
                key = (labels.get("pod", ""), labels.get("container", ""), labels.get("probe_type", ""),
                       labels.get("result", ""))
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def readiness_changes(log_text: str) -> list[tuple[str, str]]:
    """(pod, "ready" | "not ready") for each readiness change the kubelet logged (`"SyncLoop (probe)"
    probe="readiness" status="not ready" pod="default/web-node1"`, kubelet.go syncLoopIteration, at -v=2)."""
    changes = []
    for line in log_text.splitlines():
        if '"SyncLoop (probe)"' not in line or 'probe="readiness"' not in line:
            continue
        status = line.split('status="', 1)[1].split('"', 1)[0]
        pod = line.split(' pod="', 1)[1].split('"', 1)[0]
        changes.append((pod.split("/", 1)[-1], status))
    return changes


# A klog text header: severity, date, time, thread id, file:line] (k8s.io/klog/v2 formatHeader).
_KLOG_HEADER = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ [^ \]]+\] ", re.M)
_KLOG_KEY = re.compile(r" ([A-Za-z_][\w.-]*)=")
_GO_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
               '"': '"', "'": "'"}


@dataclass(frozen=True)
class LogRecord:
    """One structured line of the kubelet's klog text log: `I... file.go:12] "message" key="value" ...`."""

    message: str
    values: dict[str, str]   # quoted values unquoted; bare ones (numbers, lists) as written
    line: str


def log_records(log_text: str, message: str) -> list[LogRecord]:
    """The kubelet's log records with this message, in order (k8s.io/klog/v2 internal/serialize: a string value is
    strconv.Quote'd, or written `key=<` then its lines indented by a tab and ` >` when it holds a newline)."""
    starts = [m.start() for m in _KLOG_HEADER.finditer(log_text)]
    records = []
    for start, end in zip(starts, [*starts[1:], len(log_text)]):
        text = log_text[start:end].rstrip("\n")
        body = text[_KLOG_HEADER.match(text).end():]
        if not body.startswith('"'):
            continue
        msg, rest = _go_string(body)
        if msg == message:
            records.append(LogRecord(msg, _klog_values(rest), text))
    return records


def _klog_values(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    while (key := _KLOG_KEY.match(text)) is not None:
        text = text[key.end():]
        if text.startswith('"'):
            value, text = _go_string(text)
        elif text.startswith("<\n"):
            block, _, text = text[2:].partition("\n >")
            value = "\n".join(line[1:] for line in block.split("\n"))
        else:
            nxt = _KLOG_KEY.search(text)
            value, text = (text, "") if nxt is None else (text[:nxt.start()], text[nxt.start():])
        values[key.group(1)] = value
    return values


def _go_string(text: str) -> tuple[str, str]:
    """strconv.Quote's output at the start of text, unquoted, and what follows it."""
    out, i = [], 1
    while text[i] != '"':
        if text[i] != "\\":
            out.append(text[i])
            i += 1
            continue
        kind = text[i + 1]
        if kind in _GO_ESCAPES:
            out.append(_GO_ESCAPES[kind])
            i += 2
        else:
            width = {"x": 2, "u": 4, "U": 8}[kind]
            out.append(chr(int(text[i + 2:i + 2 + width], 16)))
            i += 2 + width
    return "".join(out), text[i + 1:]


class ReadinessRecorder:
    """Samples /pods in a thread, every POLL_S, while a scenario runs: every readiness and restart count seen.

    A readiness flip lasts at least one probe period (the kubelet needs successThreshold successes to undo it), so
    sampling every 100 ms sees any flip of a probe at 1 s; the kubelet's own log lines are read as well."""

    def __init__(self, kubelet: KubeletProcess, pods: list[str]) -> None:
        self.kubelet = kubelet
        self.pods = pods
        self.samples: list[tuple[float, dict[str, PodView]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._log_start = 0

    def __enter__(self) -> "ReadinessRecorder":
        self._log_start = len(self.kubelet.log_text())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.kubelet.pods()))
            except (OSError, ValueError) as exc:  # the kubelet answers anyway; keep what went wrong
                self.errors.append(repr(exc))
            self._stop.wait(POLL_S)

    def not_ready_samples(self) -> dict[str, int]:
        """How many samples saw each pod not Ready (or missing)."""
        missing = {name: 0 for name in self.pods}
        for _, pods in self.samples:
            for name in self.pods:
                if name not in pods or not pods[name].ready:
                    missing[name] += 1
        return {name: count for name, count in missing.items() if count}

    def restarts(self) -> dict[str, int]:
        """Each pod's highest restart count seen."""
        seen: dict[str, int] = {}
        for _, pods in self.samples:
            for name in self.pods:
                if name in pods:
                    seen[name] = max(seen.get(name, 0), pods[name].restarts)
        return seen

    def logged_changes(self) -> list[tuple[str, str]]:
        return readiness_changes(self.kubelet.log_text()[self._log_start:])
