"""What a kubelet HTTP lifecycle hook decides beyond a probe's request, as pure functions. No I/O.

A hook (pkg/kubelet/lifecycle/handlers.go runHTTPHandler, ConsistentHTTPGetHandlers) builds
the probe's request with User-Agent kube-lifecycle/V and sends it with the kubelet's lifecycle
client (request.LIFECYCLE_TRANSPORT: keep-alives and compression on), the same redirect
checker, and no timeout of its own (the worker bounds it by the spec's timeout). Then:
  - any response is success, and its body is discarded (`hook_response_outcome`,
    `hook_discard_budget`, with Go's view of the length, response.response_length);
  - an HTTPS hook answered in plain HTTP is sent once more over http (`lifecycle_fallback`),
    and only a retry that got a response replaces the first error (`fallback_wins`).
"""

from __future__ import annotations

from dataclasses import replace

from probe_worker.attempt import SUCCESS
from probe_worker.go_errors import SCHEME_MISMATCH
from probe_worker.probes.http.request import ProbeRequest
from probe_worker.probes.http.response import MAX_BODY_BYTES


def hook_response_outcome(status: int) -> tuple[int, str]:
    """handlers.go runHTTPHandler: a hook that got any response succeeded; status and body are ignored.

    (1xx responses never get here: the transport skips them, as for probes.)
    """
    return SUCCESS, ""


def hook_discard_budget(content_length: int | None) -> int:
    """handlers.go discardHTTPRespBody: up to 10 KiB of the body is read, and only when Content-Length <= 10 KiB.

    `content_length` is Go's (`response_length`): an unknown one counts as small. Go reads
    10 KiB of a body it decompresses, the worker 10 KiB of raw bytes: only timing differs.
    Read errors do not matter.
    """
    if content_length is None or content_length <= MAX_BODY_BYTES:
        return MAX_BODY_BYTES
    return 0


def lifecycle_fallback(sent: ProbeRequest, cause: str | None) -> ProbeRequest | None:
    """handlers.go: a hook whose error says the server answered HTTPS in plain HTTP is sent once more over http.

    isHTTPResponseError looks for SCHEME_MISMATCH in the url.Error's own error (`cause`),
    whatever the scheme of the request (an https redirect hop may be the one answered in
    plain HTTP); the retry is always a clone of the first request with scheme http and no
    Authorization header (URL credentials still become one, as in any Client.send).
    None: no retry.
    """
    if cause is None or SCHEME_MISMATCH not in cause:
        return None
    header = sent.header.copy()
    header.delete("Authorization")
    return replace(sent, url=replace(sent.url, scheme="http"), header=header)


def fallback_wins(retry_result: int) -> bool:
    """`if httpErr == nil { err = nil }`: only a retry that got a response replaces the first error."""
    return retry_result == SUCCESS
