"""What probectl prints: tables, ages, handler summaries, the trace waterfall, JSON and YAML (the plain pieces:
render_text.py).

Pure: every function takes data (protos, numbers, the current time) and returns text or plain
dicts, so all of probectl's output is unit-tested without a daemon.

Conventions, chosen to match the tools operators already read:
- tables as crictl draws them: left-aligned columns 3 spaces apart, ids cut to 13 characters;
- ages as kubectl's AGE column (apimachinery's duration.HumanDuration: "45s", "3m20s", "2h", "4d");
- JSON as crictl's `-o json`: protojson with camelCase field names, enum names, unpopulated fields
  included, 64-bit integers as strings, 2-space indent; YAML is the same data.

yaml and protobuf's json_format are imported by the functions that write JSON or YAML (22 ms of a start that may
take 80 here): a table needs neither (tests/unit/test_probectl_startup.py).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probectl_pb2 as probectl_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.gostrings import go_duration
from probe_api.grpc_codes import attempt_grpc_status
from probe_api.validation import effective_timing

# The plain pieces, re-exported: probectl's callers and tests say `render.age`, `render.table`.
from probectl.render_text import (  # noqa: F401
    COLUMN_GAP, ID_WIDTH, NONE, age, event_name, fixed_row, format_ms, human_bytes, human_duration, key_values,
    one_line, result_name, state_name, table, truncate_id, type_name, worker_state_name,
)

OUTPUTS = ("table", "json", "yaml")


# --- probes ----------------------------------------------------------------------------

def _port(ref: spec_pb.PortRef) -> str:
    return ref.name if ref.WhichOneof("port") == "name" else str(ref.number)


def _host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def handler_text(spec: spec_pb.ProbeSpec) -> str:
    """The handler as `kubectl describe pod` shows it: `http-get http://:8080/healthz`, `tcp-socket :5432`."""
    if spec.HasField("http_get"):
        action = spec.http_get
        scheme = spec_pb.URIScheme.Name(action.scheme).lower()
        h2c = " (h2c)" if action.protocol == spec_pb.HTTP2 else ""
        return f"http-get {scheme}://{_host_port(action.host, _port(action.port))}{action.path or '/'}{h2c}"
    if spec.HasField("tcp_socket"):
        return f"tcp-socket {_host_port(spec.tcp_socket.host, _port(spec.tcp_socket.port))}"
    if spec.HasField("grpc"):
        service = f" {spec.grpc.service}" if spec.grpc.service else ""
        tls = " (TLS)" if spec.grpc.mode == spec_pb.TLS else ""
        return f"grpc :{spec.grpc.port}{service}{tls}"
    if spec.HasField("exec"):
        return f"exec {list(spec.exec.command)}"
    return NONE


def timing_text(spec: spec_pb.ProbeSpec) -> str:
    """kubectl describe's probe attributes, with the Kubernetes defaults filled in."""
    ms = 1_000_000
    timing = effective_timing(spec)
    return (f"delay={go_duration(timing.initial_delay_ms * ms)} timeout={go_duration(timing.timeout_ms * ms)} "
            f"period={go_duration(timing.period_ms * ms)} "
            f"#success={timing.success_threshold} #failure={timing.failure_threshold}")


def _has_attempt(probe: service_pb.Probe) -> bool:
    return probe.status.last_attempt.started_at_unix_ns != 0


def last_result(probe: service_pb.Probe) -> str:
    return result_name(probe.status.last_attempt.result) if _has_attempt(probe) else NONE


def last_latency(probe: service_pb.Probe) -> str:
    return format_ms(probe.status.last_attempt.duration_ns) if _has_attempt(probe) else NONE


def successes_failures(probe: service_pb.Probe) -> str:
    """Attempt totals; a warning (e.g. an unfollowed redirect) counts as a success, as for the kubelet."""
    totals = probe.status.totals
    return f"{totals.success + totals.warning}/{totals.failure}"


def probe_order(probe: service_pb.Probe) -> tuple:
    """Listing order: by pod, then container, then liveness / readiness / startup."""
    return (probe.pod_sandbox_id, probe.container_name or probe.container_id, probe.type, probe.probe_id)


PS_HEADERS = ("PROBE ID", "POD", "CONTAINER", "TYPE", "HANDLER", "STATE", "LAST", "LATENCY",
              "SUCCESSES/FAILURES", "AGE")


# A kubelet bridge row's state column: the thresholded state is the kubelet's, which the shim never sees.
BRIDGED_STATE = "kubelet"


def role_name(probe: service_pb.Probe) -> str:
    """The TYPE column: the probe type, or a bridged handler's role (which may be a hook: postStart, preStop)."""
    return probe.bridged.role if probe.HasField("bridged") else type_name(probe.type)


def probe_state(probe: service_pb.Probe) -> str:
    return BRIDGED_STATE if probe.HasField("bridged") else state_name(probe.status.state)


def probe_row(probe: service_pb.Probe, now_ns: int, no_trunc: bool = False) -> list[str]:
    return [
        truncate_id(probe.probe_id, no_trunc), truncate_id(probe.pod_sandbox_id, no_trunc),
        probe.container_name or truncate_id(probe.container_id, no_trunc), role_name(probe),
        handler_text(probe.spec), probe_state(probe), last_result(probe), last_latency(probe),
        successes_failures(probe), age(probe.created_at, now_ns),
    ]


def probes_table(probes: Iterable[service_pb.Probe], now_ns: int, no_trunc: bool = False) -> str:
    return table(PS_HEADERS, (probe_row(p, now_ns, no_trunc) for p in probes))


def describe_probe(probe: service_pb.Probe, now_ns: int, bar: str = "█") -> str:
    """`probectl inspect -o table`: one probe in kubectl-describe style, then its last attempt's waterfall."""
    spec, status = probe.spec, probe.status
    worker, totals = status.worker, status.totals
    container = probe.container_name
    if probe.container_id and probe.container_id != probe.container_name:
        container = f"{container} ({probe.container_id})" if container else probe.container_id
    bridged = probe.HasField("bridged")
    if bridged:
        state = "held by the kubelet, which runs this handler through the kubelet bridge (ExecSync)"
        timing = f"timeout={go_duration(effective_timing(spec).timeout_ms * 1_000_000)} (period and " \
                 "thresholds are the kubelet's)"
    else:
        state = f"{state_name(status.state)} for {age(status.state_changed_at, now_ns)}"
        state += f" (consecutive: {status.consecutive_successes} successes, {status.consecutive_failures} failures)"
        if status.on_hold:
            state += ", on hold until the container restarts"
        timing = timing_text(spec)
    pid = f" pid {worker.pid}" if worker.pid else ""
    pairs = [
        ("Probe ID", probe.probe_id), ("Pod", probe.pod_sandbox_id), ("Container", container or NONE),
        ("Type", f"{role_name(probe)} (kubelet bridge)" if bridged else role_name(probe)),
        ("Handler", f"{handler_text(spec)} {timing}"),
        ("Target", f"{spec_pb.Target.Name(spec.target).lower().replace('_', '-')}, "
                   f"{spec_pb.IPFamily.Name(spec.ip_family).lower()}"),
        ("Labels", ",".join(f"{k}={v}" for k, v in sorted(probe.labels.items())) or NONE),
        ("Created", f"{age(probe.created_at, now_ns)} ago" if probe.created_at else NONE),
        ("State", state),
        ("Totals", f"{totals.success} success, {totals.warning} warning, "
                   f"{totals.failure} failure, {totals.unknown} unknown"),
        ("Worker", f"{worker_state_name(worker.state)}{pid}, {worker.restarts} restarts"
                   + (f", last error: {one_line(worker.last_error, 200)}" if worker.last_error else "")),
    ]
    if not _has_attempt(probe):
        return key_values(pairs + [("Last attempt", "none yet")])
    pairs.append(("Last attempt", f"{age(status.last_attempt.started_at_unix_ns, now_ns)} ago"))
    return key_values(pairs) + "\n\n" + attempt_text(status.last_attempt, status.last_trace_id, bar)


# --- sandboxes and workers -------------------------------------------------------------

def merge_sandboxes(shim: Sequence[service_pb.ProbeSandbox],
                    runtime: Sequence[cri_pb.PodSandbox] | None) -> list[service_pb.ProbeSandbox]:
    """The runtime's pods joined with what the shim knows of them (the shim only knows pods it probes)."""
    if runtime is None:
        return list(shim)
    known = {s.id: s for s in shim}
    merged = []
    for pod in runtime:
        entry = service_pb.ProbeSandbox()
        if pod.id in known:
            entry.CopyFrom(known.pop(pod.id))
        else:
            entry.id = pod.id
        # The runtime is the authority on a pod's name and life; the shim adds netns, worker, probes.
        entry.name, entry.namespace, entry.uid = pod.metadata.name, pod.metadata.namespace, pod.metadata.uid
        entry.ready = pod.state == cri_pb.SANDBOX_READY
        entry.created_at = pod.created_at or entry.created_at
        merged.append(entry)
    merged.extend(known.values())  # probed sandboxes the runtime no longer lists
    return sorted(merged, key=lambda s: -s.created_at)


PODS_HEADERS = ("POD ID", "NAME", "NAMESPACE", "STATE", "NETNS", "WORKER PID", "PROBES", "AGE")
HOST_NETWORK = "host network"  # the node's own namespace, never probed: no path to show, nothing to probe in


def netns_text(sandbox: service_pb.ProbeSandbox) -> str:
    return HOST_NETWORK if sandbox.host_network else sandbox.netns_path or NONE


def pods_table(sandboxes: Iterable[service_pb.ProbeSandbox], now_ns: int, no_trunc: bool = False) -> str:
    rows = ([truncate_id(s.id, no_trunc), s.name or NONE, s.namespace or NONE, "Ready" if s.ready else "NotReady",
             netns_text(s), s.worker.pid or NONE, s.probes, age(s.created_at, now_ns)] for s in sandboxes)
    return table(PODS_HEADERS, rows)


WORKERS_HEADERS = ("PID", "GROUP", "SANDBOXES", "PODS", "UPTIME", "PSS", "CPU%", "PROBES", "RESTARTS")
PODS_SHOWN = 2  # a group's first pod ids in the table, then "+N" (all of them with --no-trunc)


def served_pods(ids: list[str], no_trunc: bool = False) -> str:
    if not ids:
        return NONE
    shown = ids if no_trunc else ids[:PODS_SHOWN]
    text = ",".join(truncate_id(i, no_trunc) for i in shown)
    return text if len(shown) == len(ids) else f"{text},+{len(ids) - len(shown)}"


def workers_table(workers: Iterable[probectl_pb.WorkerUsage], no_trunc: bool = False) -> str:
    rows = ([w.pid or NONE, w.group or NONE, len(w.pod_sandbox_ids), served_pods(list(w.pod_sandbox_ids), no_trunc),
             human_duration(w.uptime_seconds) if w.HasField("uptime_seconds") else NONE,
             human_bytes(w.pss_bytes) if w.HasField("pss_bytes") else NONE,
             f"{w.cpu_percent:.1f}" if w.HasField("cpu_percent") else NONE, w.probes, w.restarts] for w in workers)
    return table(WORKERS_HEADERS, rows)


# --- one attempt: summary and waterfall ------------------------------------------------

@dataclass(frozen=True)
class WaterfallRow:
    depth: int
    name: str
    start_ns: int
    duration_ns: int
    detail: str
    error: str


def flatten_phases(phases: Iterable[spec_pb.Phase], depth: int = 0) -> list[WaterfallRow]:
    rows = []
    for phase in phases:
        rows.append(WaterfallRow(depth, phase.name, phase.start_offset_ns, phase.duration_ns, phase.detail, phase.error))
        rows.extend(flatten_phases(phase.children, depth + 1))
    return rows


def timeline_bar(start_ns: int, duration_ns: int, total_ns: int, width: int, bar: str = "█") -> str:
    """A phase's place in the attempt: `|  ████    |`; every phase gets at least one cell."""
    total_ns = max(total_ns, 1)
    offset = min(width - 1, max(0, start_ns * width // total_ns))
    length = min(width - offset, max(1, round(duration_ns * width / total_ns)))
    return "|" + " " * offset + bar * length + " " * (width - offset - length) + "|"


WATERFALL_HEADERS = ("PHASE", "START", "DURATION", "TIMELINE", "DETAIL")


def waterfall(attempt: spec_pb.Attempt, width: int = 40, bar: str = "█") -> str:
    """The attempt's phases on one time axis; nested phases (redirect hops) indented under their parent."""
    rows = flatten_phases(attempt.phases)
    if not rows:
        return "(no phases recorded)"
    total = max([attempt.duration_ns] + [r.start_ns + r.duration_ns for r in rows])
    cells = [
        ["  " * r.depth + r.name, format_ms(r.start_ns), format_ms(r.duration_ns),
         timeline_bar(r.start_ns, r.duration_ns, total, width, bar),
         f"error: {one_line(r.error, 120)}" if r.error else one_line(r.detail, 120)]
        for r in rows
    ]
    return table(WATERFALL_HEADERS, cells)


def attempt_text(attempt: spec_pb.Attempt, trace_id: str = "", bar: str = "█") -> str:
    """`probectl exec`'s default output: result, output, address, then the waterfall."""
    pairs: list[tuple[str, object]] = [("Result", result_name(attempt.result))]
    output_lines = attempt.output.splitlines()
    if len(output_lines) <= 1:
        pairs.append(("Output", one_line(attempt.output, 1000) or NONE))
    pairs += [("Address", attempt.address or NONE), ("Duration", format_ms(attempt.duration_ns))]
    if attempt.http_status_code:
        pairs.append(("HTTP status", attempt.http_status_code))
    if grpc_status := attempt_grpc_status(attempt):
        pairs.append(("gRPC status", grpc_status))
    if trace_id:
        pairs.append(("Trace ID", trace_id))
    text = key_values(pairs)
    if len(output_lines) > 1:
        text += "\nOutput:\n" + "\n".join("  " + one_line(line, 1000) for line in output_lines)
    return text + "\n\n" + waterfall(attempt, bar=bar)


# --- watch -----------------------------------------------------------------------------

WATCH_HEADERS = ("TIME", "EVENT", "PROBE ID", "POD", "CONTAINER", "TYPE", "STATE", "LAST", "LATENCY", "OUTPUT")
_WATCH_WIDTHS = (12, 8, ID_WIDTH, ID_WIDTH, 10, 9, 7, 7, 8, 0)


def watch_widths(no_trunc: bool = False) -> tuple[int, ...]:
    # Full ids have no fixed length; a stream cannot measure rows it has not seen, so those columns just grow.
    return _WATCH_WIDTHS if not no_trunc else tuple(0 if h in ("PROBE ID", "POD") else w
                                                      for h, w in zip(WATCH_HEADERS, _WATCH_WIDTHS))


def clock(now_ns: int) -> str:
    return datetime.datetime.fromtimestamp(now_ns / 1e9).strftime("%H:%M:%S.%f")[:-3]


def watch_header(no_trunc: bool = False) -> str:
    return fixed_row(WATCH_HEADERS, watch_widths(no_trunc))


def event_line(event: service_pb.WatchProbeStatusResponse, now_ns: int, no_trunc: bool = False) -> str:
    """One watch event as one line under watch_header()."""
    widths = watch_widths(no_trunc)
    name = event_name(event.type)
    if event.type in (service_pb.SNAPSHOT_COMPLETE, service_pb.RESYNC):
        return fixed_row([clock(now_ns), name, f"revision {event.revision}"], widths)
    probe = event.probe
    ident = [clock(now_ns), name, truncate_id(probe.probe_id, no_trunc), truncate_id(probe.pod_sandbox_id, no_trunc),
             probe.container_name or truncate_id(probe.container_id, no_trunc) or NONE, role_name(probe)]
    if event.type == service_pb.REMOVED:
        return fixed_row(ident, widths)
    output = one_line(probe.status.last_attempt.output, 60) if _has_attempt(probe) else ""
    return fixed_row(ident + [probe_state(probe), last_result(probe), last_latency(probe), output], widths)


# --- JSON and YAML ---------------------------------------------------------------------

def message_dict(message) -> dict:
    """protojson, as crictl prints it (EmitDefaultValues): camelCase, enum names, every field present,
    in field-number order as Go's protojson writes them (Python's puts unpopulated fields last)."""
    from google.protobuf import json_format

    return _in_field_order(message.DESCRIPTOR,
                           json_format.MessageToDict(message, always_print_fields_with_no_presence=True))


# Shown even when unset, with every field: a probe's status before anything was observed reads as Kubernetes shows
# an object's `status: {}` would, and a reader of `status.state` never meets a missing key.
_ALWAYS_SHOWN = {service_pb.ProbeStatus.DESCRIPTOR.full_name: service_pb.ProbeStatus}


def _in_field_order(descriptor, data: dict) -> dict:
    from google.protobuf import json_format

    ordered = {}
    for field in sorted(descriptor.fields, key=lambda f: f.number):
        shown = _ALWAYS_SHOWN.get(field.message_type.full_name) if field.message_type is not None else None
        if field.json_name not in data and shown is not None and not field.is_repeated:
            data[field.json_name] = json_format.MessageToDict(shown(), always_print_fields_with_no_presence=True)
        if field.json_name not in data:
            continue
        value = data[field.json_name]
        nested = field.message_type
        if nested is not None and not nested.GetOptions().map_entry:
            value = ([_in_field_order(nested, v) for v in value] if isinstance(value, list)
                     else _in_field_order(nested, value))
        elif nested is not None and nested.fields_by_name["value"].message_type is not None:
            value = {k: _in_field_order(nested.fields_by_name["value"].message_type, v) for k, v in value.items()}
        ordered[field.json_name] = value
    return ordered


def to_json(data, indent: int | None = 2) -> str:
    return json.dumps(data, indent=indent, ensure_ascii=False)


def to_yaml(data) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False).rstrip("\n")


def structured(data, output: str) -> str:
    """data (plain dicts from message_dict and friends) as `-o json` or `-o yaml`."""
    if output == "json":
        return to_json(data)
    if output == "yaml":
        return to_yaml(data)
    raise ValueError(f"not a structured output: {output!r}")
