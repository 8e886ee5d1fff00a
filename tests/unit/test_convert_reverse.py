"""probectl convert --reverse (probectl/convert.py): it undoes the conversion exactly and leaves, with a note, a marker
command it did not write. Pure: no daemon, no root."""

from __future__ import annotations

import json

from probe_api.bridge_command import MARKER, command_for
from probectl.convert import convert
from tests.support.convert_manifests import GOLDEN, converted, parsed, pod


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
