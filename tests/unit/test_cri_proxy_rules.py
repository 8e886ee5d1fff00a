"""The CRI proxy's pure rules (shim/cri/proxy.py), tested alone: which paths it takes and as what kind of call, which
metadata it forwards, which calls are sandbox events, which endpoint forms it dials, the kubelet's channel options."""

from __future__ import annotations

import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.endpoints import upstream_target
from shim.cri import proxy as cri_proxy
from tests.support.cri_proxy_rig import (
    ALL_PATHS, FACTS_IMAGE, FACTS_RUNTIME, FACTS_STREAMING, IMAGE, RUNTIME, unknown_fields,
)


def test_method_lists_match_the_cri_wire_facts():
    assert list(cri_proxy.RUNTIME_METHODS) == FACTS_RUNTIME
    assert list(cri_proxy.IMAGE_METHODS) == FACTS_IMAGE
    assert set(cri_proxy.STREAMING_METHODS) == FACTS_STREAMING
    assert list(cri_proxy.KNOWN_PATHS) == ALL_PATHS


@pytest.mark.parametrize("path, method", [
    (f"{RUNTIME}/Version", "Version"),
    (f"{IMAGE}/PullImage", "PullImage"),
    (f"{RUNTIME}/SomeFutureMethod", "SomeFutureMethod"),
    (f"{RUNTIME}/", None),
    (f"{RUNTIME}/a/b", None),
    ("/runtime.v1alpha2.RuntimeService/Version", None),  # kubelet 1.32 speaks v1 only
    ("/runtime.v1.RuntimeServiceX/Version", None),
    ("/runtime.probe.v1alpha1.ProbeService/RunProbe", None),
    ("/grpc.health.v1.Health/Check", None),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", None),
    ("", None),
])
def test_cri_method(path, method):
    assert cri_proxy.cri_method(path) == method


def test_unknown_methods_are_relayed_as_streams():
    assert cri_proxy.forwards_as_stream("GetContainerEvents")
    assert not cri_proxy.forwards_as_stream("ListContainers")
    # A method newer than the list: the stream relay carries both a unary and a streaming answer.
    assert cri_proxy.forwards_as_stream("SomeFutureMethod")


def test_forwardable_metadata_drops_transport_keys_only():
    incoming = (
        ("user-agent", "grpc-go/1.68.0"), (":authority", "localhost"), ("te", "trailers"),
        ("content-type", "application/grpc"), ("grpc-timeout", "2S"), ("grpc-accept-encoding", "gzip"),
        ("x-a", "1"), ("x-a", "2"), ("x-b-bin", b"\x00\x01"), ("traceparent", "00-ab-cd-01"),
        ("grpc-trace-bin", b"\x00"),
    )
    assert cri_proxy.forwardable_metadata(incoming) == (
        ("x-a", "1"), ("x-a", "2"), ("x-b-bin", b"\x00\x01"), ("traceparent", "00-ab-cd-01"),
        ("grpc-trace-bin", b"\x00"),
    )
    assert cri_proxy.forwardable_metadata(None) == ()


def test_sandbox_event_reads_only_stop_and_remove():
    stop = cri_pb.StopPodSandboxRequest(pod_sandbox_id="sb-1").SerializeToString()
    remove = cri_pb.RemovePodSandboxRequest(pod_sandbox_id="sb-2").SerializeToString()
    assert cri_proxy.sandbox_event(f"{RUNTIME}/StopPodSandbox", stop) == ("stop", "sb-1")
    assert cri_proxy.sandbox_event(f"{RUNTIME}/RemovePodSandbox", remove) == ("remove", "sb-2")
    assert cri_proxy.sandbox_event(f"{RUNTIME}/StopPodSandbox", stop + unknown_fields()) == ("stop", "sb-1")
    assert cri_proxy.sandbox_event(f"{RUNTIME}/PodSandboxStatus", stop) is None
    assert cri_proxy.sandbox_event(f"{RUNTIME}/StopPodSandbox", b"") is None      # no id: nothing to stop
    assert cri_proxy.sandbox_event(f"{RUNTIME}/StopPodSandbox", b"\xff\xff") is None  # undecodable


@pytest.mark.parametrize("endpoint, target", [
    ("unix:///run/containerd/containerd.sock", "unix:/run/containerd/containerd.sock"),
    ("unix:/run/containerd/containerd.sock", "unix:/run/containerd/containerd.sock"),
    ("/run/containerd/containerd.sock", "unix:/run/containerd/containerd.sock"),
    ("127.0.0.1:10010", "127.0.0.1:10010"),
    ("tcp://127.0.0.1:10010", "127.0.0.1:10010"),
    ("localhost:10010", "localhost:10010"),
    ("[::1]:10010", "[::1]:10010"),
    (" unix:///run/x.sock\n", "unix:/run/x.sock"),
])
def test_upstream_target(endpoint, target):
    assert upstream_target(endpoint) == target


@pytest.mark.parametrize("endpoint", ["", "none", "unix://", "unix:", "unix://run/x.sock", "npipe:////./pipe/x",
                                      "http://127.0.0.1:80", "containerd.sock"])
def test_upstream_target_rejects(endpoint):
    with pytest.raises(ValueError, match="runtime endpoint"):
        upstream_target(endpoint)


