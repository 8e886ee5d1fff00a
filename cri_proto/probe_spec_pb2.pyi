from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProbeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE_TYPE_UNSPECIFIED: _ClassVar[ProbeType]
    LIVENESS: _ClassVar[ProbeType]
    READINESS: _ClassVar[ProbeType]
    STARTUP: _ClassVar[ProbeType]

class URIScheme(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HTTP: _ClassVar[URIScheme]
    HTTPS: _ClassVar[URIScheme]

class Target(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POD_IP: _ClassVar[Target]
    LOOPBACK: _ClassVar[Target]

class IPFamily(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIMARY: _ClassVar[IPFamily]
    IPV4: _ClassVar[IPFamily]
    IPV6: _ClassVar[IPFamily]
    ANY: _ClassVar[IPFamily]

class HTTPProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HTTP1: _ClassVar[HTTPProtocol]
    HTTP2: _ClassVar[HTTPProtocol]

class GRPCProbeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAINTEXT: _ClassVar[GRPCProbeMode]
    TLS: _ClassVar[GRPCProbeMode]

class AttemptResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_UNKNOWN: _ClassVar[AttemptResult]
    RESULT_SUCCESS: _ClassVar[AttemptResult]
    RESULT_WARNING: _ClassVar[AttemptResult]
    RESULT_FAILURE: _ClassVar[AttemptResult]

class ProbeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_UNKNOWN: _ClassVar[ProbeState]
    STATE_SUCCESS: _ClassVar[ProbeState]
    STATE_FAILURE: _ClassVar[ProbeState]

class GRPCServingStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRPC_SERVING_STATUS_UNSET: _ClassVar[GRPCServingStatus]
    GRPC_UNKNOWN: _ClassVar[GRPCServingStatus]
    GRPC_SERVING: _ClassVar[GRPCServingStatus]
    GRPC_NOT_SERVING: _ClassVar[GRPCServingStatus]
    GRPC_SERVICE_UNKNOWN: _ClassVar[GRPCServingStatus]
PROBE_TYPE_UNSPECIFIED: ProbeType
LIVENESS: ProbeType
READINESS: ProbeType
STARTUP: ProbeType
HTTP: URIScheme
HTTPS: URIScheme
POD_IP: Target
LOOPBACK: Target
PRIMARY: IPFamily
IPV4: IPFamily
IPV6: IPFamily
ANY: IPFamily
HTTP1: HTTPProtocol
HTTP2: HTTPProtocol
PLAINTEXT: GRPCProbeMode
TLS: GRPCProbeMode
RESULT_UNKNOWN: AttemptResult
RESULT_SUCCESS: AttemptResult
RESULT_WARNING: AttemptResult
RESULT_FAILURE: AttemptResult
STATE_UNKNOWN: ProbeState
STATE_SUCCESS: ProbeState
STATE_FAILURE: ProbeState
GRPC_SERVING_STATUS_UNSET: GRPCServingStatus
GRPC_UNKNOWN: GRPCServingStatus
GRPC_SERVING: GRPCServingStatus
GRPC_NOT_SERVING: GRPCServingStatus
GRPC_SERVICE_UNKNOWN: GRPCServingStatus

class PortRef(_message.Message):
    __slots__ = ("number", "name")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    number: int
    name: str
    def __init__(self, number: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class HTTPHeader(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class HTTPGetAction(_message.Message):
    __slots__ = ("path", "port", "host", "scheme", "http_headers", "protocol")
    PATH_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    HTTP_HEADERS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    path: str
    port: PortRef
    host: str
    scheme: URIScheme
    http_headers: _containers.RepeatedCompositeFieldContainer[HTTPHeader]
    protocol: HTTPProtocol
    def __init__(self, path: _Optional[str] = ..., port: _Optional[_Union[PortRef, _Mapping]] = ..., host: _Optional[str] = ..., scheme: _Optional[_Union[URIScheme, str]] = ..., http_headers: _Optional[_Iterable[_Union[HTTPHeader, _Mapping]]] = ..., protocol: _Optional[_Union[HTTPProtocol, str]] = ...) -> None: ...

class TCPSocketAction(_message.Message):
    __slots__ = ("port", "host")
    PORT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    port: PortRef
    host: str
    def __init__(self, port: _Optional[_Union[PortRef, _Mapping]] = ..., host: _Optional[str] = ...) -> None: ...

class GRPCAction(_message.Message):
    __slots__ = ("port", "service", "mode")
    PORT_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    port: int
    service: str
    mode: GRPCProbeMode
    def __init__(self, port: _Optional[int] = ..., service: _Optional[str] = ..., mode: _Optional[_Union[GRPCProbeMode, str]] = ...) -> None: ...

class ExecAction(_message.Message):
    __slots__ = ("command",)
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    command: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, command: _Optional[_Iterable[str]] = ...) -> None: ...

class ProbeSpec(_message.Message):
    __slots__ = ("http_get", "tcp_socket", "grpc", "exec", "initial_delay_ms", "period_ms", "timeout_ms", "success_threshold", "failure_threshold", "termination_grace_period_ms", "target", "ip_family")
    HTTP_GET_FIELD_NUMBER: _ClassVar[int]
    TCP_SOCKET_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    EXEC_FIELD_NUMBER: _ClassVar[int]
    INITIAL_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FAILURE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TERMINATION_GRACE_PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    IP_FAMILY_FIELD_NUMBER: _ClassVar[int]
    http_get: HTTPGetAction
    tcp_socket: TCPSocketAction
    grpc: GRPCAction
    exec: ExecAction
    initial_delay_ms: int
    period_ms: int
    timeout_ms: int
    success_threshold: int
    failure_threshold: int
    termination_grace_period_ms: int
    target: Target
    ip_family: IPFamily
    def __init__(self, http_get: _Optional[_Union[HTTPGetAction, _Mapping]] = ..., tcp_socket: _Optional[_Union[TCPSocketAction, _Mapping]] = ..., grpc: _Optional[_Union[GRPCAction, _Mapping]] = ..., exec: _Optional[_Union[ExecAction, _Mapping]] = ..., initial_delay_ms: _Optional[int] = ..., period_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., success_threshold: _Optional[int] = ..., failure_threshold: _Optional[int] = ..., termination_grace_period_ms: _Optional[int] = ..., target: _Optional[_Union[Target, str]] = ..., ip_family: _Optional[_Union[IPFamily, str]] = ...) -> None: ...

class ContainerPort(_message.Message):
    __slots__ = ("name", "container_port", "protocol")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    name: str
    container_port: int
    protocol: str
    def __init__(self, name: _Optional[str] = ..., container_port: _Optional[int] = ..., protocol: _Optional[str] = ...) -> None: ...

class Phase(_message.Message):
    __slots__ = ("name", "start_offset_ns", "duration_ns", "detail", "error", "children")
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    name: str
    start_offset_ns: int
    duration_ns: int
    detail: str
    error: str
    children: _containers.RepeatedCompositeFieldContainer[Phase]
    def __init__(self, name: _Optional[str] = ..., start_offset_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., detail: _Optional[str] = ..., error: _Optional[str] = ..., children: _Optional[_Iterable[_Union[Phase, _Mapping]]] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("result", "output", "started_at_unix_ns", "duration_ns", "address", "phases", "http_status_code", "scheduled_at_unix_ns", "ticks_missed", "grpc_code", "grpc_serving_status")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    TICKS_MISSED_FIELD_NUMBER: _ClassVar[int]
    GRPC_CODE_FIELD_NUMBER: _ClassVar[int]
    GRPC_SERVING_STATUS_FIELD_NUMBER: _ClassVar[int]
    result: AttemptResult
    output: str
    started_at_unix_ns: int
    duration_ns: int
    address: str
    phases: _containers.RepeatedCompositeFieldContainer[Phase]
    http_status_code: int
    scheduled_at_unix_ns: int
    ticks_missed: int
    grpc_code: int
    grpc_serving_status: GRPCServingStatus
    def __init__(self, result: _Optional[_Union[AttemptResult, str]] = ..., output: _Optional[str] = ..., started_at_unix_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., address: _Optional[str] = ..., phases: _Optional[_Iterable[_Union[Phase, _Mapping]]] = ..., http_status_code: _Optional[int] = ..., scheduled_at_unix_ns: _Optional[int] = ..., ticks_missed: _Optional[int] = ..., grpc_code: _Optional[int] = ..., grpc_serving_status: _Optional[_Union[GRPCServingStatus, str]] = ...) -> None: ...
