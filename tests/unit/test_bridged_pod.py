"""What a converted pod carries besides its handlers (probe_api/bridged_pod.py): the original handlers'
annotation, the shim nodes' affinity merged with the pod's own, and exactly that taken off by --reverse."""

from __future__ import annotations

import copy
import json

from probe_api.bridged_pod import mark, problems, unmark
from probe_api.rollout import NODE_LABEL, NODE_LABEL_VALUE, ORIGINAL_HANDLERS_ANNOTATION

REQUIREMENT = {"key": NODE_LABEL, "operator": "In", "values": [NODE_LABEL_VALUE]}
ORIGINALS = {"containers[web].readinessProbe": {"httpGet": {"port": 8080}}}


def pod(spec: dict | None = None, metadata: dict | None = None) -> dict:
    out = {"apiVersion": "v1", "kind": "Pod"}
    if metadata is not None:
        out["metadata"] = metadata
    out["spec"] = spec if spec is not None else {"containers": [{"name": "web"}]}
    return out


def terms(p: dict) -> list:
    return p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


def test_a_pod_without_affinity_gets_one_term_and_the_annotation():
    p = pod()
    mark(p, p["spec"], ORIGINALS)
    assert terms(p) == [{"matchExpressions": [REQUIREMENT]}]
    assert json.loads(p["metadata"]["annotations"][ORIGINAL_HANDLERS_ANNOTATION]) == ORIGINALS


def test_every_existing_term_also_needs_a_shim_node_and_preferred_terms_stay():
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    spec = {"containers": [], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [zone]}, {"matchFields": [{"key": "metadata.name", "operator": "In",
                                                             "values": ["n1"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [zone]}}],
    }, "podAntiAffinity": {"x": 1}}}
    p = pod(spec)
    before = copy.deepcopy(p)
    mark(p, p["spec"], ORIGINALS)
    assert terms(p) == [{"matchExpressions": [zone, REQUIREMENT]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
                         "matchExpressions": [REQUIREMENT]}]
    assert p["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    assert unmark(p, p["spec"]) and p == before


def test_marking_twice_merges_the_annotation_and_adds_the_requirement_once():
    p = pod()
    mark(p, p["spec"], ORIGINALS)
    mark(p, p["spec"], {"containers[web].lifecycle.preStop": {"tcpSocket": {"port": 1}}})
    assert terms(p) == [{"matchExpressions": [REQUIREMENT]}]
    assert set(json.loads(p["metadata"]["annotations"][ORIGINAL_HANDLERS_ANNOTATION])) == {
        "containers[web].readinessProbe", "containers[web].lifecycle.preStop"}


def test_unmark_restores_exactly_key_order_included():
    p = pod(metadata={"name": "x", "labels": {"a": "b"}})
    before = copy.deepcopy(p)
    mark(p, p["spec"], ORIGINALS)
    assert unmark(p, p["spec"])
    assert json.dumps(p) == json.dumps(before)
    assert not unmark(p, p["spec"])  # nothing left to take off


def test_without_node_affinity_only_the_annotation():
    p = pod()
    mark(p, p["spec"], ORIGINALS, node_affinity=False)
    assert "affinity" not in p["spec"] and ORIGINAL_HANDLERS_ANNOTATION in p["metadata"]["annotations"]


def test_fields_of_the_wrong_type_are_named_before_anything_is_written():
    assert problems(pod(), {"containers": []}) == []
    assert problems(pod(metadata={"annotations": ["x"]}), {}) == ["metadata.annotations"]
    assert problems(pod(metadata={"annotations": {ORIGINAL_HANDLERS_ANNOTATION: "not json"}}), {}) == [
        f"metadata.annotations[{ORIGINAL_HANDLERS_ANNOTATION}]"]
    assert problems(pod(), {"affinity": {"nodeAffinity": []}}) == ["spec.affinity.nodeAffinity"]
    assert problems(pod(), {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": "x"}]}}}}) == [
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"]
