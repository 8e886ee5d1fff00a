"""probectl's commands that read what the shim holds: pods, ps, inspect, watch. What is printed is
render.py's; how the shim is called is client.py's."""

from __future__ import annotations

import signal
import time

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.cli_names import STATE_NAMES, enum_name
from probe_api.handler_flags import PROBE_TYPES
from probectl import render
from probectl.client import ProbeShimClient
from probectl.commands.base import EXIT_OK, connect, print_line, resolve_probes, waterfall_bar

STATES = {name: spec_pb.ProbeState.Value("STATE_" + enum_name(name)) for name in STATE_NAMES}  # --state


def cmd_pods(args) -> int:
    with connect(args) as client:
        sandboxes = render.merge_sandboxes(client.sandboxes(), client.list_pod_sandboxes())
    if args.output == "table":
        print_line(render.pods_table(sandboxes, time.time_ns(), args.no_trunc))
    else:
        data = render.message_dict(service_pb.ListProbeSandboxesResponse(sandboxes=sandboxes))
        print_line(render.structured(data, args.output))
    return EXIT_OK


def _listed_probes(client: ProbeShimClient, args) -> list[service_pb.Probe]:
    probes = client.probes(pod_sandbox_id=args.pod or "", probe_type=PROBE_TYPES.get(args.type or "", 0),
                           labels=dict(args.label), container=args.container or "",
                           state=STATES[args.state] if args.state else None)
    return sorted(probes, key=render.probe_order)


def cmd_ps(args) -> int:
    with connect(args) as client:
        probes = _listed_probes(client, args)
    if args.quiet:
        for probe in probes:
            print_line(probe.probe_id)
    elif args.output == "table":
        print_line(render.probes_table(probes, time.time_ns(), args.no_trunc))
    else:
        print_line(render.structured({"probes": [render.message_dict(p) for p in probes]}, args.output))
    return EXIT_OK


def cmd_inspect(args) -> int:
    with connect(args) as client:
        probes = resolve_probes(client, args.probe_ids)
    if args.output == "table":
        now, bar = time.time_ns(), waterfall_bar()
        print_line("\n\n".join(render.describe_probe(p, now, bar) for p in probes))
    else:
        # As crictl inspect: one object for one id, a list for several.
        data = [render.message_dict(p) for p in probes]
        print_line(render.structured(data[0] if len(data) == 1 else data, args.output))
    return EXIT_OK


def cmd_watch(args) -> int:
    client = connect(args)
    interrupted = False

    def on_ctrl_c(_signum, _frame) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        events = client.watch(pod_sandbox_id=args.pod or "", probe_type=PROBE_TYPES.get(args.type or "", 0),
                              every_attempt=args.attempts, labels=dict(args.label), container=args.container or "",
                              state=STATES[args.state] if args.state else None)
        if args.output == "table":
            print_line(render.watch_header(args.no_trunc))
        for event in events:
            if args.output == "table":
                print_line(render.event_line(event, time.time_ns(), args.no_trunc))
            elif args.output == "json":
                print_line(render.to_json(render.message_dict(event), indent=None))
            else:
                print_line("---\n" + render.to_yaml(render.message_dict(event)))
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
