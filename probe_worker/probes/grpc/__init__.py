"""The gRPC health probe (KEP-1665): the executor, the kubelet's rules, the HTTP/2 wire side."""
