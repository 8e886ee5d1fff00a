"""Go net/url behaviour the HTTP probe relies on; expectations are Go's (url_test.go, RFC 3986 5.4)."""

import pytest

from probe_api.gostrings import go_quote
from probe_worker.probes.http.url import GoURL, URLError, Userinfo, parse, split_host_port
from probe_worker.probes.http.url_escape import PATH, escape, unescape


@pytest.mark.parametrize(
    "raw, fields",
    [
        ("http://www.google.com", dict(scheme="http", host="www.google.com")),
        ("http://www.google.com/", dict(scheme="http", host="www.google.com", path="/")),
        ("http://www.google.com/file%20one%26two",
         dict(scheme="http", host="www.google.com", path="/file one&two", raw_path="/file%20one%26two")),
        ("HTTP://x/", dict(scheme="http", host="x", path="/")),
        ("mailto:/webmaster@golang.org", dict(scheme="mailto", path="/webmaster@golang.org", omit_host=True)),
        ("mailto:webmaster@golang.org", dict(scheme="mailto", opaque="webmaster@golang.org")),
        ("/foo?query=http://bad", dict(path="/foo", raw_query="query=http://bad")),
        ("//foo", dict(host="foo")),
        ("//user@foo/path?a=b", dict(user=Userinfo("user"), host="foo", path="/path", raw_query="a=b")),
        ("http://%3Fam:pa%3Fsword@google.com",
         dict(scheme="http", user=Userinfo("?am", "pa?sword", True), host="google.com")),
        ("http://[fe80::1%25en0]:8080/", dict(scheme="http", host="[fe80::1%en0]:8080", path="/")),
        ("http://x/p?", dict(scheme="http", host="x", path="/p", force_query=True)),
        ("http://x/p?a?b", dict(scheme="http", host="x", path="/p", raw_query="a?b")),
        ("http://x/p#frag%20x", dict(scheme="http", host="x", path="/p", fragment="frag x")),
        ("*", dict(path="*")),
        ("healthz", dict(path="healthz")),
        ("", dict()),
    ],
)
def test_parse_matches_go(raw, fields):
    assert parse(raw) == GoURL(**fields)


@pytest.mark.parametrize(
    "raw, error",
    [
        ("http://[::1", 'parse "http://[::1": missing \']\' in host'),
        ("http://foo:bar/", 'parse "http://foo:bar/": invalid port ":bar" after host'),
        ("http://[::1]x/", 'parse "http://[::1]x/": invalid port "x" after host'),
        (":foo", 'parse ":foo": missing protocol scheme'),
        ("1a:b", 'parse "1a:b": first path segment in URL cannot contain colon'),
        ("/p\n", 'parse "/p\\n": net/url: invalid control character in URL'),
        ("/%zz", 'parse "/%zz": invalid URL escape "%zz"'),
        ("/%4", 'parse "/%4": invalid URL escape "%4"'),
        ("http://%41/", 'parse "http://%41/": invalid URL escape "%41"'),
        ("http://a b/", 'parse "http://a b/": invalid character " " in host name'),
        ("http://a<b@x/", 'parse "http://a<b@x/": net/url: invalid userinfo'),
        ("/p#%zz", 'parse "/p#%zz": invalid URL escape "%zz"'),
    ],
)
def test_parse_errors_carry_go_text(raw, error):
    with pytest.raises(URLError) as err:
        parse(raw)
    assert str(err.value) == error


@pytest.mark.parametrize(
    "raw",
    [
        "http://www.google.com/file%20one%26two",
        "http://x/a%2Fb",
        "mailto:/webmaster@golang.org",
        "http://[fe80::1%25en0]:8080/",
        "http://user:pass@x/p?q=1#f",
        "//foo/bar",
        "http://x/p?",
        "*",
    ],
)
def test_string_round_trips(raw):
    assert parse(raw).string() == raw


def test_string_escapes_path_and_adds_slash_before_relative_path_with_host():
    assert GoURL(scheme="http", host="x", path="a b").string() == "http://x/a%20b"
    assert GoURL(path="a:b").string() == "./a:b"


@pytest.mark.parametrize(
    "raw, uri",
    [
        ("http://x", "/"),
        ("http://x/p?x=1", "/p?x=1"),
        ("http://x/a%2Fb", "/a%2Fb"),
        ("http://x/a b", "/a%20b"),
        ("http://x/p?", "/p?"),
        ("http://x/p#frag", "/p"),
        ("http:opaque?q", "opaque?q"),
        ("http://x/é", "/%C3%A9"),
    ],
)
def test_request_uri(raw, uri):
    assert parse(raw).request_uri() == uri


def test_request_uri_of_scheme_relative_opaque():
    assert GoURL(scheme="http", opaque="//x/p").request_uri() == "http://x/p"


@pytest.mark.parametrize(
    "host_port, host, port",
    [
        ("10.0.0.1:8080", "10.0.0.1", "8080"),
        ("[fd00::2]:80", "fd00::2", "80"),
        ("[fd00::2]", "fd00::2", ""),
        ("example.com", "example.com", ""),
        ("example.com:", "example.com", ""),
        ("host:abc", "host:abc", ""),
    ],
)
def test_hostname_and_port(host_port, host, port):
    assert split_host_port(host_port) == (host, port)
    assert GoURL(host=host_port).hostname() == host


# RFC 3986 section 5.4, as in Go's resolveReferenceTests.
RFC3986_BASE = "http://a/b/c/d;p?q"


@pytest.mark.parametrize(
    "ref, expected",
    [
        ("g:h", "g:h"),
        ("g", "http://a/b/c/g"),
        ("./g", "http://a/b/c/g"),
        ("g/", "http://a/b/c/g/"),
        ("/g", "http://a/g"),
        ("//g", "http://g"),
        ("?y", "http://a/b/c/d;p?y"),
        ("g?y", "http://a/b/c/g?y"),
        ("#s", "http://a/b/c/d;p?q#s"),
        ("g#s", "http://a/b/c/g#s"),
        ("g?y#s", "http://a/b/c/g?y#s"),
        (";x", "http://a/b/c/;x"),
        ("g;x", "http://a/b/c/g;x"),
        ("g;x?y#s", "http://a/b/c/g;x?y#s"),
        ("", "http://a/b/c/d;p?q"),
        (".", "http://a/b/c/"),
        ("./", "http://a/b/c/"),
        ("..", "http://a/b/"),
        ("../", "http://a/b/"),
        ("../g", "http://a/b/g"),
        ("../..", "http://a/"),
        ("../../", "http://a/"),
        ("../../g", "http://a/g"),
        ("../../../g", "http://a/g"),
        ("../../../../g", "http://a/g"),
        ("/./g", "http://a/g"),
        ("/../g", "http://a/g"),
        ("g.", "http://a/b/c/g."),
        (".g", "http://a/b/c/.g"),
        ("g..", "http://a/b/c/g.."),
        ("..g", "http://a/b/c/..g"),
        ("./../g", "http://a/b/g"),
        ("./g/.", "http://a/b/c/g/"),
        ("g/./h", "http://a/b/c/g/h"),
        ("g/../h", "http://a/b/c/h"),
        ("g;x=1/./y", "http://a/b/c/g;x=1/y"),
        ("g;x=1/../y", "http://a/b/c/y"),
        ("g?y/./x", "http://a/b/c/g?y/./x"),
        ("g?y/../x", "http://a/b/c/g?y/../x"),
        ("g#s/./x", "http://a/b/c/g#s/./x"),
        ("g#s/../x", "http://a/b/c/g#s/../x"),
        ("http:g", "http:g"),
    ],
)
def test_resolve_reference_rfc3986(ref, expected):
    assert parse(RFC3986_BASE).parse_reference(ref).string() == expected


def test_resolve_keeps_port_and_ipv6_brackets():
    base = parse("http://[fd00:5a::2]:8080/a/b?q")
    assert base.parse_reference("/x").string() == "http://[fd00:5a::2]:8080/x"
    assert base.parse_reference("http://[fd00:5a::2]:9090/z").hostname() == "fd00:5a::2"


def test_redacted_string_hides_only_the_password():
    assert parse("http://user:secret@x/p").redacted_string() == "http://user:***@x/p"
    assert parse("http://user@x/p").redacted_string() == "http://user@x/p"


@pytest.mark.parametrize(
    "text, quoted",
    [
        ("http://x/", '"http://x/"'),
        ('a"b\\c', '"a\\"b\\\\c"'),
        ("tab\there\nnl", '"tab\\there\\nnl"'),
        ("\x00\x1b\x7f", '"\\x00\\x1b\\x7f"'),
        ("é日本", '"é日本"'),
        ("\u00a0\u200b", '"\\u00a0\\u200b"'),
        ("\U000e0001", '"\\U000e0001"'),
        (b"\xff\xfe".decode("utf-8", "surrogateescape"), '"\\xff\\xfe"'),
    ],
)
def test_go_quote(text, quoted):
    assert go_quote(text) == quoted


def test_escape_and_unescape_are_bytewise():
    assert escape("/a b?é", PATH) == "/a%20b%3F%C3%A9"
    assert unescape("/a%20b%3F%C3%A9", PATH) == "/a b?é"
    # Bytes that are not UTF-8 survive a round trip.
    assert escape(unescape("%FF", PATH), PATH) == "%FF"
