"""probectl convert (probectl/convert.py, its rule in probe_api/pod_conversion.py, the `convert` command): pure,
no daemon, no root.

Goldens: tests/golden/convert/<kind>.yaml -> <kind>.converted.yaml, compared exactly. After a deliberate change
of the output, regenerate them with `PROBECTL_UPDATE_GOLDEN=1 pytest tests/unit/test_convert.py` and read the diff.
The corpus (tests/golden/convert/corpus/) is checked for an exact round trip and for idempotence.
"""

from __future__ import annotations

import io
import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from probe_api.bridge_command import MARKER, command_for, handler_in
from probe_api.pod_conversion import HOST_FORBIDDEN, HOST_NETWORK_NOTE, convert_object
from probectl import cli, client
from probectl.convert import convert

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "convert"
KINDS = ("pod", "deployment", "statefulset", "daemonset", "replicaset", "job", "cronjob", "list")
CORPUS = sorted((GOLDEN / "corpus").iterdir())
UPDATE = os.environ.get("PROBECTL_UPDATE_GOLDEN") == "1"


def ordered(value):
    """A parsed manifest in a form whose == also compares key order."""
    if isinstance(value, dict):
        return ("mapping", [(key, ordered(item)) for key, item in value.items()])
    if isinstance(value, list):
        return [ordered(item) for item in value]
    return value


def parsed(text: str) -> list:
    if text.lstrip().startswith("{"):
        return [ordered(json.loads(text))]  # YAML refuses JSON's tab indentation
    return [ordered(document) for document in yaml.safe_load_all(text) if document is not None]


def pod(container: str, *, spec_extra: str = "") -> str:
    """A Pod with one container whose body (YAML at container indentation) is given."""
    body = textwrap.indent(textwrap.dedent(container), "    ")
    return f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n{spec_extra}  containers:\n  - name: c\n{body}"


def container_of(text: str, index: int = 0) -> dict:
    return yaml.safe_load(text)["spec"]["containers"][index]


def converted(text: str, **options) -> str:
    result = convert(text, **options)
    assert result.errors == []
    return result.text


# --- the rewrite -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, role", [("livenessProbe", "liveness"), ("readinessProbe", "readiness"),
                                         ("startupProbe", "startup")])
@pytest.mark.parametrize("handler", [{"httpGet": {"path": "/healthz", "port": 8080}},
                                     {"tcpSocket": {"port": 5432}},
                                     {"grpc": {"port": 9090, "service": "ready"}},
                                     {"grpc": {"port": 9443, "mode": "TLS"}},  # 1.37, KEP-4939
                                     {"httpGet": {"path": "/", "port": 8080, "protocol": "HTTP2"}}])  # KEP-5999
def test_each_probe_kind_becomes_the_marker_exec_of_its_role(field, role, handler):
    text = pod(f"{field}:\n  {json.dumps(handler)}\n")
    result = convert(text)
    assert (result.errors, result.probes, result.hooks) == ([], 1, 0)
    probe = container_of(result.text)[field]
    assert probe == {"exec": {"command": command_for(role, handler)}}
    assert handler_in(probe["exec"]["command"]) == (role, handler)


@pytest.mark.parametrize("hook", ["postStart", "preStop"])
@pytest.mark.parametrize("handler", [{"httpGet": {"path": "/drain", "port": "admin"}}, {"tcpSocket": {"port": 7000}}])
def test_each_hook_kind_becomes_the_marker_exec_of_its_role(hook, handler):
    text = pod(f"ports: [{{name: admin, containerPort: 9901}}]\nlifecycle:\n  {hook}: {json.dumps(handler)}\n")
    result = convert(text)
    assert (result.errors, result.probes, result.hooks) == ([], 0, 1)
    assert container_of(result.text)["lifecycle"][hook] == {"exec": {"command": [MARKER, hook, json.dumps(
        handler, separators=(",", ":"))]}}


def test_every_other_probe_field_stays_in_its_place():
    text = pod("""\
        livenessProbe:
          initialDelaySeconds: 5
          timeoutSeconds: 2
          httpGet: {port: 8080}
          periodSeconds: 3
          successThreshold: 1
          failureThreshold: 4
          terminationGracePeriodSeconds: 30
        """)
    probe = container_of(converted(text))["livenessProbe"]
    assert list(probe) == ["initialDelaySeconds", "timeoutSeconds", "exec", "periodSeconds", "successThreshold",
                           "failureThreshold", "terminationGracePeriodSeconds"]
    assert [probe[key] for key in probe if key != "exec"] == [5, 2, 3, 1, 4, 30]


def test_exec_probes_exec_and_sleep_hooks_and_marker_commands_are_left_alone():
    marker = [MARKER, "readiness", "--tcp", "8080"]  # the hand-written form
    text = pod(f"""\
        livenessProbe:
          exec: {{command: [pg_isready]}}
        readinessProbe:
          exec: {{command: {json.dumps(marker)}}}
        startupProbe:
          exec: {{command: {json.dumps(command_for("startup", {"tcpSocket": {"port": 1}}))}}}
        lifecycle:
          postStart:
            exec: {{command: [sh, -c, "echo $(date)"]}}
          preStop:
            sleep: {{seconds: 5}}
        """)
    result = convert(text)
    assert (result.errors, result.probes, result.hooks) == ([], 0, 0)
    assert result.notes == ["no httpGet, tcpSocket or grpc probe or hook to convert"]
    assert parsed(result.text) == parsed(text)


def test_a_probe_without_a_handler_and_a_grpc_hook_are_left_to_the_api_server():
    text = pod("readinessProbe: {periodSeconds: 3}\nlifecycle:\n  preStop: {grpc: {port: 9090}}\n")
    result = convert(text)
    assert result.errors == []
    assert parsed(result.text) == parsed(text)


def test_sidecar_init_containers_are_converted_too():
    text = textwrap.dedent("""\
        kind: Pod
        metadata: {name: p}
        spec:
          initContainers:
          - name: envoy
            restartPolicy: Always
            readinessProbe: {httpGet: {path: /ready, port: 9901}}
            lifecycle: {preStop: {httpGet: {path: /drain, port: 9901}}}
          containers:
          - name: app
            livenessProbe: {tcpSocket: {port: 80}}
        """)
    result = convert(text)
    assert (result.errors, result.probes, result.hooks) == ([], 2, 1)
    sidecar = yaml.safe_load(result.text)["spec"]["initContainers"][0]
    assert sidecar["readinessProbe"]["exec"]["command"][:2] == [MARKER, "readiness"]
    assert sidecar["lifecycle"]["preStop"]["exec"]["command"][:2] == [MARKER, "preStop"]


def test_a_dollar_survives_the_round_trip_and_is_doubled_only_in_probe_commands():
    handler = {"httpGet": {"path": "/ready?token=$(TOKEN)&cost=$5", "port": 80,
                           "httpHeaders": [{"name": "X-Price", "value": "$$"}]}}
    text = pod(f"readinessProbe: {json.dumps(handler)}\nlifecycle:\n  preStop: {json.dumps(handler)}\n")
    out = container_of(converted(text))
    probe_json = out["readinessProbe"]["exec"]["command"][2]
    hook_json = out["lifecycle"]["preStop"]["exec"]["command"][2]
    assert "token=$$(TOKEN)&cost=$$5" in probe_json and '"value":"$$$$"' in probe_json
    assert "token=$(TOKEN)&cost=$5" in hook_json and '"value":"$$"' in hook_json
    # The kubelet expands `$$` to `$` in probe commands only: what the shim then reads is the handler as written.
    assert json.loads(probe_json.replace("$$", "$")) == handler == json.loads(hook_json)
    assert parsed(converted(converted(text), reverse=True)) == parsed(text)


# --- host, hostNetwork ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where, body", [
    ("spec.containers[0].readinessProbe.httpGet.host", "readinessProbe: {httpGet: {host: 10.0.0.1, port: 80}}"),
    ("spec.containers[0].livenessProbe.tcpSocket.host", "livenessProbe: {tcpSocket: {host: db.internal, port: 5432}}"),
    ("spec.containers[0].lifecycle.preStop.httpGet.host",
     "lifecycle: {preStop: {httpGet: {host: 169.254.169.254, path: /latest/meta-data/, port: 80}}}"),
])
def test_host_is_refused_with_the_ssrf_explanation_unless_allowed(where, body):
    text = pod(body + "\n")
    result = convert(text)
    assert result.errors == [f"{where}: {HOST_FORBIDDEN}"]
    assert result.text == ""
    assert "blind SSRF around NetworkPolicy, kubernetes#99425" in HOST_FORBIDDEN
    assert "allow_host_field = true" in HOST_FORBIDDEN and "--allow-host" in HOST_FORBIDDEN
    allowed = convert(text, allow_host=True)
    assert allowed.errors == [] and allowed.probes + allowed.hooks == 1
    assert parsed(converted(allowed.text, reverse=True)) == parsed(text)



@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_the_pods_own_loopback_is_converted_and_restored(host):
    text = pod(f"readinessProbe: {{httpGet: {{host: '{host}', path: /admin/health, port: 9901}}}}\n"
               f"lifecycle: {{preStop: {{tcpSocket: {{host: '{host}', port: 9901}}}}}}\n")
    result = convert(text)
    assert result.errors == [] and (result.probes, result.hooks) == (1, 1)
    command = container_of(result.text)["readinessProbe"]["exec"]["command"]
    assert json.loads(command[2]) == {"httpGet": {"host": host, "path": "/admin/health", "port": 9901}}
    assert parsed(converted(result.text, reverse=True)) == parsed(text)


def test_the_host_message_names_the_pods_loopback():
    assert "use 127.0.0.1, ::1 or localhost for the pod's own loopback" in HOST_FORBIDDEN


@pytest.mark.parametrize("host", ["127.0.0.2", "LOCALHOST", "0.0.0.0"])
def test_loopback_like_hosts_outside_the_three_spellings_are_refused(host):
    result = convert(pod(f"readinessProbe: {{httpGet: {{host: '{host}', port: 80}}}}\n"))
    assert result.errors == [f"spec.containers[0].readinessProbe.httpGet.host: {HOST_FORBIDDEN}"]


def test_a_host_network_pods_loopback_probe_is_left_with_a_note():
    # There 127.0.0.1 is the node's: the kubelet's own probe already means what it says, and the shim never probes it.
    text = pod("readinessProbe: {httpGet: {host: 127.0.0.1, port: 9100}}\n", spec_extra="  hostNetwork: true\n")
    result = convert(text)
    assert result.errors == [] and result.probes == 0
    assert result.notes[0] == f"spec.hostNetwork: {HOST_NETWORK_NOTE}"
    assert "127.0.0.1 is the node's loopback" in HOST_NETWORK_NOTE
    assert parsed(result.text) == parsed(text)

def test_an_empty_host_is_no_host():
    assert convert(pod('readinessProbe: {httpGet: {host: "", port: 80}}\n')).errors == []


def test_a_host_network_pod_is_left_unchanged_with_a_note():
    text = pod("readinessProbe: {httpGet: {host: 10.0.0.1, port: 9100}}\n", spec_extra="  hostNetwork: true\n")
    result = convert(text)
    assert result.errors == []  # not even host: nothing of this pod is converted
    assert result.notes == [f"spec.hostNetwork: {HOST_NETWORK_NOTE}",
                            "no httpGet, tcpSocket or grpc probe or hook to convert"]
    assert parsed(result.text) == parsed(text)


def test_host_network_false_is_converted():
    assert convert(pod("readinessProbe: {tcpSocket: {port: 80}}\n", spec_extra="  hostNetwork: false\n")).probes == 1


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


# --- reverse -------------------------------------------------------------------------------------------------------

def test_reverse_undoes_the_conversion_exactly_and_counts_what_it_restored():
    text = (GOLDEN / "pod.yaml").read_text()
    forward = convert(text)
    back = convert(forward.text, reverse=True)
    assert (back.errors, back.probes, back.hooks) == ([], forward.probes, forward.hooks) == ([], 3, 1)
    assert parsed(back.text) == parsed(text)


def test_reverse_leaves_a_hand_written_marker_command_with_a_note():
    text = pod(f"readinessProbe:\n  exec: {{command: [{MARKER}, readiness, --http-get, ':8080/healthz']}}\n")
    result = convert(text, reverse=True)
    assert result.errors == []
    assert result.notes == [(f"spec.containers[0].readinessProbe.exec.command: a {MARKER} command that probectl "
                             "convert did not write (the hand-written flag form?): left unchanged"),
                            f"no {MARKER} command to restore"]
    assert parsed(result.text) == parsed(text)


def test_reverse_leaves_a_marker_command_with_other_than_strings_with_a_note():
    text = pod(f"readinessProbe: {{exec: {{command: [{MARKER}, readiness, 8080]}}}}\n")
    result = convert(text, reverse=True)
    assert result.notes[0].endswith("did not write (the hand-written flag form?): left unchanged")


def test_reverse_leaves_a_marker_command_of_another_role_with_a_note():
    command = command_for("liveness", {"grpc": {"port": 9090}})
    text = pod(f"readinessProbe: {{exec: {{command: {json.dumps(command)}}}}}\n"
               f"lifecycle:\n  preStop: {{exec: {{command: {json.dumps(command_for('preStop', {'grpc': {}}))}}}}}\n")
    result = convert(text, reverse=True)
    assert result.notes[:2] == [
        (f"spec.containers[0].readinessProbe.exec.command: a {MARKER} command for liveness grpc, not for this "
         "readiness handler: left unchanged"),
        (f"spec.containers[0].lifecycle.preStop.exec.command: a {MARKER} command for preStop grpc, not for this "
         "preStop handler: left unchanged")]
    assert parsed(result.text) == parsed(text)


def test_reverse_restores_in_a_host_network_pod_too():
    text = pod("readinessProbe: {tcpSocket: {port: 80}}\n")
    host_network = converted(text).replace("spec:\n", "spec:\n  hostNetwork: true\n", 1)
    assert convert(host_network, reverse=True).probes == 1


def test_converting_twice_changes_nothing():
    once = converted((GOLDEN / "pod.yaml").read_text())
    twice = convert(once)
    assert (twice.text, twice.probes, twice.hooks) == (once, 0, 0)


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


# --- goldens and corpus --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_golden(kind):
    source = (GOLDEN / f"{kind}.yaml").read_text()
    golden_path = GOLDEN / f"{kind}.converted.yaml"
    result = convert(source)
    assert result.errors == []
    if UPDATE:
        golden_path.write_text(result.text)
    assert result.text == golden_path.read_text()
    assert parsed(converted(golden_path.read_text(), reverse=True)) == parsed(source)


@pytest.mark.parametrize("path", CORPUS, ids=[path.name for path in CORPUS])
def test_corpus_round_trip_is_exact_and_convert_is_idempotent(path):
    source = path.read_text()
    forward = convert(source)
    assert forward.errors == []
    assert forward.probes + forward.hooks > 0
    back = convert(forward.text, reverse=True)
    assert (back.probes, back.hooks) == (forward.probes, forward.hooks)
    assert parsed(back.text) == parsed(source)
    again = convert(forward.text)
    assert (again.text, again.probes, again.hooks) == (forward.text, 0, 0)


@pytest.mark.parametrize("path", CORPUS, ids=[path.name for path in CORPUS])
def test_corpus_round_trip_through_json(path):
    source = parsed(path.read_text())
    data = json.loads(converted(converted(path.read_text(), output="json"), reverse=True, output="json"))
    assert ([ordered(item) for item in data["items"]] if len(source) > 1 else [ordered(data)]) == source


def test_the_corpus_covers_what_it_should():
    text = "\n".join(path.read_text() for path in CORPUS)
    assert len(CORPUS) >= 8
    for needle in ("kind: Deployment", "kind: StatefulSet", "kind: DaemonSet", "kind: Job", "kind: CronJob",
                   "kind: Service", "kind: ConfigMap", "grpc:", "tcpSocket:", "startupProbe:", "httpHeaders:",
                   "scheme: HTTPS", "preStop:", "postStart:", "restartPolicy: Always", "exec:", "hostNetwork: true",
                   '"kind": "Deployment"'):
        assert needle in text, needle


# --- the command ---------------------------------------------------------------------------------------------------

@pytest.fixture
def no_shim(monkeypatch):
    """convert needs no daemon: building a client at all is a failure."""
    def refuse(*args, **kwargs):
        raise AssertionError("probectl convert created a client")
    monkeypatch.setattr(client, "ProbeShimClient", refuse)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_the_conversion_and_notes_on_stderr(capsys, no_shim, tmp_path):
    source = GOLDEN / "list.yaml"
    code, out, err = run_cli(capsys, "convert", "-f", str(source))
    assert code == 0
    assert out == (GOLDEN / "list.converted.yaml").read_text()
    assert err == 'probectl: items[0]: Service "echo" has no pod spec: left unchanged\n'


def test_cli_reads_stdin_and_reverses(capsys, no_shim, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO((GOLDEN / "deployment.converted.yaml").read_text()))
    code, out, err = run_cli(capsys, "convert", "-f", "-", "--reverse")
    assert (code, err) == (0, "")
    assert parsed(out) == parsed((GOLDEN / "deployment.yaml").read_text())


def test_cli_json_output(capsys, no_shim):
    code, out, _ = run_cli(capsys, "convert", "-f", str(GOLDEN / "job.yaml"), "-o", "json")
    assert code == 0
    assert json.loads(out) == yaml.safe_load((GOLDEN / "job.converted.yaml").read_text())


def test_cli_errors_exit_1_with_nothing_on_stdout(capsys, no_shim, tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(pod("readinessProbe: {httpGet: {host: 10.0.0.1, port: 0}}\n"
                            "livenessProbe: {tcpSocket: {port: 0}}\n"))
    code, out, err = run_cli(capsys, "convert", "-f", str(manifest))
    assert (code, out) == (1, "")
    assert err == ("probectl: spec.containers[0].livenessProbe.tcpSocket.port: Invalid value: 0: must be between 1 "
                   "and 65535, inclusive\n"
                   f"probectl: spec.containers[0].readinessProbe.httpGet.host: {HOST_FORBIDDEN}\n")


def test_cli_allow_host(capsys, no_shim, tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(pod("readinessProbe: {httpGet: {host: 10.0.0.1, port: 80}}\n"))
    assert run_cli(capsys, "convert", "-f", str(manifest))[0] == 1
    code, out, err = run_cli(capsys, "convert", "-f", str(manifest), "--allow-host")
    assert (code, err) == (0, "")
    assert '"host":"10.0.0.1"' in out


@pytest.mark.parametrize("args, fragment", [
    (["convert"], "the following arguments are required: -f/--filename"),
    (["convert", "-f", "x.yaml", "-o", "table"], "argument -o/--output: invalid choice: 'table'"),
    (["convert", "-f", "/nonexistent/pod.yaml"], "cannot read /nonexistent/pod.yaml: No such file or directory"),
])
def test_cli_bad_arguments_exit_1(capsys, no_shim, args, fragment):
    code, out, err = run_cli(capsys, *args)
    assert (code, out) == (1, "")
    assert err.startswith("probectl: ") and fragment in err and err.count("\n") == 1


# --- what a converted pod carries: the original handlers, the shim nodes' affinity --------------------------------

def test_a_converted_pod_records_its_handlers_and_needs_a_shim_node_and_reverse_takes_both_off():
    text = pod("readinessProbe: {httpGet: {path: /ready, port: 8080}}\n")
    out = yaml.safe_load(converted(text))
    assert json.loads(out["metadata"]["annotations"]["probe-shim.io/original-handlers"]) == {
        "containers[c].readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}}
    assert out["spec"]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "probe-shim.io/bridge", "operator": "In", "values": ["v1alpha1"]}]}]}}}
    assert parsed(converted(converted(text), reverse=True)) == parsed(text)


def test_no_node_affinity_on_request():
    out = yaml.safe_load(converted(pod("readinessProbe: {tcpSocket: {port: 80}}\n"), node_affinity=False))
    assert "affinity" not in out["spec"] and "probe-shim.io/original-handlers" in out["metadata"]["annotations"]


def test_a_pod_with_nothing_to_convert_gets_nothing():
    text = pod("readinessProbe: {exec: {command: [true]}}\n")
    assert parsed(converted(text)) == parsed(text)


def test_lenient_conversion_leaves_what_it_cannot_convert_and_says_why():
    obj = yaml.safe_load(pod("readinessProbe: {httpGet: {port: 0}}\nlivenessProbe: {tcpSocket: {port: 80}}\n"))
    result = convert_object(obj)
    assert result.errors == [] and result.probes == 1
    assert result.left == ["spec.containers[0].readinessProbe.httpGet.port: Invalid value: 0: "
                           "must be between 1 and 65535, inclusive"]
    assert obj["spec"]["containers"][0]["readinessProbe"] == {"httpGet": {"port": 0}}


def test_a_pod_field_of_the_wrong_type_where_the_affinity_goes_is_an_error():
    result = convert(pod("readinessProbe: {tcpSocket: {port: 80}}\n", spec_extra="  affinity: []\n"))
    assert result.errors == ["spec.affinity: Invalid value: must be a mapping (a list for nodeSelectorTerms): "
                             "a converted pod records its original handlers and needs a shim node there"]
