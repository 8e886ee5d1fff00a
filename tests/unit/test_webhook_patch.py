"""The webhook's RFC 6902 diff (shim/webhook/patch.py), applied with a JSON Patch library as the API server would."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from shim.webhook.patch import diff, pointer

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
    assert pointer(["metadata", "annotations", "probe-shim.io/original-handlers"]) == \
        "/metadata/annotations/probe-shim.io~1original-handlers"
    assert pointer(["a~b", 0]) == "/a~0b/0"
