"""The contract: the rules every side of cri-probe-shim shares, beside the protos in cri_proto/.

probectl on an operator's laptop, the daemon and the unprivileged worker inside a pod's netns all import this
package, and it imports only the standard library, protobuf and cri_proto, so that it stays lean enough for the
worker (tests/unit/test_worker_imports.py) and free of the daemon (tests/unit/test_import_boundaries.py).

- `validation`: which ProbeSpecs the Kubernetes API accepts, its exact error texts, the defaults it applies;
- `defaults`: the numbers several sides share (socket, message size, worker uid, kubelet version, tries, lateness);
- `worker_protocol`: frames on the daemon <-> worker socketpair and which worker requests are valid;
- `pod_loopback`: which `host` values are the pod's own loopback inside its netns (allowed without the host gate);
- `bridge_command`: the kubelet bridge's marker command, which `probectl convert` writes and the daemon reads;
- `handlers`, `handler_flags`, `cli_names`: core/v1 handler objects and probectl's handler flags -> ProbeSpec, and
  the flag words as plain strings (probectl's parser offers them before it loads protobuf);
- `pod_conversion`, `bridged_pod`, `workloads`: a pod's probes and hooks bridged to the shim and back, as
  `probectl convert` and the admission webhook both apply it, and where a pod spec sits in each kind;
- `endpoints`: kubelet/crictl style endpoints as gRPC targets;
- `grpc_codes`: grpc-go's status codes as Go prints them;
- `gostrings`: Go's quoting, durations and host:port pairs, for outputs that read like the kubelet's.
"""
