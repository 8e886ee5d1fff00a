from cri_proto import probe_worker_pb2 as _probe_worker_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Spawn(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: _probe_worker_pb2.WorkerConfig
    def __init__(self, config: _Optional[_Union[_probe_worker_pb2.WorkerConfig, _Mapping]] = ...) -> None: ...

class ZygoteRequest(_message.Message):
    __slots__ = ("seq", "spawn")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SPAWN_FIELD_NUMBER: _ClassVar[int]
    seq: int
    spawn: Spawn
    def __init__(self, seq: _Optional[int] = ..., spawn: _Optional[_Union[Spawn, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("pid", "preloaded_modules", "gc_frozen")
    PID_FIELD_NUMBER: _ClassVar[int]
    PRELOADED_MODULES_FIELD_NUMBER: _ClassVar[int]
    GC_FROZEN_FIELD_NUMBER: _ClassVar[int]
    pid: int
    preloaded_modules: int
    gc_frozen: bool
    def __init__(self, pid: _Optional[int] = ..., preloaded_modules: _Optional[int] = ..., gc_frozen: _Optional[bool] = ...) -> None: ...

class Spawned(_message.Message):
    __slots__ = ("pid",)
    PID_FIELD_NUMBER: _ClassVar[int]
    pid: int
    def __init__(self, pid: _Optional[int] = ...) -> None: ...

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

class ZygoteEvent(_message.Message):
    __slots__ = ("seq", "hello", "spawned", "spawn_failed", "exited")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SPAWNED_FIELD_NUMBER: _ClassVar[int]
    SPAWN_FAILED_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hello: Hello
    spawned: Spawned
    spawn_failed: SpawnFailed
    exited: WorkerExited
    def __init__(self, seq: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., spawned: _Optional[_Union[Spawned, _Mapping]] = ..., spawn_failed: _Optional[_Union[SpawnFailed, _Mapping]] = ..., exited: _Optional[_Union[WorkerExited, _Mapping]] = ...) -> None: ...
