"""The conversion rule (probe_api/pod_conversion.py, run by probectl/convert.py): each probe and hook handler becomes
the marker exec of its role and nothing else moves; host and hostNetwork; what a converted pod carries (its original
handlers, the shim nodes' affinity). Pure: no daemon, no root."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from probe_api.bridge_command import MARKER, command_for, handler_in
from probe_api.pod_conversion import HOST_FORBIDDEN, HOST_NETWORK_NOTE, convert_object
from probectl.convert import convert
from tests.support.convert_manifests import container_of, converted, parsed, pod

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
