"""CRI endpoints written the way the kubelet and crictl accept them, as gRPC targets: for the daemon's upstream
runtime and for probectl's `-r`. Pure.
"""

from __future__ import annotations


def upstream_target(endpoint: str) -> str:
    """A gRPC target for a runtime endpoint written the way kubelet and crictl accept it.

    `unix:///abs/path` and `unix:/abs/path` are unix sockets; a bare `/abs/path` is one too (kubelet's deprecated
    fallback); `tcp://host:port` and `host:port` are TCP. Raises ValueError for anything else, including "none"
    (the embedded mode has no upstream).
    """
    text = endpoint.strip()
    if not text or text == "none":
        raise ValueError(f"runtime endpoint {endpoint!r}: no upstream to connect to")
    if text.startswith("unix://"):
        path = text[len("unix://"):]
        if not path.startswith("/"):
            raise ValueError(f"runtime endpoint {endpoint!r}: unix socket path must be absolute (unix:///path)")
        return f"unix:{path}"
    if text.startswith("unix:"):
        if not text[len("unix:"):]:
            raise ValueError(f"runtime endpoint {endpoint!r}: empty unix socket path")
        return text
    if text.startswith("/"):
        return f"unix:{text}"
    if text.startswith("tcp://"):
        text = text[len("tcp://"):]
    if "://" in text or ":" not in text:
        raise ValueError(f"runtime endpoint {endpoint!r}: expected unix:///path, /path, tcp://host:port or host:port")
    return text
