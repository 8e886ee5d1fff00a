"""Which sandbox a container belongs to, who it is and its ports (shim/bridge/containers.py).

The pure part reads a CRI Container as the kubelet labels and annotates it (pkg/kubelet/kuberuntime/labels.go:
newContainerLabels sets io.kubernetes.pod.name, .pod.namespace, .pod.uid and io.kubernetes.container.name;
newContainerAnnotations sets io.kubernetes.container.ports to json.Marshal(container.Ports) when there are any,
fields with `omitempty` left out). `CriContainers` is driven against the fake runtime of tests/support/fake_cri.py over a
real unix socket, as tests/unit/test_cri_proxy_relay.py does; waits are bounded, never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.bridge.containers import (
    ContainerInfo, ContainerNotFound, CriContainers, container_from_listing, ports_from_annotation,
)
from shim.rpc.client import Channel
from shim.sandboxes.resolver import RuntimeUnavailable
from tests.support.fake_cri import Block, Fail, FakeCri, Respond

LIST_CONTAINERS = "/runtime.v1.RuntimeService/ListContainers"
BOUND = 10.0
PORTS_JSON = '[{"name":"http","containerPort":8080,"protocol":"TCP"}]'  # json.Marshal([]v1.ContainerPort)


def kubelet_container(container_id: str, sandbox_id: str, name: str = "app", pod: str = "web-0",
                      namespace: str = "shop", uid: str = "6f1c", ports: str | None = PORTS_JSON,
                      extra_labels: dict[str, str] | None = None) -> cri_pb.Container:
    """A container as the kubelet creates it through CRI (labels.go newContainerLabels/newContainerAnnotations)."""
    annotations = {"io.kubernetes.container.hash": "5f1b2c3d", "io.kubernetes.container.restartCount": "0",
                   "io.kubernetes.container.terminationMessagePath": "/dev/termination-log"}
    if ports is not None:
        annotations["io.kubernetes.container.ports"] = ports
    return cri_pb.Container(
        id=container_id, pod_sandbox_id=sandbox_id,
        metadata=cri_pb.ContainerMetadata(name=name, attempt=0),
        labels={"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": namespace,
                "io.kubernetes.pod.uid": uid, "io.kubernetes.container.name": name, **(extra_labels or {})},
        annotations=annotations,
    )


def listing(*containers: cri_pb.Container) -> bytes:
    return cri_pb.ListContainersResponse(containers=containers).SerializeToString()


# ---------------------------------------------------------------- container_from_listing


def test_a_kubelet_container_is_read_from_its_labels_and_annotations():
    info = container_from_listing(kubelet_container("c1", "sb1", extra_labels={"app": "web"}))
    assert info == ContainerInfo(
        id="c1", sandbox_id="sb1", name="app", pod_name="web-0", pod_namespace="shop", pod_uid="6f1c",
        ports=(spec_pb.ContainerPort(name="http", container_port=8080, protocol="TCP"),),
        labels=(("io.kubernetes.container.name", "app"), ("io.kubernetes.pod.name", "web-0"),
                ("io.kubernetes.pod.namespace", "shop"), ("io.kubernetes.pod.uid", "6f1c")),
    )


def test_without_kubelet_labels_the_name_is_the_metadatas_and_the_pod_is_unknown():
    # A container created by crictl or another CRI client: no io.kubernetes.* labels, no ports annotation.
    bare = cri_pb.Container(id="c2", pod_sandbox_id="sb2", metadata=cri_pb.ContainerMetadata(name="sidecar"),
                            labels={"team": "a"})
    assert container_from_listing(bare) == ContainerInfo(id="c2", sandbox_id="sb2", name="sidecar")


def test_an_empty_container_name_label_falls_back_to_the_metadata_name():
    container = kubelet_container("c3", "sb3", name="app")
    container.labels["io.kubernetes.container.name"] = ""
    assert container_from_listing(container).name == "app"


def test_the_container_name_label_wins_over_the_metadata_name():
    container = kubelet_container("c4", "sb4", name="app")
    container.metadata.name = "something-else"
    assert container_from_listing(container).name == "app"


def test_only_the_kubelets_labels_are_kept_for_the_board():
    info = container_from_listing(kubelet_container("c5", "sb5", extra_labels={
        "io.kubernetes.pod.terminationGracePeriod": "30", "annotation.io.kubernetes.x": "no", "z": "no"}))
    assert [key for key, _ in info.labels] == sorted(
        ["io.kubernetes.container.name", "io.kubernetes.pod.name", "io.kubernetes.pod.namespace",
         "io.kubernetes.pod.uid", "io.kubernetes.pod.terminationGracePeriod"])


# ---------------------------------------------------------------- ports_from_annotation


@pytest.mark.parametrize("text, ports", [
    (PORTS_JSON, [("http", 8080, "TCP")]),
    # hostPort and hostIP present when set (omitempty), unnamed ports (name omitempty), every protocol.
    ('[{"name":"http","hostPort":80,"containerPort":8080,"protocol":"TCP"},'
     '{"containerPort":9090,"protocol":"UDP"},'
     '{"name":"sctp-port","containerPort":7777,"protocol":"SCTP","hostIP":"127.0.0.1"}]',
     [("http", 8080, "TCP"), ("", 9090, "UDP"), ("sctp-port", 7777, "SCTP")]),
    ('[{"name":"min","containerPort":1,"protocol":"TCP"},{"name":"max","containerPort":65535,"protocol":"TCP"}]',
     [("min", 1, "TCP"), ("max", 65535, "TCP")]),
], ids=["kubelet", "host-port-unnamed-protocols", "range-ends"])
def test_the_kubelets_ports_annotation_is_read(text, ports):
    assert ports_from_annotation(text) == tuple(
        spec_pb.ContainerPort(name=name, container_port=number, protocol=protocol) for name, number, protocol in ports)


def test_a_port_without_protocol_is_tcp():
    # SetDefaults_ContainerPort: the API server fills TCP in; an older or hand-made annotation may lack it.
    assert ports_from_annotation('[{"name":"web","containerPort":80}]') == (
        spec_pb.ContainerPort(name="web", container_port=80, protocol="TCP"),)


@pytest.mark.parametrize("text", [
    "", "not json", "{", "{}", "null", "true", "8080", '"[]"', "[]", '{"containerPort":80}',
    '[1, "x", null, [], true]',
    '[{"containerPort":"8080"}]', '[{"containerPort":true}]', '[{"containerPort":0}]', '[{"containerPort":-1}]',
    '[{"containerPort":65536}]', '[{"containerPort":8080.5}]', '[{"containerPort":8080.0}]',
    '[{"containerPort":1e400}]', '[{"containerPort":NaN}]', '[{"containerPort":null}]', '[{"name":"web"}]',
    '[{"containerPort":' + "9" * 5000 + "}]", "\x00", "[" * 50 + "]" * 50, '"\\ud800"', "\ufeff[]",
])
def test_garbage_annotations_give_no_ports_and_never_raise(text):
    assert ports_from_annotation(text) == ()


def test_garbage_fields_of_a_usable_port_are_ignored_and_good_ports_kept():
    text = json.dumps([{"name": 5, "containerPort": 80, "protocol": 7}, {"containerPort": "x"},
                       {"name": "ok", "containerPort": 81, "protocol": "UDP", "extra": {"a": [1]}}, "junk"])
    assert ports_from_annotation(text) == (
        spec_pb.ContainerPort(name="", container_port=80, protocol="TCP"),
        spec_pb.ContainerPort(name="ok", container_port=81, protocol="UDP"))


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=20)
port_like = st.fixed_dictionaries({}, optional={"name": json_values, "containerPort": json_values,
                                                "protocol": json_values, "hostPort": json_values})


@given(text=st.text() | json_values.map(json.dumps) | st.lists(port_like | json_values).map(json.dumps))
def test_any_annotation_is_read_without_raising(text):
    for port in ports_from_annotation(text):
        assert 1 <= port.container_port <= 65535 and port.protocol


def test_a_deeply_nested_annotation_does_not_raise():
    assert ports_from_annotation("[" * 100_000 + "]" * 100_000) == ()


# ---------------------------------------------------------------- CriContainers over a real socket


@pytest.fixture
def sockdir():
    path = Path(tempfile.mkdtemp(prefix="bridgecnt-"))  # short: a unix socket path has 108 bytes at most
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


@contextlib.asynccontextmanager
async def runtime(sockdir: Path, **kwargs: Any) -> AsyncIterator[tuple[FakeCri, CriContainers]]:
    fake = FakeCri(str(sockdir / "cri.sock"))
    async with fake:
        channel = Channel(fake.target)
        try:
            yield fake, CriContainers(channel, **kwargs)
        finally:
            await channel.close()


def asked_ids(fake: FakeCri) -> list[str]:
    assert all(received.method == LIST_CONTAINERS for received in fake.received)
    return [cri_pb.ListContainersRequest.FromString(received.request).filter.id for received in fake.received]


def test_resolve_lists_the_one_container_and_reads_it(sockdir):
    async def scenario():
        async with runtime(sockdir, timeout_s=4.0) as (fake, containers):
            fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container("c1", "sb1"))))
            info = await containers.resolve("c1")
            assert info == container_from_listing(kubelet_container("c1", "sb1"))
            (received,) = fake.received
            assert cri_pb.ListContainersRequest.FromString(received.request) == cri_pb.ListContainersRequest(
                filter=cri_pb.ContainerFilter(id="c1"))
            # Bounded by timeout_s; grpc rounds a propagated deadline up, so a few ms above 4 s are the same bound.
            assert 3.0 < received.time_remaining <= 4.1

    run(scenario())


def test_a_second_resolve_is_answered_from_memory(sockdir):
    async def scenario():
        async with runtime(sockdir) as (fake, containers):
            fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container("c1", "sb1"))))
            first = await containers.resolve("c1")
            assert await containers.resolve("c1") is first
            assert asked_ids(fake) == ["c1"]
            assert len(containers) == 1

    run(scenario())


def test_the_exact_id_is_taken_among_several_answers(sockdir):
    async def scenario():
        async with runtime(sockdir) as (fake, containers):
            fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container("c10", "sbX", name="other"),
                                                     kubelet_container("c1", "sb1", name="app"))))
            info = await containers.resolve("c1")
            assert (info.id, info.sandbox_id, info.name) == ("c1", "sb1", "app")

    run(scenario())


def test_a_unique_prefix_resolves_to_the_runtimes_container_and_is_remembered_as_asked(sockdir):
    full = "4f2a" + "0" * 60

    async def scenario():
        async with runtime(sockdir) as (fake, containers):
            fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container(full, "sb1"))))
            info = await containers.resolve("4f2a")
            assert info.id == full
            assert (await containers.resolve("4f2a")) is info and asked_ids(fake) == ["4f2a"]

    run(scenario())


def test_an_unknown_container_is_not_found_and_not_remembered(sockdir):
    async def scenario():
        async with runtime(sockdir) as (fake, containers):
            fake.on(LIST_CONTAINERS, Respond(listing()))
            for _ in range(2):
                with pytest.raises(ContainerNotFound):
                    await containers.resolve("gone")
            assert asked_ids(fake) == ["gone", "gone"]  # it may exist by the next call
            assert len(containers) == 0

    run(scenario())


def test_an_empty_id_never_lists_every_container(sockdir):
    async def scenario():
        async with runtime(sockdir) as (fake, containers):
            fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container("c1", "sb1"))))
            with pytest.raises(ContainerNotFound):
                await containers.resolve("")
            assert fake.received == []

    run(scenario())


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN])
def test_a_runtime_error_is_runtime_unavailable(sockdir, code):
    async def scenario():
        async with runtime(sockdir) as (fake, containers):
            fake.on(LIST_CONTAINERS, Fail(code, "containerd is restarting"))
            with pytest.raises(RuntimeUnavailable) as caught:
                await containers.resolve("c1")
            assert str(caught.value) == f"ListContainers(c1): {code.name}: containerd is restarting"
            assert len(containers) == 0

    run(scenario())


def test_a_runtime_that_does_not_answer_in_time_is_runtime_unavailable(sockdir):
    async def scenario():
        async with runtime(sockdir, timeout_s=0.2) as (fake, containers):
            fake.on(LIST_CONTAINERS, Block())
            with pytest.raises(RuntimeUnavailable, match=r"^ListContainers\(c1\): DEADLINE_EXCEEDED: "):
                await containers.resolve("c1")
            await asyncio.wait_for(fake.cancelled.wait(), BOUND)  # the runtime's call ended too

    run(scenario())


def test_a_runtime_that_is_not_there_is_runtime_unavailable(sockdir):
    async def scenario():
        channel = Channel(f"unix:{sockdir / 'nobody.sock'}")
        try:
            with pytest.raises(RuntimeUnavailable, match=r"^ListContainers\(c1\): UNAVAILABLE: "):
                await CriContainers(channel, timeout_s=BOUND).resolve("c1")
        finally:
            await channel.close()

    run(scenario())


def test_forget_sandbox_drops_only_that_sandboxs_containers(sockdir):
    async def scenario():
        async with runtime(sockdir) as (fake, containers):
            for cid, sandbox in (("a1", "sbA"), ("a2", "sbA"), ("b1", "sbB")):
                fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container(cid, sandbox))))
                await containers.resolve(cid)
            containers.forget_sandbox("sbA")
            assert len(containers) == 1
            await containers.resolve("b1")  # still remembered
            assert asked_ids(fake) == ["a1", "a2", "b1"]
            fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container("a1", "sbA"))))
            await containers.resolve("a1")  # asked again
            assert asked_ids(fake) == ["a1", "a2", "b1", "a1"]
            containers.forget_sandbox("no-such-sandbox")
            assert len(containers) == 2

    run(scenario())


def test_memory_is_bounded_oldest_first(sockdir):
    async def scenario():
        async with runtime(sockdir, max_remembered=2) as (fake, containers):
            for cid in ("c1", "c2", "c3"):
                fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container(cid, "sb"))))
                await containers.resolve(cid)
            assert len(containers) == 2
            await containers.resolve("c3")
            await containers.resolve("c2")
            assert asked_ids(fake) == ["c1", "c2", "c3"]
            fake.on(LIST_CONTAINERS, Respond(listing(kubelet_container("c1", "sb"))))
            await containers.resolve("c1")
            assert asked_ids(fake) == ["c1", "c2", "c3", "c1"]

    run(scenario())
