"""Daemon settings: defaults, the optional TOML file, then command-line flags (last wins)."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path


class ConfigError(Exception):
    pass


@dataclass
class Config:
    listen: str = "unix:///run/probe-shim/probe-shim.sock"
    runtime_endpoint: str = "unix:///run/containerd/containerd.sock"  # "none": embedded mode, no runtime
    state_dir: str = "/var/lib/probe-shim"
    metrics_listen: str = "127.0.0.1:9555"  # "" turns the endpoint off
    reconcile_interval_s: float = 5.0
    user_agent_version: str = "1.32"
    # The deprecated probe `host` field lets a pod's probe reach any address the node
    # can (blind SSRF from the runtime's side); off unless an operator opts in.
    allow_host_field: bool = False
    max_probes_per_sandbox: int = 64
    max_probes_total: int = 8192
    log_format: str = "text"  # text | json
    trace_exporter: str = "none"  # none | console | otlp
    otlp_endpoint: str = ""
    worker_uid: int = 65534
    worker_gid: int = 65534
    heartbeat_timeout_s: float = 5.0

    def validate(self) -> "Config":
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log_format: must be text or json, not {self.log_format!r}")
        if self.trace_exporter not in ("none", "console", "otlp"):
            raise ConfigError(f"trace_exporter: must be none, console or otlp, not {self.trace_exporter!r}")
        if self.reconcile_interval_s <= 0:
            raise ConfigError("reconcile_interval_s: must be greater than 0")
        if self.max_probes_per_sandbox < 1 or self.max_probes_total < 1:
            raise ConfigError("max_probes_per_sandbox and max_probes_total: must be at least 1")
        if not self.listen.startswith("unix://"):
            raise ConfigError(f"listen: only unix:// sockets are served, not {self.listen!r}")
        return self

    @property
    def embedded(self) -> bool:
        return self.runtime_endpoint in ("", "none")

    @property
    def socket_path(self) -> str:
        return self.listen.removeprefix("unix://")


_TYPES = {f.name: f.type for f in fields(Config)}


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
    config = Config()
    for key, value in values.items():
        expected = type(getattr(config, key))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(f"{key}: expected {expected.__name__}, got {value!r}")
        setattr(config, key, value)
    return dataclasses.replace(config).validate()
