"""Scenario "admission": the admission webhook under a steady load of AdmissionReviews.

`probe-shim webhook serve` as deployed (its own process, TLS with the certificates `probe-shim webhook certs`
writes), and `rate` AdmissionReviews per second for `window_s` of a typical Deployment's pod (two containers, a
readiness, liveness and startup probe, a preStop hook, named ports), over CONNECTIONS kept-alive HTTPS connections
as the kube-apiserver keeps them, open loop (each request is sent when it is due, not when the previous one came
back). Per request: the wall time from sending to the whole answer; the webhook's own histogram beside it; its
CPU over the window, its RSS and PSS at the end; every answer checked to carry the patch.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.stats import summarize
from tests.support.webhook_env import Webhook, post, review

CONNECTIONS = 4
MIB = 1 << 20


@dataclass(frozen=True)
class AdmissionParams:
    rate: int            # admissions per second, over all connections
    window_s: float
    warmup_s: float = 2.0


def typical_pod() -> dict:
    """A Deployment's pod as the API server has it at admission: defaults applied, two containers."""
    def probe(handler: dict, period: int) -> dict:
        return {**handler, "periodSeconds": period, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3}
    web = {"name": "web", "image": "shop/web:1.4", "imagePullPolicy": "IfNotPresent",
           "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                     {"name": "admin", "containerPort": 9901, "protocol": "TCP"}],
           "readinessProbe": probe({"httpGet": {"path": "/ready", "port": "http", "scheme": "HTTP"}}, 5),
           "livenessProbe": probe({"httpGet": {"path": "/healthz", "port": "admin", "scheme": "HTTP",
                                               "httpHeaders": [{"name": "X-Probe", "value": "liveness"}]}}, 10),
           "startupProbe": probe({"tcpSocket": {"port": 8080}}, 2),
           "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "http", "scheme": "HTTP"}}},
           "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
           "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    cart = {"name": "cart", "image": "shop/cart:2.0", "imagePullPolicy": "IfNotPresent",
            "ports": [{"name": "grpc", "containerPort": 9090, "protocol": "TCP"}],
            "readinessProbe": probe({"grpc": {"port": 9090}}, 5),
            "resources": {}, "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "web-7d4b9c-", "namespace": "shop",
                         "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c",
                                              "uid": "6b1c", "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"containers": [web, cart], "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                     "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "schedulerName": "default-scheduler",
                     "securityContext": {}, "enableServiceLinks": True}}


def _load(webhook: Webhook, body: bytes, rate_per_connection: float, until: float, start: float,
          latencies: list[float], errors: list[str]) -> None:
    conn = webhook.connection()
    index = 0
    try:
        while True:
            due = start + index / rate_per_connection
            if due >= until:
                return
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # open loop: the request's due time, whatever the last answer's was
            sent = time.monotonic()
            status, answer = post(conn, body)
            took = time.monotonic() - sent
            if status != 200 or "patch" not in answer.get("response", {}):
                errors.append(f"{status}: {str(answer)[:200]}")
            latencies.append(took * 1000)
            index += 1
    finally:
        conn.close()


def _drive(webhook: Webhook, body: bytes, rate: int, seconds: float) -> tuple[list[float], list[str], float]:
    latencies: list[float] = []
    errors: list[str] = []
    start = time.monotonic() + 0.05
    until = start + seconds
    threads = [threading.Thread(target=_load, args=(webhook, body, rate / CONNECTIONS, until,
                                                    start + i / rate, latencies, errors)) for i in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors, time.monotonic() - start


def run(params: AdmissionParams) -> dict:
    body = json.dumps(review(typical_pod())).encode()
    with tempfile.TemporaryDirectory(prefix="probe-shim-admission-") as workdir:
        webhook = Webhook(Path(workdir), request_timeout_s=10.0, handshake_timeout_s=5.0)
        try:
            process = psutil.Process(webhook.proc.pid)
            _drive(webhook, body, params.rate, params.warmup_s)
            cpu_before = sum(process.cpu_times()[:2])
            latencies, errors, wall = _drive(webhook, body, params.rate, params.window_s)
            cpu = (sum(process.cpu_times()[:2]) - cpu_before) / wall * 100
            memory = process.memory_full_info()
            metrics = webhook.get("/metrics")[1].decode()
        finally:
            code = webhook.stop()
    return {"rate_per_s": params.rate, "connections": CONNECTIONS, "window_s": round(wall, 1),
            "admissions": len(latencies), "achieved_per_s": round(len(latencies) / wall, 1),
            "errors": len(errors), "first_errors": errors[:3], "latency_ms": summarize(latencies),
            "cpu_percent": round(cpu, 1), "rss_mib": round(memory.rss / MIB, 1),
            "pss_mib": round(memory.pss / MIB, 1), "body_bytes": len(body), "exit_code": code,
            "server_histogram_count": _histogram_count(metrics)}


def _histogram_count(metrics: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith("probe_shim_webhook_admission_duration_seconds_count"):
            return float(line.split()[-1])
    return None


# --- its rows in the suite's tables (pure) ---------------------------------------------------------------------------

P99_TARGET_MS = 10.0


def rows(scenario: dict | None) -> list:
    from bench.report import measured_row

    def p99(s: dict):
        latency = s["latency_ms"]
        note = (f"{s['achieved_per_s']:.0f}/s achieved over {s['connections']} connections, {s['errors']} errors; "
                f"p50 {latency['median']:.2f} ms; webhook {s['cpu_percent']:.0f}% of a core")
        return f"{latency['p99']:.2f} ms", latency["p99"] <= P99_TARGET_MS and s["errors"] == 0, note

    def memory(s: dict):
        return f"{s['rss_mib']:.1f} MiB RSS, {s['pss_mib']:.1f} MiB PSS", None, "after the window"
    return [measured_row(f"admission webhook at 200/s, a typical Deployment's pod: p99", f"<= {P99_TARGET_MS:g} ms",
                         scenario, p99),
            measured_row("admission webhook: memory", "(none)", scenario, memory)]


def details(scenario: dict | None) -> str:
    if not scenario or "latency_ms" not in scenario:
        return ""
    s, latency = scenario, scenario["latency_ms"]
    return (f"admission: {s['admissions']} AdmissionReviews of a {s['body_bytes']}-byte pod at {s['rate_per_s']}/s "
            f"({s['achieved_per_s']}/s achieved) over {s['connections']} kept-alive TLS connections, "
            f"{s['window_s']:.0f} s: latency median {latency['median']:.2f} ms, p90 {latency['p90']:.2f}, "
            f"p99 {latency['p99']:.2f}, max {latency['max']:.2f}; {s['errors']} errors; webhook "
            f"{s['cpu_percent']:.1f}% of a core, {s['rss_mib']:.1f} MiB RSS, {s['pss_mib']:.1f} MiB PSS")
