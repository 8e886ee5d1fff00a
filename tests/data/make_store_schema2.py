# Ran once, at commit c7a508e (store schema version 2, status fields flat in Probe), to write
# store_schema2.sqlite for tests/unit/test_store_migration.py. It needs that commit's code; kept as the record of the file.
"""Writes tests/data/store_schema2.sqlite with the store code of commit c7a508e (schema version 2, flat status)."""
import sys
from pathlib import Path

sys.path.insert(0, "/work/main")
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.state.store import ProbeStore
from shim.state.writer import observed_blob

out = Path(sys.argv[1])
for suffix in ("", "-wal", "-shm"):
    Path(str(out) + suffix).unlink(missing_ok=True)
store = ProbeStore(out)
reg = service_pb.Probe(
    probe_id="p-http", pod_sandbox_id="sb1", container_id="c1", container_name="app", type=spec_pb.READINESS,
    spec=spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/healthz", port=spec_pb.PortRef(number=8080)),
                           period_ms=7000, failure_threshold=4),
    labels={"app": "web"}, container_started_at=1_700_000_000_000_000_001,
    container_ports=[spec_pb.ContainerPort(name="http", container_port=8080)], created_at=1_700_000_000_000_000_002)
store.save(reg)
row = service_pb.Probe()
row.CopyFrom(reg)
row.state = spec_pb.STATE_FAILURE
row.state_changed_at = 1_700_000_000_000_000_003
row.last_attempt.CopyFrom(spec_pb.Attempt(result=spec_pb.RESULT_FAILURE, output="HTTP probe failed with statuscode: 503",
                                          started_at_unix_ns=1_700_000_000_000_000_004, duration_ns=5_000_000,
                                          scheduled_at_unix_ns=1_700_000_000_000_000_000, ticks_missed=2, address="10.0.0.5:8080", http_status_code=503, phases=[spec_pb.Phase(name="connect", duration_ns=7)]))
row.last_trace_id, row.last_span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
row.consecutive_successes, row.consecutive_failures, row.on_hold = 0, 4, True
row.totals.success, row.totals.warning, row.totals.failure, row.totals.unknown = 11, 2, 4, 1
row.worker.CopyFrom(service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=4242, netns_path="/var/run/netns/x",
                                            netns_inode=99, restarts=3, last_error="boom", started_at=5,
                                            group="default#1", group_sandboxes=2))
row.revision = 41
bridged = service_pb.Probe(probe_id="b-exec", pod_sandbox_id="sb2", container_id="c2", container_name="side",
                           type=spec_pb.LIVENESS, spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=9000))),
                           created_at=1_700_000_000_000_000_010, revision=42,
                           bridged=service_pb.BridgedHandler(role="liveness", last_exec_at=1_700_000_000_000_000_011))
bridged.last_attempt.CopyFrom(spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, started_at_unix_ns=1_700_000_000_000_000_012))
bridged.last_trace_id, bridged.last_span_id = "1af7651916cd43dd8448eb211c80319c", "c7ad6b7169203331"
bridged.totals.success = 7
bridged.worker.CopyFrom(service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=4343, group="sb2"))
store.save_observed({"p-http": observed_blob(row), "b-exec": observed_blob(bridged)},
                    {"instance_id": "feedbeef", "revision": "42", "revision_reserved": "1048618"}, True)
store.close()
import sqlite3

conn = sqlite3.connect(out)
conn.execute("PRAGMA journal_mode = DELETE")
conn.execute("VACUUM")
conn.close()
print(row)
