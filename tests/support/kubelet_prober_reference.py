"""The kubelet's own prober as a reference: tests/reference/kubelet_prober (Go, k8s.io/kubernetes v1.37.2's
pkg/kubelet/prober runProbe with pkg/probe/{http,tcp,grpc}), built by hack/build-kubelet-prober.sh into a cache
outside the work tree, and run inside a test's network namespace.

A case is what the kubelet gets: a core/v1 Probe, the container's ports and the pod IP. The kubelet's answer is
(result, output, error); the engine reports an error as an UNKNOWN attempt whose output is the error's text (the
kubelet discards such a result and shows the text in its event), so both are compared as the engine reports them:
(result name, output), exactly but for what Go itself does not fix (`comparable`):
  - the order of an HTTP/2 request's regular header fields, which x/net/http2's EncodeHeaders takes from ranging
    over the Header map (random in Go): an echo of them is compared with those fields sorted, pseudo-headers kept
    in place;
  - the local port of a connection (`read tcp 198.18.0.2:PORT->...`), the kernel's choice;
  - for a case marked `timeout_race`, which of its texts Go's HTTP/2 client gives when the timeout strikes while
    it awaits the headers: x/net/http2's RoundTrip selects on the request's context and on its Cancel channel,
    both closed at the deadline, and http.Client adds "(Client.Timeout exceeded ...)" only if its timer's goroutine
    has marked the timeout by then (measured: 12, 3 and 1 of 16). Such a case accepts any of the three.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.manifest_handlers import TIMING, handler_spec
from tests.support.netns_env import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-kubelet-prober.sh"
# A cold build (modules already in the Go module cache from the kubelet's build) takes about 10 s on the 2-core VM,
# 45 s with empty Go caches; this leaves room for a slow proxy.
BUILD_TIMEOUT_S = 600

RESULT_NAMES = {spec_pb.RESULT_SUCCESS: "success", spec_pb.RESULT_WARNING: "warning",
                spec_pb.RESULT_FAILURE: "failure", spec_pb.RESULT_UNKNOWN: "unknown"}


class ReferenceUnavailable(Exception):
    """Why the reference prober cannot run here (the tests skip with it)."""


def reference_binary() -> Path:
    """$KUBELET_PROBER_BIN, else the build script's binary (built now if its sources changed since)."""
    given = os.environ.get("KUBELET_PROBER_BIN")
    if given:
        if not os.access(given, os.X_OK):
            raise ReferenceUnavailable(f"KUBELET_PROBER_BIN={given} is not an executable")
        return Path(given)
    if shutil.which("go") is None:
        raise ReferenceUnavailable("needs Go to build the kubelet's prober (hack/build-kubelet-prober.sh), or "
                                   "KUBELET_PROBER_BIN naming one built before")
    built = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if built.returncode != 0:
        raise RuntimeError(f"hack/build-kubelet-prober.sh failed:\n{built.stderr[-4000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Case:
    """One probe as the kubelet has it: a core/v1 Probe (timeoutSeconds included), the container's ports."""

    name: str
    probe: dict
    ports: tuple[dict, ...] = ()
    ipv6: bool = False            # the pod IP is the pod's IPv6 address (the engine: ip_family IPV6)
    timeout_race: bool = False    # an HTTPS probe over HTTP/2 that times out awaiting headers (see above)

    def kubelet_input(self, pod_ipv4: str, pod_ipv6: str) -> dict:
        return {"name": self.name, "podIP": pod_ipv6 if self.ipv6 else pod_ipv4,
                "container": {"name": "app", "ports": list(self.ports)}, "probe": self.probe}

    def container_ports(self) -> tuple[spec_pb.ContainerPort, ...]:
        return tuple(spec_pb.ContainerPort(name=p.get("name", ""), container_port=p["containerPort"],
                                           protocol=p.get("protocol", "TCP")) for p in self.ports)

    def engine_spec(self) -> spec_pb.ProbeSpec:
        """The ProbeSpec the kubelet bridge and probectl make of this Probe (probe_api.manifest_handlers)."""
        handlers = {key: value for key, value in self.probe.items() if key in ("httpGet", "tcpSocket", "grpc")}
        # handler_spec refuses a name the container has not (a manifest error); the kubelet takes it and fails
        # each attempt, which is what a case with such a port compares, so the name is let through here.
        named = [h["port"] for h in handlers.values() if isinstance(h.get("port"), str)]
        known = self.container_ports() + tuple(spec_pb.ContainerPort(name=n) for n in named)
        spec = handler_spec(handlers, "", known)
        for k8s_name, (proto_name, per_unit, _) in TIMING.items():
            if k8s_name in self.probe:
                setattr(spec, proto_name, self.probe[k8s_name] * per_unit)
        if self.ipv6:
            spec.ip_family = spec_pb.IPV6
        return spec


@dataclass
class Answer:
    result: str
    output: str
    tries: int = 1
    seconds: float = 0.0


_LOCAL_PORT = re.compile(r"(?P<op>read|write) tcp (?P<ip>\S+):\d+->")
_AWAITING_HEADERS = " (Client.Timeout exceeded while awaiting headers)"
_DEADLINE = "context deadline exceeded"
# Go's three texts for an HTTP/2 request timed out awaiting headers, each as the first (the engine's).
_TIMEOUT_RACE = {f": net/http: request canceled{_AWAITING_HEADERS}": f": {_DEADLINE}{_AWAITING_HEADERS}",
                 f": {_DEADLINE}": f": {_DEADLINE}{_AWAITING_HEADERS}"}


def comparable(case: Case, answer: Answer) -> tuple[str, str]:
    """(result, output) with what Go leaves to chance put in one form (see the module's docstring)."""
    output = _LOCAL_PORT.sub(r"\g<op> tcp \g<ip>:PORT->", answer.output)
    if case.timeout_race:
        for text, canonical in _TIMEOUT_RACE.items():
            if output.endswith(text):
                output = output[:-len(text)] + canonical
    if output.startswith('{"protocol": "h2", "headers": '):
        echo = json.loads(output)
        fields = echo["headers"]
        echo["headers"] = ([f for f in fields if f[0].startswith(":")]
                           + sorted(f for f in fields if not f[0].startswith(":")))
        output = json.dumps(echo)
    return answer.result, output


def kubelet_answers(binary: Path, netns: str, cases: list[Case], pod_ipv4: str, pod_ipv6: str,
                    parallel: int = 8) -> tuple[str, dict[str, Answer]]:
    """The kubelet's answers, by case name, run inside `netns`; and the gitVersion the binary says it is."""
    stdin = json.dumps({"cases": [case.kubelet_input(pod_ipv4, pod_ipv6) for case in cases]})
    run = subprocess.run(["ip", "netns", "exec", netns, str(binary), f"-parallel={parallel}"], input=stdin,
                         capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        raise RuntimeError(f"kubelet-prober exited {run.returncode}: {run.stderr[-4000:]}")
    reply = json.loads(run.stdout)
    answers = {}
    for r in reply["results"]:
        result, output = ("unknown", r["error"]) if r["error"] else (r["result"], r["output"])
        answers[r["name"]] = Answer(result, output, r["tries"], r["seconds"])
    return reply["gitVersion"], answers


def engine_answer(attempt: spec_pb.Attempt) -> Answer:
    return Answer(RESULT_NAMES[attempt.result], attempt.output, seconds=attempt.duration_ns / 1e9)

