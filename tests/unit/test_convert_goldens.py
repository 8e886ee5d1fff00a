"""probectl convert (probectl/convert.py) against its goldens and corpus: pure, no daemon, no root.

Goldens: tests/golden/convert/<kind>.yaml -> <kind>.converted.yaml, compared exactly. After a deliberate change
of the output, regenerate them with `PROBECTL_UPDATE_GOLDEN=1 pytest tests/unit/test_convert_goldens.py` and read the
diff. The corpus (tests/golden/convert/corpus/) is checked for an exact round trip and for idempotence.
"""

from __future__ import annotations

import json
import os

import pytest

from probectl.convert import convert
from tests.support.convert_manifests import GOLDEN, converted, ordered, parsed

KINDS = ("pod", "deployment", "statefulset", "daemonset", "replicaset", "job", "cronjob", "list")
CORPUS = sorted((GOLDEN / "corpus").iterdir())
UPDATE = os.environ.get("PROBECTL_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("kind", KINDS)
def test_golden(kind):
    source = (GOLDEN / f"{kind}.yaml").read_text()
    golden_path = GOLDEN / f"{kind}.converted.yaml"
    result = convert(source)
    assert result.errors == []
    if UPDATE:
        golden_path.write_text(result.text)
    assert result.text == golden_path.read_text()
    assert parsed(converted(golden_path.read_text(), reverse=True)) == parsed(source)


@pytest.mark.parametrize("path", CORPUS, ids=[path.name for path in CORPUS])
def test_corpus_round_trip_is_exact_and_convert_is_idempotent(path):
    source = path.read_text()
    forward = convert(source)
    assert forward.errors == []
    assert forward.probes + forward.hooks > 0
    back = convert(forward.text, reverse=True)
    assert (back.probes, back.hooks) == (forward.probes, forward.hooks)
    assert parsed(back.text) == parsed(source)
    again = convert(forward.text)
    assert (again.text, again.probes, again.hooks) == (forward.text, 0, 0)


@pytest.mark.parametrize("path", CORPUS, ids=[path.name for path in CORPUS])
def test_corpus_round_trip_through_json(path):
    source = parsed(path.read_text())
    data = json.loads(converted(converted(path.read_text(), output="json"), reverse=True, output="json"))
    assert ([ordered(item) for item in data["items"]] if len(source) > 1 else [ordered(data)]) == source


def test_the_corpus_covers_what_it_should():
    text = "\n".join(path.read_text() for path in CORPUS)
    assert len(CORPUS) >= 8
    for needle in ("kind: Deployment", "kind: StatefulSet", "kind: DaemonSet", "kind: Job", "kind: CronJob",
                   "kind: Service", "kind: ConfigMap", "grpc:", "tcpSocket:", "startupProbe:", "httpHeaders:",
                   "scheme: HTTPS", "preStop:", "postStart:", "restartPolicy: Always", "exec:", "hostNetwork: true",
                   '"kind": "Deployment"'):
        assert needle in text, needle
