"""The words probectl's command line and the kubelet bridge's marker command share, as plain strings. Imports
nothing: probectl's parser offers them before it loads protobuf (27 ms of a start here), so that `probectl --help`
starts in about 40 ms; the protobuf values they stand for are derived from these names in
probe_api/handler_flags.py, by the enum value's name, so a name and its value are written once.

- MARKER: the first word of the bridge's marker command (probe_api/bridge_command.py);
- the probe types, as `--type` and the marker command's ROLE spell them (the kubelet's probe names);
- `--target`, `--ip-family`, `--http-protocol` and `--grpc-mode` values (the last two as the API spells them);
- `--state` values, the probe states probectl filters on.
"""

MARKER = "cri-probe-shim"
PROBE_TYPE_NAMES = ("liveness", "readiness", "startup")
TARGET_NAMES = ("pod-ip", "loopback")
IP_FAMILY_NAMES = ("primary", "ipv4", "ipv6", "any")
HTTP_PROTOCOL_NAMES = ("HTTP1", "HTTP2")  # core/v1 HTTPProtocol (KEP-5999)
GRPC_MODE_NAMES = ("Plaintext", "TLS")    # core/v1 GRPCProbeMode (KEP-4939)
STATE_NAMES = ("success", "failure", "unknown")


def enum_name(name: str) -> str:
    """The protobuf enum value's name a word stands for: `pod-ip` -> POD_IP, `Plaintext` -> PLAINTEXT."""
    return name.upper().replace("-", "_")
