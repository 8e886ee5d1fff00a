"""Daemon settings: defaults, the optional TOML file, then command-line flags (last wins).

Also the pure decisions about them: which socket group a setting names, and whether
the metrics address reaches beyond the node (a warning, not an error). The workers'
part is handed on as one frozen WorkerSettings (`worker_settings`), whose defaults
are the ones written here.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from probe_api.defaults import DEFAULT_ENDPOINT
from shim.workers.grouping import ISOLATION_MODES, MAX_SANDBOXES_PER_WORKER
from shim.workers.settings import WorkerSettings


class ConfigError(Exception):
    pass


MAX_ID = 2**31 - 1
_WORKERS = WorkerSettings()  # the defaults of the workers' keys
HANDOVER_SUBDIR = "workers"  # under state_dir: the zygotes' handover sockets


@dataclass(frozen=True)
class Config:
    """The daemon's settings, fixed once loaded: nothing changes them while it runs (a change is a restart)."""

    listen: str = DEFAULT_ENDPOINT
    runtime_endpoint: str = "unix:///run/containerd/containerd.sock"  # "none": embedded mode, no runtime
    state_dir: str = "/var/lib/probe-shim"
    metrics_listen: str = "127.0.0.1:9555"  # "" turns the endpoint off
    reconcile_interval_s: float = 5.0
    user_agent_version: str = _WORKERS.user_agent_version
    # The deprecated probe `host` field lets a pod's probe reach any address the node
    # can (blind SSRF from the runtime's side); off unless an operator opts in.
    allow_host_field: bool = False
    max_probes_per_sandbox: int = 64
    max_probes_total: int = 8192
    log_format: str = "text"  # text | json
    trace_exporter: str = "none"  # none | console | otlp
    otlp_endpoint: str = ""
    worker_uid: int = _WORKERS.run_as_uid
    worker_gid: int = _WORKERS.run_as_gid
    heartbeat_timeout_s: float = _WORKERS.heartbeat_timeout_s
    # "pooled": a worker serves up to sandboxes_per_worker sandboxes of one Kubernetes namespace;
    # "sandbox": one worker per sandbox (strict isolation, the memory of a process per pod).
    worker_isolation: str = _WORKERS.isolation
    sandboxes_per_worker: int = _WORKERS.sandboxes_per_worker
    # Embedded mode: a bare netns has no Kubernetes namespace, so all of them form one tenancy; with a
    # separator, the part of a netns name before it is its namespace ("team-a.web-1" with ".").
    embedded_namespace_separator: str = ""
    # The kubelet bridge's bound on a lifecycle hook (the kubelet sends hooks' ExecSync without a timeout and puts
    # none on its own HTTP hooks; a preStop hook is cut by the pod's termination grace period anyway).
    hook_timeout_s: float = 300.0
    # Workers outlive the daemon (a crash, SIGTERM for a restart or an upgrade) and go on probing for this long,
    # waiting for the next daemon to adopt them; 0: they stop with it. SIGINT (Ctrl-C) always stops them.
    handover_timeout_s: float = _WORKERS.handover_timeout_s
    # Group of the API socket (mode 0660): its owner and this group's members may call the
    # API, which can make the node probe any pod. A group name or a numeric gid; "" keeps
    # the daemon's own group (root's, under systemd).
    socket_group: str = ""

    def validate(self) -> "Config":
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log_format: must be text or json, not {self.log_format!r}")
        if self.trace_exporter not in ("none", "console", "otlp"):
            raise ConfigError(f"trace_exporter: must be none, console or otlp, not {self.trace_exporter!r}")
        if self.reconcile_interval_s <= 0:
            raise ConfigError("reconcile_interval_s: must be greater than 0")
        if self.worker_isolation not in ISOLATION_MODES:
            raise ConfigError(f"worker_isolation: must be {' or '.join(ISOLATION_MODES)}, not {self.worker_isolation!r}")
        if not 1 <= self.sandboxes_per_worker <= MAX_SANDBOXES_PER_WORKER:
            raise ConfigError(f"sandboxes_per_worker: must be between 1 and {MAX_SANDBOXES_PER_WORKER}")
        if not 0 <= self.handover_timeout_s <= 86400:
            raise ConfigError("handover_timeout_s: must be between 0 and 86400")
        if not 0 < self.hook_timeout_s <= 3600:
            raise ConfigError("hook_timeout_s: must be more than 0 and at most 3600")
        if self.max_probes_per_sandbox < 1 or self.max_probes_total < 1:
            raise ConfigError("max_probes_per_sandbox and max_probes_total: must be at least 1")
        if not self.listen.startswith("unix://"):
            raise ConfigError(f"listen: only unix:// sockets are served, not {self.listen!r}")
        for key in ("worker_uid", "worker_gid"):
            # Workers parse bytes chosen by pods: never as root. 0 would also read as "unset"
            # in the worker protocol; the protocol's ids are int32.
            if not 1 <= getattr(self, key) <= MAX_ID:
                raise ConfigError(f"{key}: must be between 1 and {MAX_ID} (workers never run as root)")
        return self

    @property
    def embedded(self) -> bool:
        return self.runtime_endpoint in ("", "none")

    @property
    def socket_path(self) -> str:
        return self.listen.removeprefix("unix://")

    def worker_settings(self) -> WorkerSettings:
        """The workers' settings: the keys above, the handover directory under state_dir (none with a handover
        timeout of 0: workers end with the daemon), and WorkerSettings' own defaults for the rest."""
        return WorkerSettings(
            isolation=self.worker_isolation, sandboxes_per_worker=self.sandboxes_per_worker,
            heartbeat_timeout_s=self.heartbeat_timeout_s, user_agent_version=self.user_agent_version,
            run_as_uid=self.worker_uid, run_as_gid=self.worker_gid,
            handover_dir=os.path.join(self.state_dir, HANDOVER_SUBDIR) if self.handover_timeout_s > 0 else "",
            handover_timeout_s=self.handover_timeout_s,
        )


_TYPES = {f.name: f.type for f in fields(Config)}
_DEFAULTS = Config()


def load(path: str | None, overrides: dict) -> Config:
    """Defaults <- TOML file <- overrides (flags given on the command line, None = not given)."""
    values: dict = {}
    if path:
        try:
            values = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        unknown = sorted(set(values) - set(_TYPES))
        if unknown:
            raise ConfigError(f"config file {path}: unknown keys {', '.join(unknown)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Config(**{key: _typed(key, value) for key, value in values.items()}).validate()


def _typed(key: str, value: object) -> object:
    """A key's value as its default's type (an int where a float goes, a gid number as socket_group's text)."""
    expected = type(getattr(_DEFAULTS, key))
    if key == "socket_group" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # socket_group = 1001 means that gid
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{key}: expected {expected.__name__}, got {value!r}")
    return value


def socket_gid(group: str, lookup: Callable[[str], grp.struct_group] = grp.getgrnam) -> int | None:
    """The gid socket_group names (None: keep the daemon's own); a number is taken as it is."""
    if not group:
        return None
    if group.isascii() and group.isdigit():
        if int(group) > MAX_ID:
            raise ConfigError(f"socket_group: gid {group} is out of range")
        return int(group)
    try:
        return lookup(group).gr_gid
    except KeyError:
        raise ConfigError(f"socket_group: no group named {group!r} on this system "
                          "(create it, or give an existing group name or a numeric gid)") from None


def metrics_exposure_warning(listen: str) -> str | None:
    """A warning when /metrics would be reachable from beyond the node; None if loopback or off.

    Accepted rather than refused: an operator may scrape from another host on purpose,
    behind a firewall. The metrics carry pod names, namespaces and probe results.
    """
    if not listen:
        return None
    host = listen.rpartition(":")[0].removeprefix("[").removesuffix("]")
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host.split("%")[0]).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve anywhere
    return (f"metrics endpoint listens on {host}, beyond loopback: anyone who reaches it reads pod names, "
            "namespaces and probe results; bind 127.0.0.1 (the default) unless a firewall guards it")
