"""probectl: the crictl-style command line of the probe shim.

Owns: the commands and flags, the dispatch to a command, exit codes of what fails, and the one-line error
messages. The commands themselves are probectl/commands/*.py, one module per family, imported only once the
arguments are parsed, so that `--help` starts without the client, the converter or psutil, and `convert` without
the client: a start's target is 80 ms on a 2-core node (bench/probectl_startup.py times it;
tests/unit/test_probectl_startup.py asserts on the imports). What is printed is render.py's; how the shim is
called is client.py's; handler syntax is probe_api/handler_flags.py's, durations specs.py's.

Exit codes (probectl/commands/base.py): 0 ok (for exec: success or warning), 1 bad arguments or an error the shim
reported, 2 the shim cannot be reached, 3 exec result unknown, 4 exec result failure (grpc_health_probe's spirit).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from probe_api.cli_names import (
    GRPC_MODE_NAMES, HTTP_PROTOCOL_NAMES, IP_FAMILY_NAMES, MARKER, PROBE_TYPE_NAMES, STATE_NAMES, TARGET_NAMES,
)
from probe_api.defaults import DEFAULT_ENDPOINT
from probectl.commands.base import EXIT_ERROR, EXIT_OK, EXIT_UNREACHABLE, UsageError

# render.OUTPUTS and convert.OUTPUTS, written here so that parsing loads neither the renderer nor the converter
# (tests/unit/test_probectl_startup.py checks they agree).
OUTPUTS = ("table", "json", "yaml")
CONVERT_OUTPUTS = ("yaml", "json")
ENDPOINT_ENV = "PROBE_SHIM_ENDPOINT"  # client.ENDPOINT_ENV, for the help text (checked alike)


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


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The command `module.function` of probectl/commands/, imported when it runs, not when the parser is built."""
    module, _, function = name.rpartition(".")

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"probectl.commands.{module}"), function)(args)

    run.__qualname__ = name
    return run


# --- argument types --------------------------------------------------------------------

def _key_value(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: use KEY=VALUE")
    return key, value


def _container_port(text: str):
    """NAME=PORT[/PROTOCOL]: a container port, so that a named probe port can be resolved."""
    from cri_proto import probe_spec_pb2 as spec_pb

    name, eq, rest = text.partition("=")
    number, _, protocol = rest.partition("/")
    if not eq or not name or not (number.isascii() and number.isdigit()) or not 1 <= int(number) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: use NAME=PORT[/PROTOCOL], e.g. http=8080")
    return spec_pb.ContainerPort(name=name, container_port=int(number), protocol=(protocol or "TCP").upper())


def _duration_ms(text: str) -> int:
    from probectl.specs import parse_duration_ms  # fractions: only when a duration is given

    return parse_duration_ms(text)


def _positive_duration_ms(text: str) -> int:
    value = _duration_ms(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0, e.g. 2s")
    return value


def _positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number of at least 1")
    return int(text)


# --- the parser ------------------------------------------------------------------------

def _output_flag(parser: argparse.ArgumentParser, default: str = "table", choices=OUTPUTS) -> None:
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
    parser.add_argument("--http-protocol", choices=HTTP_PROTOCOL_NAMES,
                        help="with --http-get: HTTP1 (default; HTTPS may negotiate HTTP/2) or HTTP2: "
                             "HTTP/2 cleartext with prior knowledge, h2c (KEP-5999)")
    parser.add_argument("--service", help="gRPC health service name (with --grpc)")
    parser.add_argument("--grpc-mode", choices=GRPC_MODE_NAMES,
                        help="with --grpc: Plaintext (default) or TLS, without certificate verification (KEP-4939)")
    parser.add_argument("--target", choices=TARGET_NAMES, help="pod-ip (default) or loopback: the pod's 127.0.0.1")
    parser.add_argument("--ip-family", choices=IP_FAMILY_NAMES, help="default primary: the sandbox's first IP")
    parser.add_argument("--container-port", action="append", default=[], type=_container_port,
                        metavar="NAME=PORT[/PROTOCOL]", help="a container port, to resolve a named probe port")
    parser.add_argument("--type", choices=PROBE_TYPE_NAMES, required=type_required,
                        default=None if type_required else "readiness",
                        help="which kubelet probe this is" + ("" if type_required else " (default readiness)"))


def _filter_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pod", metavar="ID", help="only probes of this pod sandbox")
    parser.add_argument("--container", metavar="NAME|ID", help="only probes of this container (name or id)")
    parser.add_argument("--type", choices=PROBE_TYPE_NAMES, help="only probes of this type")
    parser.add_argument("--state", choices=STATE_NAMES, help="only probes in this state (watch: until they leave it)")
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
    p.set_defaults(handler=_command("version.cmd_version"))

    p = commands.add_parser("pods", help="pod sandboxes with their probe workers")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=_command("status.cmd_pods"))

    p = commands.add_parser("run", help="register a probe and print its id")
    p.add_argument("--pod", required=True, metavar="ID", help="pod sandbox id (a netns name with --runtime-endpoint none)")
    p.add_argument("--container", required=True, metavar="NAME", help="container name")
    p.add_argument("--container-id", default="", metavar="ID", help="container id (default: the name identifies it)")
    _handler_flags(p, type_required=True)
    p.add_argument("--initial-delay", type=_duration_ms, metavar="DURATION", help="default 0s")
    p.add_argument("--period", type=_duration_ms, metavar="DURATION", help="default 10s")
    p.add_argument("--timeout", dest="probe_timeout_ms", type=_duration_ms, metavar="DURATION",
                   help="of one attempt (default 1s)")
    p.add_argument("--success-threshold", type=_positive_int, metavar="N", help="default 1")
    p.add_argument("--failure-threshold", type=_positive_int, metavar="N", help="default 3")
    p.add_argument("--label", action="append", default=[], type=_key_value, metavar="KEY=VALUE", help="repeatable")
    _output_flag(p)
    p.set_defaults(handler=_command("probes.cmd_run"))

    p = commands.add_parser("apply", help="register every probe of a Kubernetes Pod manifest")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="YAML or JSON manifest, - for stdin")
    p.add_argument("--pod", required=True, metavar="ID", help="pod sandbox id the manifest's pod runs in")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=_command("probes.cmd_apply"))

    p = commands.add_parser("convert", help="bridge a manifest's HTTP, TCP and gRPC probes and hooks to the shim "
                                            "(exec commands the shim answers); needs no shim")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="YAML or JSON manifest, - for stdin")
    p.add_argument("--reverse", action="store_true", help="undo a conversion: the handlers back in place of the "
                                                          f"{MARKER} commands")
    p.add_argument("--allow-host", action="store_true",
                   help="convert handlers that set host (the shim refuses them unless its config allows host)")
    p.add_argument("--no-node-affinity", dest="node_affinity", action="store_false",
                   help="do not require a node labelled probe-shim.io/bridge (by the kubelet drop-in): converted "
                        "pods may then land where no shim answers their probes, and never become Ready there")
    _output_flag(p, default="yaml", choices=CONVERT_OUTPUTS)
    p.set_defaults(handler=_command("rollout.cmd_convert"))

    p = commands.add_parser("doctor", help="on a node: does the kubelet go through the shim? each finding with a fix")
    p.add_argument("--kubelet-pid", type=int, help="the kubelet's pid (default: the process named kubelet)")
    p.set_defaults(handler=_command("rollout.cmd_doctor"))

    p = commands.add_parser("ps", aliases=["probes"], help="list probes")
    _filter_flags(p)
    p.add_argument("-q", "--quiet", action="store_true", help="only print probe ids")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=_command("status.cmd_ps"))

    p = commands.add_parser("inspect", help="full status of probes, with the last attempt's trace")
    p.add_argument("probe_ids", nargs="+", metavar="PROBE_ID", help="a probe id or a unique prefix of one")
    _output_flag(p, default="json")
    p.set_defaults(handler=_command("status.cmd_inspect"))

    p = commands.add_parser("watch", help="follow probe status changes (Ctrl-C to stop)")
    _filter_flags(p)
    p.add_argument("--attempts", action="store_true", help="also show every attempt, not only state changes")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=_command("status.cmd_watch"))

    p = commands.add_parser("exec", help="run one probe attempt now and show its trace")
    p.add_argument("--pod", required=True, metavar="ID", help="pod sandbox id (a netns name with --runtime-endpoint none)")
    _handler_flags(p, type_required=False)
    p.add_argument("--timeout", dest="probe_timeout_ms", type=_duration_ms, metavar="DURATION",
                   help="of the attempt (default 1s)")
    p.add_argument("--traceparent", help="W3C traceparent to parent the attempt's span")
    _output_flag(p)
    p.set_defaults(handler=_command("probes.cmd_exec"))

    p = commands.add_parser("rm", help="stop probes")
    p.add_argument("probe_ids", nargs="*", metavar="PROBE_ID", help="a probe id or a unique prefix of one")
    p.add_argument("--pod", metavar="ID", help="stop every probe of this pod sandbox")
    p.set_defaults(handler=_command("probes.cmd_rm"))

    p = commands.add_parser("workers", help="probe worker processes and what they cost")
    p.add_argument("--interval", type=_positive_duration_ms, default=500, metavar="DURATION",
                   help="CPU%% is measured over this interval (default 500ms)")
    _output_flag(p)
    _no_trunc_flag(p)
    p.set_defaults(handler=_command("workers.cmd_workers"))
    return parser


# --- entry point -----------------------------------------------------------------------

def _known_failure(exc: Exception, args) -> tuple[str, int] | None:
    """(message, exit code) for bad probe syntax or an error of the client library, None for anything else. Such an
    error can only come from a command that loaded its module, so no module is imported to ask."""
    flags = sys.modules.get("probe_api.handler_flags")
    if flags is not None and isinstance(exc, flags.SpecError):
        return str(exc), EXIT_ERROR
    client = sys.modules.get("probectl.client")
    if client is None:
        return None
    if isinstance(exc, client.ShimUnavailable):
        return str(exc), EXIT_UNREACHABLE
    if isinstance(exc, client.NotFoundError):
        return f"{exc} (list pod sandboxes with 'probectl pods')", EXIT_ERROR
    if isinstance(exc, client.ShimError):
        # The shim's error, and what to do about it where that is not already said.
        if getattr(exc.code, "name", "") == "DEADLINE_EXCEEDED":
            return f"{exc} (no answer within -t/--timeout {args.rpc_timeout_ms}ms; give it longer, e.g. -t 10s)", \
                EXIT_ERROR
        return str(exc), EXIT_ERROR
    return None


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        import traceback

        traceback.print_exc()
    print(f"probectl: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """The command line. As the program itself (argv None: the console script, `python -m probectl.cli`) the process
    ends here, without the interpreter's teardown; a caller that passes argv gets the exit code back."""
    if argv is not None:
        return _run(argv)
    _exit_now(_run(sys.argv[1:]))


def _exit_now(code: int) -> NoReturn:
    """Ends the process once what was written is flushed, skipping the interpreter's teardown: clearing every module
    (protobuf's descriptors with them) takes 6-14 ms of the 80 a start may take here, and nothing of probectl's needs
    it (no atexit handler; a watch closes its channel before this). A flush that fails leaves the ending to Python,
    which says what failed as it always did; a reader that left (`probectl ps | head`) is no error, as in _run."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        sys.exit(code)
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


def _run(argv: list[str]) -> int:
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
    except UsageError as exc:
        return _fail(str(exc), EXIT_ERROR, debug)
    except KeyboardInterrupt:
        return _fail("interrupted", 130, debug)
    except BrokenPipeError:
        # `probectl ps | head`: the reader left; silence the flush of the rest at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback, unless -D
        if (failure := _known_failure(exc, args)) is not None:
            return _fail(*failure, debug)
        return _fail(f"unexpected error: {type(exc).__name__}: {exc} (run with -D for the traceback)",
                     EXIT_ERROR, debug)


if __name__ == "__main__":
    sys.exit(main())
