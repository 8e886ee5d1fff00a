"""The webhook's decisions (shim/webhook/admission.py) on AdmissionReview v1 requests as the kube-apiserver sends
them (the API reference's fields: uid, kind, resource, requestKind, operation, object, oldObject, dryRun, options,
userInfo), without sockets. The patch is applied with a JSON Patch library and compared with `probectl convert`."""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch
import pytest
import yaml

from probe_api.rollout import CONVERT_LABEL, NODE_LABEL, ORIGINAL_HANDLERS_ANNOTATION
from probectl.convert import convert
from shim.webhook import admission
from tests.support.webhook_env import review
from tests.support.webhook_pods import web_pod

OWN = "probe-shim-system"


def admit(body: dict, **options) -> admission.Admission:
    request = admission.request_of(json.dumps(body).encode())
    return admission.admit(request, own_namespace=OWN, **options)


def patched(obj: dict, decided: admission.Admission) -> dict:
    answer = decided.review()["response"]
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    return jsonpatch.apply_patch(copy.deepcopy(obj), json.loads(base64.b64decode(answer["patch"])))


def test_the_patched_pod_is_exactly_what_probectl_convert_writes():
    pod = web_pod()
    decided = admit(review(pod))
    assert decided.outcome == admission.CONVERTED and decided.warnings == []
    by_convert = yaml.safe_load(convert(yaml.safe_dump(pod, sort_keys=False)).text)
    result = patched(pod, decided)
    assert result == by_convert  # key order aside: the API server stores a pod's fields in its own order
    container = result["spec"]["containers"][0]
    assert container["readinessProbe"]["exec"]["command"][:2] == ["cri-probe-shim", "readiness"]
    assert container["livenessProbe"]["periodSeconds"] == 10  # the kubelet keeps its timing
    original = json.loads(result["metadata"]["annotations"][ORIGINAL_HANDLERS_ANNOTATION])
    assert original["containers[web].readinessProbe"] == {
        "httpGet": pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]}
    (term,) = result["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term["matchExpressions"][0]["key"] == NODE_LABEL


def test_the_patch_is_minimal():
    decided = admit(review(web_pod()))
    ops = [(op["op"], op["path"]) for op in decided.patch]
    assert ops == [
        ("add", "/metadata/annotations"),
        ("add", "/spec/affinity"),
        ("remove", "/spec/containers/0/readinessProbe/httpGet"),
        ("add", "/spec/containers/0/readinessProbe/exec"),
        ("remove", "/spec/containers/0/livenessProbe/tcpSocket"),
        ("add", "/spec/containers/0/livenessProbe/exec"),
        ("remove", "/spec/containers/0/lifecycle/preStop/httpGet"),
        ("add", "/spec/containers/0/lifecycle/preStop/exec"),
    ]


def test_a_second_admission_changes_nothing():
    pod = web_pod()
    once = patched(pod, admit(review(pod)))
    again = admit(review(once))  # reinvocationPolicy: IfNeeded, or a pod recreated from its own YAML
    assert (again.outcome, again.patch) == (admission.UNCHANGED, [])
    assert "patch" not in again.review()["response"]


def test_existing_required_affinity_terms_each_gain_the_shim_node_requirement():
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-1a", "eu-1b"]}
    pod = web_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [
            {"key": "disk", "operator": "Exists"}]}]}}})
    result = patched(pod, admit(review(pod)))
    terms = result["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert [[e["key"] for e in t["matchExpressions"]] for t in terms] == [
        ["topology.kubernetes.io/zone", NODE_LABEL], ["disk", NODE_LABEL]]


@pytest.mark.parametrize("where", ["labels", "annotations"])
def test_the_pods_opt_out_wins(where):
    pod = web_pod()
    pod["metadata"].setdefault(where, {})[CONVERT_LABEL] = "disabled"
    decided = admit(review(pod))
    assert (decided.outcome, decided.patch) == (admission.SKIPPED, [])
    assert decided.review()["response"] == {"uid": decided.uid, "allowed": True}


def test_the_webhooks_own_namespace_is_never_mutated():
    decided = admit(review(web_pod(), namespace=OWN))
    assert decided.outcome == admission.SKIPPED and decided.reason == "the webhook's own namespace"


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_creation_is_converted(operation):
    assert admit(review(web_pod(), operation=operation)).outcome == admission.SKIPPED


def test_another_kind_is_allowed_unchanged():
    decided = admit(review({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, kind="ConfigMap"))
    assert decided.outcome == admission.SKIPPED and decided.reason == "not a Pod (ConfigMap)"


def test_host_network_pods_are_left_with_a_warning():
    decided = admit(review(web_pod(hostNetwork=True)))
    assert (decided.outcome, decided.patch) == (admission.UNCHANGED, [])
    assert len(decided.warnings) == 1 and "node's network namespace" in decided.warnings[0]


def test_a_host_outside_the_pod_is_left_alone_with_a_warning_and_the_rest_converted():
    pod = web_pod()
    pod["spec"]["containers"][0]["livenessProbe"] = {"tcpSocket": {"port": 5432, "host": "db.internal"}}
    decided = admit(review(pod))
    assert decided.outcome == admission.CONVERTED
    (warning,) = decided.warnings
    assert warning.startswith("probe-shim: spec.containers[0].livenessProbe.tcpSocket.host: Forbidden:")
    assert len(warning) <= admission.MAX_WARNING_CHARS
    result = patched(pod, decided)
    assert result["spec"]["containers"][0]["livenessProbe"] == {"tcpSocket": {"port": 5432, "host": "db.internal"}}
    assert "exec" in result["spec"]["containers"][0]["readinessProbe"]
    assert decided.review()["response"]["warnings"] == decided.warnings


def test_a_pod_without_network_probes_is_allowed_without_a_patch():
    pod = web_pod()
    container = pod["spec"]["containers"][0]
    for key in ("readinessProbe", "livenessProbe", "lifecycle"):
        del container[key]
    container["livenessProbe"] = {"exec": {"command": ["true"]}}
    decided = admit(review(pod))
    assert (decided.outcome, decided.patch) == (admission.UNCHANGED, [])


def test_dry_run_gets_the_same_patch():
    pod = web_pod()
    dry = admit(review(pod, dry_run=True))
    assert dry.dry_run and dry.patch == admit(review(pod)).patch


@pytest.mark.parametrize("body, reason", [
    (b"{not json", "the body is not JSON"),
    (b"[]", "the body is not an AdmissionReview"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}}
                ).encode(), "only admission.k8s.io/v1"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "no request with a uid"),
])
def test_a_body_that_is_no_admission_review_is_refused_with_the_reason(body, reason):
    with pytest.raises(admission.BadReview, match=reason):
        admission.request_of(body)
    refused = admission.refusal(admission.uid_of(body), "why")["response"]
    assert refused["allowed"] is False and refused["status"] == {"code": 400, "message": "why"}


def test_a_pod_spec_of_the_wrong_shape_is_left_to_the_api_server():
    pod = web_pod()
    pod["spec"]["containers"] = "not a list"
    decided = admit(review(pod))
    assert decided.patch == [] and decided.warnings  # allowed unchanged; the API server's validation refuses it
