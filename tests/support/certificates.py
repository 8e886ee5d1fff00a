"""Test certificates with chosen names and validity (cryptography), as files for a server or a client to load.

tests/support/servers/http_server.py's make_self_signed makes the one the servers use when any will do; these are
for the tests about what a verifying client says of a certificate (an h2c probe's redirect to https).
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def write_certificate(directory: Path, name: str, *, common_name: str = "probe-test", ip_sans: tuple[str, ...] = (),
                      dns_sans: tuple[str, ...] = (), not_before: datetime.datetime | None = None,
                      not_after: datetime.datetime | None = None) -> tuple[str, str]:
    """A self-signed certificate (valid from 5 minutes ago for a day unless told) and its key in `directory`;
    (cert, key) paths. No SAN extension at all when neither ip_sans nor dns_sans is given."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
               .not_valid_after(not_after or now + datetime.timedelta(days=1)))
    names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_sans] + [x509.DNSName(n) for n in dns_sans]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)
