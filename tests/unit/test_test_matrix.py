"""hack/test_matrix.py's pure parts: which kubelet runs on which containerd, and the table it prints."""

from __future__ import annotations

import importlib.util

from tests.support.netns_env import REPO_ROOT

spec = importlib.util.spec_from_file_location("test_matrix", REPO_ROOT / "hack" / "test_matrix.py")
matrix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(matrix)


def test_only_1_35_runs_on_containerd_1_6():
    assert [(k, r.version) for k, r in matrix.pairs(["1.35.4", "1.36.3", "1.37.2"], "2.4.2")] == [
        ("1.35.4", "1.6"), ("1.35.4", "2.4.2"), ("1.36.3", "2.4.2"), ("1.37.2", "2.4.2")]


def test_outcomes_come_from_junit_without_the_parameter_id(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="m" name="test_a[containerd2.4.2]"/>
      <testcase classname="m" name="test_b[containerd2.4.2]"><failure message="x"/></testcase>
      <testcase classname="m" name="test_c[containerd2.4.2]"><skipped message="y"/></testcase>
      <testcase classname="m" name="test_d[containerd2.4.2]"><error message="z"/></testcase>
    </testsuite></testsuites>""")
    assert matrix.outcomes(junit) == {"test_a": "passed", "test_b": "failed", "test_c": "skipped", "test_d": "error"}


def test_the_table_has_a_row_per_test_and_a_column_per_pair():
    text = matrix.table(["1.35.4 / 1.6", "1.37.2 / 2.4.2"],
                        {"1.35.4 / 1.6": {"test_a": "passed"}, "1.37.2 / 2.4.2": {"test_a": "failed", "test_b": "passed"}})
    assert text.splitlines() == ["| test | 1.35.4 / 1.6 | 1.37.2 / 2.4.2 |", "|---|---|---|",
                                 "| `a` | pass | FAIL |", "| `b` | - | pass |"]
