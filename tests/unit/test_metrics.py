"""shim/observe/metrics.py: the kubelet's prober metrics, the shim's own, and the /metrics endpoint."""

from __future__ import annotations

import asyncio
import gzip

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from cri_proto import probe_spec_pb2 as spec_pb
from shim.config import ConfigError
from shim.observe import metrics_http
from shim.observe.metrics import GO_DEFAULT_BUCKETS, ShimMetrics
from shim.observe.metrics_http import parse_listen
from shim.state.results import ProbeLabels

POD = dict(container="web", pod="web-0", namespace="shop", pod_uid="uid-1")


def probe_labels(probe_type: int, *, container: str, pod: str, namespace: str, pod_uid: str) -> ProbeLabels:
    """A probe's labels, from the metric label values they become."""
    return ProbeLabels(probe_id="p", probe_type=probe_type, sandbox_id="sb", container_name=container, pod_name=pod,
                       pod_namespace=namespace, pod_uid=pod_uid)


def families(metrics: ShimMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def samples(metrics: ShimMetrics, name: str) -> dict[tuple, float]:
    """{sorted label items: value} of the samples called `name`."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def total_labels(probe_type: str, result: str, **pod) -> tuple:
    return tuple(sorted({"probe_type": probe_type, "result": result, **POD, **pod}.items()))


def test_each_result_counts_under_the_kubelets_label_values():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.02)
    m.observe_attempt(probe_labels(spec_pb.LIVENESS, **POD), spec_pb.RESULT_FAILURE, 1.0)
    m.observe_attempt(probe_labels(spec_pb.STARTUP, **POD), spec_pb.RESULT_UNKNOWN, 0.0)
    assert samples(m, "prober_probe_total") == {
        total_labels("Readiness", "successful"): 2.0,
        total_labels("Liveness", "failed"): 1.0,
        total_labels("Startup", "unknown"): 1.0,
    }


def test_a_warning_counts_as_successful():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_WARNING, 0.01)
    assert samples(m, "prober_probe_total") == {total_labels("Readiness", "successful"): 1.0}


def test_histogram_observes_successes_and_unknowns_but_not_failures_like_worker_go():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.003)
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_WARNING, 0.2)
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_FAILURE, 7.0)
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_UNKNOWN, 0.0)
    labels = tuple(sorted({"probe_type": "Readiness", "container": "web", "pod": "web-0", "namespace": "shop"}.items()))
    assert samples(m, "prober_probe_duration_seconds_count") == {labels: 3.0}
    assert samples(m, "prober_probe_duration_seconds_sum")[labels] == pytest.approx(0.203)
    buckets = {dict(k)["le"]: v for k, v in samples(m, "prober_probe_duration_seconds_bucket").items()}
    assert buckets["0.005"] == 2.0 and buckets["0.25"] == 3.0 and buckets["+Inf"] == 3.0
    # Go's prometheus.DefBuckets, not prometheus_client's defaults; no pod_uid label.
    assert sorted(float(le) for le in buckets) == [*GO_DEFAULT_BUCKETS, float("inf")]
    assert all("pod_uid" not in dict(k) for k in samples(m, "prober_probe_duration_seconds_bucket"))


def test_exposition_matches_the_kubelets_shape():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.LIVENESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    text = m.render().decode()
    assert "# TYPE prober_probe_total counter" in text
    # pkg/kubelet/prober/prober_manager.go (1.33+): StabilityLevel: metrics.BETA; component-base writes
    # "[%v] %v" of the level and the help.
    assert "# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe" in text
    assert "# HELP prober_probe_duration_seconds [ALPHA] Duration in seconds for a probe response." in text
    assert "# TYPE prober_probe_duration_seconds histogram" in text
    assert "_created" not in text  # the kubelet's Go client does not expose them
    fams = families(m)
    assert fams["prober_probe"].type == "counter"
    assert fams["prober_probe_duration_seconds"].type == "histogram"


def test_shim_metrics():
    m = ShimMetrics()
    m.set_workers(3)
    m.count_watchers_with(lambda: 2)
    m.count_probes_with(lambda: 7)
    m.inc_worker_restarts()
    m.inc_worker_restarts()
    assert samples(m, "probe_shim_workers") == {(): 3.0}
    assert samples(m, "probe_shim_watch_subscribers") == {(): 2.0}
    assert samples(m, "probe_shim_probes") == {(): 7.0}
    assert samples(m, "probe_shim_worker_restarts_total") == {(): 2.0}
    m.set_workers(0)
    assert samples(m, "probe_shim_workers") == {(): 0.0}


def test_forget_probe_removes_its_series_and_keeps_the_others():
    m = ShimMetrics()
    other = dict(POD, container="sidecar")
    for result in (spec_pb.RESULT_SUCCESS, spec_pb.RESULT_FAILURE, spec_pb.RESULT_UNKNOWN):
        m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), result, 0.01)
    m.observe_attempt(probe_labels(spec_pb.READINESS, **other), spec_pb.RESULT_SUCCESS, 0.01)
    m.observe_attempt(probe_labels(spec_pb.LIVENESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    m.forget_probe(probe_labels(spec_pb.READINESS, **POD))
    assert samples(m, "prober_probe_total") == {
        total_labels("Readiness", "successful", container="sidecar"): 1.0,
        total_labels("Liveness", "successful"): 1.0,
    }
    assert {dict(k)["container"] + "/" + dict(k)["probe_type"]
            for k in samples(m, "prober_probe_duration_seconds_count")} == {"sidecar/Readiness", "web/Liveness"}
    m.forget_probe(probe_labels(spec_pb.STARTUP, **POD))  # never observed: nothing to do, no error


def per_probe_labels(probe_type: str = "Readiness", **pod) -> tuple:
    labels = {"probe_type": probe_type, "container": "web", "pod": "web-0", "namespace": "shop", **pod}
    return tuple(sorted(labels.items()))


def test_late_attempts_and_missed_ticks_are_counted_per_probe():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    # A punctual probe shows 0, not an absent series.
    assert samples(m, "probe_shim_attempts_late_total") == {per_probe_labels(): 0.0}
    assert samples(m, "probe_shim_ticks_missed_total") == {per_probe_labels(): 0.0}
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_FAILURE, 2.5, late=True, ticks_missed=2)
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01, late=True)
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01, ticks_missed=-5)  # a bad worker
    assert samples(m, "probe_shim_attempts_late_total") == {per_probe_labels(): 2.0}
    assert samples(m, "probe_shim_ticks_missed_total") == {per_probe_labels(): 2.0}
    assert "probe_shim_attempts_late_created" not in m.render().decode()


def test_forget_probe_removes_its_punctuality_series():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01, late=True, ticks_missed=1)
    m.observe_attempt(probe_labels(spec_pb.LIVENESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    m.forget_probe(probe_labels(spec_pb.READINESS, **POD))
    assert samples(m, "probe_shim_attempts_late_total") == {per_probe_labels("Liveness"): 0.0}
    assert samples(m, "probe_shim_ticks_missed_total") == {per_probe_labels("Liveness"): 0.0}


def test_a_probe_observed_again_after_forget_counts_from_zero():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    m.forget_probe(probe_labels(spec_pb.READINESS, **POD))
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    assert samples(m, "prober_probe_total") == {total_labels("Readiness", "successful"): 1.0}
    assert list(samples(m, "prober_probe_duration_seconds_count").values()) == [1.0]


def test_forgetting_a_namesake_pod_keeps_the_new_pods_histogram_observing():
    # A recreated StatefulSet pod: same name, new uid. The histogram has no pod_uid label,
    # so both pods' probes share its series; forgetting the old one removes it.
    m = ShimMetrics()
    new_pod = dict(POD, pod_uid="uid-2")
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    m.observe_attempt(probe_labels(spec_pb.READINESS, **new_pod), spec_pb.RESULT_SUCCESS, 0.01)
    m.forget_probe(probe_labels(spec_pb.READINESS, **POD))
    m.observe_attempt(probe_labels(spec_pb.READINESS, **new_pod), spec_pb.RESULT_SUCCESS, 0.01)
    assert samples(m, "prober_probe_total") == {total_labels("Readiness", "successful", pod_uid="uid-2"): 2.0}
    assert list(samples(m, "prober_probe_duration_seconds_count").values()) == [1.0]


def test_metrics_use_a_private_registry():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    assert REGISTRY.get_sample_value("prober_probe_total", {**POD, "probe_type": "Readiness",
                                                             "result": "successful"}) is None
    ShimMetrics()  # a second instance does not collide with the first


def test_render_for_openmetrics_when_asked():
    m = ShimMetrics()
    m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
    body, content_type = m.render_for("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n") and b"_created" not in body
    body, content_type = m.render_for("")
    assert content_type.startswith("text/plain") and body == m.render()


@pytest.mark.parametrize("listen, expected", [
    ("127.0.0.1:9555", ("127.0.0.1", 9555)),
    ("[::1]:0", ("::1", 0)),
    ("localhost:9555", ("localhost", 9555)),
    ("0.0.0.0:9555", ("0.0.0.0", 9555)),
])
def test_parse_listen(listen, expected):
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", [":9555", "9555", "::1:9555", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1"])
def test_parse_listen_rejects_what_does_not_say_where_to_bind(listen):
    with pytest.raises(ConfigError):
        parse_listen(listen)


def test_empty_listen_serves_nothing():
    assert asyncio.run(ShimMetrics().serve("")) is None


async def http_exchange(port: int, request: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """Sends raw bytes, reads to EOF (the server closes), splits status line, headers and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines)}
    return status, headers, body


def get(path: str, *extra: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *extra]) + "\r\n\r\n").encode()


def test_http_endpoint_serves_metrics_on_loopback_and_404_elsewhere():
    async def main():
        m = ShimMetrics()
        m.observe_attempt(probe_labels(spec_pb.READINESS, **POD), spec_pb.RESULT_SUCCESS, 0.01)
        server = await m.serve("127.0.0.1:0")
        try:
            ((host, port),) = server.addresses
            assert host == "127.0.0.1" and port > 0
            status, headers, body = await http_exchange(port, get("/metrics"))
            assert status == b"HTTP/1.1 200 "
            assert headers[b"content-type"].startswith(b"text/plain; version=0.0.4")
            assert int(headers[b"content-length"]) == len(body)
            fams = {f.name for f in text_string_to_metric_families(body.decode())}
            assert {"prober_probe", "prober_probe_duration_seconds", "probe_shim_workers"} <= fams
            status, _, body = await http_exchange(port, get("/metrics?name[]=x"))
            assert status == b"HTTP/1.1 200 " and b"prober_probe_total{" in body
            for path in ("/", "/metricsx", "/favicon.ico", "/debug"):
                status, _, _ = await http_exchange(port, get(path))
                assert status == b"HTTP/1.1 404 ", path
            status, headers, _ = await http_exchange(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            assert status == b"HTTP/1.1 405 " and headers[b"allow"] == b"GET"
            status, _, _ = await http_exchange(port, b"this is not http\r\n\r\n")
            assert status == b"HTTP/1.1 400 "
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())


def test_http_endpoint_gzips_when_the_scraper_accepts_it():
    async def main():
        m = ShimMetrics()
        m.count_probes_with(lambda: 4)
        server = await m.serve("127.0.0.1:0")
        try:
            port = server.addresses[0][1]
            status, headers, body = await http_exchange(port, get("/metrics", "Accept-Encoding: gzip"))
            assert status == b"HTTP/1.1 200 " and headers[b"content-encoding"] == b"gzip"
            assert b"probe_shim_probes 4.0" in gzip.decompress(body)
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())


def test_http_endpoint_binds_only_where_told():
    async def main():
        server = await ShimMetrics().serve("127.0.0.1:0")
        try:
            assert {host for host, _ in server.addresses} == {"127.0.0.1"}
            port = server.addresses[0][1]
            # Another loopback address of this host: nothing listens there.
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.2", port)
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())


def test_an_oversized_request_head_is_refused_not_buffered():
    async def main():
        server = await ShimMetrics().serve("127.0.0.1:0")
        try:
            port = server.addresses[0][1]
            huge = get("/metrics", "X-Filler: " + "a" * 64 * 1024)
            status, _, _ = await http_exchange(port, huge)
            assert status == b"HTTP/1.1 431 "
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())


def test_close_ends_a_connection_that_never_sends_a_request():
    async def main():
        server = await ShimMetrics().serve("127.0.0.1:0")
        port = server.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metr")  # an incomplete head, then silence
        await writer.drain()
        server.close()
        await asyncio.wait_for(server.wait_closed(), timeout=10)
        try:  # closed without an answer: EOF, or a reset since the server left bytes unread
            assert await asyncio.wait_for(reader.read(), timeout=10) == b""
        except ConnectionResetError:
            pass
        writer.close()
    asyncio.run(main())


async def _stalled(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that sends one byte of a request head, then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"G")
    await writer.drain()
    return reader, writer


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """EOF (or a reset, when the server left the byte unread) within 10 s; a connection still held times out."""
    try:
        return await asyncio.wait_for(reader.read(), timeout=10) == b""
    except ConnectionResetError:
        return True


def test_a_stalled_client_is_cut_at_the_deadline(monkeypatch):
    """Why the endpoint is hand-written (metrics_http.py): a client that sends a byte and then nothing holds its
    connection only until REQUEST_TIMEOUT_S, and the scraper is answered meanwhile."""
    monkeypatch.setattr(metrics_http, "REQUEST_TIMEOUT_S", 0.5)

    async def main():
        server = await ShimMetrics().serve("127.0.0.1:0")
        try:
            port = server.addresses[0][1]
            reader, writer = await _stalled(port)
            status, _, _ = await http_exchange(port, get("/metrics"))
            assert status == b"HTTP/1.1 200 "
            assert await _closed_by_server(reader)  # cut at the deadline, without an answer
            writer.close()
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())


def test_connections_over_the_cap_are_closed_at_once(monkeypatch):
    """No more than MAX_CONNECTIONS are held at once: with the deadline far away, only the cap can close the
    connection that goes over it."""
    monkeypatch.setattr(metrics_http, "REQUEST_TIMEOUT_S", 60.0)
    monkeypatch.setattr(metrics_http, "MAX_CONNECTIONS", 3)

    async def main():
        server = await ShimMetrics().serve("127.0.0.1:0")
        try:
            port = server.addresses[0][1]
            held = [await _stalled(port) for _ in range(3)]
            extra_reader, extra_writer = await _stalled(port)
            assert await _closed_by_server(extra_reader)  # over the cap: closed, nothing read
            for _, writer in [*held, (extra_reader, extra_writer)]:
                writer.close()
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())
