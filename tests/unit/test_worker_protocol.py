"""probe_api.worker_protocol's request rules: a RunOnce's verdict, kept per message."""

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.worker_protocol import validate_run_once


def _run_once(path: str = "/healthz", max_tries: int = 1) -> worker_pb.RunOnce:
    spec = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path=path, port=spec_pb.PortRef(number=8080)))
    return worker_pb.RunOnce(probe=worker_pb.ProbeRegistration(sandbox_id="sb", type=spec_pb.READINESS, spec=spec),
                             max_tries=max_tries)


def test_the_same_request_gets_the_same_verdict_every_time():
    assert validate_run_once(_run_once()) == validate_run_once(_run_once()) == []
    bad = _run_once(max_tries=9)
    first = validate_run_once(bad)
    assert first and first == validate_run_once(bad)


def test_a_message_changed_in_place_is_judged_again():
    run = _run_once()
    assert validate_run_once(run) == []
    run.max_tries = 9
    assert any(e.startswith("max_tries: Invalid value: 9") for e in validate_run_once(run))
    run.max_tries = 1
    run.probe.spec.http_get.port.number = 0
    assert validate_run_once(run) != []


def test_a_caller_changing_the_returned_list_does_not_change_the_next_verdict():
    bad = _run_once(max_tries=9)
    errors = validate_run_once(bad)
    errors.append("mine")
    errors2 = validate_run_once(bad)
    assert "mine" not in errors2 and errors2 == errors[:-1]
