#!/usr/bin/env python3
"""A/B of two benchmark runs on the same machine: every target row both runs have, before beside after.

    python bench/ab.py BEFORE/results.json AFTER/results.json     # prints the table, writes AFTER/ab.md

Rows are paired by their figure (bench/suite.py's results.json "targets"); each shows its target, the value
measured before and after (the first number of the measured text: the figure the target is about), their
ratio after/before, and the verdicts. When the after run measured another checkout's shim in the same windows
(`bench/suite.py --before-code DIR`, bridge_load's "beside"), those interleaved figures follow: they are the
fairer comparison of CPU per probe, as both shims met the same machine at the same moments.

The code before the node cost work (bench/node_cost.py's targets) is commit 7b56778, the last before its changes.
Both runs use THIS checkout's benchmark, so that both have the same scenarios and rows; only the shim's code
differs. bench/ab_full.sh does all of it (`bench/ab_full.sh 7b56778`); by hand:

    git worktree add ../before-7b56778 7b56778       # beside main; the kubelet is make k8s's cached build
    rm -rf ../before-7b56778/bench && cp -a bench ../before-7b56778/bench
    .venv/bin/python ../before-7b56778/bench/suite.py --mode full --out /tmp/ab/before
    out=bench/results/DATE-HOST-full-node-cost
    .venv/bin/python bench/suite.py --mode full --out $out --before-code ../before-7b56778
    .venv/bin/python bench/ab.py /tmp/ab/before/results.json $out/results.json
    git worktree remove --force ../before-7b56778

(as root, from this checkout; the suite and the daemons it starts put their own checkout's code first on the
path, so ../before-7b56778/bench/suite.py runs the code of 7b56778 with this venv.)
Run the two suites one after the other with nothing else measuring on the machine; the node's native probe (the
kubelet's own httpGet) is in both runs and shows how much the machine itself moved between them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
UNMEASURED = "-"  # bench/report.py's measured text of a row without a figure


@dataclass(frozen=True)
class Pair:
    figure: str
    target: str
    before: str
    after: str
    before_status: str
    after_status: str

    @property
    def unmeasured(self) -> bool:
        """Neither run has a figure for this row (its scenario skipped, failed or not run in both)."""
        return self.before == UNMEASURED and self.after == UNMEASURED

    @property
    def ratio(self) -> float | None:
        before, after = leading_number(self.before), leading_number(self.after)
        if before is None or after is None or before == 0:
            return None
        return after / before


def leading_number(measured: str) -> float | None:
    """The first number of a measured text ("1.55 ms (p99 2.3 ms)" -> 1.55, "3.1x (...)" -> 3.1); None when it
    has none ("-" for a skipped row)."""
    match = NUMBER.search(measured)
    return float(match.group()) if match else None


def pairs(before_rows: list[dict], after_rows: list[dict]) -> tuple[list[Pair], list[str], list[str]]:
    """The rows both runs have, in the after run's order; and the figures only one of them has."""
    before = {r["figure"]: r for r in before_rows}
    after_figures = {r["figure"] for r in after_rows}
    both = [Pair(r["figure"], r["target"], before[r["figure"]]["measured"], r["measured"],
                 before[r["figure"]]["status"], r["status"]) for r in after_rows if r["figure"] in before]
    only_before = [r["figure"] for r in before_rows if r["figure"] not in after_figures]
    only_after = [r["figure"] for r in after_rows if r["figure"] not in before]
    return both, only_before, only_after


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(str(c)) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pairs_table(both: list[Pair]) -> str:
    rows = []
    for p in both:
        ratio = "-" if p.ratio is None else f"{p.ratio:.2f}"
        verdict = p.after_status if p.before_status == p.after_status else f"{p.before_status} -> {p.after_status}"
        rows.append([p.figure, p.target, p.before, p.after, ratio, verdict])
    return markdown_table(["figure", "target", "before", "after", "after/before", "status"], rows)


def interleaved_table(bridge_load: dict) -> str:
    """bridge_load's figures of this code and of each shim measured beside it in the same windows; "" if none."""
    beside = bridge_load.get("beside") or {}
    if "rates" not in bridge_load or not beside:
        return ""
    sections = []
    for name, other in beside.items():
        rows = []
        for mine, theirs in zip(bridge_load["rates"], other["rates"]):
            for key, what in (("daemon_ms_per_call", "daemon CPU ms per probe"),
                              ("workers_ms_per_call", "workers CPU ms per probe")):
                rows.append(_ratio_row(f"{what} at {mine['rate_per_s']:.0f}/s", theirs[key], mine[key], ".3f"))
            rows.append(_ratio_row(f"latency median at {mine['rate_per_s']:.0f}/s (ms)",
                                   theirs["latency_ms"]["median"], mine["latency_ms"]["median"], ".2f"))
        sections.append(f"bridge_load in the same windows, alternating: {name} (--before-code) vs this code\n\n"
                        + markdown_table(["figure", name, "this code", "after/before"], rows))
    return "\n\n".join(sections)


def _ratio_row(figure: str, before: float, after: float, spec: str) -> list[str]:
    return [figure, format(before, spec), format(after, spec), f"{after / before:.2f}" if before else "-"]


def _run_line(label: str, results: dict) -> str:
    m = results.get("machine", {})
    return (f"- {label}: commit {m.get('git_commit', '?')}, {results.get('mode', '?')} mode, {m.get('date', '?')}, "
            f"{m.get('hostname', '?')} ({m.get('cpu_model', '?')}, {m.get('cpu_cores', '?')} cores), load average "
            f"{m.get('loadavg_at_start', '?')} at start, {m.get('loadavg_at_end', '?')} at end")


def report(before: dict, after: dict) -> str:
    both, only_before, only_after = pairs(before.get("targets", []), after.get("targets", []))
    measured = [p for p in both if not p.unmeasured]
    parts = ["# A/B: the benchmark before and after", "",
             _run_line("before", before), _run_line("after", after), "",
             "Every target row both runs have; before and after are the measured texts, after/before the ratio of "
             "their first numbers.", "", pairs_table(measured)]
    interleaved = interleaved_table(after.get("scenarios", {}).get("bridge_load") or {})
    if interleaved:
        parts += ["", interleaved]
    unmeasured = [p.figure for p in both if p.unmeasured]
    for label, figures in (("measured in neither run", unmeasured), ("only before", only_before),
                           ("only after", only_after)):
        if figures:
            parts += ["", f"{label}: " + "; ".join(figures)]
    return "\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="results.json of the run before")
    parser.add_argument("after", type=Path, help="results.json of the run after (ab.md is written beside it)")
    args = parser.parse_args()
    text = report(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
    out = args.after.parent / "ab.md"
    out.write_text(text)
    print(text)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
