"""The daemon's event loop: uvloop's when it is installed, asyncio's own otherwise or when asked for.

Why uvloop (measured for the node-cost work): the daemon's work is many small reads and writes on unix sockets (the kubelet's calls, the
runtime's answers, the workers' frames), each a turn of the loop; uvloop's loop and transports (libuv, in C) make
a turn cheaper. Measured in the bridge's load scenario, the same code A/B in one run: the daemon's CPU per bridged
probe 0.80-0.90 -> 0.63-0.77 ms at 30/s and 0.43-0.44 -> 0.39 ms at 300/s. grpcio's aio client (the daemon's
typed calls to the runtime) runs on it. `PROBE_SHIM_EVENT_LOOP=asyncio` keeps asyncio's loop (to rule the loop out
when chasing a problem); the workers and the zygote always run asyncio's (measured there: ~4%, inside the noise).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

VARIABLE = "PROBE_SHIM_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


class UnknownLoop(ValueError):
    pass


def loop_factory(environ: Mapping[str, str]) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for asyncio.Runner, or None for asyncio's own loop."""
    choice = environ.get(VARIABLE, "").strip() or "uvloop"
    if choice not in CHOICES:
        raise UnknownLoop(f"{VARIABLE}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
