"""Which pod sandbox a container belongs to, who it is, and its ports: asked of the runtime, remembered.

The bridge gets only a container id from ExecSync. The runtime knows the rest, for every container, whether it was
created before the shim started or after a restart of the shim: CRI ListContainers filtered by that id gives the
sandbox id, the kubelet's labels (io.kubernetes.pod.name, .namespace, .uid, io.kubernetes.container.name) and
annotations, among them `io.kubernetes.container.ports`, the container's ports as the kubelet hands them to the
runtime (JSON of core/v1 ContainerPort), which resolve named probe ports as the kubelet resolves them.
(ContainerStatus carries the same labels and annotations but names the sandbox only in its runtime-specific
verbose info; ListContainers names it in a field of the CRI itself.)

None of this changes during a container's life, so an answer is remembered until its sandbox is stopped or
removed (`forget_sandbox`, from the CRI proxy), within a bound. Parsing is pure (`container_from_listing`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.rpc.client import CallError, Channel
from shim.sandboxes.resolver import RUNTIME_SERVICE, RuntimeUnavailable

POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
POD_UID_LABEL = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"
CONTAINER_PORTS_ANNOTATION = "io.kubernetes.container.ports"
MAX_REMEMBERED = 4096  # containers; a node runs at most a few hundred


class ContainerNotFound(Exception):
    """The runtime does not know the container."""


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    sandbox_id: str
    name: str
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""
    ports: tuple[spec_pb.ContainerPort, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()  # the kubelet's io.kubernetes.* labels, for the status board


def container_from_listing(container: cri_pb.Container) -> ContainerInfo:
    labels = container.labels
    return ContainerInfo(
        id=container.id,
        sandbox_id=container.pod_sandbox_id,
        name=labels.get(CONTAINER_NAME_LABEL) or container.metadata.name,
        pod_name=labels.get(POD_NAME_LABEL, ""),
        pod_namespace=labels.get(POD_NAMESPACE_LABEL, ""),
        pod_uid=labels.get(POD_UID_LABEL, ""),
        ports=ports_from_annotation(container.annotations.get(CONTAINER_PORTS_ANNOTATION, "")),
        labels=tuple(sorted((k, v) for k, v in labels.items() if k.startswith("io.kubernetes."))),
    )


def chosen_container(listed, container_id: str) -> cri_pb.Container | None:
    """The listed container that is the one asked for: the same id, or the only one whose id it prefixes (the
    runtime may match a unique prefix, as crictl allows). Anything else, e.g. a runtime that ignored the filter,
    is not an answer: probing another pod's container would be worse than not probing."""
    exact = [c for c in listed if c.id == container_id]
    if exact:
        return exact[0]
    prefixed = [c for c in listed if c.id.startswith(container_id)]
    return prefixed[0] if len(prefixed) == 1 and len(listed) == 1 else None


def ports_from_annotation(text: str) -> tuple[spec_pb.ContainerPort, ...]:
    """The kubelet's JSON list of ContainerPort; anything unreadable gives no ports (a named port then fails to
    resolve and says so), never an exception: the annotation is the runtime's data, not the caller's."""
    try:
        items = json.loads(text) if text else []
    except (ValueError, RecursionError):
        return ()
    ports = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        number = item.get("containerPort")
        if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 65536:
            continue
        name, protocol = item.get("name"), item.get("protocol")
        ports.append(spec_pb.ContainerPort(name=name if isinstance(name, str) else "", container_port=number,
                                           protocol=protocol if isinstance(protocol, str) else "TCP"))
    return tuple(ports)


class CriContainers:
    """`resolve(container_id)` over CRI ListContainers, remembered per sandbox (see the module)."""

    def __init__(self, channel: Channel, *, timeout_s: float = 5.0,
                 max_remembered: int = MAX_REMEMBERED) -> None:
        self._timeout_s = timeout_s
        self._max = max_remembered
        self._known: OrderedDict[str, ContainerInfo] = OrderedDict()
        self._list = channel.unary_unary(
            f"{RUNTIME_SERVICE}/ListContainers",
            request_serializer=cri_pb.ListContainersRequest.SerializeToString,
            response_deserializer=cri_pb.ListContainersResponse.FromString,
        )

    async def resolve(self, container_id: str) -> ContainerInfo:
        info = self._known.get(container_id)
        if info is not None:
            self._known.move_to_end(container_id)  # least recently used goes first
            return info
        if not container_id:  # an empty id filter would list every container
            raise ContainerNotFound(container_id)
        request = cri_pb.ListContainersRequest(filter=cri_pb.ContainerFilter(id=container_id))
        try:
            response = await self._list(request, timeout=self._timeout_s)
        except CallError as exc:
            raise RuntimeUnavailable(f"ListContainers({container_id}): {exc}") from None
        found = chosen_container(response.containers, container_id)
        if found is None:
            raise ContainerNotFound(container_id)
        info = container_from_listing(found)
        self._known[container_id] = info
        if len(self._known) > self._max:
            self._known.popitem(last=False)
        return info

    def forget_sandbox(self, sandbox_id: str) -> None:
        for container_id in [cid for cid, info in self._known.items() if info.sandbox_id == sandbox_id]:
            del self._known[container_id]

    def __len__(self) -> int:
        return len(self._known)
