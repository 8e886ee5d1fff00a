"""Kubernetes manifests -> probe registrations (probectl/manifest.py): pure, table-driven."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from cri_proto import probe_spec_pb2 as spec_pb
from probectl.manifest import EXEC_NOTE, ManifestProbe, probes_from_manifest

POD = textwrap.dedent("""\
    apiVersion: v1
    kind: Pod
    metadata:
      name: shop
    spec:
      initContainers:
      - name: migrate            # a plain init container: no probes, nothing to do
        image: migrate:1
      - name: envoy              # a sidecar (Kubernetes 1.29+): probed like a container
        image: envoy:1
        restartPolicy: Always
        ports:
        - {name: admin, containerPort: 9901}
        readinessProbe:
          tcpSocket: {port: admin}
      containers:
      - name: web
        image: web:1
        ports:
        - name: http
          containerPort: 8080
        - {name: metrics, containerPort: 9100, protocol: TCP}
        livenessProbe:
          httpGet:
            path: /healthz?verbose=1
            port: http
            scheme: HTTPS
            httpHeaders:
            - {name: X-Probe, value: live}
            - {name: User-Agent, value: ""}
          initialDelaySeconds: 5
          periodSeconds: 3
          timeoutSeconds: 2
          failureThreshold: 4
          terminationGracePeriodSeconds: 30
        readinessProbe:
          httpGet: {port: 8080}
          successThreshold: 2
        startupProbe:
          tcpSocket: {port: metrics}
          failureThreshold: 30
          periodSeconds: 1
      - name: api
        image: api:1
        readinessProbe:
          grpc: {port: 9090, service: ready}
        livenessProbe:
          exec: {command: [cat, /tmp/healthy]}
    """)


def by_path(result):
    return {probe.path: probe for probe in result.probes}


def test_every_kind_of_probe_in_a_multi_container_pod():
    result = probes_from_manifest(POD)
    assert result.errors == []
    assert result.skipped == [f"spec.containers[1].livenessProbe: {EXEC_NOTE}"]
    probes = by_path(result)
    assert list(probes) == [
        "spec.initContainers[1].readinessProbe",
        "spec.containers[0].livenessProbe", "spec.containers[0].readinessProbe", "spec.containers[0].startupProbe",
        "spec.containers[1].readinessProbe",
    ]
    web_ports = (spec_pb.ContainerPort(name="http", container_port=8080, protocol="TCP"),
                 spec_pb.ContainerPort(name="metrics", container_port=9100, protocol="TCP"))
    assert probes["spec.containers[0].livenessProbe"] == ManifestProbe(
        path="spec.containers[0].livenessProbe", container_name="web", probe_type=spec_pb.LIVENESS,
        spec=spec_pb.ProbeSpec(
            http_get=spec_pb.HTTPGetAction(
                path="/healthz?verbose=1", port=spec_pb.PortRef(name="http"), scheme=spec_pb.HTTPS,
                http_headers=[spec_pb.HTTPHeader(name="X-Probe", value="live"),
                              spec_pb.HTTPHeader(name="User-Agent", value="")]),
            initial_delay_ms=5000, period_ms=3000, timeout_ms=2000, failure_threshold=4,
            termination_grace_period_ms=30_000),
        container_ports=web_ports, pod_name="shop")
    readiness = probes["spec.containers[0].readinessProbe"]
    # Unset fields stay 0: the daemon applies the Kubernetes defaults (10 s period, 1 s timeout, 3 failures).
    assert readiness.spec == spec_pb.ProbeSpec(
        http_get=spec_pb.HTTPGetAction(path="/", port=spec_pb.PortRef(number=8080)), success_threshold=2)
    startup = probes["spec.containers[0].startupProbe"]
    assert (startup.probe_type, startup.spec.tcp_socket.port.name, startup.spec.period_ms,
            startup.spec.failure_threshold) == (spec_pb.STARTUP, "metrics", 1000, 30)
    grpc = probes["spec.containers[1].readinessProbe"]
    assert (grpc.container_name, grpc.spec.grpc.port, grpc.spec.grpc.service, grpc.container_ports) == (
        "api", 9090, "ready", ())
    sidecar = probes["spec.initContainers[1].readinessProbe"]
    assert (sidecar.container_name, sidecar.spec.tcp_socket.port.name, sidecar.container_ports) == (
        "envoy", "admin", (spec_pb.ContainerPort(name="admin", container_port=9901, protocol="TCP"),))


def test_json_is_read_like_yaml():
    as_json = json.dumps(yaml.safe_load(POD))
    assert probes_from_manifest(as_json) == probes_from_manifest(POD)


def pod(container: dict, kind: str = "Pod", **spec) -> dict:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "p"}, "spec": {"containers": [container], **spec}}


def test_a_list_and_several_documents_prefix_their_paths():
    first = pod({"name": "a", "readinessProbe": {"tcpSocket": {"port": 1}}})
    second = pod({"name": "b", "ports": [{"name": "web", "containerPort": 80}],
                  "readinessProbe": {"httpGet": {"port": "www"}}})
    listed = probes_from_manifest(json.dumps({"apiVersion": "v1", "kind": "List", "items": [first, second]}))
    assert [p.path for p in listed.probes] == ["items[0].spec.containers[0].readinessProbe"]
    assert listed.errors == ['items[1].spec.containers[0].readinessProbe.httpGet.port: unknown named port "www"']

    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}}
    stream = "---\n".join(yaml.safe_dump(doc) for doc in (first, service, {**second, "kind": "Pod"}))
    documents = probes_from_manifest(stream + "---\n")  # a trailing empty document is no object
    assert [p.path for p in documents.probes] == ["documents[0].spec.containers[0].readinessProbe"]
    assert documents.skipped == ['documents[1]: Service "web" has no pod spec']
    assert documents.errors == [
        'documents[2].spec.containers[0].readinessProbe.httpGet.port: unknown named port "www"']
    pod_list = probes_from_manifest(json.dumps({"kind": "PodList", "items": [first]}))
    assert [p.path for p in pod_list.probes] == ["items[0].spec.containers[0].readinessProbe"]


def test_workloads_are_read_through_their_pod_template():
    template = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [
        {"name": "app", "livenessProbe": {"tcpSocket": {"port": 8080}}}]}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"replicas": 2, "template": template}}
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
               "spec": {"jobTemplate": {"spec": {"template": template}}}}
    assert [(p.path, p.pod_name) for p in probes_from_manifest(json.dumps(deployment)).probes] == [
        ("spec.template.spec.containers[0].livenessProbe", "d")]
    assert [p.path for p in probes_from_manifest(json.dumps(cronjob)).probes] == [
        "spec.jobTemplate.spec.template.spec.containers[0].livenessProbe"]
    assert probes_from_manifest(json.dumps({"kind": "Deployment", "spec": {}})).errors == [
        "spec.template: Required value: a Deployment has a pod spec here"]


@pytest.mark.parametrize("container, error", [
    # Named ports must exist on that container (the kubelet would fail every attempt otherwise).
    ({"name": "c", "readinessProbe": {"httpGet": {"port": "web"}}},
     'spec.containers[0].readinessProbe.httpGet.port: unknown named port "web"'),
    ({"name": "c", "ports": [{"name": "web", "containerPort": 80}], "livenessProbe": {"tcpSocket": {"port": "db"}}},
     'spec.containers[0].livenessProbe.tcpSocket.port: unknown named port "db"'),
    # Kubernetes validation, in Kubernetes field names and units.
    ({"name": "c", "livenessProbe": {"httpGet": {"port": 0}}},
     "spec.containers[0].livenessProbe.httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive"),
    ({"name": "c", "livenessProbe": {"httpGet": {"port": "8080"}}},   # a string is a name, even with digits
     'spec.containers[0].livenessProbe.httpGet.port: Invalid value: "8080": must contain at least one letter (a-z)'),
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": 1}, "successThreshold": 3}},
     "spec.containers[0].livenessProbe.successThreshold: Invalid value: 3: must be 1"),
    ({"name": "c", "readinessProbe": {"tcpSocket": {"port": 1}, "periodSeconds": -2}},
     "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -2: must be greater than or equal to 0"),
    ({"name": "c", "readinessProbe": {"tcpSocket": {"port": 1}, "terminationGracePeriodSeconds": 5}},
     "spec.containers[0].readinessProbe.terminationGracePeriodSeconds: Invalid value: 5: "
     "must not be set for readinessProbes"),
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": 1}, "terminationGracePeriodSeconds": 0}},
     "spec.containers[0].livenessProbe.terminationGracePeriodSeconds: Invalid value: 0: must be greater than 0"),
    ({"name": "c", "livenessProbe": {"httpGet": {"port": 1, "httpHeaders": [{"name": "Bad Name", "value": "x"}]}}},
     "spec.containers[0].livenessProbe.httpGet.httpHeaders: Invalid value: \"Bad Name\": a valid HTTP header must "
     "consist of alphanumeric characters or '-' (e.g. 'X-Header-Name', regex used for validation is "
     "'[-A-Za-z0-9]+')"),
    ({"name": "c", "livenessProbe": {"periodSeconds": 1}},
     "spec.containers[0].livenessProbe: Required value: must specify a handler type"),
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": 1}, "grpc": {"port": 2}}},
     "spec.containers[0].livenessProbe.grpc: Forbidden: may not specify more than 1 handler type"),
    ({"name": "c", "livenessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": 1}}},
     "spec.containers[0].livenessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type"),
    ({"name": "c", "livenessProbe": {"httpGet": {"port": 1, "scheme": "https"}}},  # case-sensitive in the API
     'spec.containers[0].livenessProbe.httpGet.scheme: Unsupported value: "https": supported values: '
     '"HTTP", "HTTPS"'),
    ({"name": "c", "livenessProbe": {"httpGet": {"port": 1, "protocol": "h2c"}}},  # 1.37, KEP-5999
     'spec.containers[0].livenessProbe.httpGet.protocol: Unsupported value: "h2c": supported values: '
     '"HTTP1", "HTTP2"'),
    ({"name": "c", "livenessProbe": {"httpGet": {"port": 1, "protocol": "HTTP2", "scheme": "HTTPS"}}},
     'spec.containers[0].livenessProbe.httpGet.protocol: Invalid value: "HTTP2": is only supported with HTTP (H2C)'),
    # Wrong types name the path; never a traceback.
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": [1]}}},
     "spec.containers[0].livenessProbe.tcpSocket.port: Invalid value: [1]: must be a port number or a port name"),
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": True}}},
     "spec.containers[0].livenessProbe.tcpSocket.port: Invalid value: true: must be a port number or a port name"),
    ({"name": "c", "livenessProbe": {"grpc": {"port": "grpc"}}},
     'spec.containers[0].livenessProbe.grpc.port: Invalid value: "grpc": must be an integer'),
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": 1}, "periodSeconds": "10s"}},
     'spec.containers[0].livenessProbe.periodSeconds: Invalid value: "10s": must be an integer'),
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": 1}, "timeoutSeconds": 1.5}},
     "spec.containers[0].livenessProbe.timeoutSeconds: Invalid value: 1.5: must be an integer"),
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": 1}, "periodSeconds": 2**31}},
     "spec.containers[0].livenessProbe.periodSeconds: Invalid value: 2147483648: must fit in a 32-bit integer"),
    ({"name": "c", "livenessProbe": {"tcpSocket": {"port": 2**40}}},
     "spec.containers[0].livenessProbe.tcpSocket.port: Invalid value: 1099511627776: "
     "must be between 1 and 65535, inclusive"),
    ({"name": "c", "livenessProbe": ["tcpSocket"]},
     'spec.containers[0].livenessProbe: Invalid value: ["tcpSocket"]: must be a mapping'),
    ({"name": "c", "livenessProbe": {"httpget": {"port": 1}}},
     'spec.containers[0].livenessProbe: unknown field "httpget"'),
    ({"name": "c", "livenessProbe": {"httpGet": {"port": 1, "headers": []}}},
     'spec.containers[0].livenessProbe.httpGet: unknown field "headers"'),
    ({"name": "c", "livenessProbe": {"httpGet": {"port": 1, "path": 5}}},
     "spec.containers[0].livenessProbe.httpGet.path: Invalid value: 5: must be a string"),
    ({"name": "c", "ports": [{"name": "web"}], "livenessProbe": {"tcpSocket": {"port": "web"}}},
     "spec.containers[0].ports[0].containerPort: Required value"),
    ({"name": "c", "ports": "8080"},
     'spec.containers[0].ports: Invalid value: "8080": must be a list'),
    ({"livenessProbe": {"tcpSocket": {"port": 1}}},
     "spec.containers[0].name: Required value"),
])
def test_errors_name_the_manifest_path(container, error):
    result = probes_from_manifest(json.dumps(pod(container)))
    assert (result.errors, result.probes) == ([error], [])


def test_probes_on_plain_init_containers_are_refused():
    manifest = pod({"name": "app"}, initContainers=[{"name": "init", "startupProbe": {"tcpSocket": {"port": 1}}}])
    assert probes_from_manifest(json.dumps(manifest)).errors == [
        "spec.initContainers[0].startupProbe: Forbidden: may not be set for init containers without "
        "restartPolicy=Always"]


def test_one_bad_probe_does_not_hide_the_others():
    manifest = pod({"name": "a", "readinessProbe": {"tcpSocket": {"port": "nope"}},
                    "livenessProbe": {"tcpSocket": {"port": 1}, "initialDelaySeconds": -1, "failureThreshold": -1}})
    result = probes_from_manifest(json.dumps(manifest))
    assert result.probes == []
    assert result.errors == [
        "spec.containers[0].livenessProbe.initialDelaySeconds: Invalid value: -1: must be greater than or equal to 0",
        "spec.containers[0].livenessProbe.failureThreshold: Invalid value: -1: must be greater than or equal to 0",
        'spec.containers[0].readinessProbe.tcpSocket.port: unknown named port "nope"',
    ]


def test_names_must_be_unique_in_the_one_sandbox():
    probe = {"tcpSocket": {"port": 1}}
    duplicate = pod({"name": "a", "readinessProbe": probe}, initContainers=[
        {"name": "a", "restartPolicy": "Always", "readinessProbe": probe}])
    assert probes_from_manifest(json.dumps(duplicate)).errors == ['spec.containers[0].name: Duplicate value: "a"']
    # Two pods applied to one --pod sandbox: the second's "a" would replace the first's probe.
    two = {"kind": "List", "items": [pod({"name": "a", "readinessProbe": probe})] * 2}
    result = probes_from_manifest(json.dumps(two))
    assert [p.path for p in result.probes] == ["items[0].spec.containers[0].readinessProbe"]
    assert result.errors == ['items[1].spec.containers[0].readinessProbe: container "a" already has this probe at '
                             'items[0].spec.containers[0].readinessProbe (every probe goes to the one --pod sandbox)']


@pytest.mark.parametrize("text, error", [
    ("kind: Pod\nspec: {containers: [\n", "not valid YAML or JSON: "),
    ('{"kind": "Pod", ', "not valid YAML or JSON: "),
    ("", "the manifest has no objects"),
    ("- a\n- b\n", "the manifest: expected a Kubernetes object, got a list"),
    ("spec: {}\n", "kind: Required value: expected Pod, a List of Pods or a workload"),
    ("kind: List\nitems: 3\n", "items: Invalid value: 3: must be a list"),
    ("kind: Pod\nspec: {containers: {name: a}}\n", 'spec.containers: Invalid value: {"name": "a"}: must be a list'),
    ("kind: Pod\nspec: {containers: [7]}\n", "spec.containers[0]: Invalid value: 7: must be a container (a mapping)"),
])
def test_malformed_manifests(text, error):
    result = probes_from_manifest(text)
    assert len(result.errors) == 1 and result.errors[0].startswith(error), result.errors
    assert "\n" not in result.errors[0]


def test_yaml_errors_say_where():
    (error,) = probes_from_manifest("kind: Pod\nspec:\n  containers: [\n").errors
    assert "(line 4, column 1)" in error
