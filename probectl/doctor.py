"""`probectl doctor`: run on a node, says whether the kubelet really goes through the shim, and how to fix what
does not. Read-only; it calls the shim like any client.

Checks, each ok / FAIL with a fix:
1. the kubelet's CRI endpoint is the shim's socket: from the kubelet's command line (the last
   `--container-runtime-endpoint` wins, as kubelet flags are parsed left to right), else its `--config` file's
   `containerRuntimeEndpoint` (a flag wins over the file);
2. the shim answers (ShimVersion);
3. the shim reaches the container runtime: a CRI Version call through the shim's own socket;
4. the node label (probe_api.rollout.NODE_LABEL) is among the kubelet's `--node-labels` (the kubelet applies them
   when it registers the node: an already registered node needs `kubectl label node` too, which only the API
   server can tell, so the fix says it);
5. the shim's workers are healthy: no sandbox's worker in backoff or failed.
Facts are gathered first (`gather`), then judged by `evaluate`, which is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil
import yaml

from probe_api.rollout import NODE_LABEL, NODE_LABEL_VALUE

OK, FAIL = "ok", "FAIL"
DROP_IN = "systemd/kubelet-probe-shim.conf"


@dataclass(frozen=True)
class Finding:
    status: str
    check: str
    detail: str
    fix: str = ""


@dataclass
class Facts:
    shim_endpoint: str
    kubelet_pid: int | None = None
    kubelet_argv: list[str] = field(default_factory=list)
    kubelet_config: dict | None = None       # the --config file, parsed
    kubelet_config_error: str = ""
    shim_version: str = ""                   # "" when the shim did not answer
    shim_error: str = ""
    runtime_endpoint: str = ""
    runtime_version: str = ""                # the runtime's name and version through the shim, "" if not reached
    runtime_error: str = ""
    unhealthy_workers: list[str] = field(default_factory=list)   # "SANDBOX: STATE: last error"
    sandboxes: int = 0


def flag_values(argv: list[str], name: str) -> list[str]:
    """Every value of `--name` in a Go-style command line (`--name=v`, `--name v`, `-name=v`), in order."""
    values = []
    for index, arg in enumerate(argv):
        for prefix in (f"--{name}", f"-{name}"):
            if arg == prefix and index + 1 < len(argv):
                values.append(argv[index + 1])
            elif arg.startswith(prefix + "="):
                values.append(arg[len(prefix) + 1:])
    return values


def node_labels(argv: list[str]) -> dict[str, str]:
    """--node-labels values merged (the kubelet adds each flag's labels to the others')."""
    labels = {}
    for value in flag_values(argv, "node-labels"):
        for pair in value.split(","):
            key, _, val = pair.partition("=")
            if key.strip():
                labels[key.strip()] = val.strip()
    return labels


def same_endpoint(a: str, b: str) -> bool:
    def path(endpoint: str) -> str:
        return endpoint.removeprefix("unix://").rstrip("/")
    return path(a) == path(b)


def kubelet_endpoint(facts: Facts) -> tuple[str, str]:
    """(the endpoint, where it was read); ("", why not) when neither the flags nor the config file say."""
    from_flags = flag_values(facts.kubelet_argv, "container-runtime-endpoint")
    if from_flags:
        return from_flags[-1], "--container-runtime-endpoint"
    if facts.kubelet_config and facts.kubelet_config.get("containerRuntimeEndpoint"):
        return facts.kubelet_config["containerRuntimeEndpoint"], "containerRuntimeEndpoint in its --config file"
    return "", facts.kubelet_config_error or "neither a flag nor its config file sets it (containerd's default)"


def evaluate(facts: Facts) -> list[Finding]:
    findings = []
    check = "the kubelet's CRI endpoint is the shim"
    if facts.kubelet_pid is None:
        findings.append(Finding(FAIL, check, "no kubelet process on this node",
                                "run this on a node, as root, or name it with --kubelet-pid"))
    else:
        endpoint, source = kubelet_endpoint(facts)
        if endpoint and same_endpoint(endpoint, facts.shim_endpoint):
            findings.append(Finding(OK, check, f"kubelet (pid {facts.kubelet_pid}) uses {endpoint} ({source})"))
        else:
            findings.append(Finding(
                FAIL, check, f"kubelet (pid {facts.kubelet_pid}) uses {endpoint or 'its default'} ({source}), "
                             f"not {facts.shim_endpoint}",
                f"install {DROP_IN} as /etc/systemd/system/kubelet.service.d/20-probe-shim.conf (or set "
                f"containerRuntimeEndpoint: {facts.shim_endpoint} in the KubeletConfiguration), then "
                "`systemctl daemon-reload && systemctl restart kubelet`"))
    check = "the shim answers"
    if facts.shim_version:
        findings.append(Finding(OK, check, f"probe-shim {facts.shim_version} on {facts.shim_endpoint}"))
    else:
        findings.append(Finding(FAIL, check, f"{facts.shim_endpoint}: {facts.shim_error}",
                                "`systemctl status probe-shim` and `journalctl -u probe-shim`; or give its socket "
                                "with -r"))
    check = "the shim reaches the container runtime"
    if not facts.shim_version:
        pass  # nothing to ask through a shim that does not answer
    elif facts.runtime_version:
        findings.append(Finding(OK, check, f"{facts.runtime_version} at {facts.runtime_endpoint}"))
    else:
        findings.append(Finding(FAIL, check, f"{facts.runtime_endpoint or 'no runtime'}: {facts.runtime_error}",
                                "is containerd running (`systemctl status containerd`)? Is the shim's "
                                "runtime_endpoint (/etc/probe-shim/config.toml) its socket?"))
    check = f"the node is labelled {NODE_LABEL}={NODE_LABEL_VALUE}"
    labels = node_labels(facts.kubelet_argv)
    label_fix = (f"the drop-in ({DROP_IN}) passes --node-labels={NODE_LABEL}={NODE_LABEL_VALUE}; the kubelet applies "
                 f"it when it registers the node, so on a registered node also `kubectl label node NODE "
                 f"{NODE_LABEL}={NODE_LABEL_VALUE}`")
    if facts.kubelet_pid is None:
        pass  # the first check said so: no kubelet, no flags to read
    elif labels.get(NODE_LABEL) == NODE_LABEL_VALUE:
        findings.append(Finding(OK, check, "in the kubelet's --node-labels (a node registered before needs "
                                           "`kubectl label node` as well)"))
    else:
        found = f"{NODE_LABEL}={labels[NODE_LABEL]}" if NODE_LABEL in labels else "not in the kubelet's --node-labels"
        findings.append(Finding(FAIL, check, f"{found}: converted pods (their node affinity) are not scheduled here",
                                label_fix))
    check = "the shim's workers are healthy"
    if facts.shim_version:
        if facts.unhealthy_workers:
            findings.append(Finding(FAIL, check, "; ".join(facts.unhealthy_workers),
                                    "`probectl pods` for each sandbox's worker and `journalctl -u probe-shim`: a "
                                    "worker in backoff restarts by itself, a failed one has its reason"))
        else:
            findings.append(Finding(OK, check, f"{facts.sandboxes} sandboxes, no worker in backoff or failed"))
    return findings


def render(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{f.status:4}  {f.check}: {f.detail}")
        if f.fix:
            lines.append(f"      fix: {f.fix}")
    return "\n".join(lines) + "\n"


# --- I/O: gathering the facts --------------------------------------------------------------------------------------

def find_kubelet(pid: int | None) -> tuple[int | None, list[str]]:
    """The kubelet's pid and command line: the one given, or the process whose executable is named kubelet."""
    try:
        candidates = [psutil.Process(pid)] if pid else [
            p for p in psutil.process_iter(["name"]) if p.info["name"] == "kubelet"]
    except psutil.Error:  # --kubelet-pid of a process that is gone: "no kubelet", with its fix
        return None, []
    for process in candidates:
        try:
            return process.pid, process.cmdline()
        except psutil.Error:
            continue
    return None, []


def read_kubelet_config(argv: list[str]) -> tuple[dict | None, str]:
    paths = flag_values(argv, "config")
    if not paths:
        return None, ""
    try:
        with open(paths[-1]) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        return None, f"its --config file {paths[-1]} cannot be read: {exc}"
    return (data if isinstance(data, dict) else None), ""


def gather(client, kubelet_pid: int | None) -> Facts:
    """Facts from the node (the kubelet's process) and from the shim through `client` (a ProbeShimClient)."""
    from cri_proto import probe_service_pb2 as service_pb
    from probectl.client import ShimError, ShimUnavailable

    facts = Facts(shim_endpoint=client.endpoint)
    facts.kubelet_pid, facts.kubelet_argv = find_kubelet(kubelet_pid)
    facts.kubelet_config, facts.kubelet_config_error = read_kubelet_config(facts.kubelet_argv)
    try:
        version = client.version()
    except (ShimError, ShimUnavailable) as exc:
        facts.shim_error = str(exc)
        return facts
    facts.shim_version, facts.runtime_endpoint = version.version or version.api_version, version.runtime_endpoint
    try:
        runtime = client.runtime_version()
        if runtime is None:
            facts.runtime_error = "the shim runs without a container runtime (--runtime-endpoint none)"
        else:
            facts.runtime_version = f"{runtime.runtime_name} {runtime.runtime_version}"
    except (ShimError, ShimUnavailable) as exc:
        facts.runtime_error = str(exc)
    try:
        sandboxes = client.sandboxes()
    except (ShimError, ShimUnavailable) as exc:
        facts.unhealthy_workers.append(f"cannot list sandboxes: {exc}")
        return facts
    facts.sandboxes = len(sandboxes)
    for sandbox in sandboxes:
        if sandbox.worker.state in (service_pb.WORKER_BACKOFF, service_pb.WORKER_FAILED):
            state = service_pb.WorkerState.Name(sandbox.worker.state).removeprefix("WORKER_").lower()
            facts.unhealthy_workers.append(f"{sandbox.id[:13]}: {state}: {sandbox.worker.last_error}")
    return facts
