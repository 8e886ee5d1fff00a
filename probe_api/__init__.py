"""The contract: the rules every side of cri-probe-shim shares, beside the protos in cri_proto/.

probectl on an operator's laptop, the daemon and the unprivileged worker inside a pod's netns all import this
package, and it imports only the standard library, protobuf and cri_proto, so that it stays lean enough for the
worker (tests/test_worker_imports.py) and free of the daemon (tests/test_import_boundaries.py).

- `validation`: which ProbeSpecs the Kubernetes API accepts, its exact error texts, the defaults it applies;
- `defaults`: the numbers several sides share (socket, message size, worker uid, kubelet version, tries, lateness);
- `worker_protocol`: frames on the daemon <-> worker socketpair and which worker requests are valid;
- `pod_loopback`: which `host` values are the pod's own loopback inside its netns (allowed without the host gate);
- `endpoints`: kubelet/crictl style endpoints as gRPC targets;
- `grpc_codes`: grpc-go's status codes as Go prints them;
- `gostrings`: Go's quoting, durations and host:port pairs, for outputs that read like the kubelet's.
"""
