"""shim/workers/adoption.py: which running workers a restarted daemon adopts, and what it changes in them (pure)."""

from __future__ import annotations

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
from probe_api.defaults import SHIM_VERSION
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION
from probe_api.zygote_protocol import ZYGOTE_PROTOCOL_VERSION
from shim.workers.adoption import BROKER_ONLY, SPAWN_FROM, ProbePlan, adoption_verdict, probe_plan, same_registration


def hello(**fields) -> zygote_pb.Hello:
    values = dict(protocol_version=ZYGOTE_PROTOCOL_VERSION, worker_protocol_version=WORKER_PROTOCOL_VERSION,
                  version=SHIM_VERSION, adopted=True)
    values.update(fields)
    return zygote_pb.Hello(**values)


def test_the_same_version_is_adopted_and_forks_the_new_workers_too():
    assert adoption_verdict(hello(), have_spawner=False).use == SPAWN_FROM


def test_a_second_zygote_of_the_same_version_is_only_a_broker():
    assert adoption_verdict(hello(), have_spawner=True).use == BROKER_ONLY


def test_after_an_upgrade_the_workers_are_adopted_but_new_ones_run_the_new_code():
    verdict = adoption_verdict(hello(version="0.0.9"), have_spawner=False)
    assert verdict.use == BROKER_ONLY and verdict.reason == ""


def test_another_protocol_is_not_adopted_and_says_why():
    worker = adoption_verdict(hello(worker_protocol_version=WORKER_PROTOCOL_VERSION + 1), have_spawner=False)
    assert worker.use == "" and f"worker protocol {WORKER_PROTOCOL_VERSION + 1}" in worker.reason
    zygote = adoption_verdict(hello(protocol_version=1), have_spawner=False)
    assert zygote.use == "" and "zygote protocol 1" in zygote.reason


def reg(probe_id: str = "p", port: int = 80, **fields) -> worker_pb.ProbeRegistration:
    return worker_pb.ProbeRegistration(
        probe_id=probe_id, sandbox_id="sb", type=spec_pb.READINESS,
        spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port))),
        container=worker_pb.ContainerRef(id="c1", name="app", started_at_unix_ns=fields.pop("started", 0)), **fields)


def test_how_a_probe_began_does_not_make_it_another():
    running = reg(started=123, start_now=True)
    assert same_registration(reg(), running)  # the worker pinned the start the daemon left open
    wanted = reg(start_now=False)
    wanted.status.state = spec_pb.STATE_SUCCESS
    assert same_registration(wanted, reg(started=0))
    assert not same_registration(reg(started=5), reg(started=123))  # the runtime's own start differs
    assert not same_registration(reg(port=81), reg())


def test_the_plan_touches_only_what_differs():
    wanted = {"same": reg("same"), "changed": reg("changed", port=9), "new": reg("new")}
    running = {"same": reg("same", started=1), "changed": reg("changed"), "gone": reg("gone")}
    assert probe_plan(wanted, running) == ProbePlan(add=("changed", "new"), remove=("gone",))
    assert probe_plan({}, {}) == ProbePlan()
