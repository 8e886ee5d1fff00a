"""What a converted pod carries besides its rewritten handlers, and how `--reverse` takes it off again. Pure.
Shared by `probectl convert` and the admission webhook through probe_api/pod_conversion.py.

- The annotation probe_api.rollout.ORIGINAL_HANDLERS_ANNOTATION: the original handlers by field path
  (`{"containers[web].readinessProbe": {"httpGet": {...}}}`, JSON with sorted keys), merged with what an earlier
  conversion recorded, so that `kubectl get pod -o yaml` shows what was changed.
- A required node affinity on probe_api.rollout.NODE_LABEL: a converted pod's probes are answered only where the
  kubelet goes through the shim; anywhere else it would never become Ready. nodeSelectorTerms are ORed and the
  requirements within one ANDed, so the requirement is added to every existing term (each keeps its meaning, and
  each now also needs a shim node); with no required affinity, one term holds it alone.

`unmark` removes exactly that: the annotation, the requirement from every term, and each mapping or list left
empty by the removal (those that convert created), so that reverse(convert(x)) == x, key order included. An
input that already had an explicitly empty `annotations: {}` or `affinity: {}` loses it: the one case the round
trip cannot tell apart.
"""

from __future__ import annotations

import json

from probe_api.rollout import ORIGINAL_HANDLERS_ANNOTATION, node_selector_requirement

_REQUIRED = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")


def mark(holder: dict, spec: dict, originals: dict[str, dict], node_affinity: bool = True) -> None:
    """Records `originals` on the pod's metadata (`holder`: the Pod, or a template) and, with node_affinity, makes
    `spec` need a shim node. Every value on the way must be a mapping or absent: the caller checked (problems())."""
    metadata = holder.setdefault("metadata", {})
    annotations = metadata.setdefault("annotations", {})
    recorded = json.loads(annotations.get(ORIGINAL_HANDLERS_ANNOTATION) or "{}")
    annotations[ORIGINAL_HANDLERS_ANNOTATION] = json.dumps({**recorded, **originals}, sort_keys=True,
                                                           separators=(",", ":"))
    if not node_affinity:
        return
    required = spec
    for key in _REQUIRED:
        required = required.setdefault(key, {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        expressions = term.setdefault("matchExpressions", [])
        if node_selector_requirement() not in expressions:
            expressions.append(node_selector_requirement())


def problems(holder: object, spec: dict) -> list[str]:
    """Why mark() cannot write where it must (a field of the wrong type: the API server's error to give), as
    paths relative to the pod; [] when it can."""
    out = []
    metadata = holder.get("metadata") if isinstance(holder, dict) else None
    if metadata is not None and not isinstance(metadata, dict):
        out.append("metadata")
    elif isinstance(metadata, dict):
        annotations = metadata.get("annotations")
        if annotations is not None and not isinstance(annotations, dict):
            out.append("metadata.annotations")
        elif isinstance(annotations, dict) and not _json_object(annotations.get(ORIGINAL_HANDLERS_ANNOTATION)):
            out.append(f"metadata.annotations[{ORIGINAL_HANDLERS_ANNOTATION}]")
    node: object = spec
    path = "spec"
    for key in (*_REQUIRED, "nodeSelectorTerms"):
        path += f".{key}"
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return out
        if not isinstance(node, list if key == "nodeSelectorTerms" else dict):
            return [*out, path]
    for index, term in enumerate(node):
        if not isinstance(term, dict) or not isinstance(term.get("matchExpressions", []), list):
            out.append(f"{path}[{index}]")
    return out


def _json_object(text: object) -> bool:
    if text is None:
        return True
    try:
        return isinstance(json.loads(text), dict) if isinstance(text, str) else False
    except ValueError:
        return False


def unmark(holder: dict, spec: dict) -> bool:
    """Takes off what mark() put on; True if there was anything."""
    found = False
    metadata = holder.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("annotations"), dict):
        found = metadata["annotations"].pop(ORIGINAL_HANDLERS_ANNOTATION, None) is not None
        _prune(holder, ("metadata", "annotations"))
    required = spec
    for key in _REQUIRED:
        required = required.get(key) if isinstance(required, dict) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list):
        return found
    for term in terms:
        expressions = term.get("matchExpressions") if isinstance(term, dict) else None
        if isinstance(expressions, list) and node_selector_requirement() in expressions:
            expressions.remove(node_selector_requirement())
            found = True
    if found:
        for term in terms:
            if isinstance(term, dict) and term.get("matchExpressions") == []:
                del term["matchExpressions"]
        terms[:] = [term for term in terms if term != {}]
        _prune(spec, (*_REQUIRED, "nodeSelectorTerms"))
    return found


def _prune(root: dict, keys: tuple[str, ...]) -> None:
    """Deletes root[k1]...[kn] and then each parent on the way back while it is empty."""
    chain = [root]
    for key in keys:
        value = chain[-1].get(key) if isinstance(chain[-1], dict) else None
        if value is None:
            break
        chain.append(value)
    for parent, key in reversed(list(zip(chain, keys))):
        child = parent.get(key)
        if child in ({}, []):
            del parent[key]
        else:
            break
