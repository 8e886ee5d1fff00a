"""The HTTP probe and HTTP lifecycle hook: the executor, the kubelet's rules, Go's URL parsing, HTTP/2."""
