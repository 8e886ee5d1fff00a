"""`probe-shim webhook certs`: a CA and the webhook's serving certificate, for clusters without cert-manager.

Built with `cryptography` (no hand-made ASN.1): an ECDSA P-256 CA (CA:TRUE, pathlen 0, keyCertSign) and a serving
certificate it signs for the Service's DNS names (`SERVICE.NAMESPACE.svc` and its longer forms: the API server
calls a webhook's Service by `SERVICE.NAMESPACE.svc`), and for IP addresses when asked (a webhook registered by
`clientConfig.url` with an IP, e.g. one run outside the cluster), serverAuth only. Written as `ca.crt`, `tls.crt` (the
serving certificate then the CA: the chain), `tls.key` (mode 0600), and `ca-bundle.txt`: the base64 of `ca.crt`,
the value of every webhook's `clientConfig.caBundle`. The CA's key is not kept: a new pair means a new CA, whose
bundle goes into the configuration with it (docs/rollout.md, The admission webhook).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DAYS = 365
CLOCK_SKEW = datetime.timedelta(minutes=5)  # valid a little before now: nodes' clocks differ


@dataclass(frozen=True)
class Written:
    ca_cert: Path
    cert: Path
    key: Path
    ca_bundle: str


def dns_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cri-probe-shim"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def issue(service: str, namespace: str, days: int = DEFAULT_DAYS, now: datetime.datetime | None = None,
          ips: Sequence[str] = ()) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, serving certificate, serving key), PEM. A malformed address in `ips` raises ValueError."""
    addresses = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    now = now or datetime.datetime.now(datetime.timezone.utc)
    not_before, not_after = now - CLOCK_SKEW, now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"probe-shim webhook CA {now:%Y-%m-%d}")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = dns_names(service, namespace)
    cert = (x509.CertificateBuilder().subject_name(_name(names[2])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names] + addresses), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


def write(out_dir: Path, service: str, namespace: str, days: int = DEFAULT_DAYS, ips: Sequence[str] = ()) -> Written:
    ca_pem, cert_pem, key_pem = issue(service, namespace, days, ips=ips)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = Written(out_dir / "ca.crt", out_dir / "tls.crt", out_dir / "tls.key",
                    base64.b64encode(ca_pem).decode())
    paths.ca_cert.write_bytes(ca_pem)
    paths.cert.write_bytes(cert_pem + ca_pem)
    # Created 0600 before the key is in it.
    fd = os.open(paths.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
    (out_dir / "ca-bundle.txt").write_text(paths.ca_bundle + "\n")
    return paths
