"""probectl's commands that register, run and stop probes: run, apply, exec, rm. A handler's flags are
probe_api.handler_flags' syntax; a manifest is read by manifest.py; what is printed is render.py's."""

from __future__ import annotations

import sys

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probectl_pb2 as probectl_pb
from probe_api.handler_flags import IP_FAMILIES, PROBE_TYPES, TARGETS, grpc_action, http_get_action, tcp_socket_action
from probectl import render
from probectl.client import ShimError
from probectl.commands.base import (
    EXIT_ERROR, EXIT_FAILURE, EXIT_OK, EXIT_UNKNOWN, UsageError, connect, print_line, read_manifest, resolve_probes,
    waterfall_bar,
)
from probectl.manifest import daemon_errors, probes_from_manifest

# exec's exit code by the attempt's result: a warning is a success, as the kubelet counts it.
EXIT_CODES = {spec_pb.RESULT_SUCCESS: EXIT_OK, spec_pb.RESULT_WARNING: EXIT_OK,
              spec_pb.RESULT_FAILURE: EXIT_FAILURE, spec_pb.RESULT_UNKNOWN: EXIT_UNKNOWN}


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
        spec.http_get.CopyFrom(http_get_action(args.http_get, args.header, args.http_protocol))
    elif args.tcp is not None:
        spec.tcp_socket.CopyFrom(tcp_socket_action(args.tcp))
    else:
        spec.grpc.CopyFrom(grpc_action(args.grpc, args.service, args.grpc_mode))
    if args.target:
        spec.target = TARGETS[args.target]
    if args.ip_family:
        spec.ip_family = IP_FAMILIES[args.ip_family]
    if args.probe_timeout_ms is not None:
        spec.timeout_ms = args.probe_timeout_ms
    for flag, field in (("initial_delay", "initial_delay_ms"), ("period", "period_ms"),
                        ("success_threshold", "success_threshold"), ("failure_threshold", "failure_threshold")):
        value = getattr(args, flag, None)
        if value is not None:
            setattr(spec, field, value)
    return spec


def cmd_run(args) -> int:
    spec = _spec(args)
    with connect(args) as client:
        probe_id = client.run_probe(args.pod, args.container, PROBE_TYPES[args.type], spec,
                                    container_id=args.container_id, container_ports=args.container_port,
                                    labels=dict(args.label))
    if args.output == "table":
        print_line(probe_id)
    else:
        print_line(render.structured(render.message_dict(service_pb.RunProbeResponse(probe_id=probe_id)), args.output))
    return EXIT_OK


def cmd_apply(args) -> int:
    result = probes_from_manifest(read_manifest(args.filename))
    if result.errors:
        # Nothing is registered from a manifest with errors, as the API server admits no invalid Pod.
        for error in result.errors:
            print(f"probectl: {args.filename}: {error}", file=sys.stderr)
        return EXIT_ERROR
    for skipped in result.skipped:
        print(f"probectl: {args.filename}: skipped {skipped}", file=sys.stderr)
    applied = []
    with connect(args) as client:
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
        print_line(render.structured(render.message_dict(done), args.output))
    elif applied:
        rows = ([render.truncate_id(probe_id, args.no_trunc), p.container_name, render.type_name(p.probe_type),
                 render.handler_text(p.spec), p.path] for p, probe_id in applied)
        print_line(render.table(("PROBE ID", "CONTAINER", "TYPE", "HANDLER", "SOURCE"), rows))
    else:
        print(f"probectl: {args.filename}: no HTTP, TCP or gRPC probe to register", file=sys.stderr)
    return EXIT_OK


def cmd_exec(args) -> int:
    spec = _spec(args)
    with connect(args) as client:
        response = client.exec_probe(args.pod, spec, probe_type=PROBE_TYPES[args.type],
                                     container_ports=args.container_port, traceparent=args.traceparent)
    if args.output == "table":
        print_line(render.attempt_text(response.attempt, response.trace_id, waterfall_bar()))
    else:
        print_line(render.structured(render.message_dict(response), args.output))
    return EXIT_CODES.get(response.attempt.result, EXIT_UNKNOWN)


def cmd_rm(args) -> int:
    if bool(args.probe_ids) == bool(args.pod):
        raise UsageError("give probe ids or --pod ID (not both) (see 'probectl rm --help')")
    with connect(args) as client:
        if args.pod:
            stopped = client.stop_probes(pod_sandbox_id=args.pod)
        else:
            stopped = [pid for probe in resolve_probes(client, args.probe_ids)
                       for pid in client.stop_probes(probe_id=probe.probe_id)]
    for probe_id in stopped:
        print_line(probe_id)
    return EXIT_OK
