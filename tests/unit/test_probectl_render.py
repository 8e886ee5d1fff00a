"""probectl's output, without a daemon: tables, ages, truncation, the waterfall, JSON and YAML."""

from __future__ import annotations

import json

import pytest
import yaml

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probectl_pb2 as probectl_pb
from probectl import render

NOW = 1_700_000_000 * 10**9
SECOND = 10**9


def http_spec(port=8080, path="/healthz", **kw) -> spec_pb.ProbeSpec:
    ref = spec_pb.PortRef(name=port) if isinstance(port, str) else spec_pb.PortRef(number=port)
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path=path, port=ref), **kw)


def probed(probe_id="readiness-0123456789abcdef", **kw) -> service_pb.Probe:
    """A probe; keyword arguments naming a ProbeStatus field go into its status."""
    probe = service_pb.Probe(
        probe_id=probe_id, pod_sandbox_id="cps-pod-4242-0", container_name="web", type=spec_pb.READINESS,
        spec=http_spec(), created_at=NOW - 90 * SECOND,
        status=service_pb.ProbeStatus(
            state=spec_pb.STATE_SUCCESS,
            last_attempt=spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, started_at_unix_ns=NOW - SECOND,
                                         duration_ns=580_000),
            totals=service_pb.AttemptTotals(success=7, warning=1, failure=2)),
    )
    for key, value in kw.items():
        owner = probe.status if key in service_pb.ProbeStatus.DESCRIPTOR.fields_by_name else probe
        field = getattr(owner, key)
        if hasattr(field, "CopyFrom"):
            field.CopyFrom(value)
        else:
            setattr(owner, key, value)
    return probe


def columns_of(header: str, name: str) -> int:
    return header.index(name)


# --- building blocks ---------------------------------------------------------------------

@pytest.mark.parametrize("seconds, text", [
    (-5, "<invalid>"), (-0.5, "0s"), (0, "0s"), (45, "45s"), (119, "119s"), (120, "2m"), (200, "3m20s"),
    (600, "10m"), (179 * 60, "179m"), (3 * 3600, "3h"), (3 * 3600 + 120, "3h2m"), (8 * 3600, "8h"),
    (47 * 3600, "47h"), (48 * 3600, "2d"), (2 * 86400 + 3 * 3600, "2d3h"), (10 * 86400, "10d"),
    (800 * 86400, "2y70d"), (9 * 365 * 86400, "9y"),
])
def test_ages_are_kubectls(seconds, text):
    assert render.human_duration(seconds) == text


def test_age_of_an_unset_time_is_a_dash():
    assert render.age(0, NOW) == "-"
    assert render.age(NOW - 5 * SECOND, NOW) == "5s"


def test_ids_are_cut_to_13_characters_unless_no_trunc():
    assert render.truncate_id("readiness-0123456789abcdef") == "readiness-012"
    assert render.truncate_id("readiness-0123456789abcdef", no_trunc=True) == "readiness-0123456789abcdef"
    assert render.truncate_id("short") == "short"


def test_table_columns_align_three_spaces_apart_without_trailing_blanks():
    text = render.table(("A", "LONGER HEADER", "C"), [("wide cell", "x", "last"), ("y", "z", "")])
    lines = text.splitlines()
    assert lines == [
        "A           LONGER HEADER   C",
        "wide cell   x               last",
        "y           z",
    ]


def test_format_ms_keeps_about_three_digits():
    assert [render.format_ms(ns) for ns in (580_000, 12_345_000, 250_400_000, 0)] == \
        ["0.58ms", "12.3ms", "250ms", "0.00ms"]


def test_one_line_removes_control_characters_and_bounds_pod_text():
    assert render.one_line("a\nb\r\nc\x1b[31md") == "a b c [31md"
    assert render.one_line("x" * 100, limit=10) == "xxxxxxx..."


def test_human_bytes():
    assert [render.human_bytes(n) for n in (512, 2048, 21 * 1024 * 1024 + 300_000)] == ["512B", "2.0KiB", "21.3MiB"]


# --- probes ------------------------------------------------------------------------------

def test_handlers_read_like_kubectl_describe():
    assert render.handler_text(http_spec("http")) == "http-get http://:http/healthz"
    https = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(scheme=spec_pb.HTTPS, port=spec_pb.PortRef(number=443)))
    assert render.handler_text(https) == "http-get https://:443/"
    tcp = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=5432), host="::1"))
    assert render.handler_text(tcp) == "tcp-socket [::1]:5432"
    h2c = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(protocol=spec_pb.HTTP2, port=spec_pb.PortRef(number=80)))
    assert render.handler_text(h2c) == "http-get http://:80/ (h2c)"
    assert render.handler_text(spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=9090))) == "grpc :9090"
    assert render.handler_text(spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=9090, service="cart"))) == "grpc :9090 cart"
    assert render.timing_text(spec_pb.ProbeSpec(period_ms=500)) == \
        "delay=0s timeout=1s period=500ms #success=1 #failure=3"


def test_ps_table_has_crictl_columns_and_truncated_ids():
    probes = [probed(), probed("liveness-fedcba9876543210", type=spec_pb.LIVENESS, state=spec_pb.STATE_FAILURE,
                               container_name="a-much-longer-container-name",
                               spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=80))),
                               last_attempt=spec_pb.Attempt(), totals=service_pb.AttemptTotals())]
    lines = render.probes_table(probes, NOW).splitlines()
    header = lines[0]
    assert [columns_of(header, name) for name in render.PS_HEADERS] == \
        sorted(columns_of(header, name) for name in render.PS_HEADERS)
    # Every cell of a column starts where its header does.
    for name, first, second in (("TYPE", "readiness", "liveness"), ("STATE", "success", "failure"),
                                ("AGE", "90s", "90s"), ("HANDLER", "http-get", "tcp-socket")):
        at = columns_of(header, name)
        assert lines[1][at:].startswith(first) and lines[2][at:].startswith(second)
    assert lines[1].startswith("readiness-012   cps-pod-4242-   web   ")
    assert lines[1][columns_of(header, "LAST"):].startswith("success   0.58ms")
    assert lines[1][columns_of(header, "SUCCESSES/FAILURES"):].startswith("8/2")
    # No attempt yet: LAST and LATENCY are dashes.
    assert lines[2][columns_of(header, "LAST")] == "-" and lines[2][columns_of(header, "LATENCY")] == "-"
    wide = render.probes_table(probes, NOW, no_trunc=True).splitlines()
    assert wide[1].startswith("readiness-0123456789abcdef   cps-pod-4242-0   ")


def test_describe_probe_has_state_and_waterfall():
    probe = probed(state_changed_at=NOW - 30 * SECOND, last_trace_id="ab" * 16,
                   worker=service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=4321, restarts=1))
    probe.status.last_attempt.phases.add(name="connect", duration_ns=100_000, detail="198.18.0.2:8080")
    text = render.describe_probe(probe, NOW)
    assert "State:         success for 30s" in text
    assert "Worker:        running pid 4321, 1 restarts" in text
    assert "Trace ID:  " + "ab" * 16 in text
    assert "connect" in text and "198.18.0.2:8080" in text


def bridged_hook() -> service_pb.Probe:
    """A kubelet bridge row for a preStop hook: no probe type, the role says what it is."""
    return probed("bridged-prestop-0123456789ab", type=spec_pb.PROBE_TYPE_UNSPECIFIED, state=spec_pb.STATE_UNKNOWN,
                  spec=http_spec(path="/drain", timeout_ms=300_000),
                  bridged=service_pb.BridgedHandler(role="preStop", last_exec_at=NOW - SECOND))


def test_a_bridged_row_shows_its_role_and_that_the_kubelet_holds_its_state():
    lines = render.probes_table([bridged_hook()], NOW).splitlines()
    header = lines[0]
    for name, value in (("TYPE", "preStop"), ("STATE", "kubelet"), ("HANDLER", "http-get http://:8080/drain")):
        assert lines[1][columns_of(header, name):].startswith(value)
    text = render.describe_probe(bridged_hook(), NOW)
    assert "Type:          preStop (kubelet bridge)" in text
    assert "State:         held by the kubelet" in text
    assert "timeout=5m0s (period and thresholds are the kubelet's)" in text
    line = render.event_line(service_pb.WatchProbeStatusResponse(type=service_pb.ATTEMPT, probe=bridged_hook()), NOW)
    watch = render.watch_header()
    assert line[watch.index("TYPE"):].startswith("preStop") and line[watch.index("STATE"):].startswith("kubelet")


# --- waterfall ---------------------------------------------------------------------------

def redirected_attempt() -> spec_pb.Attempt:
    """Two hops: the first answered 302, the redirect hop nests its own phases."""
    us = 1000
    return spec_pb.Attempt(
        result=spec_pb.RESULT_SUCCESS, output="ok", duration_ns=1000 * us, address="198.18.0.2:8080",
        http_status_code=200, started_at_unix_ns=NOW,
        phases=[
            spec_pb.Phase(name="connect", start_offset_ns=0, duration_ns=100 * us, detail="198.18.0.2:8080"),
            spec_pb.Phase(name="request", start_offset_ns=100 * us, duration_ns=50 * us,
                          detail="GET /redirect HTTP/1.1"),
            spec_pb.Phase(name="processing", start_offset_ns=150 * us, duration_ns=200 * us),
            spec_pb.Phase(name="transfer", start_offset_ns=350 * us, duration_ns=50 * us),
            spec_pb.Phase(name="redirect", start_offset_ns=400 * us, duration_ns=600 * us,
                          detail="http://198.18.0.2:8080/ok", children=[
                              spec_pb.Phase(name="connect", start_offset_ns=400 * us, duration_ns=100 * us),
                              spec_pb.Phase(name="request", start_offset_ns=500 * us, duration_ns=100 * us),
                              spec_pb.Phase(name="processing", start_offset_ns=600 * us, duration_ns=300 * us,
                                            error="deadline exceeded"),
                          ]),
        ],
    )


def test_waterfall_draws_phases_on_one_time_axis():
    lines = render.waterfall(redirected_attempt(), width=20, bar="#").splitlines()
    assert lines[0].split() == ["PHASE", "START", "DURATION", "TIMELINE", "DETAIL"]
    rows = {line.split()[0] + str(i): line for i, line in enumerate(lines[1:])}
    bars = [line[line.index("|"):line.rindex("|") + 1] for line in lines[1:]]
    assert bars[0] == "|##" + " " * 18 + "|"               # connect: 0-100us of 1000us = cells 0-1
    assert bars[1] == "|  #" + " " * 17 + "|"              # request: starts at cell 2, 1 cell
    assert bars[2] == "|   ####" + " " * 13 + "|"          # processing: cells 3-6
    assert bars[4] == "|        ############|"            # redirect: cells 8-19, to the end of the attempt
    assert all(len(bar) == 22 for bar in bars)
    assert rows["connect0"].split()[:3] == ["connect", "0.00ms", "0.10ms"]


def test_waterfall_indents_nested_hops_and_shows_errors():
    lines = render.waterfall(redirected_attempt(), width=20).splitlines()
    names = [line[:12].rstrip() for line in lines[1:]]
    assert names == ["connect", "request", "processing", "transfer", "redirect", "  connect", "  request",
                     "  processing"]
    assert lines[5].endswith("http://198.18.0.2:8080/ok")
    assert lines[-1].endswith("error: deadline exceeded")
    assert "█" in lines[1]


def test_waterfall_gives_every_phase_a_cell_and_survives_no_phases():
    attempt = spec_pb.Attempt(duration_ns=10**9, phases=[spec_pb.Phase(name="connect", start_offset_ns=10**9 - 1,
                                                                       duration_ns=1)])
    (row,) = render.waterfall(attempt, width=10, bar="#").splitlines()[1:]
    assert "|         #|" in row
    assert render.waterfall(spec_pb.Attempt()) == "(no phases recorded)"


def test_attempt_text_has_result_output_address_then_waterfall():
    text = render.attempt_text(redirected_attempt(), trace_id="cd" * 16, bar="#")
    head, waterfall = text.split("\n\n")
    assert head.splitlines() == [
        "Result:       success",
        "Output:       ok",
        "Address:      198.18.0.2:8080",
        "Duration:     1.00ms",
        "HTTP status:  200",
        "Trace ID:     " + "cd" * 16,
    ]
    assert waterfall.startswith("PHASE")


def test_multi_line_output_is_indented_below():
    attempt = spec_pb.Attempt(result=spec_pb.RESULT_FAILURE, output="line one\nline two")
    text = render.attempt_text(attempt)
    assert "Output:\n  line one\n  line two" in text


def test_exec_json_is_the_responses_protojson():
    response = service_pb.ExecProbeResponse(attempt=redirected_attempt(), trace_id="cd" * 16, span_id="ef" * 8)
    data = render.message_dict(response)
    assert list(data) == ["attempt", "traceId", "spanId"]  # in field order; the unset worker is absent
    attempt = data["attempt"]
    assert attempt["result"] == "RESULT_SUCCESS" and attempt["durationNs"] == "1000000"
    assert attempt["address"] == "198.18.0.2:8080" and attempt["startedAtUnixNs"] == str(NOW)
    redirect = attempt["phases"][4]
    assert redirect["name"] == "redirect" and [c["name"] for c in redirect["children"]] == \
        ["connect", "request", "processing"]
    assert redirect["children"][2]["error"] == "deadline exceeded"
    assert json.loads(render.to_json(data)) == data


@pytest.mark.parametrize("result, name", [(spec_pb.RESULT_SUCCESS, "success"), (spec_pb.RESULT_WARNING, "warning"),
                                          (spec_pb.RESULT_FAILURE, "failure"), (spec_pb.RESULT_UNKNOWN, "unknown")])
def test_result_names(result, name):
    assert render.result_name(result) == name


# --- sandboxes and workers ---------------------------------------------------------------

def test_merge_sandboxes_joins_the_runtimes_pods_with_the_shims():
    shim = [service_pb.ProbeSandbox(id="aaaa", netns_path="/var/run/netns/cni-1", probes=2,
                                    worker=service_pb.WorkerStatus(pid=77)),
            service_pb.ProbeSandbox(id="gone", probes=1)]
    runtime = [cri_pb.PodSandbox(id="aaaa", metadata=cri_pb.PodSandboxMetadata(name="web", namespace="shop"),
                                 state=cri_pb.SANDBOX_READY, created_at=NOW - 10 * SECOND),
               cri_pb.PodSandbox(id="bbbb", metadata=cri_pb.PodSandboxMetadata(name="db", namespace="shop"),
                                 state=cri_pb.SANDBOX_NOTREADY, created_at=NOW - 20 * SECOND)]
    merged = render.merge_sandboxes(shim, runtime)
    assert [s.id for s in merged] == ["aaaa", "bbbb", "gone"]
    assert merged[0].name == "web" and merged[0].worker.pid == 77 and merged[0].ready and merged[0].probes == 2
    assert not merged[1].ready and merged[1].probes == 0
    assert render.merge_sandboxes(shim, None) == shim
    lines = render.pods_table(merged, NOW).splitlines()
    header = lines[0]
    assert header.startswith("POD ID   NAME   NAMESPACE   STATE      NETNS")
    assert lines[2][header.index("STATE"):].startswith("NotReady   -")
    assert lines[1].split() == ["aaaa", "web", "shop", "Ready", "/var/run/netns/cni-1", "77", "2", "10s"]
    assert lines[2].split() == ["bbbb", "db", "shop", "NotReady", "-", "-", "0", "20s"]


def test_a_sandbox_in_the_nodes_network_namespace_shows_as_host_network_not_a_path():
    shim = [service_pb.ProbeSandbox(id="hhhh", netns_path="/var/run/netns/host", host_network=True),
            service_pb.ProbeSandbox(id="cccc", host_network=True)]
    runtime = [cri_pb.PodSandbox(id="cccc", metadata=cri_pb.PodSandboxMetadata(name="agent", namespace="kube-system"),
                                 state=cri_pb.SANDBOX_READY, created_at=NOW - SECOND)]
    lines = render.pods_table(render.merge_sandboxes(shim, runtime), NOW).splitlines()
    assert [line.split()[4:6] for line in lines[1:]] == [["host", "network"], ["host", "network"]]


def test_workers_table_has_a_row_per_worker_with_the_sandboxes_it_serves():
    usage = [probectl_pb.WorkerUsage(pid=4321, group="shop#1", pod_sandbox_ids=["aaaaaaaaaaaaaaaa", "bbbb", "cccc"],
                                     state=service_pb.WORKER_RUNNING, uptime_seconds=200, pss_bytes=3 * 1024 * 1024,
                                     cpu_percent=0.25, probes=9, restarts=1),
             probectl_pb.WorkerUsage(pid=0, group="x", pod_sandbox_ids=["x"], state=service_pb.WORKER_BACKOFF,
                                     probes=1, restarts=4)]
    lines = render.workers_table(usage).splitlines()
    assert lines[0].split() == ["PID", "GROUP", "SANDBOXES", "PODS", "UPTIME", "PSS", "CPU%", "PROBES", "RESTARTS"]
    assert lines[1].split() == ["4321", "shop#1", "3", "aaaaaaaaaaaaa,bbbb,+1", "3m20s", "3.0MiB", "0.2", "9", "1"]
    assert lines[2].split() == ["-", "x", "1", "x", "-", "-", "-", "1", "4"]
    wide = render.workers_table(usage, no_trunc=True).splitlines()
    assert wide[1].split()[3] == "aaaaaaaaaaaaaaaa,bbbb,cccc"
    # -o json is the message's protojson: an unmeasured number is absent, not null.
    data = render.message_dict(probectl_pb.WorkersResult(workers=usage))
    assert data["workers"][0]["pssBytes"] == str(3 * 1024 * 1024) and data["workers"][0]["state"] == "WORKER_RUNNING"
    assert data["workers"][0]["podSandboxIds"] == ["aaaaaaaaaaaaaaaa", "bbbb", "cccc"]
    assert "pssBytes" not in data["workers"][1] and "uptimeSeconds" not in data["workers"][1]


# --- watch -------------------------------------------------------------------------------

def test_watch_lines_line_up_under_the_header():
    header = render.watch_header()
    update = service_pb.WatchProbeStatusResponse(type=service_pb.UPDATED, revision=9, probe=probed())
    removed = service_pb.WatchProbeStatusResponse(type=service_pb.REMOVED, probe=service_pb.Probe(
        probe_id="readiness-0123456789abcdef", pod_sandbox_id="cps-pod-4242-0", type=spec_pb.READINESS))
    line = render.event_line(update, NOW)
    for name, value in (("EVENT", "updated"), ("PROBE ID", "readiness-012"), ("STATE", "success"),
                        ("LATENCY", "0.58ms"), ("TYPE", "readiness")):
        assert line[header.index(name):].startswith(value)
    gone = render.event_line(removed, NOW)
    assert gone[header.index("EVENT"):].startswith("removed") and gone.endswith("readiness")
    synced = service_pb.WatchProbeStatusResponse(type=service_pb.SNAPSHOT_COMPLETE, revision=12)
    assert render.event_line(synced, NOW).split()[1:] == ["synced", "revision", "12"]


# --- JSON and YAML -----------------------------------------------------------------------

def test_json_is_crictls_protojson_and_yaml_the_same_data():
    data = render.message_dict(probed())
    assert data["probeId"] == "readiness-0123456789abcdef"     # camelCase, as protojson
    assert data["type"] == "READINESS" and data["status"]["state"] == "STATE_SUCCESS"   # enum names
    assert data["status"]["onHold"] is False and data["labels"] == {}   # unpopulated fields are there too
    assert data["createdAt"] == str(NOW - 90 * SECOND)       # 64-bit integers as strings
    text = render.structured(data, "json")
    assert text.startswith('{\n  "probeId": ')
    assert json.loads(text) == data
    assert yaml.safe_load(render.structured(data, "yaml")) == data


def test_json_shows_a_probes_status_before_anything_was_observed():
    data = render.message_dict(service_pb.WatchProbeStatusResponse(probe=service_pb.Probe(probe_id="x")))
    assert data["probe"]["status"]["state"] == "STATE_UNKNOWN" and data["probe"]["status"]["onHold"] is False


def test_json_fields_come_in_field_number_order_like_gos_protojson():
    probe = service_pb.Probe(probe_id="x", spec=spec_pb.ProbeSpec(period_ms=5))
    probe.status.last_attempt.phases.add(name="connect").children.add(name="inner")
    data = render.message_dict(probe)
    assert list(data)[:5] == ["probeId", "podSandboxId", "containerId", "containerName", "type"]
    assert list(data["spec"])[:2] == ["initialDelayMs", "periodMs"]
    assert list(data["status"]["lastAttempt"]["phases"][0]["children"][0]) == \
        ["name", "startOffsetNs", "durationNs", "detail", "error", "children"]


def test_workers_are_one_row_per_group_whatever_the_order_of_the_sandboxes():
    from probectl.commands.workers import _measure_workers

    def sandbox(sid: str, group: str, probes: int, restarts: int = 0) -> service_pb.ProbeSandbox:
        # pid 0: a worker in backoff, nothing for psutil to read (and no measuring interval)
        return service_pb.ProbeSandbox(id=sid, probes=probes, worker=service_pb.WorkerStatus(
            state=service_pb.WORKER_BACKOFF, group=group, restarts=restarts))

    usage = _measure_workers([sandbox("a1", "team-a#1", 3, 2), sandbox("b1", "team-b#1", 1),
                              sandbox("a2", "team-a#1", 2, 2), sandbox("old", "", 1)], interval_s=60)
    assert [(u.group, list(u.pod_sandbox_ids), u.probes, u.restarts) for u in usage] == [
        ("team-a#1", ["a1", "a2"], 5, 2), ("team-b#1", ["b1"], 1, 0), ("", ["old"], 1, 0)]
