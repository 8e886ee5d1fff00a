"""The standard CRI, proxied to the container runtime."""
