"""TCP socket probe as the kubelet 1.37 runs it (pkg/probe/tcp).

Success iff a connection is established within the timeout; the connection is
closed at once and nothing is sent. A failure's output is the Go dial error,
e.g. `dial tcp 10.0.0.1:80: connect: connection refused` or `...: i/o timeout`.

A tcpSocket lifecycle hook (ctx.lifecycle_hook) means the same. The kubelet itself
refuses one at run time ("invalid handler"); the shim gives it the obvious meaning
of KEP-4559's LifecycleHandler v2: the hook succeeds iff the connection is made.
"""

from __future__ import annotations

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.attempt import FAILURE, SUCCESS, AttemptContext, Endpoint, Outcome
from probe_worker.connect import ConnectError, close_quietly, connect


async def probe(spec: spec_pb.ProbeSpec, endpoint: Endpoint, ctx: AttemptContext) -> Outcome:
    try:
        sock, address = await connect(endpoint, ctx)
    except ConnectError as exc:
        return Outcome(FAILURE, str(exc)).bounded()
    close_quietly(sock)
    return Outcome(SUCCESS, "", address=address)
