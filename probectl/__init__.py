"""probectl's library: a client of the probe shim's socket (ProbeService and the proxied CRI), and its command line.

`ProbeShimClient` (client.py) calls the shim (unary calls over unary_h2.py, the watch over grpcio); `specs` reads
durations, `manifest` turns Kubernetes Pod manifests into probe registrations and `convert` bridges them to the shim
(all pure); `cli` and `commands/` are the command line. The client's names are exported here lazily (PEP 562):
importing probectl, as the command line does, loads no client until a command calls the shim.
"""

from __future__ import annotations

import importlib

__all__ = ["DEFAULT_ENDPOINT", "ENDPOINT_ENV", "NotFoundError", "ProbeShimClient", "RuntimeUnavailableError",
           "ShimError", "ShimUnavailable"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("probectl.client"), name)
    raise AttributeError(f"module 'probectl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
