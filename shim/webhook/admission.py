"""One AdmissionReview in, one out (admission.k8s.io/v1): the webhook's decision and patch, without sockets. Pure.

The API server sends only what the MutatingWebhookConfiguration selects (deploy/webhook.yaml: Pods on CREATE, in a
namespace labelled `probe-shim.io/convert=enabled` or with that label on the pod, not labelled `disabled`); this
decides again from the request itself, so that a configuration written by hand cannot make it convert what must
stay:
- not a Pod, or not CREATE: allowed, unchanged (pods' probes cannot change after creation);
- the webhook's own namespace: unchanged (its own pods must never depend on it);
- `probe-shim.io/convert: disabled` as a label or an annotation on the pod: unchanged (the pod's word wins);
- everything else: `probectl convert`'s own rule (probe_api.pod_conversion.convert_object, leniently): every
  handler it can bridge is, the pod gets the annotation of its original handlers and the shim nodes' affinity
  (probe_api/bridged_pod.py); a pod it changes nothing in (converted already, hostNetwork, no network probe or
  hook) is allowed without a patch.
Whatever is left alone and why (a host outside the pod, a port the shim would refuse) comes back as `warnings`,
which kubectl prints. `dryRun` changes nothing here: the webhook has no side effects (`sideEffects: None`), so a
dry run gets the same patch, which `kubectl apply --dry-run=server` shows.

A body that is not an AdmissionReview v1 gets an AdmissionReview whose response refuses it with status 400 and the
reason (the API server then applies the configuration's failurePolicy); it never gets a traceback.
"""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass, field

from probe_api.pod_conversion import convert_object
from probe_api.rollout import CONVERT_LABEL, DISABLED
from shim.webhook.patch import diff

API_VERSION = "admission.k8s.io/v1"
# Outcomes, the metric's `result` label.
CONVERTED, UNCHANGED, SKIPPED, REFUSED = "converted", "unchanged", "skipped", "refused"
MAX_WARNINGS = 20          # kubectl prints each; the API server caps a warning at 256 characters
MAX_WARNING_CHARS = 256


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 this webhook can answer; str() says why."""


@dataclass
class Admission:
    uid: str
    outcome: str
    reason: str = ""                          # why unchanged or skipped, for the log
    patch: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    namespace: str = ""
    name: str = ""
    dry_run: bool = False

    def review(self) -> dict:
        """The AdmissionReview to send back."""
        response: dict = {"uid": self.uid, "allowed": True}
        if self.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(self.patch, separators=(",", ":")).encode()).decode()
        if self.warnings:
            response["warnings"] = self.warnings
        return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def refusal(uid: str, message: str) -> dict:
    """What a body that cannot be answered gets: not allowed, status 400 with the reason."""
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": False, "status": {"code": 400, "message": message}}}


def request_of(body: bytes) -> dict:
    """The `request` of an AdmissionReview v1 body; BadReview otherwise."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReview(f"the body is not JSON: {exc}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadReview("the body is not an AdmissionReview")
    if review.get("apiVersion") != API_VERSION:
        raise BadReview(f"apiVersion {review.get('apiVersion')!r} is not served: only {API_VERSION} "
                        "(set admissionReviewVersions: [v1])")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("the AdmissionReview has no request with a uid")
    return request


def uid_of(body: bytes) -> str:
    """The request's uid when the body has one at all (for a refusal the API server can match), else ""."""
    try:
        uid = json.loads(body)["request"]["uid"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        return ""
    return uid if isinstance(uid, str) else ""


def admit(request: dict, *, own_namespace: str, allow_host: bool = False) -> Admission:
    """The decision on one admission request (AdmissionReview v1 `request`)."""
    uid = request["uid"]
    namespace = request.get("namespace") or ""
    obj = request.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) else {}
    name = meta.get("name") or meta.get("generateName") or ""
    admission = Admission(uid, SKIPPED, namespace=namespace, name=str(name), dry_run=request.get("dryRun") is True)
    kind = request.get("kind") if isinstance(request.get("kind"), dict) else {}
    if (kind.get("group", ""), kind.get("kind")) != ("", "Pod") or not isinstance(obj, dict) \
            or obj.get("kind", "Pod") != "Pod":
        admission.reason = f"not a Pod ({kind.get('kind') or 'no kind'})"
        return admission
    if request.get("operation") != "CREATE":
        admission.reason = f"operation {request.get('operation')}: a pod's probes are set at its creation"
        return admission
    if namespace and namespace == own_namespace:
        admission.reason = "the webhook's own namespace"
        return admission
    if _opted_out(meta):
        admission.reason = f"{CONVERT_LABEL}: {DISABLED} on the pod"
        return admission
    pod = copy.deepcopy(obj)
    pod.setdefault("kind", "Pod")  # the API server may leave kind out of an embedded object
    result = convert_object(pod, allow_host=allow_host)
    if "kind" not in obj:
        del pod["kind"]
    admission.warnings = _warnings(result.left + result.errors + _notes_worth_a_warning(result.notes))
    admission.patch = diff(obj, pod)
    admission.outcome = CONVERTED if admission.patch else UNCHANGED
    if not admission.patch:
        admission.reason = "; ".join(result.notes) or "nothing to convert"
    return admission


def _opted_out(meta: dict) -> bool:
    for where in ("labels", "annotations"):
        values = meta.get(where)
        if isinstance(values, dict) and values.get(CONVERT_LABEL) == DISABLED:
            return True
    return False


def _notes_worth_a_warning(notes: list[str]) -> list[str]:
    # hostNetwork: the pod keeps its own probes, which a user who labelled the namespace may not expect.
    return [note for note in notes if ".hostNetwork:" in note]


def _warnings(texts: list[str]) -> list[str]:
    out = [f"probe-shim: {text}" for text in texts[:MAX_WARNINGS]]
    if len(texts) > MAX_WARNINGS:
        out[-1] = f"probe-shim: and {len(texts) - MAX_WARNINGS + 1} more left unchanged"
    return [text if len(text) <= MAX_WARNING_CHARS else text[:MAX_WARNING_CHARS - 3] + "..." for text in out]
