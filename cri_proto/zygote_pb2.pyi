from cri_proto import probe_worker_pb2 as _probe_worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Spawn(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: _probe_worker_pb2.WorkerConfig
    def __init__(self, config: _Optional[_Union[_probe_worker_pb2.WorkerConfig, _Mapping]] = ...) -> None: ...

class Assign(_message.Message):
    __slots__ = ("worker_pid", "sandbox_id", "netns_path", "find_pod_ips")
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    NETNS_PATH_FIELD_NUMBER: _ClassVar[int]
    FIND_POD_IPS_FIELD_NUMBER: _ClassVar[int]
    worker_pid: int
    sandbox_id: str
    netns_path: str
    find_pod_ips: bool
    def __init__(self, worker_pid: _Optional[int] = ..., sandbox_id: _Optional[str] = ..., netns_path: _Optional[str] = ..., find_pod_ips: _Optional[bool] = ...) -> None: ...

class Unassign(_message.Message):
    __slots__ = ("worker_pid", "sandbox_id")
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    worker_pid: int
    sandbox_id: str
    def __init__(self, worker_pid: _Optional[int] = ..., sandbox_id: _Optional[str] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Adopt(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Reattach(_message.Message):
    __slots__ = ("worker_pid",)
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    worker_pid: int
    def __init__(self, worker_pid: _Optional[int] = ...) -> None: ...

class ZygoteRequest(_message.Message):
    __slots__ = ("seq", "spawn", "assign", "unassign", "shutdown", "adopt", "reattach")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SPAWN_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    UNASSIGN_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    ADOPT_FIELD_NUMBER: _ClassVar[int]
    REATTACH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    spawn: Spawn
    assign: Assign
    unassign: Unassign
    shutdown: Shutdown
    adopt: Adopt
    reattach: Reattach
    def __init__(self, seq: _Optional[int] = ..., spawn: _Optional[_Union[Spawn, _Mapping]] = ..., assign: _Optional[_Union[Assign, _Mapping]] = ..., unassign: _Optional[_Union[Unassign, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ..., adopt: _Optional[_Union[Adopt, _Mapping]] = ..., reattach: _Optional[_Union[Reattach, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("pid", "preloaded_modules", "gc_frozen", "protocol_version", "worker_protocol_version", "version", "adopted")
    PID_FIELD_NUMBER: _ClassVar[int]
    PRELOADED_MODULES_FIELD_NUMBER: _ClassVar[int]
    GC_FROZEN_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    pid: int
    preloaded_modules: int
    gc_frozen: bool
    protocol_version: int
    worker_protocol_version: int
    version: str
    adopted: bool
    def __init__(self, pid: _Optional[int] = ..., preloaded_modules: _Optional[int] = ..., gc_frozen: _Optional[bool] = ..., protocol_version: _Optional[int] = ..., worker_protocol_version: _Optional[int] = ..., version: _Optional[str] = ..., adopted: _Optional[bool] = ...) -> None: ...

class Adoptable(_message.Message):
    __slots__ = ("pid", "config", "sandboxes", "started_at_unix_ns")
    PID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    config: _probe_worker_pb2.WorkerConfig
    sandboxes: _containers.RepeatedCompositeFieldContainer[Assignment]
    started_at_unix_ns: int
    def __init__(self, pid: _Optional[int] = ..., config: _Optional[_Union[_probe_worker_pb2.WorkerConfig, _Mapping]] = ..., sandboxes: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ..., started_at_unix_ns: _Optional[int] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("sandbox_id", "netns_inode")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    NETNS_INODE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    netns_inode: int
    def __init__(self, sandbox_id: _Optional[str] = ..., netns_inode: _Optional[int] = ...) -> None: ...

class AdoptDone(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: int
    def __init__(self, workers: _Optional[int] = ...) -> None: ...

class Reattached(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Spawned(_message.Message):
    __slots__ = ("pid", "started_at_unix_ns")
    PID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    started_at_unix_ns: int
    def __init__(self, pid: _Optional[int] = ..., started_at_unix_ns: _Optional[int] = ...) -> None: ...

class SpawnFailed(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class WorkerExited(_message.Message):
    __slots__ = ("pid", "exit_code", "signal")
    PID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    pid: int
    exit_code: int
    signal: int
    def __init__(self, pid: _Optional[int] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ...) -> None: ...

class Assigned(_message.Message):
    __slots__ = ("netns_inode", "pod_ips")
    NETNS_INODE_FIELD_NUMBER: _ClassVar[int]
    POD_IPS_FIELD_NUMBER: _ClassVar[int]
    netns_inode: int
    pod_ips: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, netns_inode: _Optional[int] = ..., pod_ips: _Optional[_Iterable[str]] = ...) -> None: ...

class AssignFailed(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class ZygoteEvent(_message.Message):
    __slots__ = ("seq", "hello", "spawned", "spawn_failed", "exited", "assigned", "assign_failed", "adoptable", "adopt_done", "reattached")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SPAWNED_FIELD_NUMBER: _ClassVar[int]
    SPAWN_FAILED_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FAILED_FIELD_NUMBER: _ClassVar[int]
    ADOPTABLE_FIELD_NUMBER: _ClassVar[int]
    ADOPT_DONE_FIELD_NUMBER: _ClassVar[int]
    REATTACHED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hello: Hello
    spawned: Spawned
    spawn_failed: SpawnFailed
    exited: WorkerExited
    assigned: Assigned
    assign_failed: AssignFailed
    adoptable: Adoptable
    adopt_done: AdoptDone
    reattached: Reattached
    def __init__(self, seq: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., spawned: _Optional[_Union[Spawned, _Mapping]] = ..., spawn_failed: _Optional[_Union[SpawnFailed, _Mapping]] = ..., exited: _Optional[_Union[WorkerExited, _Mapping]] = ..., assigned: _Optional[_Union[Assigned, _Mapping]] = ..., assign_failed: _Optional[_Union[AssignFailed, _Mapping]] = ..., adoptable: _Optional[_Union[Adoptable, _Mapping]] = ..., adopt_done: _Optional[_Union[AdoptDone, _Mapping]] = ..., reattached: _Optional[_Union[Reattached, _Mapping]] = ...) -> None: ...
