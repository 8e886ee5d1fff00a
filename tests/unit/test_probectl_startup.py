"""What probectl loads before it does anything, and how it ends: no command but `watch` loads grpc (35-57 ms of
the 80 ms a start may take here; crictl starts in 10): unary calls go over probectl/unary_h2.py, and grpc is
imported to name the status of an error only. `--help` loads not the converter either, `convert` no client,
`version` neither render.py (protojson, YAML) nor importlib.metadata; the program ends without the interpreter's
teardown. Asserted on imports and behaviour, in a fresh interpreter each, not on timings: the times are
bench/probectl_startup.py's rows of the benchmark.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import socket
import subprocess
import sys
import threading

import h2.config
import h2.connection
import h2.events
import pytest

from cri_proto import probe_service_pb2 as service_pb
from probe_api.grpc_wire_rules import frame_message
from tests.support.netns_env import REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "golden" / "convert"
HEAVY = ("grpc", "psutil", "probectl.client", "probectl.render")
CONVERTER = ("yaml", "probectl.convert", "probe_api.pod_conversion")
# What a call to the shim does without: grpcio, the other HTTP/2 libraries, the structured outputs, a package lookup.
CALLS_WITHOUT = ("grpc", "h2", "hpack", "psutil", "yaml", "google.protobuf.json_format", "probectl.render",
                 "importlib.metadata")


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after `code` (which may call probectl.cli.main)."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=60, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def run_cli(*argv: str) -> str:
    return ("from probectl import cli\n"
            "import contextlib, io\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    cli.main({list(argv)!r})\n")


def roots(modules: set[str], wanted: tuple[str, ...]) -> set[str]:
    return {name for name in wanted if name in modules or any(m.startswith(name + ".") for m in modules)}


@pytest.mark.parametrize("argv", [["--help"], ["convert", "--help"], ["version", "--help"], ["ps", "--help"]])
def test_help_loads_neither_grpc_nor_the_converter(argv):
    modules = loaded_after(run_cli(*argv))
    assert roots(modules, HEAVY + CONVERTER) == set()


def test_convert_loads_no_grpc():
    modules = loaded_after(run_cli("convert", "-f", str(GOLDEN / "list.yaml")))
    assert roots(modules, HEAVY) == set()
    assert roots(modules, CONVERTER) == set(CONVERTER)  # it did convert


class FakeShim:
    """A unix socket answering ShimVersion (no runtime) with h2's server, one connection at a time."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self._answer(conn)

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        peer = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        # Without Huffman coding, as the shim's own server writes its headers (h2's would load hpack's table).
        peer.encoder.encode = functools.partial(peer.encoder.encode, huffman=False)
        peer.initiate_connection()
        conn.sendall(peer.data_to_send())
        answer = service_pb.ShimVersionResponse(version="0.1.0", runtime_endpoint="none").SerializeToString()
        while data := conn.recv(65536):
            for event in peer.receive_data(data):
                if isinstance(event, h2.events.StreamEnded):
                    peer.send_headers(event.stream_id, [(":status", "200"), ("content-type", "application/grpc")])
                    peer.send_data(event.stream_id, frame_message(answer))
                    peer.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
            conn.sendall(peer.data_to_send())

    def close(self) -> None:
        self.listener.close()


def test_version_calls_the_shim_without_grpc_render_or_a_package_lookup(tmp_path):
    parsed = loaded_after("from probectl import cli\ncli.build_parser().parse_args(['version'])\n")
    assert roots(parsed, HEAVY) == set()
    unreachable = loaded_after(run_cli("-r", "unix:///nonexistent/probe-shim.sock", "version"))
    assert roots(unreachable, CALLS_WITHOUT) == set() and "probectl.client" in unreachable
    shim = FakeShim(str(tmp_path / "shim.sock"))
    try:
        answered = loaded_after(run_cli("-r", f"unix://{tmp_path / 'shim.sock'}", "version").replace(
            "    cli.main(", "    assert 0 == cli.main("))
    finally:
        shim.close()
    assert roots(answered, CALLS_WITHOUT) == set() and "probectl.unary_h2" in answered


def test_importing_probectl_and_its_client_loads_no_grpc_and_a_watch_loads_it():
    assert roots(loaded_after("import probectl"), HEAVY) == set()
    assert roots(loaded_after("from probectl import ProbeShimClient"), CALLS_WITHOUT) == set()
    watched = loaded_after("from probectl import ProbeShimClient, ShimUnavailable\n"
                           "try:\n"
                           "    next(ProbeShimClient('unix:///nonexistent/probe-shim.sock').watch())\n"
                           "except ShimUnavailable:\n"
                           "    pass\n")
    assert "grpc" in watched


def test_the_client_version_probectl_prints_is_the_installed_packages():
    from probectl.commands import version

    assert version.CLIENT_VERSION == importlib.metadata.version("cri-probe-shim")


def test_the_names_the_parser_offers_are_the_ones_the_commands_take():
    from probectl import cli, client, convert, render

    assert cli.OUTPUTS == render.OUTPUTS
    assert cli.CONVERT_OUTPUTS == convert.OUTPUTS
    assert cli.ENDPOINT_ENV == client.ENDPOINT_ENV


def test_the_program_ends_without_the_interpreters_teardown_once_its_output_is_written():
    from probectl import convert

    expected = convert.convert((GOLDEN / "list.yaml").read_text()).text
    script = ("import atexit, sys\n"
              "atexit.register(lambda: sys.stderr.write('teardown\\n'))\n"
              "from probectl.cli import main\n"
              f"sys.argv = ['probectl', 'convert', '-f', {str(GOLDEN / 'list.yaml')!r}]\n"
              "main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert (done.returncode, done.stdout) == (0, expected)
    assert "teardown" not in done.stderr and done.stderr.startswith("probectl: ")  # the notes, and no more
    called = subprocess.run([sys.executable, "-c", "import sys\nfrom probectl import cli\n"
                             "sys.exit(10 + cli.main(['-r', 'unix:///nonexistent/x.sock', 'version']))\n"],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert called.returncode == 12  # with argv given, main returns the code to its caller
