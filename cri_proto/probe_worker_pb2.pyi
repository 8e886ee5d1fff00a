from cri_proto import probe_spec_pb2 as _probe_spec_pb2
from cri_proto import probe_service_pb2 as _probe_service_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerConfig(_message.Message):
    __slots__ = ("user_agent_version", "run_as_uid", "run_as_gid", "keep_privileges", "max_memory_bytes", "max_open_files", "heartbeat_interval_ms", "group", "outlives_daemon", "protocol_version", "tenancy", "restarts")
    USER_AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_UID_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_GID_FIELD_NUMBER: _ClassVar[int]
    KEEP_PRIVILEGES_FIELD_NUMBER: _ClassVar[int]
    MAX_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OPEN_FILES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OUTLIVES_DAEMON_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENANCY_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    user_agent_version: str
    run_as_uid: int
    run_as_gid: int
    keep_privileges: bool
    max_memory_bytes: int
    max_open_files: int
    heartbeat_interval_ms: int
    group: str
    outlives_daemon: bool
    protocol_version: int
    tenancy: str
    restarts: int
    def __init__(self, user_agent_version: _Optional[str] = ..., run_as_uid: _Optional[int] = ..., run_as_gid: _Optional[int] = ..., keep_privileges: _Optional[bool] = ..., max_memory_bytes: _Optional[int] = ..., max_open_files: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., group: _Optional[str] = ..., outlives_daemon: _Optional[bool] = ..., protocol_version: _Optional[int] = ..., tenancy: _Optional[str] = ..., restarts: _Optional[int] = ...) -> None: ...

class AddSandbox(_message.Message):
    __slots__ = ("sandbox_id", "pod_ips")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    POD_IPS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    pod_ips: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sandbox_id: _Optional[str] = ..., pod_ips: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveSandbox(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class ContainerRef(_message.Message):
    __slots__ = ("id", "name", "started_at_unix_ns", "ports")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    started_at_unix_ns: int
    ports: _containers.RepeatedCompositeFieldContainer[_probe_spec_pb2.ContainerPort]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., started_at_unix_ns: _Optional[int] = ..., ports: _Optional[_Iterable[_Union[_probe_spec_pb2.ContainerPort, _Mapping]]] = ...) -> None: ...

class ProbeRegistration(_message.Message):
    __slots__ = ("probe_id", "container", "type", "spec", "start_now", "sandbox_id", "status")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    START_NOW_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    container: ContainerRef
    type: _probe_spec_pb2.ProbeType
    spec: _probe_spec_pb2.ProbeSpec
    start_now: bool
    sandbox_id: str
    status: _probe_service_pb2.ProbeStatus
    def __init__(self, probe_id: _Optional[str] = ..., container: _Optional[_Union[ContainerRef, _Mapping]] = ..., type: _Optional[_Union[_probe_spec_pb2.ProbeType, str]] = ..., spec: _Optional[_Union[_probe_spec_pb2.ProbeSpec, _Mapping]] = ..., start_now: _Optional[bool] = ..., sandbox_id: _Optional[str] = ..., status: _Optional[_Union[_probe_service_pb2.ProbeStatus, _Mapping]] = ...) -> None: ...

class AddProbe(_message.Message):
    __slots__ = ("probe",)
    PROBE_FIELD_NUMBER: _ClassVar[int]
    probe: ProbeRegistration
    def __init__(self, probe: _Optional[_Union[ProbeRegistration, _Mapping]] = ...) -> None: ...

class RemoveProbe(_message.Message):
    __slots__ = ("probe_id", "sandbox_id")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    sandbox_id: str
    def __init__(self, probe_id: _Optional[str] = ..., sandbox_id: _Optional[str] = ...) -> None: ...

class RunOnce(_message.Message):
    __slots__ = ("probe", "max_tries", "lifecycle_hook")
    PROBE_FIELD_NUMBER: _ClassVar[int]
    MAX_TRIES_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_HOOK_FIELD_NUMBER: _ClassVar[int]
    probe: ProbeRegistration
    max_tries: int
    lifecycle_hook: bool
    def __init__(self, probe: _Optional[_Union[ProbeRegistration, _Mapping]] = ..., max_tries: _Optional[int] = ..., lifecycle_hook: _Optional[bool] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("unix_ns", "probes")
    UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    unix_ns: int
    probes: int
    def __init__(self, unix_ns: _Optional[int] = ..., probes: _Optional[int] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Detach(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Resume(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerRequest(_message.Message):
    __slots__ = ("seq", "config", "add_probe", "remove_probe", "run_once", "heartbeat", "shutdown", "add_sandbox", "remove_sandbox", "detach", "resume")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ADD_PROBE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_PROBE_FIELD_NUMBER: _ClassVar[int]
    RUN_ONCE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    ADD_SANDBOX_FIELD_NUMBER: _ClassVar[int]
    REMOVE_SANDBOX_FIELD_NUMBER: _ClassVar[int]
    DETACH_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    seq: int
    config: WorkerConfig
    add_probe: AddProbe
    remove_probe: RemoveProbe
    run_once: RunOnce
    heartbeat: Heartbeat
    shutdown: Shutdown
    add_sandbox: AddSandbox
    remove_sandbox: RemoveSandbox
    detach: Detach
    resume: Resume
    def __init__(self, seq: _Optional[int] = ..., config: _Optional[_Union[WorkerConfig, _Mapping]] = ..., add_probe: _Optional[_Union[AddProbe, _Mapping]] = ..., remove_probe: _Optional[_Union[RemoveProbe, _Mapping]] = ..., run_once: _Optional[_Union[RunOnce, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ..., add_sandbox: _Optional[_Union[AddSandbox, _Mapping]] = ..., remove_sandbox: _Optional[_Union[RemoveSandbox, _Mapping]] = ..., detach: _Optional[_Union[Detach, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("pid", "netns_inode", "uid", "gid", "protocol_version", "adopted", "group")
    PID_FIELD_NUMBER: _ClassVar[int]
    NETNS_INODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    pid: int
    netns_inode: int
    uid: int
    gid: int
    protocol_version: int
    adopted: bool
    group: str
    def __init__(self, pid: _Optional[int] = ..., netns_inode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., protocol_version: _Optional[int] = ..., adopted: _Optional[bool] = ..., group: _Optional[str] = ...) -> None: ...

class Fatal(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class Rejected(_message.Message):
    __slots__ = ("errors",)
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, errors: _Optional[_Iterable[str]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AttemptReport(_message.Message):
    __slots__ = ("probe_id", "sandbox_id", "status")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    sandbox_id: str
    status: _probe_service_pb2.ProbeStatus
    def __init__(self, probe_id: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., status: _Optional[_Union[_probe_service_pb2.ProbeStatus, _Mapping]] = ...) -> None: ...

class StateChange(_message.Message):
    __slots__ = ("probe_id", "previous", "state", "output", "sandbox_id", "changed_at_unix_ns")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    previous: _probe_spec_pb2.ProbeState
    state: _probe_spec_pb2.ProbeState
    output: str
    sandbox_id: str
    changed_at_unix_ns: int
    def __init__(self, probe_id: _Optional[str] = ..., previous: _Optional[_Union[_probe_spec_pb2.ProbeState, str]] = ..., state: _Optional[_Union[_probe_spec_pb2.ProbeState, str]] = ..., output: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., changed_at_unix_ns: _Optional[int] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("sandboxes", "probes", "dropped_events")
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[AddSandbox]
    probes: _containers.RepeatedCompositeFieldContainer[ProbeSnapshot]
    dropped_events: int
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[AddSandbox, _Mapping]]] = ..., probes: _Optional[_Iterable[_Union[ProbeSnapshot, _Mapping]]] = ..., dropped_events: _Optional[int] = ...) -> None: ...

class ProbeSnapshot(_message.Message):
    __slots__ = ("registration", "status")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    registration: ProbeRegistration
    status: _probe_service_pb2.ProbeStatus
    def __init__(self, registration: _Optional[_Union[ProbeRegistration, _Mapping]] = ..., status: _Optional[_Union[_probe_service_pb2.ProbeStatus, _Mapping]] = ...) -> None: ...

class WorkerEvent(_message.Message):
    __slots__ = ("seq", "ready", "fatal", "ack", "rejected", "attempt", "state_change", "heartbeat", "snapshot")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ready: Ready
    fatal: Fatal
    ack: Ack
    rejected: Rejected
    attempt: AttemptReport
    state_change: StateChange
    heartbeat: Heartbeat
    snapshot: Snapshot
    def __init__(self, seq: _Optional[int] = ..., ready: _Optional[_Union[Ready, _Mapping]] = ..., fatal: _Optional[_Union[Fatal, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., rejected: _Optional[_Union[Rejected, _Mapping]] = ..., attempt: _Optional[_Union[AttemptReport, _Mapping]] = ..., state_change: _Optional[_Union[StateChange, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class SocketRequest(_message.Message):
    __slots__ = ("seq", "sandbox_id", "family", "count")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sandbox_id: str
    family: int
    count: int
    def __init__(self, seq: _Optional[int] = ..., sandbox_id: _Optional[str] = ..., family: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class SocketReply(_message.Message):
    __slots__ = ("seq", "count", "error", "control")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    seq: int
    count: int
    error: str
    control: bool
    def __init__(self, seq: _Optional[int] = ..., count: _Optional[int] = ..., error: _Optional[str] = ..., control: _Optional[bool] = ...) -> None: ...
