"""The probectl start-up rows of the benchmark (bench/probectl_startup.py): medians against the target. No
processes started."""

from __future__ import annotations

from bench import probectl_startup, report


def times(**medians: float) -> dict[str, list[float]]:
    return {name: [medians.get(name, 50.0) + d for d in (-4, -2, -1, 0, 0, 1, 2, 3, 40)]
            for name in probectl_startup.COMMANDS}


def test_figures_are_each_commands_median_min_and_max_and_say_how_python_found_bytecode():
    figures = probectl_startup.figures(times(convert=70.0), {"PYTHONDONTWRITEBYTECODE": "1"})
    assert figures["runs"] == 9
    assert figures["commands"]["convert"] | {"times_ms": None} == \
        {"median_ms": 70.0, "min_ms": 66.0, "max_ms": 110.0, "times_ms": None}
    assert "compiled at each start" in figures["bytecode"]
    assert probectl_startup.figures(times(), {})["bytecode"] == "bytecode cached"


def test_a_row_per_command_met_at_80_ms_and_not_above():
    rows = probectl_startup.rows(probectl_startup.figures(times(version=80.0, convert=81.0), {}))
    by_figure = {r.figure: r for r in rows}
    assert len(rows) == len(probectl_startup.COMMANDS) == 4
    assert {r.target for r in rows} == {"<= 80 ms"}
    version = by_figure["probectl start-up: probectl version against the daemon"]
    assert (version.measured, version.status) == ("80 ms", report.MET)
    convert = by_figure["probectl start-up: probectl convert -f tests/golden/convert/list.yaml"]
    assert (convert.measured, convert.status) == ("81 ms", report.NOT_MET)
    assert convert.note == "median of 9; min 77, max 121 ms; bytecode cached"
    loaded = probectl_startup.rows({**probectl_startup.figures(times(), {}), "loadavg": [0.5, 1.25]})
    assert loaded[0].note.endswith("bytecode cached; load average 0.5 to 1.2")


def test_a_run_without_the_scenario_has_its_rows_skipped():
    assert {r.status for r in probectl_startup.rows(None)} == {report.SKIPPED}
    assert {r.status for r in probectl_startup.rows({"skipped": "no console script"})} == {report.SKIPPED}


def test_the_runs_get_a_bytecode_cache_as_an_installed_probectl_has():
    env = probectl_startup.node_environment({"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}, "/tmp/cache")
    assert env == {"PATH": "/bin", "PYTHONPYCACHEPREFIX": "/tmp/cache"}
    assert probectl_startup.bytecode_note(env) == "bytecode cached"
