"""What a restarted daemon does with the workers an earlier daemon left running (pure rules, no I/O).

A worker is adopted only if it and its zygote speak this daemon's protocols; otherwise it is replaced and its
probes go on from the stored state. An adopted zygote also forks the new workers only if it runs this very shim
version: after an upgrade, new workers must run the new code. An adopted worker keeps running the probes it has
as they are (ticks, thresholds, sockets) unless the daemon's registrations say otherwise: `probe_plan` says which
probes to add, replace or remove, and only those are touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
from probe_api.defaults import SHIM_VERSION
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION
from probe_api.zygote_protocol import ZYGOTE_PROTOCOL_VERSION

SPAWN_FROM = "spawn from"  # adopt its workers, and fork new ones from it too
BROKER_ONLY = "broker only"  # adopt its workers; new ones come from another zygote


@dataclass(frozen=True)
class Verdict:
    use: str = ""
    reason: str = ""  # why its workers cannot be adopted ("" when they can)


def adoption_verdict(hello: zygote_pb.Hello, *, have_spawner: bool) -> Verdict:
    """What to do with an earlier daemon's zygote, from the Hello it says on its handover socket."""
    if hello.protocol_version != ZYGOTE_PROTOCOL_VERSION:
        return Verdict(reason=f"it speaks zygote protocol {hello.protocol_version}, this daemon "
                              f"{ZYGOTE_PROTOCOL_VERSION}")
    if hello.worker_protocol_version != WORKER_PROTOCOL_VERSION:
        return Verdict(reason=f"its workers speak worker protocol {hello.worker_protocol_version}, this daemon "
                              f"{WORKER_PROTOCOL_VERSION}")
    if hello.version == SHIM_VERSION and not have_spawner:
        return Verdict(use=SPAWN_FROM)
    return Verdict(use=BROKER_ONLY)


def same_registration(wanted: worker_pb.ProbeRegistration, running: worker_pb.ProbeRegistration) -> bool:
    """Whether a running probe already is the registration the daemon wants. Not compared: start_now and status
    (how it began, not what it is), and the container start when the daemon has none (the worker pinned one then:
    keeping it keeps the initial delay counted from the same instant)."""
    a, b = worker_pb.ProbeRegistration(), worker_pb.ProbeRegistration()
    a.CopyFrom(wanted)
    b.CopyFrom(running)
    for reg in (a, b):
        reg.ClearField("start_now")
        reg.ClearField("status")
    if not a.container.started_at_unix_ns:
        b.container.started_at_unix_ns = 0
    return a == b


@dataclass(frozen=True)
class ProbePlan:
    add: tuple[str, ...] = ()      # probe ids to send (new to the worker, or changed)
    remove: tuple[str, ...] = ()   # probe ids the worker runs that nobody registered any more


def probe_plan(wanted: dict[str, worker_pb.ProbeRegistration],
               running: dict[str, worker_pb.ProbeRegistration]) -> ProbePlan:
    """One sandbox: what to change in an adopted worker so that it runs exactly `wanted`."""
    add = tuple(sorted(pid for pid, reg in wanted.items()
                       if pid not in running or not same_registration(reg, running[pid])))
    remove = tuple(sorted(pid for pid in running if pid not in wanted))
    return ProbePlan(add=add, remove=remove)
