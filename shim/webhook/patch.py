"""The RFC 6902 JSON Patch that turns the pod the API server sent into the converted one, for an admission
response: jsonpatch's make_patch (the library the tests already apply patches with). Pure.

Why the library and not a hand-written diff: nothing here needs a patch of our own making. The API server applies
the patch to the very object it sent in this AdmissionReview (reinvoked webhooks get a new review), so an operation
on a list element by index applies where it was meant, and a list need not be replaced whole to be safe; for the pods
the webhook converts, make_patch writes the same operations a hand-written diff did (a handler renamed in place is a
`remove` and an `add`; an absent annotation map is added whole, one key is added into an existing one), and 1 and
True differ as they do in JSON. jsonpatch 1.48 or later (pyproject.toml) writes them in the documents' key order,
so a pod gets the same patch on every replica and in every log; older releases, Debian 12's 1.32 among them, order
an object's keys by set iteration, which changes with the interpreter's hash seed.
"""

from __future__ import annotations

import jsonpatch


def diff(before: object, after: object) -> list[dict]:
    """Operations that turn `before` into `after`."""
    return jsonpatch.make_patch(before, after).patch
