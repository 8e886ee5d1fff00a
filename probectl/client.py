"""The Python client of a probe shim: ProbeService and the proxied CRI calls probectl needs.

Owns: the endpoint (flag, then $PROBE_SHIM_ENDPOINT, then the default socket), the connections, one deadline per
unary call, the translation of gRPC errors into the exceptions a caller can act on (probectl/errors.py:
ShimUnavailable, nobody answers at the endpoint; NotFoundError; ShimError for the rest, one line), and the resumable
watch.

Unary calls go over probectl/unary_h2.py on a socket of probectl/shim_socket.py's, not grpcio: `import grpc` takes
35-57 ms of the 80 a probectl start may take on a 2-core node. grpcio is imported for the watch (a stream that lives
for minutes, reconnecting, where a start's cost does not count) and to name the status of an error (ShimError.code
is a grpc.StatusCode): never on the way of an answer, nor for "cannot reach the probe shim".

Nobody outside this module and its socket (shim_socket.py) builds a request message or touches a connection.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import DEFAULT_ENDPOINT, FIELD_VIOLATIONS_KEY, MAX_MESSAGE_BYTES
from probe_api.endpoints import upstream_target
from probectl import unary_h2
from probectl.errors import ENDPOINT_ENV, NotFoundError, RuntimeUnavailableError, ShimError, ShimUnavailable
from probectl.shim_socket import ShimSocket

if TYPE_CHECKING:
    import grpc

    from cri_proto import cri_runtime_v1_pb2 as cri_pb

CRI_CLIENT_VERSION = "v1"  # what crictl sends in VersionRequest
PROBE_SERVICE = "/" + service_pb.DESCRIPTOR.services_by_name["ProbeService"].full_name + "/"
CRI_RUNTIME_SERVICE = "/runtime.v1.RuntimeService/"

_CHANNEL_OPTIONS = (  # the watch's grpcio channel
    # A private subchannel pool: grpc shares connections between the channels of one process, and a
    # client must never borrow another's connection to a daemon that has since been restarted.
    ("grpc.use_local_subchannel_pool", 1),
    # The shim is a local socket: an http_proxy in the operator's environment must never capture it.
    ("grpc.enable_http_proxy", 0),
    # 16 MiB like the daemon's server and the kubelet's CRI client: a status listing can be large.
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect within a fraction of a second once a restarted daemon listens again (grpc's default is 1 s+).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)

# Watch re-open delays after a drop: the first re-open is immediate (a dropped connection to a live
# daemon), then these, the last one repeating while the daemon stays away.
WATCH_BACKOFF_S = (0.1, 0.2, 0.4, 0.8, 1.6, 2.0)

# How grpc core's own UNAVAILABLE details begin when the transport, not the daemon, failed. The daemon
# answers UNAVAILABLE too (a worker or the runtime not answering, with the runtime's connect error inside
# its message), and that must not read "is the shim running?": hence prefixes, not substrings.
_TRANSPORT_FAILURES = (
    "failed to connect to all addresses", "connection refused", "no such file or directory", "socket closed",
    "stream removed", "connection reset", "recvmsg", "sendmsg", "broken pipe", "goaway", "endpoint closing",
    "connection attempt timed out", "keepalive", "cancelling all calls",
)


class ProbeShimClient:
    def __init__(self, endpoint: str | None = None, timeout_s: float = 2.0) -> None:
        """endpoint None: $PROBE_SHIM_ENDPOINT, then DEFAULT_ENDPOINT. Raises ValueError for a malformed one."""
        self.endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT
        self.timeout_s = timeout_s
        self._target = _grpc_target(self.endpoint)
        self._socket_path = self._target[len("unix:"):] if self._target.startswith("unix:") else None
        self._channel = None  # grpcio's, for the watch only: made by the first watch
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._watch_calls: set[grpc.Call] = set()
        self._idle: list[ShimSocket] = []  # connections between unary calls; one more for each call made meanwhile
        self._busy: set[ShimSocket] = set()

    # --- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Ends every watch (their iterators stop) and the channel. Safe from any thread, idempotent."""
        self._closed.set()
        with self._lock:
            calls = list(self._watch_calls)
            sockets = [*self._idle, *self._busy]
            self._idle.clear()
        for call in calls:
            call.cancel()
        for connection in sockets:
            connection.close()
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> ProbeShimClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- versions and sandboxes ------------------------------------------------------------

    def version(self) -> service_pb.ShimVersionResponse:
        return self._call("ShimVersion", service_pb.ShimVersionRequest(), service_pb.ShimVersionResponse)

    def runtime_version(self) -> cri_pb.VersionResponse | None:
        """The runtime's CRI Version through the shim's proxy; None when the shim has no runtime."""
        if self.version().runtime_endpoint == "none":
            return None
        from cri_proto import cri_runtime_v1_pb2 as cri_pb  # the CRI's messages: only with a runtime behind

        return self._proxied("Version", cri_pb.VersionRequest(version=CRI_CLIENT_VERSION), cri_pb.VersionResponse)

    def list_pod_sandboxes(self) -> list[cri_pb.PodSandbox] | None:
        """The runtime's pod sandboxes through the shim's proxy; None when the shim has no runtime."""
        if self.version().runtime_endpoint == "none":
            return None
        from cri_proto import cri_runtime_v1_pb2 as cri_pb

        answer = self._proxied("ListPodSandbox", cri_pb.ListPodSandboxRequest(), cri_pb.ListPodSandboxResponse)
        return None if answer is None else list(answer.items)

    def sandboxes(self) -> list[service_pb.ProbeSandbox]:
        return list(self._call("ListProbeSandboxes", service_pb.ListProbeSandboxesRequest(),
                               service_pb.ListProbeSandboxesResponse).sandboxes)

    # --- probes --------------------------------------------------------------------------------

    def run_probe(self, pod_sandbox_id: str, container_name: str, probe_type: int, spec: spec_pb.ProbeSpec, *,
                  container_id: str = "", container_ports: Iterable[spec_pb.ContainerPort] = (),
                  labels: Mapping[str, str] | None = None, container_started_at: int = 0) -> str:
        """Registers (or replaces: same sandbox, container and type) a probe; returns its id."""
        request = service_pb.RunProbeRequest(
            pod_sandbox_id=pod_sandbox_id, container_id=container_id, container_name=container_name,
            type=probe_type, spec=spec, container_started_at=container_started_at,
            container_ports=list(container_ports), labels=dict(labels or {}))
        return self._call("RunProbe", request, service_pb.RunProbeResponse).probe_id

    def stop_probes(self, *, probe_id: str = "", pod_sandbox_id: str = "", container_id: str = "") -> list[str]:
        """Idempotent: the ids actually stopped (none for an unknown id)."""
        request = service_pb.StopProbeRequest(probe_id=probe_id, pod_sandbox_id=pod_sandbox_id,
                                              container_id=container_id)
        return list(self._call("StopProbe", request, service_pb.StopProbeResponse).stopped_probe_ids)

    def probes(self, *, probe_id: str = "", pod_sandbox_id: str = "", container_id: str = "",
               probe_type: int = spec_pb.PROBE_TYPE_UNSPECIFIED, labels: Mapping[str, str] | None = None,
               container: str = "", state: int | None = None) -> list[service_pb.Probe]:
        """Status of the matching probes (empty filters match everything), sorted by sandbox, container, type.
        `container` is a name, an id or an id prefix; `state` a ProbeState."""
        request = service_pb.ProbeStatusRequest(filter=_filter(probe_id, pod_sandbox_id, container_id,
                                                               probe_type, labels, container, state))
        return list(self._call("ProbeStatus", request, service_pb.ProbeStatusResponse).probes)

    def probe(self, probe_id: str) -> service_pb.Probe:
        """One probe's status; NotFoundError if the shim has no such probe."""
        found = self.probes(probe_id=probe_id) if probe_id else []
        if not found:
            raise NotFoundError(_status_code(unary_h2.NOT_FOUND), f"no probe with id {probe_id!r}")
        return found[0]

    def exec_probe(self, pod_sandbox_id: str, spec: spec_pb.ProbeSpec, *, probe_type: int = spec_pb.READINESS,
                   container_ports: Iterable[spec_pb.ContainerPort] = (), traceparent: str | None = None,
                   timeout_s: float | None = None) -> service_pb.ExecProbeResponse:
        """One attempt now in the sandbox. The call's deadline (timeout_s None) leaves room for the attempt:
        the worker tries up to 3 times, each bounded by the probe's timeout, like the kubelet."""
        if timeout_s is None:
            from probe_api.attempts import longest_attempt_ms  # the validation rules: only exec needs them

            timeout_s = self.timeout_s + longest_attempt_ms(spec) / 1000
        request = service_pb.ExecProbeRequest(pod_sandbox_id=pod_sandbox_id, spec=spec, type=probe_type,
                                              container_ports=list(container_ports))
        metadata = [("traceparent", traceparent)] if traceparent else None
        return self._call("ExecProbe", request, service_pb.ExecProbeResponse, timeout_s=timeout_s, metadata=metadata)

    # --- watch ---------------------------------------------------------------------------------

    def watch(self, *, pod_sandbox_id: str = "", container_id: str = "",
              probe_type: int = spec_pb.PROBE_TYPE_UNSPECIFIED, every_attempt: bool = False,
              labels: Mapping[str, str] | None = None, container: str = "", state: int | None = None,
              reconnect: bool = True,
              on_reconnect: Callable[[Exception, float], None] | None = None,
              ) -> Iterator[service_pb.WatchProbeStatusResponse]:
        """Follows WatchProbeStatus with no deadline, yielding every event the daemon sends.

        The first events are the full state (SNAPSHOT..., SNAPSHOT_COMPLETE). When the stream drops (a lost
        connection, a daemon restart, or a RESYNC, which is yielded too) and `reconnect` is set, the watch is
        opened again, at once and then with backoff (WATCH_BACKOFF_S), sending the instance id and the last
        revision seen after a completed snapshot: the daemon replays only what was missed, also after its own
        restart (the board's instance id and revisions are stored); a resume point it no longer holds (another
        state dir, a history rolled over, a revision a crash did not store) gets a fresh snapshot, which is passed
        through, so a consumer replaces its state on every SNAPSHOT_COMPLETE. `on_reconnect(error, delay_s)` is told before
        each re-open after a failure. The first open is not retried: ShimUnavailable if the shim is not there.

        Ends when close() is called (from any thread); a KeyboardInterrupt cancels the stream and propagates.
        """
        import grpc

        stub = self._watch_stub()
        base = service_pb.WatchProbeStatusRequest(
            filter=_filter("", pod_sandbox_id, container_id, probe_type, labels, container, state),
            every_attempt=every_attempt)
        resume = _ResumePoint()
        reopens = 0  # re-opens since the daemon last sent an event
        connected_once = False
        while not self._closed.is_set():
            request = service_pb.WatchProbeStatusRequest()
            request.CopyFrom(base)
            request.instance_id, request.since_revision = resume.instance_id, resume.revision
            try:
                call = stub.WatchProbeStatus(request)  # no deadline: it follows until closed
            except ValueError:  # "closed channel": close() won the race with this re-open
                return
            with self._lock:
                self._watch_calls.add(call)
            failure: Exception | None = None
            try:
                for event in call:
                    connected_once, reopens = True, 0
                    resume.see(event)
                    yield event
            except grpc.RpcError as exc:
                if self._closed.is_set():
                    return
                failure = self._translate(_code_number(exc.code()), exc.details() or "", exc.trailing_metadata())
                if not connected_once or not reconnect or not _is_drop(exc):
                    raise failure from exc
            finally:
                call.cancel()  # a consumer that stops iterating (or a KeyboardInterrupt) ends the stream
                with self._lock:
                    self._watch_calls.discard(call)
            if not reconnect:
                return
            # The first re-open is immediate (a dropped connection to a live daemon); then back off.
            delay = 0.0 if reopens == 0 else WATCH_BACKOFF_S[min(reopens, len(WATCH_BACKOFF_S)) - 1]
            reopens += 1
            if failure is not None and on_reconnect is not None:
                on_reconnect(failure, delay)
            if self._closed.wait(delay):
                return

    # --- plumbing --------------------------------------------------------------------------------

    def _watch_stub(self):
        from cri_proto import probe_service_pb2_grpc as service_grpc
        import grpc

        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
            return service_grpc.ProbeServiceStub(self._channel)

    def _unary(self, path: str, request, timeout_s: float, metadata) -> unary_h2.Answer:
        """One call on an idle connection (a new one if none is idle), which goes back to the idle ones after. An
        idle connection the shim closed or said GOAWAY on meanwhile (it restarted, say) is not used, as grpc's
        channel connects again; a call the shim says it never processed is made once more on a new connection."""
        answer = self._unary_once(path, request, timeout_s, metadata)
        if answer.unprocessed and not self._closed.is_set():
            answer = self._unary_once(path, request, timeout_s, metadata)
        return answer

    def _unary_once(self, path: str, request, timeout_s: float, metadata) -> unary_h2.Answer:
        with self._lock:
            connection = None
            while self._idle and connection is None:
                connection = self._idle.pop()
                if not connection.alive():
                    connection.close()
                    connection = None
            connection = connection or ShimSocket(self._target)
            self._busy.add(connection)
        try:
            return connection.call(path, request.SerializeToString(), timeout_s, metadata)
        except OSError as exc:  # the connect
            raise ShimUnavailable(self.endpoint, str(exc),
                                  permission_denied=exc.errno in (errno.EACCES, errno.EPERM)) from exc
        finally:
            with self._lock:
                self._busy.discard(connection)
                if connection.usable and not self._closed.is_set():
                    self._idle.append(connection)
                else:
                    connection.close()

    def _call(self, method: str, request, response_type, *, timeout_s: float | None = None, metadata=None):
        answer = self._unary(PROBE_SERVICE + method, request, self.timeout_s if timeout_s is None else timeout_s,
                             metadata)
        if answer.code != unary_h2.OK:
            raise self._translate(answer.code, answer.details, answer.trailing_metadata)
        return _parsed(response_type, answer)

    def _proxied(self, method: str, request, response_type):
        """A CRI call through the shim: UNIMPLEMENTED means the shim proxies to no runtime."""
        answer = self._unary(CRI_RUNTIME_SERVICE + method, request, self.timeout_s, None)
        if answer.code == unary_h2.UNIMPLEMENTED:
            return None
        if answer.code == unary_h2.UNAVAILABLE:
            # The shim answered the version call just before: it is the runtime behind it that is away.
            raise RuntimeUnavailableError(_status_code(answer.code), f"the container runtime behind the shim at "
                                          f"{self.endpoint} does not answer: {answer.details}")
        if answer.code != unary_h2.OK:
            raise self._translate(answer.code, answer.details, answer.trailing_metadata)
        return _parsed(response_type, answer)

    def _translate(self, code: int, details: str, trailing_metadata) -> Exception:
        if code == unary_h2.UNAVAILABLE and (_is_transport_failure(details) or self._socket_missing()):
            return ShimUnavailable(self.endpoint, details, permission_denied="permission denied" in details.lower())
        if code == unary_h2.DEADLINE_EXCEEDED and details == "Deadline Exceeded":
            # grpc's own text: the client gave up waiting (the daemon words its timeouts differently).
            return ShimError(_status_code(code),
                             f"no answer from the probe shim at {self.endpoint} in time (see -t/--timeout)")
        if code == unary_h2.NOT_FOUND:
            return NotFoundError(_status_code(code), details)
        return ShimError(_status_code(code), details, _violations(trailing_metadata))

    def _socket_missing(self) -> bool:
        return self._socket_path is not None and not os.path.exists(self._socket_path)


def _parsed(response_type, answer: unary_h2.Answer):
    try:
        return response_type.FromString(answer.message)
    except DecodeError as exc:
        # grpcio's words for an answer it cannot deserialize.
        raise ShimError(_status_code(unary_h2.INTERNAL), "Exception deserializing response!") from exc


def _status_code(number: int) -> grpc.StatusCode:
    """grpc's name for a status code: grpcio is imported here, on the way of an error only."""
    import grpc

    return next((code for code in grpc.StatusCode if code.value[0] == number), grpc.StatusCode.UNKNOWN)


def _code_number(code: grpc.StatusCode) -> int:
    return code.value[0]


def _violations(trailing_metadata) -> list[service_pb.FieldViolation]:
    for key, value in trailing_metadata or ():
        if key == FIELD_VIOLATIONS_KEY:
            try:
                return list(service_pb.FieldViolations.FromString(value).violations)
            except DecodeError:
                return []
    return []


class _ResumePoint:
    """Where a re-opened watch may resume: set only from a completed snapshot onwards (a partial one is none)."""

    def __init__(self) -> None:
        self.instance_id = ""
        self.revision = 0
        self._in_snapshot = False

    def see(self, event: service_pb.WatchProbeStatusResponse) -> None:
        if event.type == service_pb.SNAPSHOT:
            self._in_snapshot = True
        elif event.type == service_pb.SNAPSHOT_COMPLETE:
            self._in_snapshot = False
            self.instance_id, self.revision = event.instance_id, event.revision
        elif event.type in (service_pb.UPDATED, service_pb.REMOVED) and not self._in_snapshot and self.instance_id:
            self.revision = event.revision
        elif event.type == service_pb.RESYNC and self.instance_id == event.instance_id and event.revision:
            # Everything matching up to this revision was delivered (shim/state/board.py's contract).
            self.revision = max(self.revision, event.revision)


def _grpc_target(endpoint: str) -> str:
    """crictl's endpoint forms (unix:///path, unix:/path, /path, tcp://host:port, host:port) -> a grpc target."""
    if endpoint.strip() in ("", "none"):
        raise ValueError(f"endpoint {endpoint!r}: give the probe shim's socket, e.g. {DEFAULT_ENDPOINT}")
    return upstream_target(endpoint)  # its ValueError names the endpoint and the accepted forms


def _is_drop(exc: grpc.RpcError) -> bool:
    """A stream that ended for reasons of transport or daemon lifetime, worth re-opening."""
    # CANCELLED that we did not ask for: the daemon cancelled the stream while shutting down.
    return _code_number(exc.code()) in (unary_h2.UNAVAILABLE, unary_h2.CANCELLED, unary_h2.INTERNAL)


def _is_transport_failure(details: str) -> bool:
    return details.lower().startswith(_TRANSPORT_FAILURES)


def _filter(probe_id: str, pod_sandbox_id: str, container_id: str, probe_type: int,
            labels: Mapping[str, str] | None, container: str = "", state: int | None = None) -> service_pb.ProbeFilter:
    out = service_pb.ProbeFilter(probe_id=probe_id, pod_sandbox_id=pod_sandbox_id, container_id=container_id,
                                 type=probe_type, label_selector=dict(labels or {}), container=container)
    if state is not None:
        out.state = state
    return out
