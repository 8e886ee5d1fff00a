"""`probectl convert -f -` in the pipelines a cluster already has (deploy/pipelines/): a Helm post-renderer and a
kustomize exec transformer (a KRM function: a ResourceList in and out). Run as Helm and kustomize run them: a
process, the rendered stream on stdin, the result on stdout, the exit code read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.netns_env import REPO_ROOT

PIPELINES = REPO_ROOT / "deploy" / "pipelines"

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: web:1
        readinessProbe: {httpGet: {path: /ready, port: %s}, periodSeconds: 5}
"""
SERVICE = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n"
CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {a: b}\n"


def run(script: str, stdin: str) -> subprocess.CompletedProcess:
    # probectl as installed next to the interpreter running the tests (the venv's bin).
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([str(PIPELINES / script)], input=stdin, capture_output=True, text=True, env=env,
                          timeout=60, cwd=REPO_ROOT)


def test_helm_post_renderer_converts_a_rendered_chart_and_keeps_every_other_document():
    stream = "---\n".join([SERVICE, DEPLOYMENT % 8080, CONFIGMAP])
    done = run("helm-post-renderer", stream)
    assert done.returncode == 0, done.stderr
    service, deployment, configmap = list(yaml.safe_load_all(done.stdout))
    assert (service, configmap) == (yaml.safe_load(SERVICE), yaml.safe_load(CONFIGMAP))
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["exec"]["command"][:2] == ["cri-probe-shim", "readiness"] and probe["periodSeconds"] == 5


def test_a_bad_document_fails_the_whole_render_with_nothing_on_stdout():
    done = run("helm-post-renderer", "---\n".join([SERVICE, DEPLOYMENT % 0, CONFIGMAP]))
    assert done.returncode == 1 and done.stdout == ""
    assert ("probectl: documents[1].spec.template.spec.containers[0].readinessProbe.httpGet.port: "
            "Invalid value: 0") in done.stderr


def test_the_kustomize_transformer_converts_the_resource_lists_items():
    config = yaml.safe_load((PIPELINES / "kustomize-transformer.yaml").read_text())
    assert "exec" in yaml.safe_load(config["metadata"]["annotations"]["config.kubernetes.io/function"])
    resource_list = {"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList",
                     "items": [yaml.safe_load(DEPLOYMENT % "http"), yaml.safe_load(SERVICE)],
                     "functionConfig": config}
    resource_list["items"][0]["spec"]["template"]["spec"]["containers"][0]["ports"] = [
        {"name": "http", "containerPort": 8080}]
    done = run("probectl-convert", yaml.safe_dump(resource_list, sort_keys=False))
    assert done.returncode == 0, done.stderr
    out = yaml.safe_load(done.stdout)
    assert out["kind"] == "ResourceList" and out["functionConfig"] == config
    container = out["items"][0]["spec"]["template"]["spec"]["containers"][0]
    assert "exec" in container["readinessProbe"] and out["items"][1] == yaml.safe_load(SERVICE)
