"""Kubernetes manifests -> the same manifests with their network probes and hooks bridged to the shim, and back.
Pure: no I/O, no grpc. This is `probectl convert`, in the spirit of `istioctl kube-inject`.

Owns the text side: reading YAML or JSON (one or several documents), expanding YAML aliases, and writing the
result back. The rewrite rule itself, on parsed objects, is probe_api/pod_conversion.py, which the admission
webhook applies too (leniently, to one pod): see there what is rewritten, what is validated and what is noted.
Here it is applied strictly: any error means no output at all, as kubectl applies nothing from an invalid manifest.
reverse(convert(x)) equals x once parsed, key order included.

Messages name the manifest path in Kubernetes' field names (`spec.containers[0].readinessProbe.httpGet.host:
Forbidden: ...`), prefixed `items[1].` inside a List and `documents[2].` when the text has several documents, as
manifest.py's do. Empty documents are dropped. YAML aliases are expanded, so that a probe shared by alias is
converted for each role it has; their expansion is bounded (billion laughs, CVE-2019-11253 in kubectl).

Output: YAML (yaml.safe_dump_all, keys in their input order, block style, lines never folded, documents separated
by `---`), or JSON: the one object, or for several documents `{"kind": "List", "apiVersion": "v1", "items": [...]}`
as `kubectl get -o json` prints several objects (convert walks that List back item by item). Input comments are not
kept: PyYAML drops them on reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml

from probe_api.bridge_command import MARKER
from probe_api.pod_conversion import Conversion, convert_document

OUTPUTS = ("yaml", "json")
# Values that expanding YAML aliases may add to a manifest: without aliases a value takes at least a character.
_MIN_VALUES_BUDGET = 100_000


@dataclass
class ConvertResult(Conversion):
    text: str = ""                  # the converted manifest; "" when there are errors


class _Unreadable(ValueError):
    """The parsed text is no manifest convert can write back; the message completes "the manifest ..."."""


def convert(text: str, *, reverse: bool = False, allow_host: bool = False, output: str = "yaml",
            node_affinity: bool = True) -> ConvertResult:
    """The manifest with its probes and hooks bridged to the shim (or, with reverse, bridged back)."""
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, not {output!r}")
    result = ConvertResult()
    try:
        documents = _unshared(_documents(text), budget=len(text) + _MIN_VALUES_BUDGET)
    except yaml.YAMLError as exc:
        from probectl.manifest import yaml_problem  # the manifest rules: only for this message

        result.errors.append(f"not valid YAML or JSON: {yaml_problem(exc)}")
        return result
    except _Unreadable as exc:
        result.errors.append(f"the manifest {exc}")
        return result
    except RecursionError:
        result.errors.append("the manifest is nested too deeply")
        return result
    if not documents:
        result.errors.append("the manifest has no objects")
        return result
    for index, document in enumerate(documents):
        convert_document(document, f"documents[{index}]." if len(documents) > 1 else "", result, reverse=reverse,
                         allow_host=allow_host, node_affinity=node_affinity)
    if result.errors:
        return result
    if not result.probes and not result.hooks:
        result.notes.append(f"no {MARKER} command to restore" if reverse
                            else "no httpGet, tcpSocket or grpc probe or hook to convert")
    result.text = _dump(documents, output)
    return result


def _documents(text: str) -> list:
    if text.lstrip().startswith("{"):
        # JSON first: YAML refuses the tab indentation JSON may have.
        try:
            return [json.loads(text)]
        except ValueError:
            pass  # YAML in flow style, or several objects: the YAML reader says what is wrong, if anything
    # PyYAML's own parser and emitter, not libyaml's (8x faster here): libyaml accepts what PyYAML refuses (a tab
    # after a value, say) and writes the same data in other words ("..." after a bare scalar, "?" keys, quoting).
    return [document for document in yaml.safe_load_all(text) if document is not None]


def _unshared(documents: list, *, budget: int) -> list:
    """A copy in which no mapping or list is in two places. A YAML alias puts one object in several places, and
    each place is rewritten for its own role (`livenessProbe: &probe ...`, `readinessProbe: *probe`). Raises
    _Unreadable for an alias that contains itself, or aliases expanding past `budget` values (billion laughs)."""
    remaining = budget
    ancestors: set[int] = set()

    def copy(value: object) -> object:
        nonlocal remaining
        remaining -= 1
        if remaining < 0:
            raise _Unreadable(f"expands to more than {budget} values through its YAML aliases")
        if not isinstance(value, (dict, list)):
            return value
        if id(value) in ancestors:
            raise _Unreadable("has a YAML alias that contains itself")
        ancestors.add(id(value))
        out = {key: copy(item) for key, item in value.items()} if isinstance(value, dict) else \
            [copy(item) for item in value]
        ancestors.discard(id(value))
        return out

    return [copy(document) for document in documents]


def _dump(documents: list, output: str) -> str:
    if output == "json":
        data = documents[0] if len(documents) == 1 else {"kind": "List", "apiVersion": "v1", "items": documents}
        # default=str: a YAML timestamp becomes a string, as kubectl's YAML-to-JSON makes it one.
        return json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n"
    # width: a marker command's JSON stays on one line, as it is read and diffed.
    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False, allow_unicode=True,
                              width=2**31 - 1)
