"""Go's net/url, as far as the kubelet's HTTP prober depends on it. Pure, no I/O.

The kubelet builds the probe URL with url.Parse, sends Go's RequestURI() on the
wire, resolves redirect Locations with URL.Parse and compares URL.Hostname();
its error messages quote URL.String(). Python's urllib differs from Go in each
of these (escaping sets, "first path segment" rule, dot-segment removal, error
texts), so the parts we need are ported here, function by function; the
percent-encoding itself is probes/http/url_escape.py's.

Go strings are byte strings: bytes that are not valid UTF-8 (say, in a Location
header) are carried in Python str as surrogate escapes and come back out intact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from probe_api.gostrings import go_quote
from probe_worker.probes.http.url_escape import (
    FRAGMENT, HOST, PATH, USER_PASSWORD, ZONE, URLError, escape, unescape, valid_encoded,
)


@dataclass(frozen=True)
class Userinfo:
    username: str
    password: str = ""
    password_set: bool = False

    def string(self) -> str:
        s = escape(self.username, USER_PASSWORD)
        if self.password_set:
            s += ":" + escape(self.password, USER_PASSWORD)
        return s


@dataclass(frozen=True)
class GoURL:
    """url.URL. `host` keeps the port (and brackets), as in Go."""

    scheme: str = ""
    opaque: str = ""
    user: Userinfo | None = None
    host: str = ""
    path: str = ""
    raw_path: str = ""
    omit_host: bool = False
    force_query: bool = False
    raw_query: str = ""
    fragment: str = ""
    raw_fragment: str = ""

    def escaped_path(self) -> str:
        if self.raw_path and valid_encoded(self.raw_path, PATH):
            try:
                if unescape(self.raw_path, PATH) == self.path:
                    return self.raw_path
            except URLError:
                pass
        if self.path == "*":
            return "*"
        return escape(self.path, PATH)

    def escaped_fragment(self) -> str:
        if self.raw_fragment and valid_encoded(self.raw_fragment, FRAGMENT):
            try:
                if unescape(self.raw_fragment, FRAGMENT) == self.fragment:
                    return self.raw_fragment
            except URLError:
                pass
        return escape(self.fragment, FRAGMENT)

    def string(self) -> str:
        """URL.String()."""
        buf = []
        if self.scheme:
            buf.append(self.scheme + ":")
        if self.opaque:
            buf.append(self.opaque)
        else:
            if self.scheme or self.host or self.user is not None:
                if not (self.omit_host and not self.host and self.user is None):
                    if self.host or self.path or self.user is not None:
                        buf.append("//")
                    if self.user is not None:
                        buf.append(self.user.string() + "@")
                    if self.host:
                        buf.append(escape(self.host, HOST))
            path = self.escaped_path()
            if path and path[0] != "/" and self.host:
                buf.append("/")
            if not buf and ":" in path.split("/", 1)[0]:
                # A relative path whose first segment has a colon would read as a scheme.
                buf.append("./")
            buf.append(path)
        if self.force_query or self.raw_query:
            buf.append("?" + self.raw_query)
        if self.fragment:
            buf.append("#" + self.escaped_fragment())
        return "".join(buf)

    def request_uri(self) -> str:
        """URL.RequestURI(): the request-target the Go client writes on the request line."""
        result = self.opaque
        if not result:
            result = self.escaped_path() or "/"
        elif result.startswith("//"):
            result = self.scheme + ":" + result
        if self.force_query or self.raw_query:
            result += "?" + self.raw_query
        return result

    def hostname(self) -> str:
        return split_host_port(self.host)[0]

    def port(self) -> str:
        return split_host_port(self.host)[1]

    def is_abs(self) -> bool:
        return self.scheme != ""

    def parse_reference(self, ref: str) -> "GoURL":
        """URL.Parse(ref): ref parsed, then resolved against this URL (RFC 3986 section 5.2)."""
        return self.resolve_reference(parse(ref))

    def resolve_reference(self, ref: "GoURL") -> "GoURL":
        url = ref
        if not ref.scheme:
            url = replace(url, scheme=self.scheme)
        if ref.scheme or ref.host or ref.user is not None:
            return _with_path(url, _resolve_path(ref.escaped_path(), ""))
        if ref.opaque:
            return replace(url, user=None, host="", path="", raw_path="")
        if not ref.path and not ref.force_query and not ref.raw_query:
            url = replace(url, raw_query=self.raw_query)
            if not ref.fragment:
                url = replace(url, fragment=self.fragment, raw_fragment=self.raw_fragment)
        if not ref.path and self.opaque:
            return replace(url, opaque=self.opaque, user=None, host="", path="", raw_path="")
        url = replace(url, host=self.host, user=self.user)
        return _with_path(url, _resolve_path(self.escaped_path(), ref.escaped_path()))

    def redacted_string(self) -> str:
        """net/http's stripPassword: the URL as error messages show it."""
        if self.user is not None and self.user.password_set:
            return self.string().replace(
                self.user.string() + "@", escape(self.user.username, USER_PASSWORD) + ":***@", 1
            )
        return self.string()


def split_host_port(host_port: str) -> tuple[str, str]:
    """net/url's splitHostPort (lenient, unlike net.SplitHostPort)."""
    host, port = host_port, ""
    colon = host.rfind(":")
    if colon != -1 and _valid_optional_port(host[colon:]):
        host, port = host[:colon], host[colon + 1:]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _valid_optional_port(port: str) -> bool:
    if port == "":
        return True
    return port[0] == ":" and all("0" <= c <= "9" for c in port[1:])


def _with_path(url: GoURL, escaped: str) -> GoURL:
    path = unescape(escaped, PATH)
    return replace(url, path=path, raw_path="" if escape(path, PATH) == escaped else escaped)


def _resolve_path(base: str, ref: str) -> str:
    """url.resolvePath: merge, then remove dot segments."""
    if ref == "":
        full = base
    elif ref[0] != "/":
        full = base[:base.rfind("/") + 1] + ref
    else:
        full = ref
    if full == "":
        return ""
    dst = "/"
    first = True
    elems = full.split("/")
    for elem in elems:
        if elem == ".":
            first = False
            continue
        if elem == "..":
            rest = dst[1:]
            index = rest.rfind("/")
            dst = "/"
            if index == -1:
                first = True
            else:
                dst += rest[:index]
        else:
            if not first:
                dst += "/"
            dst += elem
            first = False
    if elems[-1] in (".", ".."):
        dst += "/"
    if len(dst) > 1 and dst[1] == "/":
        dst = dst[1:]
    return dst


_SCHEME_FIRST = re.compile(r"[A-Za-z]")
_SCHEME_REST = re.compile(r"[A-Za-z0-9+\-.]")


def _get_scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if _SCHEME_FIRST.match(c):
            continue
        if _SCHEME_REST.match(c):
            if i == 0:
                return "", raw
            continue
        if c == ":":
            if i == 0:
                raise URLError("missing protocol scheme")
            return raw[:i], raw[i + 1:]
        return "", raw
    return "", raw


def _contains_ctl(s: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in s)


def parse(raw: str) -> GoURL:
    """url.Parse."""
    without_fragment, _, fragment = raw.partition("#")
    try:
        url = _parse(without_fragment)
    except URLError as exc:
        raise URLError(f"parse {go_quote(without_fragment)}: {exc}") from None
    if not fragment:
        return url
    try:
        frag = unescape(fragment, FRAGMENT)
    except URLError as exc:
        raise URLError(f"parse {go_quote(raw)}: {exc}") from None
    return replace(url, fragment=frag, raw_fragment="" if escape(frag, FRAGMENT) == fragment else fragment)


def _parse(raw: str) -> GoURL:
    if _contains_ctl(raw):
        raise URLError("net/url: invalid control character in URL")
    if raw == "*":
        return GoURL(path="*")
    scheme, rest = _get_scheme(raw)
    scheme = scheme.lower()
    force_query, raw_query = False, ""
    if rest.endswith("?") and rest.count("?") == 1:
        force_query, rest = True, rest[:-1]
    else:
        rest, _, raw_query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            return GoURL(scheme=scheme, opaque=rest, force_query=force_query, raw_query=raw_query)
        if ":" in rest.split("/", 1)[0]:
            raise URLError("first path segment in URL cannot contain colon")
    user, host, omit_host = None, "", False
    if (scheme or not rest.startswith("///")) and rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        user, host = _parse_authority(authority)
    elif scheme and rest.startswith("/"):
        omit_host = True
    url = GoURL(scheme=scheme, user=user, host=host, omit_host=omit_host, force_query=force_query, raw_query=raw_query)
    return _with_path(url, rest)


def _parse_authority(authority: str) -> tuple[Userinfo | None, str]:
    at = authority.rfind("@")
    host = _parse_host(authority[at + 1:] if at >= 0 else authority)
    if at < 0:
        return None, host
    userinfo = authority[:at]
    if not all(c.isascii() and (c.isalnum() or c in "-._:~!$&'()*+,;=%@") for c in userinfo):
        raise URLError("net/url: invalid userinfo")
    if ":" not in userinfo:
        return Userinfo(unescape(userinfo, USER_PASSWORD)), host
    name, _, password = userinfo.partition(":")
    return Userinfo(unescape(name, USER_PASSWORD), unescape(password, USER_PASSWORD), True), host


def _parse_host(host: str) -> str:
    if host.startswith("["):
        close = host.rfind("]")
        if close < 0:
            raise URLError("missing ']' in host")
        colon_port = host[close + 1:]
        if not _valid_optional_port(colon_port):
            raise URLError(f"invalid port {go_quote(colon_port)} after host")
        zone = host[:close].find("%25")
        if zone >= 0:
            return unescape(host[:zone], HOST) + unescape(host[zone:close], ZONE) + unescape(host[close:], HOST)
    else:
        colon = host.rfind(":")
        if colon != -1 and not _valid_optional_port(host[colon:]):
            raise URLError(f"invalid port {go_quote(host[colon:])} after host")
    return unescape(host, HOST)
