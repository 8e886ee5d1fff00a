"""probectl convert (probectl/convert.py) over what a manifest file holds: kinds with and without a pod spec, Lists,
several documents, YAML aliases, JSON in and out, and rejections that name the manifest path. Pure: no daemon, no
root."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from probe_api.bridge_command import MARKER
from probe_api.pod_conversion import HOST_FORBIDDEN
from probectl.convert import convert
from tests.support.convert_manifests import container_of, converted, ordered, parsed, pod

# --- kinds, Lists, documents ---------------------------------------------------------------------------------------

def test_kinds_without_a_pod_spec_pass_through_with_a_note():
    text = textwrap.dedent("""\
        apiVersion: v1
        kind: Service
        metadata: {name: web}
        spec:
          ports: [{port: 80, targetPort: http}]
        ---
        apiVersion: example.com/v1
        kind: Widget
        spec:
          readinessProbe: {httpGet: {port: 80}}
        """)
    result = convert(text)
    assert result.errors == []
    assert result.notes == ['documents[0]: Service "web" has no pod spec: left unchanged',
                            'documents[1]: Widget "" has no pod spec: left unchanged',
                            "no httpGet, tcpSocket or grpc probe or hook to convert"]
    assert parsed(result.text) == parsed(text)


def test_a_list_is_walked_item_by_item_and_messages_name_the_item():
    text = textwrap.dedent("""\
        kind: List
        apiVersion: v1
        items:
        - kind: ConfigMap
          metadata: {name: settings}
        - kind: Pod
          metadata: {name: a}
          spec:
            containers:
            - name: c
              readinessProbe: {tcpSocket: {port: 80}}
        - kind: PodList
          items:
          - kind: Pod
            spec:
              containers:
              - name: c
                livenessProbe: {httpGet: {port: 80, host: example.com}}
        """)
    result = convert(text)
    assert result.errors == [f"items[2].items[0].spec.containers[0].livenessProbe.httpGet.host: {HOST_FORBIDDEN}"]
    allowed = convert(text, allow_host=True)
    assert (allowed.errors, allowed.probes) == ([], 2)
    assert allowed.notes == ['items[0]: ConfigMap "settings" has no pod spec: left unchanged']
    items = yaml.safe_load(allowed.text)["items"]
    assert items[1]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"][1] == "readiness"
    assert items[2]["items"][0]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"][1] == "liveness"


def test_several_documents_keep_their_order_and_are_named_in_messages():
    documents = [{"kind": "ConfigMap", "metadata": {"name": f"c{index}"}} for index in range(3)]
    documents.insert(2, yaml.safe_load(pod("readinessProbe: {httpGet: {port: 0}}\n")))
    text = yaml.safe_dump_all(documents, sort_keys=False)
    result = convert(text)
    assert result.errors == [("documents[2].spec.containers[0].readinessProbe.httpGet.port: Invalid value: 0: "
                              "must be between 1 and 65535, inclusive")]
    documents[2]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = 80
    out = converted(yaml.safe_dump_all(documents, sort_keys=False))
    assert [document["kind"] for document in yaml.safe_load_all(out)] == ["ConfigMap", "ConfigMap", "Pod",
                                                                          "ConfigMap"]
    assert out.count("\n---\n") == 3 and not out.startswith("---")


def test_empty_documents_are_dropped():
    text = "---\n" + pod("readinessProbe: {tcpSocket: {port: 80}}\n") + "---\n---\n"
    out = converted(text)
    assert "---" not in out and len(parsed(out)) == 1


def test_a_probe_shared_by_yaml_alias_is_converted_for_each_of_its_roles():
    text = pod("livenessProbe: &probe {httpGet: {path: /$x, port: 80}, periodSeconds: 3}\n"
               "readinessProbe: *probe\nlifecycle: {preStop: {httpGet: {path: /$x, port: 80}}}\n")
    result = convert(text)
    assert (result.errors, result.probes, result.hooks) == ([], 2, 1)
    out = container_of(result.text)
    assert [out[field]["exec"]["command"][1] for field in ("livenessProbe", "readinessProbe")] == \
        ["liveness", "readiness"]
    assert "&" not in result.text and "*" not in result.text  # the aliases are expanded
    assert parsed(converted(result.text, reverse=True)) == parsed(text)


def test_yaml_aliases_that_never_end_are_refused():
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{name}: &{name} [{', '.join([f'*{previous}'] * 10)}]\n" for previous, name in zip("abcdef", "bcdefg"))
    text = "kind: Pod\n" + laughs  # 10**7 values once expanded
    assert convert(text).errors == [
        f"the manifest expands to more than {len(text) + 100_000} values through its YAML aliases"]
    assert convert("kind: Pod\nspec: &s {containers: [*s]}\n").errors == [
        "the manifest has a YAML alias that contains itself"]
    assert convert("kind: Pod\nspec: {containers: " + "[" * 5000 + "]" * 5000 + "}\n").errors == [
        "the manifest is nested too deeply"]


def test_a_null_probe_or_hook_is_unset():
    text = pod("readinessProbe: null\nlivenessProbe: {tcpSocket: {port: 80}}\nlifecycle: {preStop: null}\n")
    result = convert(text)
    assert (result.errors, result.probes, result.hooks) == ([], 1, 0)


def test_comments_are_not_kept():
    assert "# keep me" not in converted("# keep me\n" + pod("readinessProbe: {tcpSocket: {port: 80}}  # too\n"))


# --- JSON ----------------------------------------------------------------------------------------------------------

def test_json_output_is_the_object_or_a_list_of_the_documents():
    one = pod("readinessProbe: {tcpSocket: {port: 80}}\n")
    out = json.loads(converted(one, output="json"))
    assert out["kind"] == "Pod" and out["spec"]["containers"][0]["readinessProbe"]["exec"]["command"][0] == MARKER
    several = one + "---\n" + "kind: ConfigMap\nmetadata: {name: c}\n"
    listed = json.loads(converted(several, output="json"))
    assert list(listed) == ["kind", "apiVersion", "items"]
    assert (listed["kind"], listed["apiVersion"], [item["kind"] for item in listed["items"]]) == \
        ("List", "v1", ["Pod", "ConfigMap"])
    # The List walks back to the documents it holds.
    back = yaml.safe_load(converted(json.dumps(listed), reverse=True))
    assert [ordered(item) for item in back["items"]] == parsed(several)


def test_json_input_with_tab_indentation_is_read():
    text = '{\n\t"kind": "Pod",\n\t"spec": {"containers": [{"name": "c", "readinessProbe": ' \
           '{"tcpSocket": {"port": 80}}}]}\n}\n'
    assert convert(text).probes == 1


def test_an_unknown_output_is_a_programming_error():
    with pytest.raises(ValueError):
        convert("kind: Pod\n", output="table")


# --- rejections ----------------------------------------------------------------------------------------------------

PORTS = "ports: [{name: web, containerPort: 80}]\n"


@pytest.mark.parametrize("text, error", [
    ("", "the manifest has no objects"),
    ("a: [", "not valid YAML or JSON: expected the node content, but found '<stream end>' (line 1, column 5)"),
    ("- 1\n", "the manifest: expected a Kubernetes object, got a list"),
    ("apiVersion: v1\n", "kind: Required value: expected a Kubernetes object with its kind"),
    ("kind: Pod\n", "spec: Required value: a Pod has a pod spec here"),
    ("kind: CronJob\nspec: {jobTemplate: {spec: {}}}\n",
     "spec.jobTemplate.spec.template: Required value: a CronJob has a pod spec here"),
    ("kind: List\nitems: 3\n", "items: Invalid value: 3: must be a list"),
    ("kind: Pod\nspec: {containers: {name: c}}\n",
     'spec.containers: Invalid value: {"name": "c"}: must be a list'),
    ("kind: Pod\nspec: {initContainers: [web]}\n",
     'spec.initContainers[0]: Invalid value: "web": must be a container (a mapping)'),
    (pod("lifecycle: [preStop]\n"), 'spec.containers[0].lifecycle: Invalid value: ["preStop"]: must be a mapping'),
    (pod("readinessProbe: 5\n"), "spec.containers[0].readinessProbe: Invalid value: 5: must be a mapping"),
    (pod("readinessProbe: {httpGet: 80}\n"),
     "spec.containers[0].readinessProbe.httpGet: Invalid value: 80: must be a mapping"),
    (pod("readinessProbe: {exec: {command: [x]}, httpGet: {port: 80}}\n"),
     "spec.containers[0].readinessProbe.httpGet: Forbidden: may not specify more than 1 handler type"),
    (pod("lifecycle: {preStop: {sleep: {seconds: 1}, tcpSocket: {port: 80}}}\n"),
     "spec.containers[0].lifecycle.preStop.sleep: Forbidden: may not specify more than 1 handler type"),
    (pod(PORTS + "readinessProbe: {httpGet: {port: http}}\n"),
     'spec.containers[0].readinessProbe.httpGet.port: unknown named port "http"'),
    (pod(PORTS + "livenessProbe: {tcpSocket: {port: 0}}\n"),
     "spec.containers[0].livenessProbe.tcpSocket.port: Invalid value: 0: must be between 1 and 65535, inclusive"),
    (pod("startupProbe: {grpc: {port: 70000}}\n"),
     "spec.containers[0].startupProbe.grpc.port: Invalid value: 70000: must be between 1 and 65535, inclusive"),
    (pod("readinessProbe: {httpGet: {port: 80, scheme: https}}\n"),
     ('spec.containers[0].readinessProbe.httpGet.scheme: Unsupported value: "https": supported values: "HTTP", '
      '"HTTPS"')),
    (pod("readinessProbe: {httpGet: {port: 80, hots: example.com}}\n"),
     'spec.containers[0].readinessProbe.httpGet: unknown field "hots"'),
    (pod("lifecycle: {postStart: {httpGet: {port: 80, httpHeaders: [{name: X-Day, value: 2026-11-25}]}}}\n"),
     ("spec.containers[0].lifecycle.postStart.httpGet: Invalid value: Object of type date is not JSON serializable: "
      "must be JSON data (quote a YAML timestamp)")),
])
def test_rejections_name_the_manifest_path(text, error):
    result = convert(text)
    assert result.errors == [error]
    assert result.text == ""


def test_every_error_is_reported_not_only_the_first():
    text = pod(PORTS + "readinessProbe: {httpGet: {port: http}}\nlivenessProbe: {tcpSocket: {port: 0}}\n")
    assert len(convert(text).errors) == 2
