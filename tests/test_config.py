import pytest

from shim.config import Config, ConfigError, load


def test_defaults_match_the_issue():
    c = load(None, {})
    assert c.listen == "unix:///run/probe-shim/probe-shim.sock"
    assert c.runtime_endpoint == "unix:///run/containerd/containerd.sock"
    assert c.state_dir == "/var/lib/probe-shim" and c.metrics_listen == "127.0.0.1:9555"
    assert c.reconcile_interval_s == 5.0 and c.allow_host_field is False and not c.embedded


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
