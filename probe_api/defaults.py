"""The numbers more than one side of the project needs, each written once.

Kubernetes' own probe defaults and limits are validation.py's (they come with the rules that use them); these are
the kubelet's behaviours the daemon, the client and the worker all count on, and this project's own defaults.
It imports nothing, so that probectl's parser can offer them before it loads protobuf.
"""

from __future__ import annotations

# This release of the shim, written only here: pyproject.toml reads it from here (tool.setuptools.dynamic), probectl
# and ShimVersion show it. A daemon that adopts the workers of an earlier daemon (a restart, or an upgrade) forks new
# ones from that daemon's zygote only if it runs this same version.
SHIM_VERSION = "0.1.0"

# The shim's socket. The kubelet, crictl and probectl all talk to it.
DEFAULT_SOCKET = "/run/probe-shim/probe-shim.sock"
DEFAULT_ENDPOINT = f"unix://{DEFAULT_SOCKET}"

# The kubelet's and crictl's CRI message limit (cri-client maxMsgSize): the shim serves and forwards no less, and
# probectl reads status listings up to it.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# An INVALID_ARGUMENT answer's errors as data (a FieldViolations message), in its trailing metadata.
FIELD_VIOLATIONS_KEY = "probe-shim-field-violations-bin"

# Workers parse bytes chosen by pods, so they run as nobody / nogroup by default and never as root.
WORKER_UID = 65534
WORKER_GID = 65534
# A worker's RLIMIT_NOFILE: the usual soft limit, raised for a big group (shim/workers/grouping.py worker_open_files).
WORKER_OPEN_FILES = 1024
# A worker sends a heartbeat when it has sent nothing for this long, and the daemon one when it has heard nothing
# (the daemon's WorkerConfig carries it; the worker's own default when none does).
HEARTBEAT_INTERVAL_MS = 1000

# How long workers go on probing after their daemon stopped (SIGTERM) or crashed, for the next one to adopt them
# (the daemon's handover_timeout_s, which it passes to the zygote; the zygote's own default).
HANDOVER_TIMEOUT_S = 300.0

# The kubelet version whose behaviour the engine follows; its User-Agent is kube-probe/<this>. Its own prober is
# the reference the engine is tested against (tests/system/test_kubelet_prober_reference.py).
KUBELET_VERSION = "1.37"

# pkg/kubelet/prober runProbeWithRetries: an attempt that ends in an error is run again at once, up to this many
# times in all.
MAX_TRIES = 3

# An attempt that starts this long after its tick was due is late (probe_shim_attempts_late_total).
LATE_AFTER_NS = 100_000_000


def is_late(scheduled_at_ns: int, started_at_ns: int) -> bool:
    """Whether an attempt started more than LATE_AFTER_NS after its tick was due.

    Any clock works, the same for both; an attempt without a tick (scheduled_at_ns 0,
    a one-off ExecProbe) is never late.
    """
    return scheduled_at_ns > 0 and started_at_ns - scheduled_at_ns > LATE_AFTER_NS
