"""probectl's commands for rolling the bridge out: convert (manifests bridged to the shim and back; needs no shim)
and doctor (on a node: does the kubelet go through the shim?)."""

from __future__ import annotations

import sys

from probectl import convert as converter
from probectl.commands.base import EXIT_ERROR, EXIT_OK, connect, read_manifest


def cmd_convert(args) -> int:
    """The converted manifest on stdout, notes on stderr; with any error, nothing on stdout. No shim is called."""
    result = converter.convert(read_manifest(args.filename), reverse=args.reverse, allow_host=args.allow_host,
                               output=args.output, node_affinity=args.node_affinity)
    for message in result.errors or result.notes:
        print(f"probectl: {message}", file=sys.stderr)
    if result.errors:
        return EXIT_ERROR
    sys.stdout.write(result.text)
    sys.stdout.flush()
    return EXIT_OK


def cmd_doctor(args) -> int:
    """Every check's finding, a fix under each that failed; exit 1 if any failed. Read-only."""
    from probectl import doctor

    with connect(args) as client:
        findings = doctor.evaluate(doctor.gather(client, args.kubelet_pid))
    sys.stdout.write(doctor.render(findings))
    return EXIT_ERROR if any(f.status == doctor.FAIL for f in findings) else EXIT_OK
