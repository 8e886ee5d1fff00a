"""The daemon: wires the parts together, serves the socket, stops cleanly.

Start-up order matters: the worker zygote is started (or an earlier daemon's found,
with its running workers) first, before any grpc object exists in this process (the
zygote is a fresh interpreter anyway, but no child of a process with grpc threads
should ever be forked); then the store and the board as the last daemon left them, the
registry restoring every acknowledged probe, the adopted workers taken over, and last
the socket. Until then a client's connection is refused: it fails fast (UNAVAILABLE).

Stopping: SIGTERM (systemd's stop and restart) hands the workers over to the next
daemon (they go on probing, handover_timeout_s at most); SIGINT (Ctrl-C) stops them.
Either way the board's last state is written before the daemon exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import stat
import time
from dataclasses import dataclass, field

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from shim.api.service import ProbeServicer
from shim.bridge.containers import CriContainers
from shim.bridge.service import KubeletBridge
from shim.config import Config, ConfigError, metrics_exposure_warning, socket_gid
from shim.cri.proxy import cri_proxy_handler, forwarding_channel
from shim.event_loop import loop_name
from shim.observe.metrics import ShimMetrics
from shim.observe.metrics_http import MetricsServer
from shim.observe.tracing import AttemptTracer
from shim.rpc.client import Channel
from shim.rpc.server import Server
from shim.sandboxes.directory import SandboxDirectory
from shim.sandboxes.resolver import CriSandboxes, NetnsSandboxes
from shim.sdnotify import Notifier
from shim.state.board import StatusBoard
from shim.state.registry import ProbeRegistry, is_registered
from shim.state.results import ResultsManager
from shim.state.store import DEFAULT_FILENAME, ProbeStore, StoreCorrupt
from shim.state.writer import BoardIdentity, StateWriter, board_identity
from shim.workers.supervisor import WorkerSupervisor
from shim.workers.zygote_handle import Zygote

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660
# While the server binds the socket: it is born 0600, so nobody but the daemon's user can
# connect in the moment before it gets its group and mode (which happens before serving).
BIND_UMASK = 0o177
PROBE_SERVICE = service_pb.DESCRIPTOR.services_by_name["ProbeService"].full_name


class AlreadyServing(Exception):
    pass


def _prepare_socket_path(path: str) -> None:
    """Creates the directory; removes a stale socket file, refuses to steal a live one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise AlreadyServing(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a leftover of a crash
    else:
        raise AlreadyServing(f"another daemon is serving {path}")
    finally:
        probe.close()


@contextlib.contextmanager
def _umask(mask: int):
    # Process-wide, hence only around the bind, during start-up.
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _restrict_socket(path: str, gid: int | None) -> None:
    """The daemon's user and the socket group's members may call the API; nobody else may connect."""
    if gid is not None:
        try:
            os.chown(path, -1, gid)
        except PermissionError:
            raise ConfigError(f"socket_group: cannot give {path} to gid {gid}: the daemon needs CAP_CHOWN "
                              "(or to be a member of that group)") from None
    os.chmod(path, SOCKET_MODE)


def _open_store(path: str) -> ProbeStore:
    """A damaged database must not keep the daemon (and the CRI proxy with it) down. An unwritable state dir
    (StoreUnavailable) or a newer schema (StoreError) is not damage: nothing is moved, the daemon does not start."""
    try:
        return ProbeStore(path)
    except StoreCorrupt as exc:
        aside = f"{path}.corrupt-{int(time.time())}"
        os.replace(path, aside)
        log.error("probe store unreadable (%s); moved to %s, starting with no probes", exc, aside)
        return ProbeStore(path)


@dataclass
class _Parts:
    """What one daemon runs, made by `_assemble` in start-up order, opened by `_open`, closed by `_close`."""

    config: Config
    store: ProbeStore
    identity: BoardIdentity
    board: StatusBoard
    metrics: ShimMetrics
    writer: StateWriter
    tracer: AttemptTracer
    upstream: Channel | None   # the runtime (CRI mode); None in the embedded mode
    sandboxes: SandboxDirectory
    results: ResultsManager
    supervisor: WorkerSupervisor
    adopting: int              # running workers an earlier daemon left, found at start
    registry: ProbeRegistry
    server: Server | None = None
    health: health_aio.HealthServicer | None = None
    metrics_server: MetricsServer | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)


async def serve(config: Config, ready: asyncio.Event | None = None) -> None:
    # Read (and removed from the environment) before the zygote starts: no worker inherits it.
    notifier = Notifier.from_environment()
    stop, stopped_by = _stop_on_signals()
    gid = socket_gid(config.socket_group)  # a group that does not exist stops us before anything starts
    _prepare_socket_path(config.socket_path)
    parts = await _assemble(config)
    _add_services(parts)
    try:
        await _open(parts, gid)
        if ready is not None:
            ready.set()
        notifier.ready(f"serving on {config.listen}")
        parts.tasks.append(asyncio.create_task(notifier.keep_alive()))
        await stop.wait()
        notifier.stopping()
        log.info("stopping")
        parts.board.end_watches()  # watchers resume with the next daemon; in-flight calls get the grace period
    finally:
        await _close(parts, hand_over=stopped_by == [signal.SIGTERM])


def _stop_on_signals() -> tuple[asyncio.Event, list[int]]:
    """SIGTERM and SIGINT set the event; which one came is kept (SIGTERM alone hands the workers over)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stopped_by: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda sig=sig: (stopped_by.append(sig), stop.set()))
    return stop, stopped_by


async def _assemble(config: Config) -> _Parts:
    """The state as the last daemon left it, the workers (the zygote first, before any grpc object exists), and
    the registry over them. Nothing is served yet."""
    # The store creates the state dir (0700); StoreError (exit 1, one line) if it cannot be used.
    store = _open_store(os.path.join(config.state_dir, DEFAULT_FILENAME))
    identity = board_identity(await store.run(store.load_meta))
    board = StatusBoard(instance_id=identity.instance_id, revision=identity.revision,
                        resume_point=identity.resume_point)
    metrics = ShimMetrics()
    writer = StateWriter(store, board, on_write=metrics.count_state_write)
    tracer = AttemptTracer(config.trace_exporter, otlp_endpoint=config.otlp_endpoint or None)

    # One connection to the runtime (shim/rpc's client) for the proxy's calls and the daemon's own.
    upstream = None if config.embedded else forwarding_channel(config.runtime_endpoint)
    # One directory of sandboxes (resolutions, identities, the stopped set) for the registry, bridge and results.
    sandboxes = SandboxDirectory(
        NetnsSandboxes(config.embedded_namespace_separator) if upstream is None else CriSandboxes(upstream))
    results = ResultsManager(board=board, tracer=tracer, metrics=metrics, sandboxes=sandboxes)
    workers = config.worker_settings()
    supervisor = WorkerSupervisor(
        functools.partial(Zygote.start, handover_dir=workers.handover_dir,
                          handover_timeout_s=workers.handover_timeout_s),
        on_event=results.on_event,
        on_worker=results.on_worker,
        settings=workers,
        progress_of=results.progress_of,
    )
    # The zygote (or the one left running, and its workers), before any grpc object below.
    adopting = await supervisor.start(adopt=workers.outlives_daemon)
    # Listening before the restore: what changes while probes are restored and workers adopted is stored too.
    await writer.start(identity)
    registry = ProbeRegistry(config=config, sandboxes=sandboxes, store=store, board=board, supervisor=supervisor,
                             results=results)
    return _Parts(config=config, store=store, identity=identity, board=board, metrics=metrics, writer=writer,
                  tracer=tracer, upstream=upstream, sandboxes=sandboxes, results=results, supervisor=supervisor,
                  adopting=adopting, registry=registry)


def _add_services(parts: _Parts) -> None:
    """The socket's services: ProbeService, health, reflection and, with a runtime, the CRI proxy and the kubelet
    bridge behind it."""
    config, registry, board = parts.config, parts.registry, parts.board
    server = parts.server = Server()  # receives 16 MiB messages, like the kubelet's CRI client
    service_grpc.add_ProbeServiceServicer_to_server(
        ProbeServicer(registry, board, instance_id=board.instance_id,
                      runtime_endpoint="none" if config.embedded else config.runtime_endpoint),
        server,
    )
    health = parts.health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        [PROBE_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    if parts.upstream is None:
        return
    bridge = KubeletBridge(
        containers=CriContainers(parts.upstream), sandboxes=parts.sandboxes, supervisor=parts.supervisor,
        results=parts.results, metrics=parts.metrics, allow_host_field=config.allow_host_field,
        hook_timeout_s=config.hook_timeout_s,
    )

    async def on_sandbox_event(kind: str, sandbox_id: str) -> None:
        bridge.forget_sandbox(sandbox_id)
        await registry.sandbox_event(kind, sandbox_id)

    server.add_generic_rpc_handlers([cri_proxy_handler(parts.upstream, on_sandbox_event, exec_bridge=bridge)])


async def _open(parts: _Parts, gid: int | None) -> None:
    """Binds the socket (NOT_SERVING), restores the probes, takes the running workers over, serves, starts /metrics
    and says SERVING last: a client that saw it can count on every endpoint, /metrics included."""
    config, board, metrics, health = parts.config, parts.board, parts.metrics, parts.health
    with _umask(BIND_UMASK):
        parts.server.add_insecure_port(config.listen)  # binds now; connections are served from start()
    _restrict_socket(config.socket_path, gid)
    await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # until all is up (SERVING last)
    await parts.registry.restore()
    adopted = await parts.supervisor.finish_adoption()
    metrics.set_adopted_workers(adopted)
    if parts.adopting:
        log.info("adopted the running workers", extra={"found": parts.adopting, "adopted": adopted})
    await parts.server.start()
    if config.metrics_listen:
        metrics.count_watchers_with(lambda: board.watcher_count)
        metrics.count_probes_with(lambda: board.count(is_registered))
        parts.metrics_server = await metrics.serve(config.metrics_listen)
        if warning := metrics_exposure_warning(config.metrics_listen):
            log.warning("%s", warning, extra={"metrics_listen": config.metrics_listen})
    for name in ("", PROBE_SERVICE):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    parts.tasks.append(asyncio.create_task(_reconcile_forever(parts.registry, config.reconcile_interval_s)))
    log.info("serving", extra={"listen": config.listen, "runtime_endpoint": config.runtime_endpoint,
                               "event_loop": loop_name(asyncio.get_running_loop()),
                               "instance_id": board.instance_id, "state_dir": config.state_dir})


async def _close(parts: _Parts, *, hand_over: bool) -> None:
    """Everything `_open` started, in reverse: the socket after a grace period, the workers (handed over to the
    next daemon, or stopped), the board's last state written, /metrics, the runtime's connection, the spans."""
    for task in parts.tasks:
        task.cancel()
    await parts.health.enter_graceful_shutdown()
    await parts.server.stop(grace=2)
    if hand_over:
        await parts.supervisor.hand_over()
    else:
        await parts.supervisor.close()
    await parts.writer.close()
    if parts.metrics_server is not None:
        parts.metrics_server.close()
        await parts.metrics_server.wait_closed()
    if parts.upstream is not None:
        await parts.upstream.close()
    await asyncio.to_thread(parts.tracer.shutdown)  # a dead collector may take seconds
    parts.store.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(parts.config.socket_path)
    log.info("stopped")


async def _reconcile_forever(registry: ProbeRegistry, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await registry.reconcile()
        except Exception:  # one failed pass must not end reconciling
            log.exception("reconcile failed")
