"""The smallest RFC 6902 JSON Patch that turns one JSON document into another, for an admission response. Pure.

Mappings are compared key by key: a key gone is `remove`, a new key `add`, a changed value is patched inside when
both sides are mappings (or lists of one length, element by element) and `replace`d otherwise. Lists that changed
length are replaced whole: a whole list is a patch that cannot apply to the wrong element. Key order is not kept
(an `add` appends; the API server stores a pod's fields in its own order anyway). Paths are RFC 6901 JSON Pointers
(`~` as `~0`, `/` as `~1`: annotation keys such as `probe-shim.io/original-handlers` have a slash).
"""

from __future__ import annotations


def pointer(parts: list) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def diff(before: object, after: object, path: list | None = None) -> list[dict]:
    """Operations that turn `before` into `after`."""
    path = path or []
    if isinstance(before, dict) and isinstance(after, dict):
        ops = [{"op": "remove", "path": pointer([*path, key])} for key in before if key not in after]
        for key, value in after.items():
            if key not in before:
                ops.append({"op": "add", "path": pointer([*path, key]), "value": value})
            else:
                ops += diff(before[key], value, [*path, key])
        return ops
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [op for index, (old, new) in enumerate(zip(before, after)) for op in diff(old, new, [*path, index])]
    if before == after and type(before) is type(after):  # 1 == True in Python, not in JSON
        return []
    return [{"op": "replace", "path": pointer(path), "value": after}]
