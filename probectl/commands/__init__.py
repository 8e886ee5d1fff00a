"""probectl's commands, one module per family, each imported only once its command is chosen (probectl/cli.py):
`--help` and `convert` never load grpc, `convert` is the only one to load the converter, `workers` the only one to
load psutil (tests/unit/test_probectl_startup.py asserts on the imports).

- `base`: exit codes, the one-line usage error, and what several commands share (the client, probe id prefixes,
  reading a manifest);
- `version`: the client's, the shim's and the runtime's versions (the table without render.py);
- `status`: pods, ps, inspect, watch (reading what the shim holds);
- `probes`: run, apply, exec, rm (registering, running and stopping probes);
- `workers`: the worker processes and what they cost (psutil);
- `rollout`: convert and doctor (bridging manifests, checking a node).
"""
