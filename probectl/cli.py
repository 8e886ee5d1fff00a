"""probectl: the crictl-style command line of the probe shim.

Owns: the commands and flags, turning arguments into ProbeShimClient calls, exit codes, and the one-line
error messages. What is printed is render.py's; how the shim is called is client.py's; handler syntax is
specs.py's and manifests are manifest.py's.

Exit codes: 0 ok (for exec: success or warning), 1 bad arguments or an error the shim reported,
2 the shim cannot be reached, 3 exec result unknown, 4 exec result failure (grpc_health_probe's spirit).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterable

import psutil

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probectl_pb2 as probectl_pb
from probe_api import handler_flags
from probectl import convert, render, specs
from probectl.client import (
    DEFAULT_ENDPOINT, ENDPOINT_ENV, NotFoundError, ProbeShimClient, ShimError, ShimUnavailable,
)
from probectl.manifest import daemon_errors, probes_from_manifest

EXIT_OK, EXIT_ERROR, EXIT_UNREACHABLE, EXIT_UNKNOWN, EXIT_FAILURE = 0, 1, 2, 3, 4
EXIT_CODES = {spec_pb.RESULT_SUCCESS: EXIT_OK, spec_pb.RESULT_WARNING: EXIT_OK,
              spec_pb.RESULT_FAILURE: EXIT_FAILURE, spec_pb.RESULT_UNKNOWN: EXIT_UNKNOWN}
STATES = {"success": spec_pb.STATE_SUCCESS, "failure": spec_pb.STATE_FAILURE, "unknown": spec_pb.STATE_UNKNOWN}


class UsageError(Exception):
    """Bad arguments: exit 1 with this one-line message."""


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are probectl's one line and exit 1 (2 means "cannot reach the shim")."""

    def error(self, message: str):
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            sys.stderr.write(message)
        raise _Exit(status)


# --- argument types --------------------------------------------------------------------

def _key_value(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: use KEY=VALUE")
    return key, value


def _container_port(text: str) -> spec_pb.ContainerPort:
    """NAME=PORT[/PROTOCOL]: a container port, so that a named probe port can be resolved."""
    name, eq, rest = text.partition("=")
    number, _, protocol = rest.partition("/")
    if not eq or not name or not (number.isascii() and number.isdigit()) or not 1 <= int(number) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: use NAME=PORT[/PROTOCOL], e.g. http=8080")
    return spec_pb.ContainerPort(name=name, container_port=int(number), protocol=(protocol or "TCP").upper())


def _positive_duration_ms(text: str) -> int:
    value = specs.parse_duration_ms(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0, e.g. 2s")
    return value


def _positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number of at least 1")
    return int(text)


# --- the parser ------------------------------------------------------------------------

def _output_flag(parser: argparse.ArgumentParser, default: str = "table", choices=render.OUTPUTS) -> None:
    parser.add_argument("-o", "--output", choices=choices, default=default, help=f"output format (default {default})")


def _no_trunc_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-trunc", action="store_true", help="show full ids")


def _handler_flags(parser: argparse.ArgumentParser, *, type_required: bool) -> None:
    group = parser.add_argument_group("handler (exactly one)").add_mutually_exclusive_group(required=True)
    group.add_argument("--http-get", metavar="[SCHEME://][HOST:]PORT[/PATH[?QUERY]]", help="an HTTP GET probe")
    group.add_argument("--tcp", metavar="[HOST:]PORT", help="a TCP connect probe")
    group.add_argument("--grpc", metavar="PORT", help="a gRPC health probe")
    parser.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                        help="HTTP request header, repeatable (with --http-get)")
    parser.add_argument("--http-protocol", choices=tuple(handler_flags.HTTP_PROTOCOLS),
                        help="with --http-get: HTTP1 (default; HTTPS may negotiate HTTP/2) or HTTP2: "
                             "HTTP/2 cleartext with prior knowledge, h2c (KEP-5999)")
    parser.add_argument("--service", help="gRPC health service name (with --grpc)")
    parser.add_argument("--grpc-mode", choices=tuple(handler_flags.GRPC_MODES),
                        help="with --grpc: Plaintext (default) or TLS, without certificate verification (KEP-4939)")
    parser.add_argument("--target", choices=handler_flags.TARGETS, help="pod-ip (default) or loopback: the pod's 127.0.0.1")
    parser.add_argument("--ip-family", choices=handler_flags.IP_FAMILIES, help="default primary: the sandbox's first IP")
    parser.add_argument("--container-port", action="append", default=[], type=_container_port,
                        metavar="NAME=PORT[/PROTOCOL]", help="a container port, to resolve a named probe port")
    parser.add_argument("--type", choices=handler_flags.PROBE_TYPES, required=type_required,
                        default=None if type_required else "readiness",
                        help="which kubelet probe this is" + ("" if type_required else " (default readiness)"))


def _filter_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pod", metavar="ID", help="only probes of this pod sandbox")
    parser.add_argument("--container", metavar="NAME|ID", help="only probes of this container (name or id)")
    parser.add_argument("--type", choices=handler_flags.PROBE_TYPES, help="only probes of this type")
    parser.add_argument("--state", choices=STATES, help="only probes in this state (watch: until they leave it)")
    parser.add_argument("--label", action="append", default=[], type=_key_value, metavar="KEY=VALUE",
                        help="only probes with this label, repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="probectl", description="Inspect and drive the probe shim, the way crictl drives a runtime.")
    parser.add_argument("-r", "--runtime-endpoint", dest="endpoint", metavar="ENDPOINT",
                        help=f"the shim's socket (default ${ENDPOINT_ENV}, then {DEFAULT_ENDPOINT})")
    parser.add_argument("-t", "--timeout", dest="rpc_timeout_ms", type=_positive_duration_ms, default=2000,
                        metavar="DURATION", help="deadline of each call to the shim, e.g. 500ms, 5s (default 2s)")
    parser.add_argument("-D", "--debug", action="store_true", help="print tracebacks of errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("version", help="client, shim and runtime versions")
    _output_flag(p)
    p.set_defaults(handler=cmd_version)

    p = commands.add_parser("pods", help="pod sandboxes with their probe workers")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=cmd_pods)

    p = commands.add_parser("run", help="register a probe and print its id")
    p.add_argument("--pod", required=True, metavar="ID", help="pod sandbox id (a netns name with --runtime-endpoint none)")
    p.add_argument("--container", required=True, metavar="NAME", help="container name")
    p.add_argument("--container-id", default="", metavar="ID", help="container id (default: the name identifies it)")
    _handler_flags(p, type_required=True)
    p.add_argument("--initial-delay", type=specs.parse_duration_ms, metavar="DURATION", help="default 0s")
    p.add_argument("--period", type=specs.parse_duration_ms, metavar="DURATION", help="default 10s")
    p.add_argument("--timeout", dest="probe_timeout_ms", type=specs.parse_duration_ms, metavar="DURATION",
                   help="of one attempt (default 1s)")
    p.add_argument("--success-threshold", type=_positive_int, metavar="N", help="default 1")
    p.add_argument("--failure-threshold", type=_positive_int, metavar="N", help="default 3")
    p.add_argument("--label", action="append", default=[], type=_key_value, metavar="KEY=VALUE", help="repeatable")
    _output_flag(p)
    p.set_defaults(handler=cmd_run)

    p = commands.add_parser("apply", help="register every probe of a Kubernetes Pod manifest")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="YAML or JSON manifest, - for stdin")
    p.add_argument("--pod", required=True, metavar="ID", help="pod sandbox id the manifest's pod runs in")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=cmd_apply)

    p = commands.add_parser("convert", help="bridge a manifest's HTTP, TCP and gRPC probes and hooks to the shim "
                                            "(exec commands the shim answers); needs no shim")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="YAML or JSON manifest, - for stdin")
    p.add_argument("--reverse", action="store_true", help="undo a conversion: the handlers back in place of the "
                                                          f"{convert.MARKER} commands")
    p.add_argument("--allow-host", action="store_true",
                   help="convert handlers that set host (the shim refuses them unless its config allows host)")
    p.add_argument("--no-node-affinity", dest="node_affinity", action="store_false",
                   help="do not require a node labelled probe-shim.io/bridge (by the kubelet drop-in): converted "
                        "pods may then land where no shim answers their probes, and never become Ready there")
    _output_flag(p, default="yaml", choices=convert.OUTPUTS)
    p.set_defaults(handler=cmd_convert)

    p = commands.add_parser("doctor", help="on a node: does the kubelet go through the shim? each finding with a fix")
    p.add_argument("--kubelet-pid", type=int, help="the kubelet's pid (default: the process named kubelet)")
    p.set_defaults(handler=cmd_doctor)

    p = commands.add_parser("ps", aliases=["probes"], help="list probes")
    _filter_flags(p)
    p.add_argument("-q", "--quiet", action="store_true", help="only print probe ids")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=cmd_ps)

    p = commands.add_parser("inspect", help="full status of probes, with the last attempt's trace")
    p.add_argument("probe_ids", nargs="+", metavar="PROBE_ID", help="a probe id or a unique prefix of one")
    _output_flag(p, default="json")
    p.set_defaults(handler=cmd_inspect)

    p = commands.add_parser("watch", help="follow probe status changes (Ctrl-C to stop)")
    _filter_flags(p)
    p.add_argument("--attempts", action="store_true", help="also show every attempt, not only state changes")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=cmd_watch)

    p = commands.add_parser("exec", help="run one probe attempt now and show its trace")
    p.add_argument("--pod", required=True, metavar="ID", help="pod sandbox id (a netns name with --runtime-endpoint none)")
    _handler_flags(p, type_required=False)
    p.add_argument("--timeout", dest="probe_timeout_ms", type=specs.parse_duration_ms, metavar="DURATION",
                   help="of the attempt (default 1s)")
    p.add_argument("--traceparent", help="W3C traceparent to parent the attempt's span")
    _output_flag(p)
    p.set_defaults(handler=cmd_exec)

    p = commands.add_parser("rm", help="stop probes")
    p.add_argument("probe_ids", nargs="*", metavar="PROBE_ID", help="a probe id or a unique prefix of one")
    p.add_argument("--pod", metavar="ID", help="stop every probe of this pod sandbox")
    p.set_defaults(handler=cmd_rm)

    p = commands.add_parser("workers", help="probe worker processes and what they cost")
    p.add_argument("--interval", type=_positive_duration_ms, default=500, metavar="DURATION",
                   help="CPU%% is measured over this interval (default 500ms)")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=cmd_workers)
    return parser


# --- shared helpers --------------------------------------------------------------------

def _client(args) -> ProbeShimClient:
    try:
        return ProbeShimClient(args.endpoint, timeout_s=args.rpc_timeout_ms / 1000)
    except ValueError as exc:
        raise UsageError(f"-r/--runtime-endpoint: {exc}") from exc


def _print(text: str) -> None:
    print(text, flush=True)


def _bar() -> str:
    """The waterfall's bar: a full block where the terminal can show it."""
    try:
        "█".encode(sys.stdout.encoding or "ascii")
        return "█"
    except (UnicodeEncodeError, LookupError):
        return "#"


def _spec(args) -> spec_pb.ProbeSpec:
    if args.header and args.http_get is None:
        raise UsageError("--header goes with --http-get")
    if args.http_protocol is not None and args.http_get is None:
        raise UsageError("--http-protocol goes with --http-get")
    if args.service is not None and args.grpc is None:
        raise UsageError("--service goes with --grpc")
    if args.grpc_mode is not None and args.grpc is None:
        raise UsageError("--grpc-mode goes with --grpc")
    spec = spec_pb.ProbeSpec()
    if args.http_get is not None:
        spec.http_get.CopyFrom(handler_flags.http_get_action(args.http_get, args.header, args.http_protocol))
    elif args.tcp is not None:
        spec.tcp_socket.CopyFrom(handler_flags.tcp_socket_action(args.tcp))
    else:
        spec.grpc.CopyFrom(handler_flags.grpc_action(args.grpc, args.service, args.grpc_mode))
    if args.target:
        spec.target = handler_flags.TARGETS[args.target]
    if args.ip_family:
        spec.ip_family = handler_flags.IP_FAMILIES[args.ip_family]
    if args.probe_timeout_ms is not None:
        spec.timeout_ms = args.probe_timeout_ms
    for flag, field in (("initial_delay", "initial_delay_ms"), ("period", "period_ms"),
                        ("success_threshold", "success_threshold"), ("failure_threshold", "failure_threshold")):
        value = getattr(args, flag, None)
        if value is not None:
            setattr(spec, field, value)
    return spec


def _resolve_probes(client: ProbeShimClient, wanted: Iterable[str]) -> list[service_pb.Probe]:
    """Full ids or unique prefixes (as `probectl ps` prints them), like crictl and docker accept."""
    known = client.probes()
    found = []
    for text in wanted:
        exact = [p for p in known if p.probe_id == text]
        matches = exact or [p for p in known if p.probe_id.startswith(text)]
        if not matches or not text:
            raise UsageError(f"no probe with id {text!r}; list probes with 'probectl ps'")
        if len(matches) > 1:
            raise UsageError(f"probe id prefix {text!r} matches {len(matches)} probes; give more of the id "
                             f"('probectl ps --no-trunc' shows them whole)")
        found.append(matches[0])
    return found



# --- commands --------------------------------------------------------------------------

def _client_version() -> str:
    try:
        return importlib.metadata.version("cri-probe-shim")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def cmd_version(args) -> int:
    with _client(args) as client:
        shim = client.version()
        runtime = client.runtime_version()
    if args.output != "table":
        data = {"clientVersion": _client_version(), "shim": render.message_dict(shim),
                "runtime": render.message_dict(runtime) if runtime is not None else None}
        _print(render.structured(data, args.output))
        return EXIT_OK
    pairs = [("ClientVersion", _client_version()), ("ShimVersion", shim.version), ("ShimApiVersion", shim.api_version),
             ("ShimInstanceId", shim.instance_id), ("RuntimeEndpoint", shim.runtime_endpoint)]
    if runtime is not None:
        pairs += [("RuntimeName", runtime.runtime_name), ("RuntimeVersion", runtime.runtime_version),
                  ("RuntimeApiVersion", runtime.runtime_api_version)]
    _print(render.key_values(pairs))
    return EXIT_OK


def cmd_pods(args) -> int:
    with _client(args) as client:
        sandboxes = render.merge_sandboxes(client.sandboxes(), client.list_pod_sandboxes())
    if args.output == "table":
        _print(render.pods_table(sandboxes, time.time_ns(), args.no_trunc))
    else:
        data = render.message_dict(service_pb.ListProbeSandboxesResponse(sandboxes=sandboxes))
        _print(render.structured(data, args.output))
    return EXIT_OK


def cmd_run(args) -> int:
    spec = _spec(args)
    with _client(args) as client:
        probe_id = client.run_probe(args.pod, args.container, handler_flags.PROBE_TYPES[args.type], spec,
                                    container_id=args.container_id, container_ports=args.container_port,
                                    labels=dict(args.label))
    if args.output == "table":
        _print(probe_id)
    else:
        _print(render.structured(render.message_dict(service_pb.RunProbeResponse(probe_id=probe_id)), args.output))
    return EXIT_OK


def _read_manifest(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as manifest:
            return manifest.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from exc


def cmd_apply(args) -> int:
    result = probes_from_manifest(_read_manifest(args.filename))
    if result.errors:
        # Nothing is registered from a manifest with errors, as the API server admits no invalid Pod.
        for error in result.errors:
            print(f"probectl: {args.filename}: {error}", file=sys.stderr)
        return EXIT_ERROR
    for skipped in result.skipped:
        print(f"probectl: {args.filename}: skipped {skipped}", file=sys.stderr)
    applied = []
    with _client(args) as client:
        for probe in result.probes:
            try:
                probe_id = client.run_probe(args.pod, probe.container_name, probe.probe_type, probe.spec,
                                            container_ports=probe.container_ports)
            except ShimError as exc:
                # The daemon names fields of its request; said in the manifest's words where it gave them as data.
                errors = daemon_errors(exc.violations, probe.path)
                details = "; ".join(errors) if errors else f"{probe.path}: {exc.details}"
                raise ShimError(exc.code, f"{args.filename}: {details}") from exc
            applied.append((probe, probe_id))
    if args.output != "table":
        done = probectl_pb.ApplyResult(skipped=result.skipped, applied=[
            probectl_pb.AppliedProbe(path=p.path, container_name=p.container_name, type=p.probe_type, probe_id=probe_id)
            for p, probe_id in applied])
        _print(render.structured(render.message_dict(done), args.output))
    elif applied:
        rows = ([render.truncate_id(probe_id, args.no_trunc), p.container_name, render.type_name(p.probe_type),
                 render.handler_text(p.spec), p.path] for p, probe_id in applied)
        _print(render.table(("PROBE ID", "CONTAINER", "TYPE", "HANDLER", "SOURCE"), rows))
    else:
        print(f"probectl: {args.filename}: no HTTP, TCP or gRPC probe to register", file=sys.stderr)
    return EXIT_OK


def cmd_convert(args) -> int:
    """The converted manifest on stdout, notes on stderr; with any error, nothing on stdout. No shim is called."""
    result = convert.convert(_read_manifest(args.filename), reverse=args.reverse, allow_host=args.allow_host,
                             output=args.output, node_affinity=args.node_affinity)
    for message in result.errors or result.notes:
        print(f"probectl: {message}", file=sys.stderr)
    if result.errors:
        return EXIT_ERROR
    sys.stdout.write(result.text)
    sys.stdout.flush()
    return EXIT_OK


def cmd_doctor(args) -> int:
    """Every check's finding, a fix under each that failed; exit 1 if any failed. Read-only."""
    from probectl import doctor

    with _client(args) as client:
        findings = doctor.evaluate(doctor.gather(client, args.kubelet_pid))
    sys.stdout.write(doctor.render(findings))
    return EXIT_ERROR if any(f.status == doctor.FAIL for f in findings) else EXIT_OK


def _listed_probes(client: ProbeShimClient, args) -> list[service_pb.Probe]:
    probes = client.probes(pod_sandbox_id=args.pod or "", probe_type=handler_flags.PROBE_TYPES.get(args.type or "", 0),
                           labels=dict(args.label), container=args.container or "",
                           state=STATES[args.state] if args.state else None)
    return sorted(probes, key=render.probe_order)


def cmd_ps(args) -> int:
    with _client(args) as client:
        probes = _listed_probes(client, args)
    if args.quiet:
        for probe in probes:
            _print(probe.probe_id)
    elif args.output == "table":
        _print(render.probes_table(probes, time.time_ns(), args.no_trunc))
    else:
        _print(render.structured({"probes": [render.message_dict(p) for p in probes]}, args.output))
    return EXIT_OK


def cmd_inspect(args) -> int:
    with _client(args) as client:
        probes = _resolve_probes(client, args.probe_ids)
    if args.output == "table":
        now, bar = time.time_ns(), _bar()
        _print("\n\n".join(render.describe_probe(p, now, bar) for p in probes))
    else:
        # As crictl inspect: one object for one id, a list for several.
        data = [render.message_dict(p) for p in probes]
        _print(render.structured(data[0] if len(data) == 1 else data, args.output))
    return EXIT_OK


def cmd_watch(args) -> int:
    client = _client(args)
    interrupted = False

    def on_ctrl_c(_signum, _frame) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        events = client.watch(pod_sandbox_id=args.pod or "", probe_type=handler_flags.PROBE_TYPES.get(args.type or "", 0),
                              every_attempt=args.attempts, labels=dict(args.label), container=args.container or "",
                              state=STATES[args.state] if args.state else None)
        if args.output == "table":
            _print(render.watch_header(args.no_trunc))
        for event in events:
            if args.output == "table":
                _print(render.event_line(event, time.time_ns(), args.no_trunc))
            elif args.output == "json":
                _print(render.to_json(render.message_dict(event), indent=None))
            else:
                _print("---\n" + render.to_yaml(render.message_dict(event)))
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends
    except Exception:
        # Ctrl-C while grpc was inside the stream can surface as the stream's own error (seen once in a full run:
        # exit 1 instead of 0): after a Ctrl-C the watch has ended as asked, whatever the stream said.
        if not interrupted:
            raise
    finally:
        signal.signal(signal.SIGINT, previous)
        client.close()
    return EXIT_OK


def cmd_exec(args) -> int:
    spec = _spec(args)
    with _client(args) as client:
        response = client.exec_probe(args.pod, spec, probe_type=handler_flags.PROBE_TYPES[args.type],
                                     container_ports=args.container_port, traceparent=args.traceparent)
    if args.output == "table":
        _print(render.attempt_text(response.attempt, response.trace_id, _bar()))
    else:
        _print(render.structured(render.message_dict(response), args.output))
    return EXIT_CODES.get(response.attempt.result, EXIT_UNKNOWN)


def cmd_rm(args) -> int:
    if bool(args.probe_ids) == bool(args.pod):
        raise UsageError("give probe ids or --pod ID (not both) (see 'probectl rm --help')")
    with _client(args) as client:
        if args.pod:
            stopped = client.stop_probes(pod_sandbox_id=args.pod)
        else:
            stopped = [pid for probe in _resolve_probes(client, args.probe_ids)
                       for pid in client.stop_probes(probe_id=probe.probe_id)]
    for probe_id in stopped:
        _print(probe_id)
    return EXIT_OK


def _measure_workers(sandboxes: list[service_pb.ProbeSandbox], interval_s: float) -> list[probectl_pb.WorkerUsage]:
    """One row per worker (a group of sandboxes), with psutil's view of its process. CPU% over one shared
    interval: every process is sampled, the interval passes once, every process is sampled again (psutil's
    cpu_percent(None) protocol), so N workers take one interval, not N."""
    groups: dict[str, list[service_pb.ProbeSandbox]] = {}
    for sandbox in sandboxes:  # a sandbox of no group yet (an older daemon, say) is a group of its own
        groups.setdefault(sandbox.worker.group or f"sandbox {sandbox.id}", []).append(sandbox)
    processes: dict[int, psutil.Process] = {}
    for members in groups.values():
        pid = members[0].worker.pid
        try:
            if pid:
                process = psutil.Process(pid)
                process.cpu_percent(None)
                processes[pid] = process
        except psutil.Error:
            pass  # gone since the listing: shown without numbers
    if processes:
        time.sleep(interval_s)  # the measurement window, not a synchronization
    now = time.time()
    usage = []
    for members in groups.values():
        worker = members[0].worker  # the group's worker: the same for every member
        process = processes.get(worker.pid)
        cpu = pss = uptime = None
        if process is not None:
            try:
                cpu = process.cpu_percent(None)
                uptime = now - process.create_time()
                pss = process.memory_full_info().pss
            except psutil.Error:
                pass
        if worker.started_at:
            uptime = now - worker.started_at / 1e9
        usage.append(probectl_pb.WorkerUsage(
            pid=worker.pid, group=worker.group, pod_sandbox_ids=[s.id for s in members], state=worker.state,
            uptime_seconds=uptime, pss_bytes=pss, cpu_percent=cpu, probes=sum(s.probes for s in members),
            restarts=max(s.worker.restarts for s in members)))
    return usage


def cmd_workers(args) -> int:
    with _client(args) as client:
        sandboxes = [s for s in client.sandboxes() if s.worker.state != service_pb.WORKER_NONE]
    usage = _measure_workers(sandboxes, args.interval / 1000)
    if args.output == "table":
        _print(render.workers_table(usage, args.no_trunc))
    else:
        _print(render.structured(render.message_dict(probectl_pb.WorkersResult(workers=usage)), args.output))
    return EXIT_OK


# --- entry point -----------------------------------------------------------------------

def _with_hint(exc: ShimError, args) -> str:
    """The shim's error, and what to do about it where that is not already said."""
    if isinstance(exc, NotFoundError):
        return f"{exc} (list pod sandboxes with 'probectl pods')"
    if getattr(exc.code, "name", "") == "DEADLINE_EXCEEDED":
        return f"{exc} (no answer within -t/--timeout {args.rpc_timeout_ms}ms; give it longer, e.g. -t 10s)"
    return str(exc)


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"probectl: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = any(a in ("-D", "--debug") for a in argv)  # until the arguments are parsed
    try:
        args = build_parser().parse_args(argv)
    except _Exit as exc:  # --help
        return exc.status
    except UsageError as exc:
        return _fail(str(exc), EXIT_ERROR, debug)
    debug = args.debug
    try:
        return args.handler(args)
    except (UsageError, handler_flags.SpecError) as exc:
        return _fail(str(exc), EXIT_ERROR, debug)
    except ShimUnavailable as exc:
        return _fail(str(exc), EXIT_UNREACHABLE, debug)
    except ShimError as exc:
        return _fail(_with_hint(exc, args), EXIT_ERROR, debug)
    except KeyboardInterrupt:
        return _fail("interrupted", 130, debug)
    except BrokenPipeError:
        # `probectl ps | head`: the reader left; silence the flush of the rest at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback, unless -D
        return _fail(f"unexpected error: {type(exc).__name__}: {exc} (run with -D for the traceback)",
                     EXIT_ERROR, debug)


if __name__ == "__main__":
    sys.exit(main())
