"""Data plane of cri-probe-shim: runs kubelet-exact probes inside one pod's network namespace.

Imports stay lean on purpose (asyncio, ssl, h11, h2, protobuf): workers are forked
from a preloaded zygote, and grpcio or the OpenTelemetry SDK here would cost
threads and megabytes per sandbox.
"""
