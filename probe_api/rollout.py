"""The names a cluster's rollout shares: what marks a node whose kubelet goes through the shim, what opts a
namespace or a pod in or out of conversion, and where a converted pod keeps its original handlers.

The kubelet drop-in (systemd/kubelet-probe-shim.conf) sets the node label; `probectl convert` and the admission
webhook give every converted pod a required node affinity on it, so that a converted pod is never scheduled where
no shim answers its probes (there it would never become Ready); `probectl doctor` checks it is there. Pure.
"""

from __future__ import annotations

# A node whose kubelet's CRI endpoint is the shim. The value is the marker command's grammar version: a pod
# converted for another grammar must not land on this node.
NODE_LABEL = "probe-shim.io/bridge"
NODE_LABEL_VALUE = "v1alpha1"

# On a namespace (label) or a pod (label or annotation): "enabled" opts in, "disabled" opts out; a pod's "disabled"
# wins over its namespace's "enabled". The API server selects on labels only, so a pod opts in with the label.
CONVERT_LABEL = "probe-shim.io/convert"
ENABLED, DISABLED = "enabled", "disabled"

# On a converted pod (or pod template): the handlers it had, by field path (`containers[web].readinessProbe`), as
# JSON. `kubectl get pod -o yaml` shows what was changed; `probectl convert --reverse` removes it.
ORIGINAL_HANDLERS_ANNOTATION = "probe-shim.io/original-handlers"


def node_selector_requirement() -> dict:
    """The core/v1 NodeSelectorRequirement every converted pod's required node affinity terms carry."""
    return {"key": NODE_LABEL, "operator": "In", "values": [NODE_LABEL_VALUE]}
