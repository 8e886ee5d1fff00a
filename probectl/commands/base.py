"""What probectl's commands share: exit codes, the one-line usage error, the client, probe id prefixes, manifests.

Exit codes: 0 ok (for exec: success or warning), 1 bad arguments or an error the shim reported, 2 the shim cannot
be reached, 3 exec result unknown, 4 exec result failure (grpc_health_probe's spirit).

Imports no grpc and no protobuf (the parser imports this): the client is built, and its module loaded, only by a
command that calls the shim.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cri_proto import probe_service_pb2 as service_pb
    from probectl.client import ProbeShimClient

EXIT_OK, EXIT_ERROR, EXIT_UNREACHABLE, EXIT_UNKNOWN, EXIT_FAILURE = 0, 1, 2, 3, 4


class UsageError(Exception):
    """Bad arguments: exit 1 with this one-line message."""


def connect(args) -> ProbeShimClient:
    from probectl.client import ProbeShimClient  # only for the commands that call the shim

    try:
        return ProbeShimClient(args.endpoint, timeout_s=args.rpc_timeout_ms / 1000)
    except ValueError as exc:
        raise UsageError(f"-r/--runtime-endpoint: {exc}") from exc


def print_line(text: str) -> None:
    print(text, flush=True)


def waterfall_bar() -> str:
    """The waterfall's bar: a full block where the terminal can show it."""
    try:
        "█".encode(sys.stdout.encoding or "ascii")
        return "█"
    except (UnicodeEncodeError, LookupError):
        return "#"


def resolve_probes(shim: ProbeShimClient, wanted: Iterable[str]) -> list[service_pb.Probe]:
    """Full ids or unique prefixes (as `probectl ps` prints them), like crictl and docker accept."""
    known = shim.probes()
    found = []
    for text in wanted:
        exact = [p for p in known if p.probe_id == text]
        matches = exact or [p for p in known if p.probe_id.startswith(text)]
        if not matches or not text:
            raise UsageError(f"no probe with id {text!r}; list probes with 'probectl ps'")
        if len(matches) > 1:
            raise UsageError(f"probe id prefix {text!r} matches {len(matches)} probes; give more of the id "
                             f"('probectl ps --no-trunc' shows them whole)")
        found.append(matches[0])
    return found


def read_manifest(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as manifest:
            return manifest.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from exc
