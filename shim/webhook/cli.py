"""`probe-shim webhook serve` and `probe-shim webhook certs`: the admission webhook's command line."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import ssl
import sys
from pathlib import Path

from shim.observe import logs

DEFAULT_SERVICE = "probe-shim-webhook"
DEFAULT_NAMESPACE = "probe-shim-system"


def add_parser(commands) -> None:
    webhook = commands.add_parser("webhook", help="the mutating admission webhook that converts pods")
    sub = webhook.add_subparsers(dest="webhook_command", required=True)
    serve = sub.add_parser("serve", help="serve AdmissionReviews over HTTPS")
    serve.add_argument("--listen", default="0.0.0.0:8443", help="HOST:PORT (default 0.0.0.0:8443)")
    serve.add_argument("--cert", required=True, help="serving certificate (PEM; reloaded when it changes)")
    serve.add_argument("--key", required=True, help="its private key (PEM)")
    serve.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", ""),
                       help="the webhook's own namespace, never mutated (default: $POD_NAMESPACE)")
    serve.add_argument("--allow-host", action="store_true",
                       help="convert handlers whose host is outside the pod (every node's shim must then set "
                            "allow_host_field = true)")
    serve.add_argument("--log-format", choices=("text", "json"), default="json")
    serve.add_argument("--request-timeout-s", type=float, default=10.0,
                       help="a request's head and body must arrive within this (default 10)")
    serve.add_argument("--handshake-timeout-s", type=float, default=5.0,
                       help="a TLS handshake must finish within this (default 5)")
    certs = sub.add_parser("certs", help="write a CA, a serving certificate and the caBundle")
    certs.add_argument("--out", required=True, type=Path, help="directory for ca.crt, tls.crt, tls.key, ca-bundle.txt")
    certs.add_argument("--service", default=DEFAULT_SERVICE, help=f"the webhook's Service (default {DEFAULT_SERVICE})")
    certs.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=f"its namespace (default {DEFAULT_NAMESPACE})")
    certs.add_argument("--days", type=int, default=365, help="validity (default 365)")
    certs.add_argument("--ip", action="append", default=[], metavar="ADDRESS",
                       help="also valid for this IP address (repeatable): for a webhook the API server calls by "
                            "clientConfig.url with an IP, e.g. one run outside the cluster")


def run(args: argparse.Namespace) -> int:
    if args.webhook_command == "certs":
        return _certs(args)
    return _serve(args)


def _certs(args) -> int:
    from shim.webhook import certs  # cryptography: only for this command

    if args.days < 1:
        print("probe-shim: --days must be at least 1", file=sys.stderr)
        return 1
    for ip in args.ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            print(f"probe-shim: --ip {ip!r}: not an IPv4 or IPv6 address", file=sys.stderr)
            return 1
    try:
        written = certs.write(args.out, args.service, args.namespace, args.days, ips=args.ip)
    except OSError as exc:
        print(f"probe-shim: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {written.ca_cert}, {written.cert}, {written.key} (for "
          f"{', '.join(certs.dns_names(args.service, args.namespace)[2:] + args.ip)}); the caBundle "
          f"({written.ca_cert.parent / 'ca-bundle.txt'}):\n{written.ca_bundle}")
    return 0


def _serve(args) -> int:
    from shim.webhook.server import WebhookConfig, serve

    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        print(f"probe-shim: --listen {args.listen!r}: expected HOST:PORT", file=sys.stderr)
        return 1
    logs.setup(args.log_format)
    config = WebhookConfig(listen_host=host.strip("[]") or "0.0.0.0", listen_port=int(port), cert_file=args.cert,
                           key_file=args.key, own_namespace=args.namespace, allow_host=args.allow_host,
                           request_timeout_s=args.request_timeout_s, handshake_timeout_s=args.handshake_timeout_s)
    try:
        asyncio.run(serve(config))
    except (OSError, ssl.SSLError) as exc:  # no certificate, a port in use: one line, exit 1
        logging.getLogger(__name__).error("cannot serve: %s", exc)
        return 1
    return 0
