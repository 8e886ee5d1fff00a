"""Pod sandboxes: which network namespace, IPs and identity a sandbox has, and the memory of it."""
