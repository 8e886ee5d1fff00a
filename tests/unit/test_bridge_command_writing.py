"""Writing the kubelet bridge's marker command (probe_api/bridge_command.py: command_for and handler_in) so that the
kubelet's own `$(VAR)` expansion leaves it as it was written, checked against a model of that expansion that passes
Kubernetes' own cases. Pure: no sockets, no daemon."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from probe_api.bridge_command import HANDLER_KEYS, HOOK_ROLES, PROBE_ROLES, ROLES, command_for, handler_in
from shim.bridge.command import parse_command
from tests.support.bridge_commands import M


def test_command_for_writes_compact_json_after_the_role():
    assert command_for("readiness", {"httpGet": {"path": "/healthz", "port": 8080}}) == [
        M, "readiness", '{"httpGet":{"path":"/healthz","port":8080}}']
    assert command_for("preStop", {"tcpSocket": {"port": "web"}}) == [M, "preStop", '{"tcpSocket":{"port":"web"}}']
    # Not ASCII-escaped: the command stays readable in `kubectl get pod -o yaml`.
    assert command_for("liveness", {"httpGet": {"path": "/é", "port": 1}})[2] == '{"httpGet":{"path":"/é","port":1}}'


@pytest.mark.parametrize("role", PROBE_ROLES)
def test_a_probes_dollars_are_doubled_for_the_kubelets_expansion(role):
    assert command_for(role, {"httpGet": {"path": "/$(HOME)/a$b$$c", "port": 80}})[2] == (
        '{"httpGet":{"path":"/$$(HOME)/a$$b$$$$c","port":80}}')


@pytest.mark.parametrize("role", HOOK_ROLES)
def test_a_hooks_dollars_are_left_alone_since_hooks_are_not_expanded(role):
    assert command_for(role, {"httpGet": {"path": "/$(HOME)/a$b", "port": 80}})[2] == (
        '{"httpGet":{"path":"/$(HOME)/a$b","port":80}}')


@pytest.mark.parametrize("command", [
    [M, "readiness"],
    [M, "readiness", '{"tcpSocket":{"port":80}}', "--target", "loopback"],  # hand-edited: not mechanical
    ["sh", "readiness", '{"tcpSocket":{"port":80}}'],
    [M, "Readiness", '{"tcpSocket":{"port":80}}'],
    [M, "readiness", "--tcp"],
    [M, "readiness", '{"tcpSocket":{"port":80}'],
    [M, "readiness", '[{"tcpSocket":{"port":80}}]'],
    [M, "readiness", "{}"],
    [M, "readiness", '{"tcpSocket":{"port":80},"grpc":{"port":80}}'],
    [M, "readiness", '{"exec":{"command":["true"]}}'],
])
def test_handler_in_reads_only_what_command_for_writes(command):
    assert handler_in(command) is None


def test_handler_in_undoes_the_escape_only_for_probes():
    assert handler_in([M, "startup", '{"httpGet":{"path":"/$$x","port":1}}']) == (
        "startup", {"httpGet": {"path": "/$x", "port": 1}})
    assert handler_in([M, "postStart", '{"httpGet":{"path":"/$$x","port":1}}']) == (
        "postStart", {"httpGet": {"path": "/$$x", "port": 1}})


json_scalars = st.text() | st.integers(min_value=-2**63, max_value=2**63 - 1)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12)
handlers = st.builds(lambda key, body: {key: body}, st.sampled_from(HANDLER_KEYS),
                     st.dictionaries(st.text(), json_values, max_size=5))


@given(role=st.sampled_from(ROLES), handler=handlers)
@example(role="readiness", handler={"httpGet": {"path": "$", "port": "$$(X)"}})
@example(role="preStop", handler={"tcpSocket": {"$$": "$(", "port": 1}})
def test_handler_in_inverts_command_for(role, handler):
    assert handler_in(command_for(role, handler)) == (role, handler)


# ---------------------------------------------------------------- the kubelet's $(VAR) expansion

# A model of kubernetes third_party/forked/golang/expansion/expand.go (Expand, tryReadVariableName,
# MappingFuncFor), which the kubelet applies to every argument of an exec probe's command
# (prober.go: kubecontainer.ExpandContainerCommandOnlyStatic(p.Exec.Command, container.Env)) and not to an exec
# hook's (lifecycle/handlers.go: RunInContainer(ctx, containerID, handler.Exec.Command, 0)). Go walks bytes;
# '$', '(' and ')' are ASCII and the default case copies a whole rune, so walking characters is the same.


def mapping_func_for(*contexts: dict[str, str]) -> Callable[[str], str]:
    """MappingFuncFor: the first context holding the name, else the reference as written: `$(NAME)`."""
    def mapping(name: str) -> str:
        for context in contexts:
            if name in context:
                return context[name]
        return f"$({name})"
    return mapping


def try_read_variable_name(text: str) -> tuple[str, bool, int]:
    """tryReadVariableName: (what was read, whether it is a variable name, characters consumed)."""
    if text[0] == "$":  # escaped operator; return it
        return "$", False, 1
    if text[0] == "(":  # scan to the expression closer
        for index in range(1, len(text)):
            if text[index] == ")":
                return text[1:index], True, index + 1
        return "$(", False, 1  # incomplete reference; return it
    return "$" + text[0], False, 1  # not an expression: the operator and the first rune


def expand(text: str, mapping: Callable[[str], str]) -> str:
    """Expand: `$$` -> `$`, `$(NAME)` -> mapping(NAME), any other `$` kept."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            read, is_var, advance = try_read_variable_name(text[cursor + 1:])
            out.append(mapping(read) if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


# expand_test.go doExpansionTest, every case, so that the model is the kubelet's and not a guess.
UPSTREAM_CASES = [
    ("$(VAR_A)", "A"), ("$(VAR_A)-$(VAR_A)", "A-A"), ("$(VAR_A)-1", "A-1"), ("___$(VAR_B)___", "___B___"),
    ("___$(VAR_C)", "___C"), ("$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"), ("$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
    ("$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"), ("f000-$$VAR_A", "f000-$VAR_A"),
    ("foo\\$(VAR_C)bar", "foo\\Cbar"), ("foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
    ("foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"), ("$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),
    ("$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"), ("$(VAR_REF)", "$(VAR_A)"),
    ("%%$(VAR_REF)--$(VAR_REF)%%", "%%$(VAR_A)--$(VAR_A)%%"), ("foo$(VAR_EMPTY)bar", "foobar"),
    ("foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"), ("f00__(VAR_A)__", "f00__(VAR_A)__"), ("$?_boo_$!", "$?_boo_$!"),
    ("$VAR_A", "$VAR_A"), ("$(VAR_DNE)", "$(VAR_DNE)"), ("$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
    ("$$$$$$(VAR_A)", "$$$(VAR_A)"), ("$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"), ("$$$$$$$(VAR_A)", "$$$A"),
    ("$VAR_A)", "$VAR_A)"), ("${VAR_A}", "${VAR_A}"), ("$(VAR_B)_______$(A", "B_______$(A"),
    ("$(VAR_C)_______$(", "C_______$("), ("$(VAR_A)foobarzab$", "Afoobarzab$"), ("foo-\\$(VAR_A", "foo-\\$(VAR_A"),
    ("--$($($($($--", "--$($($($($--"), ("$($($($($--foo$(", "$($($($($--foo$("),
    ("foo0--$($($($(", "foo0--$($($($("), ("$(foo$$var)", "$(foo$$var)"), ("\n", "\n"),
]


@pytest.mark.parametrize("contexts", [
    ({"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""},),  # TestMapping
    ({"VAR_A": "A", "VAR_EMPTY": ""}, {"VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)"}),  # TestMappingDual
], ids=["single", "dual"])
def test_the_expansion_model_passes_kubernetes_own_cases(contexts):
    mapping = mapping_func_for(*contexts)
    assert [(text, expand(text, mapping)) for text, _ in UPSTREAM_CASES] == UPSTREAM_CASES


env_names = st.sampled_from(["HOME", "X", "VAR_A", "PORT", ""]) | st.text(max_size=6)
envs = st.dictionaries(env_names, st.text(max_size=8), max_size=4)


@given(role=st.sampled_from(list(PROBE_ROLES)), handler=handlers, env=envs)
@example(role="liveness", handler={"httpGet": {"path": "/$(HOME)/$$/$", "port": "$(PORT)"}},
         env={"HOME": "/root", "PORT": "80"})
def test_a_probe_command_survives_the_kubelets_expansion(role, handler, env):
    sent = [expand(arg, mapping_func_for(env)) for arg in command_for(role, handler)]
    assert sent == [M, role, json.dumps(handler, separators=(",", ":"), ensure_ascii=False)]
    assert json.loads(sent[2]) == handler


@given(role=st.sampled_from(HOOK_ROLES), handler=handlers)
def test_a_hook_command_is_sent_as_written(role, handler):
    # The kubelet passes a hook's command to ExecSync untouched: no escape to undo.
    assert json.loads(command_for(role, handler)[2]) == handler


def test_a_path_with_dollars_reaches_the_spec_exactly_as_written():
    handler = {"httpGet": {"path": "/$(HOME)/price$5/$$", "port": 8080}}
    env = mapping_func_for({"HOME": "/root"})
    probe_cmd = [expand(arg, env) for arg in command_for("readiness", handler)]
    assert parse_command(probe_cmd, ports=(), timeout_ms=1000, allow_host=False).spec.http_get.path == (
        "/$(HOME)/price$5/$$")
    hook_cmd = command_for("preStop", handler)
    assert parse_command(hook_cmd, ports=(), timeout_ms=1000, allow_host=False).spec.http_get.path == (
        "/$(HOME)/price$5/$$")
    # Unescaped, the kubelet would have rewritten it: that is why command_for doubles every `$`.
    naive = json.dumps(handler, separators=(",", ":"))
    assert json.loads(expand(naive, env))["httpGet"]["path"] == "//root/price$5/$"
