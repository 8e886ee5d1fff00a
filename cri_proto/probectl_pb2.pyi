from cri_proto import probe_service_pb2 as _probe_service_pb2
from cri_proto import probe_spec_pb2 as _probe_spec_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AppliedProbe(_message.Message):
    __slots__ = ("path", "container_name", "type", "probe_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    container_name: str
    type: _probe_spec_pb2.ProbeType
    probe_id: str
    def __init__(self, path: _Optional[str] = ..., container_name: _Optional[str] = ..., type: _Optional[_Union[_probe_spec_pb2.ProbeType, str]] = ..., probe_id: _Optional[str] = ...) -> None: ...

class ApplyResult(_message.Message):
    __slots__ = ("applied", "skipped")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    applied: _containers.RepeatedCompositeFieldContainer[AppliedProbe]
    skipped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, applied: _Optional[_Iterable[_Union[AppliedProbe, _Mapping]]] = ..., skipped: _Optional[_Iterable[str]] = ...) -> None: ...

class WorkerUsage(_message.Message):
    __slots__ = ("pid", "state", "uptime_seconds", "pss_bytes", "cpu_percent", "probes", "restarts", "group", "pod_sandbox_ids")
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_IDS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    state: _probe_service_pb2.WorkerState
    uptime_seconds: float
    pss_bytes: int
    cpu_percent: float
    probes: int
    restarts: int
    group: str
    pod_sandbox_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pid: _Optional[int] = ..., state: _Optional[_Union[_probe_service_pb2.WorkerState, str]] = ..., uptime_seconds: _Optional[float] = ..., pss_bytes: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., probes: _Optional[int] = ..., restarts: _Optional[int] = ..., group: _Optional[str] = ..., pod_sandbox_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WorkersResult(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerUsage]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerUsage, _Mapping]]] = ...) -> None: ...
