from cri_proto import probe_spec_pb2 as _probe_spec_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_NONE: _ClassVar[WorkerState]
    WORKER_STARTING: _ClassVar[WorkerState]
    WORKER_RUNNING: _ClassVar[WorkerState]
    WORKER_BACKOFF: _ClassVar[WorkerState]
    WORKER_FAILED: _ClassVar[WorkerState]

class WatchEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WATCH_EVENT_UNSPECIFIED: _ClassVar[WatchEventType]
    SNAPSHOT: _ClassVar[WatchEventType]
    SNAPSHOT_COMPLETE: _ClassVar[WatchEventType]
    UPDATED: _ClassVar[WatchEventType]
    REMOVED: _ClassVar[WatchEventType]
    ATTEMPT: _ClassVar[WatchEventType]
    RESYNC: _ClassVar[WatchEventType]
WORKER_NONE: WorkerState
WORKER_STARTING: WorkerState
WORKER_RUNNING: WorkerState
WORKER_BACKOFF: WorkerState
WORKER_FAILED: WorkerState
WATCH_EVENT_UNSPECIFIED: WatchEventType
SNAPSHOT: WatchEventType
SNAPSHOT_COMPLETE: WatchEventType
UPDATED: WatchEventType
REMOVED: WatchEventType
ATTEMPT: WatchEventType
RESYNC: WatchEventType

class RunProbeRequest(_message.Message):
    __slots__ = ("pod_sandbox_id", "container_id", "container_name", "type", "spec", "container_started_at", "container_ports", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PORTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    container_id: str
    container_name: str
    type: _probe_spec_pb2.ProbeType
    spec: _probe_spec_pb2.ProbeSpec
    container_started_at: int
    container_ports: _containers.RepeatedCompositeFieldContainer[_probe_spec_pb2.ContainerPort]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, pod_sandbox_id: _Optional[str] = ..., container_id: _Optional[str] = ..., container_name: _Optional[str] = ..., type: _Optional[_Union[_probe_spec_pb2.ProbeType, str]] = ..., spec: _Optional[_Union[_probe_spec_pb2.ProbeSpec, _Mapping]] = ..., container_started_at: _Optional[int] = ..., container_ports: _Optional[_Iterable[_Union[_probe_spec_pb2.ContainerPort, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RunProbeResponse(_message.Message):
    __slots__ = ("probe_id",)
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    def __init__(self, probe_id: _Optional[str] = ...) -> None: ...

class StopProbeRequest(_message.Message):
    __slots__ = ("probe_id", "pod_sandbox_id", "container_id")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    pod_sandbox_id: str
    container_id: str
    def __init__(self, probe_id: _Optional[str] = ..., pod_sandbox_id: _Optional[str] = ..., container_id: _Optional[str] = ...) -> None: ...

class StopProbeResponse(_message.Message):
    __slots__ = ("stopped_probe_ids",)
    STOPPED_PROBE_IDS_FIELD_NUMBER: _ClassVar[int]
    stopped_probe_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stopped_probe_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ProbeFilter(_message.Message):
    __slots__ = ("probe_id", "pod_sandbox_id", "container_id", "type", "label_selector", "container", "state")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    pod_sandbox_id: str
    container_id: str
    type: _probe_spec_pb2.ProbeType
    label_selector: _containers.ScalarMap[str, str]
    container: str
    state: _probe_spec_pb2.ProbeState
    def __init__(self, probe_id: _Optional[str] = ..., pod_sandbox_id: _Optional[str] = ..., container_id: _Optional[str] = ..., type: _Optional[_Union[_probe_spec_pb2.ProbeType, str]] = ..., label_selector: _Optional[_Mapping[str, str]] = ..., container: _Optional[str] = ..., state: _Optional[_Union[_probe_spec_pb2.ProbeState, str]] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("state", "pid", "netns_path", "netns_inode", "restarts", "last_error", "started_at", "group", "group_sandboxes")
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    NETNS_PATH_FIELD_NUMBER: _ClassVar[int]
    NETNS_INODE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    state: WorkerState
    pid: int
    netns_path: str
    netns_inode: int
    restarts: int
    last_error: str
    started_at: int
    group: str
    group_sandboxes: int
    def __init__(self, state: _Optional[_Union[WorkerState, str]] = ..., pid: _Optional[int] = ..., netns_path: _Optional[str] = ..., netns_inode: _Optional[int] = ..., restarts: _Optional[int] = ..., last_error: _Optional[str] = ..., started_at: _Optional[int] = ..., group: _Optional[str] = ..., group_sandboxes: _Optional[int] = ...) -> None: ...

class AttemptTotals(_message.Message):
    __slots__ = ("success", "warning", "failure", "unknown")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    success: int
    warning: int
    failure: int
    unknown: int
    def __init__(self, success: _Optional[int] = ..., warning: _Optional[int] = ..., failure: _Optional[int] = ..., unknown: _Optional[int] = ...) -> None: ...

class Probe(_message.Message):
    __slots__ = ("probe_id", "pod_sandbox_id", "container_id", "container_name", "type", "spec", "labels", "container_started_at", "container_ports", "revision", "created_at", "bridged", "status")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PORTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    BRIDGED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    pod_sandbox_id: str
    container_id: str
    container_name: str
    type: _probe_spec_pb2.ProbeType
    spec: _probe_spec_pb2.ProbeSpec
    labels: _containers.ScalarMap[str, str]
    container_started_at: int
    container_ports: _containers.RepeatedCompositeFieldContainer[_probe_spec_pb2.ContainerPort]
    revision: int
    created_at: int
    bridged: BridgedHandler
    status: ProbeStatus
    def __init__(self, probe_id: _Optional[str] = ..., pod_sandbox_id: _Optional[str] = ..., container_id: _Optional[str] = ..., container_name: _Optional[str] = ..., type: _Optional[_Union[_probe_spec_pb2.ProbeType, str]] = ..., spec: _Optional[_Union[_probe_spec_pb2.ProbeSpec, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., container_started_at: _Optional[int] = ..., container_ports: _Optional[_Iterable[_Union[_probe_spec_pb2.ContainerPort, _Mapping]]] = ..., revision: _Optional[int] = ..., created_at: _Optional[int] = ..., bridged: _Optional[_Union[BridgedHandler, _Mapping]] = ..., status: _Optional[_Union[ProbeStatus, _Mapping]] = ...) -> None: ...

class ProbeStatus(_message.Message):
    __slots__ = ("state", "state_changed_at", "last_attempt", "last_trace_id", "last_span_id", "consecutive_successes", "consecutive_failures", "on_hold", "totals", "worker")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LAST_TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    ON_HOLD_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    state: _probe_spec_pb2.ProbeState
    state_changed_at: int
    last_attempt: _probe_spec_pb2.Attempt
    last_trace_id: str
    last_span_id: str
    consecutive_successes: int
    consecutive_failures: int
    on_hold: bool
    totals: AttemptTotals
    worker: WorkerStatus
    def __init__(self, state: _Optional[_Union[_probe_spec_pb2.ProbeState, str]] = ..., state_changed_at: _Optional[int] = ..., last_attempt: _Optional[_Union[_probe_spec_pb2.Attempt, _Mapping]] = ..., last_trace_id: _Optional[str] = ..., last_span_id: _Optional[str] = ..., consecutive_successes: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., on_hold: _Optional[bool] = ..., totals: _Optional[_Union[AttemptTotals, _Mapping]] = ..., worker: _Optional[_Union[WorkerStatus, _Mapping]] = ...) -> None: ...

class BridgedHandler(_message.Message):
    __slots__ = ("role", "last_exec_at")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LAST_EXEC_AT_FIELD_NUMBER: _ClassVar[int]
    role: str
    last_exec_at: int
    def __init__(self, role: _Optional[str] = ..., last_exec_at: _Optional[int] = ...) -> None: ...

class FieldViolation(_message.Message):
    __slots__ = ("field", "type", "value", "detail")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    field: str
    type: str
    value: str
    detail: str
    def __init__(self, field: _Optional[str] = ..., type: _Optional[str] = ..., value: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class FieldViolations(_message.Message):
    __slots__ = ("violations", "omitted")
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    OMITTED_FIELD_NUMBER: _ClassVar[int]
    violations: _containers.RepeatedCompositeFieldContainer[FieldViolation]
    omitted: int
    def __init__(self, violations: _Optional[_Iterable[_Union[FieldViolation, _Mapping]]] = ..., omitted: _Optional[int] = ...) -> None: ...

class ProbeStatusRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: ProbeFilter
    def __init__(self, filter: _Optional[_Union[ProbeFilter, _Mapping]] = ...) -> None: ...

class ProbeStatusResponse(_message.Message):
    __slots__ = ("probes", "instance_id", "revision")
    PROBES_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    probes: _containers.RepeatedCompositeFieldContainer[Probe]
    instance_id: str
    revision: int
    def __init__(self, probes: _Optional[_Iterable[_Union[Probe, _Mapping]]] = ..., instance_id: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class WatchProbeStatusRequest(_message.Message):
    __slots__ = ("filter", "instance_id", "since_revision", "every_attempt", "unsuccessful_attempts")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_REVISION_FIELD_NUMBER: _ClassVar[int]
    EVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    UNSUCCESSFUL_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    filter: ProbeFilter
    instance_id: str
    since_revision: int
    every_attempt: bool
    unsuccessful_attempts: bool
    def __init__(self, filter: _Optional[_Union[ProbeFilter, _Mapping]] = ..., instance_id: _Optional[str] = ..., since_revision: _Optional[int] = ..., every_attempt: _Optional[bool] = ..., unsuccessful_attempts: _Optional[bool] = ...) -> None: ...

class WatchProbeStatusResponse(_message.Message):
    __slots__ = ("instance_id", "revision", "type", "probe")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    revision: int
    type: WatchEventType
    probe: Probe
    def __init__(self, instance_id: _Optional[str] = ..., revision: _Optional[int] = ..., type: _Optional[_Union[WatchEventType, str]] = ..., probe: _Optional[_Union[Probe, _Mapping]] = ...) -> None: ...

class ExecProbeRequest(_message.Message):
    __slots__ = ("pod_sandbox_id", "spec", "type", "container_ports", "lifecycle_hook")
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PORTS_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_HOOK_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    spec: _probe_spec_pb2.ProbeSpec
    type: _probe_spec_pb2.ProbeType
    container_ports: _containers.RepeatedCompositeFieldContainer[_probe_spec_pb2.ContainerPort]
    lifecycle_hook: bool
    def __init__(self, pod_sandbox_id: _Optional[str] = ..., spec: _Optional[_Union[_probe_spec_pb2.ProbeSpec, _Mapping]] = ..., type: _Optional[_Union[_probe_spec_pb2.ProbeType, str]] = ..., container_ports: _Optional[_Iterable[_Union[_probe_spec_pb2.ContainerPort, _Mapping]]] = ..., lifecycle_hook: _Optional[bool] = ...) -> None: ...

class ExecProbeResponse(_message.Message):
    __slots__ = ("attempt", "trace_id", "span_id", "worker")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    attempt: _probe_spec_pb2.Attempt
    trace_id: str
    span_id: str
    worker: WorkerStatus
    def __init__(self, attempt: _Optional[_Union[_probe_spec_pb2.Attempt, _Mapping]] = ..., trace_id: _Optional[str] = ..., span_id: _Optional[str] = ..., worker: _Optional[_Union[WorkerStatus, _Mapping]] = ...) -> None: ...

class ProbeSandbox(_message.Message):
    __slots__ = ("id", "name", "namespace", "uid", "netns_path", "pod_ips", "probes", "worker", "ready", "created_at", "host_network")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    NETNS_PATH_FIELD_NUMBER: _ClassVar[int]
    POD_IPS_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    HOST_NETWORK_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    namespace: str
    uid: str
    netns_path: str
    pod_ips: _containers.RepeatedScalarFieldContainer[str]
    probes: int
    worker: WorkerStatus
    ready: bool
    created_at: int
    host_network: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., uid: _Optional[str] = ..., netns_path: _Optional[str] = ..., pod_ips: _Optional[_Iterable[str]] = ..., probes: _Optional[int] = ..., worker: _Optional[_Union[WorkerStatus, _Mapping]] = ..., ready: _Optional[bool] = ..., created_at: _Optional[int] = ..., host_network: _Optional[bool] = ...) -> None: ...

class ListProbeSandboxesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListProbeSandboxesResponse(_message.Message):
    __slots__ = ("sandboxes",)
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[ProbeSandbox]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[ProbeSandbox, _Mapping]]] = ...) -> None: ...

class ShimVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShimVersionResponse(_message.Message):
    __slots__ = ("version", "api_version", "instance_id", "runtime_endpoint")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    version: str
    api_version: str
    instance_id: str
    runtime_endpoint: str
    def __init__(self, version: _Optional[str] = ..., api_version: _Optional[str] = ..., instance_id: _Optional[str] = ..., runtime_endpoint: _Optional[str] = ...) -> None: ...
