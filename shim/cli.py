"""`probe-shim serve`: the daemon's command line; `probe-shim webhook ...` is shim/webhook/cli.py's."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from shim import event_loop, grpc_tuning
from shim.observe import logs
from shim.config import Config, ConfigError, load
from shim.state.store import StoreError
from shim.webhook import cli as webhook_cli


def _parser() -> argparse.ArgumentParser:
    defaults = Config()
    parser = argparse.ArgumentParser(prog="probe-shim", description="Runs Kubernetes probes inside pod network namespaces")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", help="TOML file; flags given here override it")
    serve.add_argument("--listen", help=f"unix socket to serve (default {defaults.listen})")
    serve.add_argument("--runtime-endpoint", dest="runtime_endpoint",
                       help=f"upstream CRI endpoint, or 'none' for network namespaces only (default {defaults.runtime_endpoint})")
    serve.add_argument("--state-dir", dest="state_dir", help=f"where registered probes are kept (default {defaults.state_dir})")
    serve.add_argument("--metrics-listen", dest="metrics_listen",
                       help=f"host:port for /metrics, '' for none (default {defaults.metrics_listen})")
    serve.add_argument("--reconcile-interval", dest="reconcile_interval_s", type=float,
                       help=f"seconds between sandbox reconciliations (default {defaults.reconcile_interval_s:g})")
    serve.add_argument("--log-format", dest="log_format", choices=("text", "json"), help="default text")
    serve.add_argument("--trace-exporter", dest="trace_exporter", choices=("none", "console", "otlp"), help="default none")
    serve.add_argument("--socket-group", dest="socket_group",
                       help="group (name or gid) whose members may use the socket, mode 0660 (default: the daemon's own)")
    serve.add_argument("--worker-isolation", dest="worker_isolation", choices=("pooled", "sandbox"),
                       help="pooled: a worker serves up to --sandboxes-per-worker sandboxes of one namespace; "
                            "sandbox: one worker per sandbox (default pooled)")
    serve.add_argument("--sandboxes-per-worker", dest="sandboxes_per_worker", type=int,
                       help=f"at most this many sandboxes per pooled worker (default {defaults.sandboxes_per_worker})")
    serve.add_argument("--handover-timeout-s", dest="handover_timeout_s", type=float,
                       help="how long workers go on probing for the next daemon after this one stops (SIGTERM) or "
                            "crashes, to be adopted by it; 0: workers stop with the daemon "
                            f"(default {defaults.handover_timeout_s:g})")
    serve.add_argument("--embedded-namespace-separator", dest="embedded_namespace_separator",
                       help="embedded mode: a netns name's namespace is its part before this separator "
                            "(default: none, every netns in one tenancy)")
    serve.add_argument("--allow-host-field", dest="allow_host_field", action="store_const", const=True,
                       help="accept probes with the deprecated host field (SSRF risk; off by default)")
    webhook_cli.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "webhook":
        return webhook_cli.run(args)
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    try:
        config = load(args.config, overrides)
    except ConfigError as exc:
        print(f"probe-shim: {exc}", file=sys.stderr)
        return 1
    logs.setup(config.log_format)
    grpc_tuning.apply(os.environ)  # read by grpc core once, at its import: must come first
    from shim import daemon as server  # after logging is set up; imports grpc

    try:
        factory = event_loop.loop_factory(os.environ)
    except event_loop.UnknownLoop as exc:
        print(f"probe-shim: {exc}", file=sys.stderr)
        return 1
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(server.serve(config))
    # ConfigError: e.g. a socket_group that does not exist; StoreError: e.g. a read-only state dir.
    except (server.AlreadyServing, ConfigError, StoreError) as exc:
        logging.getLogger(__spec__.name if __spec__ else __name__).error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
