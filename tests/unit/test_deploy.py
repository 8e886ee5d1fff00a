"""deploy/: what `kubectl apply -k deploy/` would take, checked without a cluster: every document is a valid object
of its kind against the Kubernetes OpenAPI schemas (kubernetes-validate, strict: no unknown field), and the parts
point at each other (the webhook at the Service, the Service at the Deployment's pods and port, the selectors)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from probe_api.rollout import CONVERT_LABEL
from tests.support.netns_env import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
KUBERNETES_VERSIONS = ("1.35", "1.36", "1.37")  # the supported releases (the tests' kubelet is 1.37.2)


def kustomization() -> dict:
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def objects() -> dict[str, dict]:
    """kind -> the object, over every resource the kustomization lists."""
    found = {}
    for resource in kustomization()["resources"]:
        for document in yaml.safe_load_all((DEPLOY / resource).read_text()):
            assert document["kind"] not in found, f"two {document['kind']} objects"
            found[document["kind"]] = document
    return found


def test_the_kustomization_lists_every_manifest_and_sets_the_namespace():
    k = kustomization()
    listed = set(k["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert k["images"][0]["name"] == objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert k["namespace"] == "probe-shim-system"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("resource", kustomization()["resources"])
def test_every_document_is_valid_against_the_kubernetes_schema(resource, version):
    for document in yaml.safe_load_all((DEPLOY / resource).read_text()):
        kubernetes_validate.validate(document, version, strict=True)


def test_the_webhook_calls_the_service_that_reaches_the_deployments_port():
    o = objects()
    service, deployment = o["Service"], o["Deployment"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    (container_port,) = container["ports"]
    assert port["targetPort"] == container_port["name"]
    assert f"0.0.0.0:{container_port['containerPort']}" in container["command"]
    for hook in o["MutatingWebhookConfiguration"]["webhooks"]:
        target = hook["clientConfig"]["service"]
        assert (target["name"], target["namespace"], target["port"]) == (
            service["metadata"]["name"], service["metadata"]["namespace"], port["port"])
        assert target["path"] == "/mutate"
        assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
        assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] <= 10
        assert hook["reinvocationPolicy"] == "IfNeeded"
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                  "resources": ["pods"], "scope": "Namespaced"}]
        excluded = next(e for e in hook["namespaceSelector"]["matchExpressions"]
                        if e["key"] == "kubernetes.io/metadata.name")
        assert {"kube-system", o["Namespace"]["metadata"]["name"]} <= set(excluded["values"])


def test_the_two_selectors_send_each_opted_in_pod_once_and_never_an_opted_out_one():
    by_namespace, by_pod = objects()["MutatingWebhookConfiguration"]["webhooks"]
    namespace_rule = next(e for e in by_namespace["namespaceSelector"]["matchExpressions"] if e["key"] == CONVERT_LABEL)
    assert namespace_rule == {"key": CONVERT_LABEL, "operator": "In", "values": ["enabled"]}
    assert by_namespace["objectSelector"]["matchExpressions"] == [
        {"key": CONVERT_LABEL, "operator": "NotIn", "values": ["disabled"]}]
    pod_rule = next(e for e in by_pod["namespaceSelector"]["matchExpressions"] if e["key"] == CONVERT_LABEL)
    assert pod_rule == {"key": CONVERT_LABEL, "operator": "NotIn", "values": ["enabled", "disabled"]}
    assert by_pod["objectSelector"] == {"matchLabels": {CONVERT_LABEL: "enabled"}}


def test_the_deployment_is_highly_available_and_restricted():
    o = objects()
    spec = o["Deployment"]["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2 and o["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] and security["seccompProfile"]["type"] == "RuntimeDefault"
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["resources"]["requests"] and container["readinessProbe"] and container["livenessProbe"]
    assert o["Namespace"]["metadata"]["labels"][CONVERT_LABEL] == "disabled"
    assert o["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"].items() <= \
        spec["template"]["metadata"]["labels"].items()


def test_the_deployments_command_is_the_webhooks_own():
    (container,) = objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    argv = container["command"]
    assert argv[:3] == ["probe-shim", "webhook", "serve"]
    done = subprocess.run([sys.executable, "-m", "shim.cli", *argv[1:], "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--cert" in done.stdout
