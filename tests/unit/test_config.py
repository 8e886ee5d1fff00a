import dataclasses
import grp

import pytest

from shim.config import Config, ConfigError, load, metrics_exposure_warning, socket_gid


def test_defaults_match_the_issue():
    c = load(None, {})
    assert c.listen == "unix:///run/probe-shim/probe-shim.sock"
    assert c.runtime_endpoint == "unix:///run/containerd/containerd.sock"
    assert c.state_dir == "/var/lib/probe-shim" and c.metrics_listen == "127.0.0.1:9555"
    assert c.reconcile_interval_s == 5.0 and c.allow_host_field is False and not c.embedded
    assert (c.worker_isolation, c.sandboxes_per_worker, c.embedded_namespace_separator) == ("pooled", 16, "")


def test_file_then_flags(tmp_path):
    f = tmp_path / "shim.toml"
    f.write_text('runtime_endpoint = "none"\nreconcile_interval_s = 2\nallow_host_field = true\nlisten = "unix:///tmp/a.sock"\n')
    c = load(str(f), {"listen": "unix:///tmp/b.sock", "state_dir": None})
    assert c.embedded and c.reconcile_interval_s == 2.0 and c.allow_host_field
    assert c.socket_path == "/tmp/b.sock" and c.state_dir == Config().state_dir


@pytest.mark.parametrize("text, message", [
    ("bogus = 1\n", "unknown keys bogus"),
    ("reconcile_interval_s = \"fast\"\n", "reconcile_interval_s: expected float"),
    ("max_probes_total = true\n", "max_probes_total: expected int"),
    ("log_format = \"xml\"\n", "log_format: must be text or json"),
    ("listen = \"tcp://0.0.0.0:1\"\n", "listen: only unix:// sockets"),
    ("worker_uid = 0\n", "worker_uid: must be between 1 and 2147483647 \\(workers never run as root\\)"),
    ("worker_gid = 0\n", "worker_gid: must be between 1"),
    ("worker_uid = 4294967295\n", "worker_uid: must be between 1"),
    ("socket_group = true\n", "socket_group: expected str"),
    ("hook_timeout_s = 0\n", "hook_timeout_s: must be more than 0 and at most 3600"),
    ("hook_timeout_s = 86400\n", "hook_timeout_s: must be more than 0 and at most 3600"),
    ("worker_isolation = \"process\"\n", "worker_isolation: must be pooled or sandbox, not 'process'"),
    ("sandboxes_per_worker = 0\n", "sandboxes_per_worker: must be between 1 and 256"),
    ("sandboxes_per_worker = 257\n", "sandboxes_per_worker: must be between 1 and 256"),
    ("embedded_namespace_separator = 1\n", "embedded_namespace_separator: expected str"),
    ("this is not toml", "config file"),
])
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    f = tmp_path / "shim.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(str(f), {})


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(str(tmp_path / "nope.toml"), {})


def test_socket_group_is_a_name_or_a_gid(tmp_path):
    assert load(None, {}).socket_group == ""  # the daemon's own group: root's under systemd
    f = tmp_path / "shim.toml"
    f.write_text("socket_group = 1001\n")
    assert load(str(f), {}).socket_group == "1001"
    f.write_text('socket_group = "probe-users"\n')
    assert load(str(f), {}).socket_group == "probe-users"


def test_socket_gid_resolves_names_and_refuses_unknown_ones():
    groups = {"probe-users": grp.struct_group(("probe-users", "x", 1234, []))}

    def lookup(name):
        return groups[name]

    assert socket_gid("", lookup) is None
    assert socket_gid("4321", lookup) == 4321  # a gid needs no name
    assert socket_gid("probe-users", lookup) == 1234
    with pytest.raises(ConfigError, match="socket_group: no group named 'nope' on this system"):
        socket_gid("nope", lookup)
    with pytest.raises(ConfigError, match="out of range"):
        socket_gid("99999999999", lookup)


@pytest.mark.parametrize("listen, warns", [
    ("", False), ("127.0.0.1:9555", False), ("127.0.0.53:1", False), ("[::1]:9555", False),
    ("localhost:9555", False), ("0.0.0.0:9555", True), ("[::]:9555", True), ("10.1.2.3:9555", True),
    ("metrics.example:9555", True),
])
def test_metrics_beyond_loopback_warns(listen, warns):
    warning = metrics_exposure_warning(listen)
    assert (warning is not None) == warns
    if warns:
        assert "beyond loopback" in warning and "127.0.0.1" in warning
    assert metrics_exposure_warning(Config().metrics_listen) is None


def test_the_workers_settings_are_one_frozen_object_built_from_the_config(tmp_path):
    from probe_api.defaults import HANDOVER_TIMEOUT_S
    from shim.workers.settings import WorkerSettings

    defaults = WorkerSettings()
    c = load(None, {})
    # The config's defaults for the workers' keys are WorkerSettings' own (written once).
    assert (c.heartbeat_timeout_s, c.worker_isolation, c.sandboxes_per_worker, c.user_agent_version, c.worker_uid,
            c.worker_gid, c.handover_timeout_s) == (
        defaults.heartbeat_timeout_s, defaults.isolation, defaults.sandboxes_per_worker, defaults.user_agent_version,
        defaults.run_as_uid, defaults.run_as_gid, HANDOVER_TIMEOUT_S)
    assert c.worker_settings() == WorkerSettings(handover_dir="/var/lib/probe-shim/workers")
    f = tmp_path / "shim.toml"
    f.write_text('worker_isolation = "sandbox"\nheartbeat_timeout_s = 2\nhandover_timeout_s = 0\n')
    settings = load(str(f), {"state_dir": str(tmp_path)}).worker_settings()
    assert (settings.isolation, settings.capacity, settings.heartbeat_timeout_s) == ("sandbox", 1, 2.0)
    assert settings.handover_dir == "" and not settings.outlives_daemon  # 0: workers end with the daemon
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.isolation = "pooled"
    with pytest.raises(dataclasses.FrozenInstanceError):  # the daemon's own settings too: a change is a restart
        load(None, {}).listen = "unix:///elsewhere.sock"


def test_a_worker_is_spawned_with_the_settings_and_its_groups_place():
    from shim.workers.settings import WorkerSettings

    config = WorkerSettings(sandboxes_per_worker=32, handover_dir="/x").worker_config(
        group="web#1", tenancy="web", restarts=3)
    assert (config.group, config.tenancy, config.restarts, config.outlives_daemon) == ("web#1", "web", 3, True)
    assert config.max_open_files == 64 * 32 and config.run_as_uid == 65534 and config.heartbeat_interval_ms == 1000
