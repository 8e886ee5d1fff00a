"""A fake container runtime with one pod sandbox, for the daemon's CRI-mode tests.

It answers the CRI calls the shim itself makes (Version, PodSandboxStatus verbose with
containerd's info layout, ListPodSandbox) and changes state on StopPodSandbox and
RemovePodSandbox, so the shim's reaction to calls it proxies can be seen. Everything
else is UNIMPLEMENTED. Prints `READY 0` once serving; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb

RUNTIME = "/runtime.v1.RuntimeService/"


class Runtime:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state: int | None = cri_pb.SANDBOX_READY  # None: removed

    def status(self, sandbox_id: str) -> cri_pb.PodSandboxStatusResponse | None:
        if sandbox_id != self.args.sandbox_id or self.state is None:
            return None
        ips = self.args.ip
        status = cri_pb.PodSandboxStatus(
            id=sandbox_id, state=self.state, created_at=1,
            metadata=cri_pb.PodSandboxMetadata(name=self.args.name, namespace=self.args.namespace, uid=self.args.uid),
            network=cri_pb.PodSandboxNetworkStatus(ip=ips[0], additional_ips=[cri_pb.PodIP(ip=i) for i in ips[1:]]),
        )
        info = {"pid": 0, "runtimeSpec": {"linux": {"namespaces": [{"type": "network", "path": self.args.netns}]}}}
        return cri_pb.PodSandboxStatusResponse(status=status, info={"info": json.dumps(info)})

    async def handle(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if method == "Version":
            return cri_pb.VersionResponse(version="0.1.0", runtime_name="fake-runtime", runtime_version="9.9",
                                          runtime_api_version="v1").SerializeToString()
        if method == "PodSandboxStatus":
            answer = self.status(cri_pb.PodSandboxStatusRequest.FromString(request).pod_sandbox_id)
            if answer is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, "an error occurred when try to find sandbox: not found")
            return answer.SerializeToString()
        if method == "ListPodSandbox":
            items = [] if self.state is None else [cri_pb.PodSandbox(id=self.args.sandbox_id, state=self.state)]
            return cri_pb.ListPodSandboxResponse(items=items).SerializeToString()
        if method == "StopPodSandbox":
            if self.state is not None:
                self.state = cri_pb.SANDBOX_NOTREADY
            return b""
        if method == "RemovePodSandbox":
            self.state = None
            return b""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"fake runtime does not implement {method}")


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def service(self, details):
        if not details.method.startswith(RUNTIME):
            return None
        method = details.method[len(RUNTIME):]

        async def unary(request, context):
            return await self.runtime.handle(method, request, context)

        return grpc.unary_unary_rpc_method_handler(unary)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--sandbox-id", required=True)
    parser.add_argument("--netns", required=True)
    parser.add_argument("--ip", action="append", required=True)
    parser.add_argument("--name", default="web-0")
    parser.add_argument("--namespace", default="shop")
    parser.add_argument("--uid", default="uid-1")
    args = parser.parse_args()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_Handler(Runtime(args)),))
    server.add_insecure_port(f"unix://{args.socket}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY 0", flush=True)
    await stop.wait()
    await server.stop(None)


if __name__ == "__main__":
    asyncio.run(main())
