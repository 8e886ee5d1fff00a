"""The conversion rule on parsed Kubernetes objects: network probes and hooks bridged to the shim, and back. Pure:
dicts in, dicts out; no YAML, no I/O, no grpc.

Owns the rewrite rule and its inverse. In every pod spec (probe_api.workloads.POD_SPEC_PATHS: a Pod, a PodTemplate,
the template of a Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, ReplicationController, a CronJob's job
template; a List or *List walked item by item; other kinds pass through unchanged, with a note), in every container
of `containers` and `initContainers` (sidecars have probes):

    livenessProbe / readinessProbe / startupProbe with httpGet, tcpSocket or grpc  -> exec, role liveness ...
    lifecycle.postStart / lifecycle.preStop with httpGet or tcpSocket              -> exec, role postStart ...

The exec is `{command: command_for(role, {handlerKey: handlerObject})}` (probe_api/bridge_command.py), in the
handler key's place: every other field (initialDelaySeconds ... terminationGracePeriodSeconds) and the key order
stay as they were, so the kubelet keeps its timing and thresholds. exec and sleep handlers are left alone, marker
commands included, so converting twice changes nothing. `reverse=True` puts back every handler `handler_in` can
read; a marker command it cannot read (probectl's hand-written flag form) is left with a note.

What convert leaves, the API server still validates; what it rewrites, the API server no longer sees. So each
rewritten handler is validated here as the shim will validate the command (parse_command: RunProbe's rules, named
ports against the container's ports), and `host` is refused (blind SSRF, probe_api/request_rules.py HOST_GATE) unless
allow_host: the daemon refuses it too unless its config allows it. The pod's own loopback (`127.0.0.1`, `::1`,
`localhost`: probe_api.pod_loopback) is no such host inside the pod's netns and is converted as it is. A pod spec
with `hostNetwork: true` is left as it is, with a note: there the pod's netns is the node's, where the kubelet's
own probes already run, and the shim never probes the node's netns.

A pod (or template) with a handler rewritten also gets the annotation of its original handlers and a required
node affinity on the shim nodes' label (probe_api/bridged_pod.py); reverse takes both off. Messages name the path
in Kubernetes' field names (`spec.containers[0].readinessProbe.httpGet.host: Forbidden: ...`).

Two callers, two modes: `probectl convert` (probectl/convert.py: files, YAML, output) converts strictly, any
error meaning no output, as kubectl applies nothing from an invalid manifest (`convert_document`); the admission
webhook (shim/webhook/admission.py) converts leniently, leaving what it cannot convert and saying so, as it must
let such a pod through as it is rather than refuse it (`convert_object`). Both must write the same pod: hence one
rule, here in the contract, that neither side imports from the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api import bridged_pod
from probe_api.bridge_command import (
    HANDLER_KEYS, HOOK_HANDLER_KEYS, HOOK_ROLES, MARKER, PROBE_ROLES, BadArguments, command_for, handler_in,
    is_marker, parse_command,
)
from probe_api.gostrings import go_quote
from probe_api.manifest_handlers import InvalidField, shown
from probe_api.pod_loopback import is_pod_loopback
from probe_api.workloads import POD_SPEC_PATHS, find_pod_spec, json_kind, object_name, pod_holder

PROBE_FIELDS: dict[str, str] = {f"{role}Probe": role for role in PROBE_ROLES}  # livenessProbe -> liveness

# The wording of probe_api/request_rules.py HOST_GATE, for a manifest: here the gate is --allow-host, and behind it the daemon's.
HOST_FORBIDDEN = (
    "Forbidden: the host field makes the runtime connect to any address the node can reach "
    "(blind SSRF around NetworkPolicy, kubernetes#99425), and the shim refuses it unless its config sets "
    "allow_host_field = true. Probes run inside the pod: leave host empty for the pod IP, use 127.0.0.1, ::1 or "
    "localhost for the pod's own loopback, or convert with --allow-host where the daemon allows it"
)
HOST_NETWORK_NOTE = ("the pod uses the node's network namespace, where the kubelet's own probes already run and "
                     "the shim never probes (there 127.0.0.1 is the node's loopback): its probes and hooks are left "
                     "unchanged")

# Every handler key of core/v1 Probe and LifecycleHandler: two of them in one handler is the API's error, and the
# exec convert writes must not land beside another handler.
_PROBE_HANDLERS = ("exec", *HANDLER_KEYS)
_HOOK_HANDLERS = ("exec", *HOOK_HANDLER_KEYS, "sleep")
# Any valid timeout: the kubelet's timeoutSeconds stays in the probe, where the API server validates it.
_VALIDATION_TIMEOUT_MS = 1000


@dataclass
class Conversion:
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # lenient: what would have been an error, left unchanged
    probes: int = 0                 # probes rewritten (with reverse: restored)
    hooks: int = 0                  # lifecycle hooks rewritten (with reverse: restored)


@dataclass
class _Run:
    reverse: bool
    allow_host: bool
    result: Conversion
    node_affinity: bool = True
    lenient: bool = False

    def problem(self, text: str) -> None:
        """A handler (or pod) convert cannot rewrite: an error, or in lenient mode left unchanged and said so."""
        (self.result.left if self.lenient else self.result.errors).append(text)


def convert_document(obj: object, prefix: str, result: Conversion, *, reverse: bool = False,
                     allow_host: bool = False, node_affinity: bool = True) -> None:
    """Converts one parsed document in place, strictly: what cannot be converted is an error in `result`.
    `prefix` is where the document sits (`documents[2].` when the text has several, else "")."""
    _walk_object(obj, prefix, _Run(reverse, allow_host, result, node_affinity))


def convert_object(obj: dict, *, allow_host: bool = False) -> Conversion:
    """Converts one parsed object in place, leniently: a handler that cannot be converted (a host outside the pod,
    a port the shim would refuse, a field of the wrong type) is left as it is and said so in `left`, for the
    admission webhook, which must let such a pod through as it is rather than refuse it."""
    result = Conversion()
    _walk_object(obj, "", _Run(False, allow_host, result, lenient=True))
    return result


# --- objects and pod specs -------------------------------------------------------------------------------------

def _walk_object(obj: object, prefix: str, run: _Run) -> None:
    where = prefix.rstrip(".") or "the manifest"
    if not isinstance(obj, dict):
        run.result.errors.append(f"{where}: expected a Kubernetes object, got {json_kind(obj)}")
        return
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        run.result.errors.append(f"{prefix}kind: Required value: expected a Kubernetes object with its kind")
        return
    if kind.endswith("List") and kind not in POD_SPEC_PATHS:
        items = obj.get("items")
        if not isinstance(items, list):
            run.result.errors.append(f"{prefix}items: Invalid value: {shown(items)}: must be a list")
            return
        for index, item in enumerate(items):
            _walk_object(item, f"{prefix}items[{index}].", run)
        return
    if kind not in POD_SPEC_PATHS:
        run.result.notes.append(f"{where}: {kind} {go_quote(object_name(obj))} has no pod spec: left unchanged")
        return
    try:
        path, pod_spec = find_pod_spec(obj, kind, prefix)
    except InvalidField as exc:
        run.problem(str(exc))
        return
    holder = pod_holder(obj, kind)
    holder_path = path.rpartition(".")[0] if "." in path else prefix.rstrip(".")
    if run.reverse:
        _walk_pod_spec(pod_spec, path, run)
        bridged_pod.unmark(holder, pod_spec)
        return
    unwritable = bridged_pod.problems(holder, pod_spec)
    if unwritable:
        where = f"{holder_path}." if holder_path else ""
        run.problem(f"{where}{unwritable[0]}: Invalid value: must be a mapping (a list for nodeSelectorTerms): "
                    "a converted pod records its original handlers and needs a shim node there")
        return
    originals = _walk_pod_spec(pod_spec, path, run)
    if originals:
        bridged_pod.mark(holder, pod_spec, originals, node_affinity=run.node_affinity)


def _walk_pod_spec(pod_spec: dict, path: str, run: _Run) -> dict[str, dict]:
    """Rewrites the pod spec's handlers; returns the original of each it rewrote, by field path
    (`containers[web].readinessProbe`)."""
    originals: dict[str, dict] = {}
    # reverse goes on: a native handler is right in any netns.
    if pod_spec.get("hostNetwork") is True and not run.reverse:
        run.result.notes.append(f"{path}.hostNetwork: {HOST_NETWORK_NOTE}")
        return originals
    for group in ("initContainers", "containers"):
        containers = pod_spec.get(group)
        if containers is None:
            continue
        if not isinstance(containers, list):
            run.problem(f"{path}.{group}: Invalid value: {shown(containers)}: must be a list")
            continue
        for index, container in enumerate(containers):
            container_path = f"{path}.{group}[{index}]"
            if not isinstance(container, dict):
                run.problem(f"{container_path}: Invalid value: {shown(container)}: must be a container (a mapping)")
                continue
            name = container.get("name")
            key = f"{group}[{name if isinstance(name, str) and name else index}]"
            for field_path, original in _walk_container(container, container_path, run).items():
                originals[f"{key}.{field_path}"] = original
    return originals


def _walk_container(container: dict, path: str, run: _Run) -> dict[str, dict]:
    ports = _container_ports(container)
    originals: dict[str, dict] = {}
    for field_name, role in PROBE_FIELDS.items():
        if container.get(field_name) is not None:  # null is unset, as in the API
            original = _handler(container[field_name], f"{path}.{field_name}", role,
                                _PROBE_HANDLERS, HANDLER_KEYS, ports, run)
            if original is not None:
                run.result.probes += 1
                originals[field_name] = original
    lifecycle = container.get("lifecycle")
    if lifecycle is None:
        return originals
    if not isinstance(lifecycle, dict):
        run.problem(f"{path}.lifecycle: Invalid value: {shown(lifecycle)}: must be a mapping")
        return originals
    for role in HOOK_ROLES:
        if lifecycle.get(role) is not None:
            original = _handler(lifecycle[role], f"{path}.lifecycle.{role}", role,
                                _HOOK_HANDLERS, HOOK_HANDLER_KEYS, ports, run)
            if original is not None:
                run.result.hooks += 1
                originals[f"lifecycle.{role}"] = original
    return originals


def _container_ports(container: dict) -> list[spec_pb.ContainerPort]:
    """The named ports a probe may refer to; a malformed port is the API server's to refuse, it stays in place."""
    raw = container.get("ports")
    ports = []
    for port in raw if isinstance(raw, list) else ():
        if not isinstance(port, dict):
            continue
        name, number, protocol = port.get("name"), port.get("containerPort"), port.get("protocol")
        if isinstance(name, str) and isinstance(number, int) and not isinstance(number, bool) \
                and 0 < number < 2**31:
            ports.append(spec_pb.ContainerPort(name=name, container_port=number,
                                               protocol=protocol if isinstance(protocol, str) else "TCP"))
    return ports


# --- one probe or hook -----------------------------------------------------------------------------------------

def _handler(owner: object, path: str, role: str, all_keys: Sequence[str], bridged_keys: Sequence[str],
             ports: Sequence[spec_pb.ContainerPort], run: _Run) -> dict | None:
    """Rewrites (or restores) the handler of one probe or hook in place; the handler it replaced ({key: action}),
    or None when it left it."""
    if not isinstance(owner, dict):
        run.problem(f"{path}: Invalid value: {shown(owner)}: must be a mapping")
        return None
    present = [key for key in all_keys if key in owner]
    if len(present) > 1:
        # validateHandler's error, on the second handler; an exec could not take the first one's place.
        run.problem(f"{path}.{present[1]}: Forbidden: may not specify more than 1 handler type")
        return None
    if run.reverse:
        return _restore(owner, path, role, bridged_keys, run) if present == ["exec"] else None
    if not present or present[0] not in bridged_keys:
        return None  # exec (a marker command too) and sleep stay; no handler is the API server's error
    key = present[0]
    action = owner[key]
    handler_path = f"{path}.{key}"
    if not isinstance(action, dict):
        run.problem(f"{handler_path}: Invalid value: {shown(action)}: must be a mapping")
        return None
    host = action.get("host")
    if host and not run.allow_host and not (isinstance(host, str) and is_pod_loopback(host)):
        run.problem(f"{handler_path}.host: {HOST_FORBIDDEN}")
        return None
    try:
        command = command_for(role, {key: action})
    except (TypeError, ValueError) as exc:  # a YAML value JSON has no type for (a timestamp, binary)
        run.problem(f"{handler_path}: Invalid value: {exc}: must be JSON data (quote a YAML timestamp)")
        return None
    errors = _shim_errors(command, role, ports)
    if errors:
        for error in errors:
            run.problem(f"{path}.{error}")
        return None
    _rename_key(owner, key, "exec", {"command": command})
    return {key: action}


def _shim_errors(command: list[str], role: str, ports: Sequence[spec_pb.ContainerPort]) -> list[str]:
    """What the daemon will say of this command, relative to the probe (`httpGet.port: ...`). No gate: host was
    gated above, in the manifest's words (HOST_FORBIDDEN)."""
    if role in PROBE_ROLES:
        # The command as ExecSync delivers it: the kubelet's expansion turns command_for's `$$` back into `$`.
        command = [*command[:2], command[2].replace("$$", "$")]
    try:
        parse_command(command, ports=ports, timeout_ms=_VALIDATION_TIMEOUT_MS, gate=lambda spec: [])
    except BadArguments as exc:
        return exc.errors
    return []


def _restore(owner: dict, path: str, role: str, bridged_keys: Sequence[str], run: _Run) -> dict | None:
    action = owner["exec"]
    command = action.get("command") if isinstance(action, dict) else None
    if not isinstance(command, list) or not is_marker(command):
        return None  # a plain exec
    readable = set(action) == {"command"} and all(isinstance(arg, str) for arg in command)
    found = handler_in(command) if readable else None
    if found is None:
        run.result.notes.append(f"{path}.exec.command: a {MARKER} command that probectl convert did not write "
                                "(the hand-written flag form?): left unchanged")
        return None
    written_for, handler = found
    key, restored = next(iter(handler.items()))
    if written_for != role or key not in bridged_keys:
        run.result.notes.append(f"{path}.exec.command: a {MARKER} command for {written_for} {key}, "
                                f"not for this {role} handler: left unchanged")
        return None
    _rename_key(owner, "exec", key, restored)
    return handler


def _rename_key(mapping: dict, old: str, new: str, value: object) -> None:
    """mapping[old] becomes mapping[new] = value, in old's place: key order is part of an exact round trip."""
    items = [(new, value) if key == old else (key, item) for key, item in mapping.items()]
    mapping.clear()
    mapping.update(items)
