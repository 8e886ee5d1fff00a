"""The node cost targets: what a probe may cost the node and the shim, each a row with its measured value and met /
NOT met (pure).

The rows come from the scenarios that measure them:
- node (a real kubelet): all pods Ready and no flips; node CPU per bridged probe <= 1.5x the kubelet's own httpGet
  (the moonshot is 1.0x), the kubelet's own probe beside it in the same run; the shim's share at 30/s
  (bench/node_report.py's rows);
- bridge_load: the shim's share, daemon and workers each <= 0.4 ms of CPU per bridged probe at 30 and 300/s;
- scale: the RunProbe path at 250 sandboxes x 3 probes at 1 s <= 25% of one core, 0 late or missed, PSS per
  sandbox <= 0.5 MiB;
- proxy: overhead <= 0.4 ms median for Version, ListPodSandbox and ListContainers with 100 containers, and no
  per-call cost growing with the answer beyond copying its bytes;
- latency: bridged median <= 2.0 ms (exec), first attempt after RunProbe p99 <= 50 ms (spawn).
A row that the suite's general targets (report.evaluate's rows) already have with the same target is taken from
`general` rather than computed twice; the tighter targets are rows of their own (the general rows stay what they
were).
"""

from __future__ import annotations

from bench import node_report, report
from bench.report import Row, measured_row, table

SHIM_SHARE_MS = 0.4
RUN_PROBE_CPU_PERCENT = 25.0
PSS_PER_SANDBOX_MIB = 0.5
PROXY_OVERHEAD_MS = 0.4
BRIDGED_MEDIAN_MS = 2.0
FIRST_ATTEMPT_P99_MS = 50.0
# Forwarding bytes costs a proxy far less than 0.01 ms per KiB (100 MB/s; a memcpy is ~100x faster, a protobuf
# decode and re-encode of the answer is of this order): more than that is a cost per container, not per byte.
COPY_MS_PER_KIB = 0.01
TARGET_SCALE_LATE_ROW = "250 sandboxes x 3 probes at 1 s, pooled workers: late or missed attempts"
SHIM_PARTS = (("daemon_ms_per_call", "daemon"), ("workers_ms_per_call", "workers (zygote, broker, workers)"))
PROXY_METHODS = (("Version", "Version"), ("ListPodSandbox", "ListPodSandbox"),
                 ("ListContainers", "ListContainers with 100 containers"))


def _rate_figures(s: dict, rate: float) -> dict:
    return next(r for r in s["rates"] if r["rate_per_s"] == rate)


def _before_note(s: dict, rate: float, key: str) -> str:
    """The same figure from a shim of another checkout measured in the same windows, when there was one."""
    notes = []
    for name, other in s.get("beside", {}).items():
        value = _rate_figures(other, rate)[key]
        notes.append(f"{name}: {value:.2f} ms")
    return "; ".join(notes)


def bridge_load_rows(s: dict | None, rates: tuple[float, ...] = (30.0, 300.0)) -> list[Row]:
    rows = []
    for rate in rates:
        for key, who in SHIM_PARTS:
            def measure(s: dict, rate=rate, key=key):
                r = _rate_figures(s, rate)
                value = r[key]
                note = "; ".join(x for x in (f"{r['calls']} calls at {r['achieved_per_s']:.0f}/s",
                                             _before_note(s, rate, key)) if x)
                return f"{value:.2f} ms", value <= SHIM_SHARE_MS, note
            rows.append(measured_row(f"bridge_load: {who} CPU per bridged probe at {rate:.0f}/s",
                                     f"<= {SHIM_SHARE_MS} ms", s, measure))

    def answers(s: dict):
        calls = sum(r["calls"] for r in s["rates"])
        bad = sum(sum(r["bad_answers"].values()) for r in s["rates"])
        latency = ", ".join(f"{r['rate_per_s']:.0f}/s median {r['latency_ms']['median']:.2f} ms, "
                            f"p99 {r['latency_ms']['p99']:.2f} ms" for r in s["rates"] if r["latency_ms"])
        return f"{bad} bad of {calls}", bad == 0, f"{s['pods']} pods' busybox httpd {s['path']}; {latency}"
    rows.append(measured_row("bridge_load: every bridged probe answered 200 by the pod (exit code, body)", "all",
                             s, answers))
    return rows


def scale_rows(scale: dict | None, general: dict[str, Row]) -> list[Row]:
    def cpu(s: dict):
        step = s["steps"][-1]
        value = step["cpu_percent"]["shim_total"]
        return f"{value:.1f}%", value <= RUN_PROBE_CPU_PERCENT, report.scale_note(step)

    def pss(s: dict):
        value = s["per_extra_sandbox"]["total_pss_mib"]
        return f"{value:.2f} MiB", value <= PSS_PER_SANDBOX_MIB, "slope of total PSS (daemon, zygote, workers) over N"
    return [
        measured_row("RunProbe path, 250 sandboxes x 3 probes at 1 s: CPU of daemon + broker + workers",
                     f"<= {RUN_PROBE_CPU_PERCENT:.0f}% of one core", scale, cpu),
        general[TARGET_SCALE_LATE_ROW],  # the general row: the same target
        measured_row("RunProbe path: PSS per sandbox", f"<= {PSS_PER_SANDBOX_MIB} MiB", scale, pss),
    ]


def proxy_rows(proxy: dict | None) -> list[Row]:
    rows = []
    for key, what in PROXY_METHODS:
        def overhead(s: dict, key=key):
            value = s[key]["overhead_ms"]["median"]
            size = f"; answer {s[key]['response_bytes']} bytes" if "response_bytes" in s[key] else ""
            return f"{value:.3f} ms", value <= PROXY_OVERHEAD_MS, f"{s['calls_per_path']} calls per path{size}"
        rows.append(measured_row(f"CRI proxy overhead per call, {what} (median)", f"<= {PROXY_OVERHEAD_MS} ms",
                                 proxy, overhead))

    def growth(s: dict):
        g = s["size_growth"]
        small, large = s["ListContainers_10"]["overhead_ms"]["median"], s["ListContainers"]["overhead_ms"]["median"]
        per_kib = g["extra_ms_per_kib"]
        text = f"{g['extra_overhead_ms']:+.3f} ms ({small:.3f} vs {large:.3f} ms)"
        note = (f"answers {g['small_bytes']} vs {g['large_bytes']} bytes"
                + ("" if per_kib is None else f"; {per_kib:.4f} ms per KiB more"))
        return text, per_kib is not None and per_kib <= COPY_MS_PER_KIB, note
    rows.append(measured_row("CRI proxy: ListContainers overhead, 100 vs 10 containers",
                             f"no more than copying (<= {COPY_MS_PER_KIB} ms per KiB)", proxy, growth))
    return rows


def latency_rows(exec_: dict | None, spawn: dict | None) -> list[Row]:
    def bridged(s: dict):
        b = s["paths_ms"]["bridged_exec_sync"]
        return f"{b['median']:.2f} ms", b["median"] <= BRIDGED_MEDIAN_MS, f"p99 {b['p99']:.2f} ms"

    def first_attempt(s: dict):
        a = s["first_attempt_ms"]
        return (f"{a['p99']:.1f} ms", a["p99"] <= FIRST_ATTEMPT_P99_MS,
                f"{s['sandboxes']} new sandboxes; median {a['median']:.1f} ms")
    return [
        report.exec_row("latency: bridged probe (marker ExecSync through the shim), median",
                         f"<= {BRIDGED_MEDIAN_MS} ms", exec_, bridged, paths=("bridged_exec_sync",)),
        measured_row("latency: first attempt after RunProbe on a new sandbox, p99", f"<= {FIRST_ATTEMPT_P99_MS:.0f} ms",
                     spawn, first_attempt),
    ]


def rows(scenarios: dict, general: list[Row]) -> list[Row]:
    """Every node cost target: node, bridge_load, scale, proxy, latency."""
    by_figure = {r.figure: r for r in general}
    return [*node_report.rows(scenarios.get("node")),
            *bridge_load_rows(scenarios.get("bridge_load")),
            *scale_rows(scenarios.get("scale"), by_figure),
            *proxy_rows(scenarios.get("proxy")),
            *latency_rows(scenarios.get("exec"), scenarios.get("spawn"))]


def details(scenarios: dict) -> str:
    """bridge_load's table: per shim and rate, CPU per call, latency, answers."""
    s = scenarios.get("bridge_load") or {}
    if "rates" not in s:
        return ""
    body = []
    for name, shim in [("this code", s), *s.get("beside", {}).items()]:
        for r in shim["rates"]:
            latency = r["latency_ms"] or {}
            bad = ", ".join(f"{n} {what}" for what, n in r["bad_answers"].items()) or "none"
            body.append([name, f"{r['rate_per_s']:.0f}", f"{r['achieved_per_s']:.1f}", r["calls"],
                         f"{r['daemon_ms_per_call']:.3f}", f"{r['workers_ms_per_call']:.3f}",
                         report.fmt(latency.get("median"), ".2f"), report.fmt(latency.get("p99"), ".2f"), bad])
    return (f"bridge_load: marker ExecSyncs (readiness httpGet {s['path']}) through the shim, paced, round robin over "
            f"{s['pods']} pods; CPU ms per call (workers: the daemon's zygote, broker and workers), latency in ms\n"
            + table(["shim", "rate/s", "achieved/s", "calls", "daemon", "workers", "median", "p99", "bad answers"],
                    body))
