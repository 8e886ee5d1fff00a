"""The webhook's RFC 6902 patch (shim/webhook/patch.py: jsonpatch's make_patch), applied as the API server would."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shim.webhook.patch import diff
from tests.support.netns_env import REPO_ROOT

CASES = [
    ({"a": 1}, {"a": 1}),
    ({"a": 1}, {"a": 2}),
    ({"a": 1, "b": 2}, {"b": 2}),
    ({"a": {"x": 1}}, {"a": {"x": 1, "y": [1, 2]}}),
    ({"l": [1, 2, 3]}, {"l": [1, 5, 3]}),
    ({"l": [1, 2]}, {"l": [1, 2, 3]}),
    ({"a": 1}, {"a": True}),            # equal in Python, not in JSON
    ({"a": {"b": 1}}, {"a": [1]}),
    ({"metadata": {}}, {"metadata": {"annotations": {"probe-shim.io/original-handlers": "{}"}}}),
    ({"k~ey/x": 1}, {"k~ey/x": 2}),
]


@pytest.mark.parametrize("before, after", CASES)
def test_the_patch_applied_gives_the_new_document(before, after):
    patch = diff(before, after)
    applied = jsonpatch.apply_patch(copy.deepcopy(before), patch)
    assert applied == after and [type(v) for v in applied.values()] == [type(v) for v in after.values()]


def test_equal_documents_need_no_operation():
    assert diff({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) == []


def test_a_handler_renamed_in_place_is_a_remove_and_an_add():
    before = {"readinessProbe": {"httpGet": {"port": 8080}, "periodSeconds": 5}}
    after = {"readinessProbe": {"exec": {"command": ["cri-probe-shim"]}, "periodSeconds": 5}}
    assert diff(before, after) == [
        {"op": "remove", "path": "/readinessProbe/httpGet"},
        {"op": "add", "path": "/readinessProbe/exec", "value": {"command": ["cri-probe-shim"]}},
    ]


def test_pointers_escape_tilde_and_slash():
    before = {"metadata": {"annotations": {"a": "1"}}, "a~b": [0]}
    after = {"metadata": {"annotations": {"a": "1", "probe-shim.io/original-handlers": "{}"}}, "a~b": [1]}
    assert diff(before, after) == [
        {"op": "add", "path": "/metadata/annotations/probe-shim.io~1original-handlers", "value": "{}"},
        {"op": "replace", "path": "/a~0b/0", "value": 1},
    ]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "a", "b/c", "d~e"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["a", "b", "c/d", "e~f"]), inner,
                                                                max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(JSON, JSON)
def test_any_two_documents_are_patched_exactly(before, after):
    applied = jsonpatch.apply_patch(copy.deepcopy(before), diff(before, after))
    assert json.dumps(applied, sort_keys=True) == json.dumps(after, sort_keys=True)  # 1 and True differ here


def test_the_patch_is_the_same_whatever_the_hash_seed():
    """Every replica of the webhook, and every log line, shows the same patch for the same pod (jsonpatch before
    1.48 ordered an object's keys by set iteration)."""
    code = ("import json; from shim.webhook.patch import diff; from tests.support.webhook_pods import web_pod; "
            "from probe_api.pod_conversion import convert_object; import copy; pod = web_pod(); "
            "pod['metadata']['labels'] = {'z': 'z'}; after = copy.deepcopy(pod); after['kind'] = 'Pod'; "
            "convert_object(after); del after['kind']; after['metadata']['labels'] = {k: k for k in 'abcdefgh'}; "
            "print(json.dumps(diff(pod, after)))")
    patches = {subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60).stdout
               for seed in ("1", "2", "3", "4")}
    assert len(patches) == 1
