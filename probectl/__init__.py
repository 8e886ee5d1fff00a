"""probectl's library: a client of the probe shim's socket (ProbeService and the proxied CRI).

`ProbeShimClient` wraps the generated stubs; `specs` turns command-line syntax into ProbeSpecs and
`manifest` turns Kubernetes Pod manifests into probe registrations (both pure).
"""

from probectl.client import (
    DEFAULT_ENDPOINT,
    ENDPOINT_ENV,
    NotFoundError,
    ProbeShimClient,
    RuntimeUnavailableError,
    ShimError,
    ShimUnavailable,
)

__all__ = ["DEFAULT_ENDPOINT", "ENDPOINT_ENV", "NotFoundError", "ProbeShimClient", "RuntimeUnavailableError",
           "ShimError", "ShimUnavailable"]
