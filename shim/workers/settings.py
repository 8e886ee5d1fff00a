"""The workers' settings: one frozen object, built from the daemon's config (shim/config.py `worker_settings`),
given to the supervisor, its lives and its zygote pool.

Each default is written here once; the config's own defaults for the settings an operator may change are read
from here, and the handover timeout (which the zygote needs too) is probe_api/defaults.py's. The timeouts an
operator has no key for are the ones tests shorten.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import HANDOVER_TIMEOUT_S, HEARTBEAT_INTERVAL_MS, KUBELET_VERSION, WORKER_GID, WORKER_UID
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION
from shim.workers.backoff import BackoffPolicy
from shim.workers.connection import REQUEST_TIMEOUT_S
from shim.workers.grouping import DEFAULT_SANDBOXES_PER_WORKER, POOLED, STRICT, worker_open_files


@dataclass(frozen=True)
class WorkerSettings:
    isolation: str = POOLED  # grouping.py: POOLED, or STRICT (a worker per sandbox)
    sandboxes_per_worker: int = DEFAULT_SANDBOXES_PER_WORKER
    # The worker sends a heartbeat when it has sent nothing for this long; the daemon one when it has heard nothing.
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS
    heartbeat_timeout_s: float = 5.0  # no frame for this long: the worker is hung, and replaced
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)  # restarts: workers, zygotes, attachments
    start_timeout_s: float = 10.0  # from the spawn to the worker's Ready
    stop_timeout_s: float = 5.0  # for its Shutdown (or Detach) to be answered, then for it to exit
    request_timeout_s: float = REQUEST_TIMEOUT_S
    user_agent_version: str = KUBELET_VERSION
    run_as_uid: int = WORKER_UID
    run_as_gid: int = WORKER_GID
    max_memory_bytes: int = 0  # 0: no limit
    max_open_files: int = 0  # 0: as the group's capacity needs (grouping.worker_open_files)
    # Where zygotes wait for the next daemon, their workers outliving this one ("": workers end with the daemon),
    # and for how long.
    handover_dir: str = ""
    handover_timeout_s: float = HANDOVER_TIMEOUT_S

    @property
    def capacity(self) -> int:
        """How many sandboxes one worker serves at most."""
        return 1 if self.isolation == STRICT else max(1, self.sandboxes_per_worker)

    @property
    def outlives_daemon(self) -> bool:
        return bool(self.handover_dir)

    def worker_config(self, *, group: str, tenancy: str, restarts: int) -> worker_pb.WorkerConfig:
        """What a new worker of the group is spawned with."""
        return worker_pb.WorkerConfig(
            user_agent_version=self.user_agent_version, run_as_uid=self.run_as_uid, run_as_gid=self.run_as_gid,
            max_memory_bytes=self.max_memory_bytes,
            max_open_files=self.max_open_files or worker_open_files(self.capacity),
            heartbeat_interval_ms=self.heartbeat_interval_ms, outlives_daemon=self.outlives_daemon,
            protocol_version=WORKER_PROTOCOL_VERSION, group=group, tenancy=tenancy, restarts=restarts,
        )
