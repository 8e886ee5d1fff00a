"""The HTTP probe executor's test harness: a spec, one attempt against a loopback server, the expected head.

Shared by tests/test_http_probe*.py (in-process, TLS, through a worker in a pod netns)."""

from __future__ import annotations

import asyncio

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import KUBELET_VERSION
from probe_worker.attempt import AttemptContext, Endpoint, Outcome
from probe_worker.deadline import AttemptDeadline
from probe_worker.probes.http import executor as http
from tests.support.servers.http_server import HTTPTestServer

UA = f"kube-probe/{KUBELET_VERSION}"


def http_spec(path: str, port: int = 0, headers=(), scheme=spec_pb.HTTP, protocol=spec_pb.HTTP1,
              **spec_fields) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(
        http_get=spec_pb.HTTPGetAction(
            path=path,
            port=spec_pb.PortRef(number=port),
            scheme=scheme,
            protocol=protocol,
            http_headers=[spec_pb.HTTPHeader(name=n, value=v) for n, v in headers],
        ),
        **spec_fields,
    )


async def run_probe(path, port, *, host="127.0.0.1", addresses=None, timeout=2.0, headers=(), scheme=spec_pb.HTTP,
                    protocol=spec_pb.HTTP1):
    """One attempt; returns (outcome, ctx, seconds taken)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # The attempt's one timer, as the prober gives it (probe_worker/deadline.py).
    timer = AttemptDeadline(deadline)
    ctx = AttemptContext(deadline=deadline, timeout_ns=int(timeout * 1e9), user_agent=UA, timer=timer)
    endpoint = Endpoint(host=host, addresses=(host,) if addresses is None else addresses, port=port)
    started = loop.time()
    try:
        outcome = await http.probe(http_spec(path, headers=headers, scheme=scheme, protocol=protocol), endpoint, ctx)
    finally:
        timer.close()
    return outcome, ctx, loop.time() - started


def probe_once(path, server_factory=HTTPTestServer, **kw) -> tuple[Outcome, AttemptContext, float, HTTPTestServer]:
    async def go():
        async with server_factory() as server:
            outcome, ctx, took = await run_probe(path, server.port, **kw)
        return outcome, ctx, took, server

    return asyncio.run(go())


def phase_names(phases) -> list[str]:
    return [p.name for p in phases]


def default_head(target: str, host: str) -> str:
    return (
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {UA}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )
