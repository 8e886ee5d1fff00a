"""The daemon (probe-shim): its API, state, observability, sandboxes, CRI proxy, kubelet bridge, workers, webhook."""
