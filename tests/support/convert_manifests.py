"""The manifests probectl convert's tests (tests/unit/test_convert_*.py, test_pod_conversion.py) feed it and read
back: a pod with one container, the conversion as text, YAML read back in key order, and the goldens' directory."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import yaml

from probectl.convert import convert

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "convert"


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
