"""Where a pod spec sits in each kind of Kubernetes object, as a manifest or an admission request holds it. Pure.

Owns: POD_SPEC_PATHS (a Pod; the pod template of a PodTemplate, Deployment, ReplicaSet, StatefulSet, DaemonSet,
Job, ReplicationController; a CronJob's job template), finding the pod spec along that path with the error when it
is not there, the object that holds it (its metadata is the pod's), and how messages name an object.

Why here: `probectl apply` (probectl/manifest.py), `probectl convert` and the admission webhook
(probe_api/pod_conversion.py) walk the same objects and must find the same pod specs.
"""

from __future__ import annotations

from probe_api.manifest_handlers import InvalidField, shown

# Where the pod spec sits in each kind, as a path of keys from the object.
POD_SPEC_PATHS = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    **{kind: ("spec", "template", "spec") for kind in
       ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "ReplicationController")},
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


def find_pod_spec(obj: dict, kind: str, prefix: str) -> tuple[str, dict]:
    """(its path, the pod spec) of an object of a kind in POD_SPEC_PATHS; InvalidField names where it is missing."""
    path, pod_spec = prefix.rstrip("."), obj
    for key in POD_SPEC_PATHS[kind]:
        path = f"{path}.{key}" if path else key
        pod_spec = pod_spec.get(key) if isinstance(pod_spec, dict) else None
        if not isinstance(pod_spec, dict):
            raise InvalidField(f"{path}: Required value: a {kind} has a pod spec here")
    return path, pod_spec


def pod_holder(obj: dict, kind: str) -> dict:
    """The object whose `spec` is the pod spec: the Pod itself, or a pod template (its metadata is the pod's).
    The caller found the pod spec first (find_pod_spec), so every step is a mapping."""
    holder = obj
    for key in POD_SPEC_PATHS[kind][:-1]:
        holder = holder[key]
    return holder


def object_name(obj: dict) -> str:
    """metadata.name, or "" when there is none."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def json_kind(value: object) -> str:
    """What a value that should have been an object is, for "expected a Kubernetes object, got ..."."""
    if isinstance(value, list):
        return "a list"
    return f"{shown(value)}"
