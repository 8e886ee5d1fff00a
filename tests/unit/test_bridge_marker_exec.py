"""marker_exec (shim/bridge/command.py): the marker command recognised in the bytes of an ExecSyncRequest, and
nothing else. Pure: no sockets, no daemon."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.bridge_command import command_for, is_marker
from shim.bridge.command import MarkerExecs, marker_exec
from tests.support.bridge_commands import M


def exec_request(cmd: list[str], container_id: str = "c0ffee", timeout: int = 1) -> bytes:
    return cri_pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout).SerializeToString()


def test_a_marker_exec_is_decoded():
    cmd = command_for("readiness", {"tcpSocket": {"port": 80}})
    decoded = marker_exec(exec_request(cmd, "abc", 3))
    assert decoded == cri_pb.ExecSyncRequest(container_id="abc", cmd=cmd, timeout=3)


@pytest.mark.parametrize("request_bytes", [
    exec_request(["cat", "/tmp/healthy"]),
    exec_request([]),
    b"",
    exec_request(["/bin/busybox", "echo", "hello", M]),                     # the marker only as a later argument
    exec_request(["sh", "-c", f"{M} readiness --tcp 80"]),                  # ... or inside one
    exec_request(["echo"], container_id=M),                                 # ... or as the container id
    exec_request([f"/usr/local/bin/{M}", "readiness", "--tcp", "80"]),      # a path is not the marker
    exec_request([M + "x", "readiness", "--tcp", "80"]),
    exec_request([" " + M, "readiness", "--tcp", "80"]),
    M.encode() + b"\xff\xff\xff",                                           # undecodable, yet holding the marker
    b"\x12" + bytes([len(M) + 2]) + M.encode() + b"\xff\xfe",               # cmd[0] with invalid UTF-8 after it
    exec_request([M])[:-3],                                                 # truncated mid-field
], ids=["ordinary", "no-cmd", "empty", "later-argument", "inside-argument", "container-id", "path", "suffix",
        "blank", "undecodable", "bad-utf8", "truncated"])
def test_anything_else_is_not_a_marker_exec(request_bytes):
    assert marker_exec(request_bytes) is None


def test_a_marker_exec_with_fields_the_subset_does_not_know_is_still_read():
    unknown = b"\xa8\x06\x01"  # field 101, varint 1: a newer ExecSyncRequest field
    cmd = [M, "readiness", "--tcp", "80"]
    assert marker_exec(exec_request(cmd) + unknown).cmd == cmd


@given(cmd=st.lists(st.sampled_from([M, "readiness", "--tcp", "80", "sh", "", M + " "]) | st.text(max_size=20),
                    max_size=5),
       container_id=st.sampled_from(["c", M, ""]), timeout=st.integers(-2**63, 2**63 - 1))
def test_marker_exec_answers_exactly_when_cmd0_is_the_marker(cmd, container_id, timeout):
    decoded = marker_exec(exec_request(cmd, container_id, timeout))
    if cmd and cmd[0] == M:
        assert decoded == cri_pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout)
    else:
        assert decoded is None
    assert is_marker(cmd) == (decoded is not None)


# --- MarkerExecs: the same bytes, decoded once ------------------------------------------------------------------

def test_the_same_marker_bytes_give_the_same_decoded_request_and_others_their_own():
    execs = MarkerExecs()
    readiness = exec_request(command_for("readiness", {"tcpSocket": {"port": 80}}), "abc", 3)
    liveness = exec_request(command_for("liveness", {"tcpSocket": {"port": 80}}), "abc", 3)
    first = execs.claim(readiness)
    assert first == marker_exec(readiness) and execs.claim(readiness) is first
    assert execs.claim(liveness) == marker_exec(liveness) != first


@pytest.mark.parametrize("request_bytes", [exec_request(["cat", "/tmp/healthy"]), M.encode() + b"\xff\xff\xff",
                                           exec_request([" " + M, "readiness", "--tcp", "80"])],
                         ids=["ordinary", "undecodable", "blank"])
def test_what_is_not_a_marker_exec_is_not_claimed_however_often(request_bytes):
    execs = MarkerExecs()
    assert [execs.claim(request_bytes) for _ in range(2)] == [None, None]


def test_a_full_memory_starts_again_and_still_decodes():
    execs = MarkerExecs(max_kept=2)
    requests = [exec_request([M, "readiness", "--tcp", str(port)]) for port in (80, 81, 82)]
    assert [execs.claim(r).cmd[-1] for r in requests + requests] == ["80", "81", "82"] * 2
