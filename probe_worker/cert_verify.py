"""Go's verification of a server certificate, in its order and with its texts. Pure, no I/O.

Every probe client of the kubelet skips verification (InsecureSkipVerify) but one: kubelet 1.37's h2c transport
(pkg/probe/http NewWithTLSConfig, `h2cTransport`) has no TLSClientConfig, so when an h2c probe is redirected to
https, Go's default tls.Config verifies the server against the node's roots. crypto/x509 Certificate.Verify checks,
in this order: the leaf's validity period (isValid), its name (VerifyHostname), then the chain to a root; crypto/tls
reports the first failure as `tls: failed to verify certificate: x509: ...`. OpenSSL checks the chain first, so the
worker lets OpenSSL judge the chain and asks this module what Go would have said of the leaf before that.

The leaf comes as ssl's certificate dict (`_ssl.Certificate.get_info()`, the shape of getpeercert()). What is not
followed: a chain error is always `certificate signed by unknown authority` without Go's hint, and a DNS name is
matched by Go's rule for valid names only (the h2c probe's host is always the pod IP: validation forbids `host`).
"""

from __future__ import annotations

import datetime
import ipaddress

VERIFY_FAILED = "tls: failed to verify certificate: "
UNKNOWN_AUTHORITY = "x509: certificate signed by unknown authority"
# HostnameError lists the certificate's names up to this many (crypto/x509 maxNamesIncluded).
MAX_NAMES_INCLUDED = 100


def leaf_error(leaf: dict, host: str, now: datetime.datetime) -> str | None:
    """Go's x509 error for the leaf before its chain is looked at (validity, then the name), or None.

    `now` is an aware datetime in the node's zone, as Go's time.Now() formats."""
    not_before = _cert_time(leaf["notBefore"])
    not_after = _cert_time(leaf["notAfter"])
    if now < not_before:
        return f"x509: certificate has expired or is not yet valid: current time {rfc3339(now)} is before " \
               f"{rfc3339(not_before)}"
    if now > not_after:
        return f"x509: certificate has expired or is not yet valid: current time {rfc3339(now)} is after " \
               f"{rfc3339(not_after)}"
    return hostname_error(leaf, host)


def hostname_error(leaf: dict, host: str) -> str | None:
    """Certificate.VerifyHostname and HostnameError.Error(): None when `host` is one of the leaf's names."""
    ips = [_ip(value) for kind, value in _sans(leaf) if kind == "IP Address"]
    dns_names = [value for kind, value in _sans(leaf) if kind == "DNS"]
    candidate = host[1:-1] if len(host) >= 3 and host[0] == "[" and host[-1] == "]" else host
    ip = _ip(candidate)
    if ip is not None:
        if ip in ips:
            return None
        host = candidate
    elif any(_match_hostnames(name, _split_hostname(host)) for name in dns_names):
        return None

    if "subjectAltName" not in leaf and _match_hostnames(_common_name(leaf), _split_hostname(host)):
        return "x509: certificate relies on legacy Common Name field, use SANs instead"
    if ip is not None:
        if not ips:
            return f"x509: cannot validate certificate for {host} because it doesn't contain any IP SANs"
        if len(ips) >= MAX_NAMES_INCLUDED:
            return f"x509: certificate is valid for {len(ips)} IP SANs, but none matched {host}"
        valid = ", ".join(str(a) for a in ips)
    else:
        if len(dns_names) >= MAX_NAMES_INCLUDED:
            return f"x509: certificate is valid for {len(dns_names)} names, but none matched {host}"
        valid = ", ".join(dns_names)
    if not valid:
        return f"x509: certificate is not valid for any names, but wanted to match {host}"
    return f"x509: certificate is valid for {valid}, not {host}"


def rfc3339(moment: datetime.datetime) -> str:
    """time.Time.Format(time.RFC3339): whole seconds, `Z` for UTC, else the zone's offset."""
    text = moment.replace(microsecond=0).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _cert_time(text: str) -> datetime.datetime:
    """OpenSSL's "Nov 27 17:42:52 2026 GMT" (ASN1_TIME_print). Parsed here: ssl.cert_time_to_seconds imports
    _strptime on first use, which a worker cannot read after its privileges are dropped."""
    month, day, clock, year, _zone = text.split()
    hour, minute, second = (int(part) for part in clock.split(":"))
    return datetime.datetime(int(year), _MONTHS.index(month) + 1, int(day), hour, minute, second,
                             tzinfo=datetime.timezone.utc)


def _sans(leaf: dict) -> tuple[tuple[str, str], ...]:
    return leaf.get("subjectAltName", ())


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """net.ParseIP, with an IPv4-mapped IPv6 address equal to its IPv4 one (net.IP.Equal)."""
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _common_name(leaf: dict) -> str:
    """The subject's last commonName (pkix.Name keeps the last of each attribute it knows)."""
    names = [value for rdn in leaf.get("subject", ()) for key, value in rdn if key == "commonName"]
    return names[-1] if names else ""


def _lower_ascii(text: str) -> str:
    return "".join(c.lower() if "A" <= c <= "Z" else c for c in text)


def _split_hostname(host: str) -> list[str]:
    return _lower_ascii(host.removesuffix(".")).split(".")


def _match_hostnames(pattern: str, host_parts: list[str]) -> bool:
    """crypto/x509 matchHostnames: label by label, `*` allowed as the whole first label."""
    pattern = _lower_ascii(pattern)
    if not pattern or not host_parts:
        return False
    parts = pattern.split(".")
    if len(parts) != len(host_parts):
        return False
    return all((i == 0 and part == "*") or part == host_parts[i] for i, part in enumerate(parts))
