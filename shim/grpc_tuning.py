"""gRPC core settings of the daemon process that only the environment can carry. Imports no grpc.

grpc core reads GRPC_EXPERIMENTS once, when grpc is imported, so `apply` must run before the first
`import grpc` of the daemon (shim/cli.py, before it imports shim.daemon).

Why: since grpc 1.6x the EventEngine client and listener experiments are on by default. They move every read
and write of a channel's or a server's socket to EventEngine threads, which then hand each completion to the
queue that grpc's Python binding polls from a thread of its own, which wakes the asyncio loop. The older
iomgr endpoints do the I/O in that polling thread itself. For the daemon (unary calls over unix sockets, the
CRI proxy making one upstream call per call it serves) that is about 10 fewer context switches per proxied
call and 80-100 us less added latency, measured by bench/proxy_latency.py on a 2-core machine. Everything
else (protocol, deadlines, cancellation, metadata) is the same code; only who does the socket I/O changes.
(Measured when grpcio served the socket and forwarded the proxy's calls. Since issues 22 and 27 the socket, the
proxy and the daemon's own calls to the runtime are all shim/rpc's; what grpc core may still do in the daemon is
the OTLP trace exporter's channel, when one is configured, which keeps the setting for the same reason.)

An experiment the operator names in their own GRPC_EXPERIMENTS keeps their setting. If a later grpc drops
one of these experiments, grpc logs "Unknown experiment" once at start-up and runs with its default.
"""

from __future__ import annotations

from collections.abc import MutableMapping

DISABLED_EXPERIMENTS: tuple[str, ...] = ("event_engine_client", "event_engine_listener")
VARIABLE = "GRPC_EXPERIMENTS"


def experiments_setting(current: str | None, disabled: tuple[str, ...] = DISABLED_EXPERIMENTS) -> str:
    """`current` (grpc's comma-separated "name" / "-name" list) with each of `disabled` turned off,
    unless `current` already names it either way."""
    items = [item.strip() for item in (current or "").split(",") if item.strip()]
    named = {item.lstrip("-") for item in items}
    return ",".join(items + [f"-{name}" for name in disabled if name not in named])


def apply(environ: MutableMapping[str, str]) -> None:
    environ[VARIABLE] = experiments_setting(environ.get(VARIABLE))
