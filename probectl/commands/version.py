"""probectl version: the client's, the shim's and the runtime's versions, as `crictl version` prints them.

A module of its own because it is the command an operator runs first to see whether the shim answers: its table
needs the client and render_text.py only, not render.py's protojson, YAML and validation rules (20 ms of the
80 ms a start may take here; tests/unit/test_probectl_startup.py).
"""

from __future__ import annotations

from probe_api.defaults import SHIM_VERSION
from probectl.commands.base import EXIT_OK, connect, print_line
from probectl.render_text import key_values

# probectl is released with the shim: its version is the code's, as crictl's is compiled in (importlib.metadata
# would ask the installed package the same, for 15 ms; tests/unit/test_probectl_startup.py checks they agree).
CLIENT_VERSION = SHIM_VERSION


def cmd_version(args) -> int:
    with connect(args) as client:
        shim = client.version()
        runtime = client.runtime_version()
    if args.output != "table":
        from probectl import render

        data = {"clientVersion": CLIENT_VERSION, "shim": render.message_dict(shim),
                "runtime": render.message_dict(runtime) if runtime is not None else None}
        print_line(render.structured(data, args.output))
        return EXIT_OK
    pairs = [("ClientVersion", CLIENT_VERSION), ("ShimVersion", shim.version), ("ShimApiVersion", shim.api_version),
             ("ShimInstanceId", shim.instance_id), ("RuntimeEndpoint", shim.runtime_endpoint)]
    if runtime is not None:
        pairs += [("RuntimeName", runtime.runtime_name), ("RuntimeVersion", runtime.runtime_version),
                  ("RuntimeApiVersion", runtime.runtime_api_version)]
    print_line(key_values(pairs))
    return EXIT_OK
