"""The "node" scenario's rows and table (bench/node.py): a probe's cost to the node under a real kubelet (pure).

The targets are bench/node_cost.py's, shown beside the figures so that the run that first measured them and
every later one read alike: a bridged probe costs the node no more than 1.5x the kubelet's own httpGet, and the
shim's share of it (daemon and workers) at most 0.4 ms each; and the delegating kubelet's (kubelet/: the kubelet
hands its probes to the shim): a delegated probe costs the node no more than the kubelet's own httpGet, moonshot
half of it.
"""

from __future__ import annotations

from bench.node import PHASES, PROBED
from bench.report import Row, measured_row, table

NATIVE_RATIO_TARGET = 1.5        # bridged node CPU per probe / the kubelet's own httpGet's
NATIVE_RATIO_MOONSHOT = 1.0      # moving probes into the pod costs the node nothing
SHIM_SHARE_TARGET_MS = 0.4       # the daemon's, and the workers', CPU per bridged probe
DELEGATED_RATIO_TARGET = 1.0     # delegated node CPU per probe / the kubelet's own httpGet's
DELEGATED_RATIO_MOONSHOT = 0.5   # the kubelet does nothing per probe, the daemon nothing per unchanged result
ROLE_TITLES = {"node": "node", "kubelet": "kubelet", "containerd": "containerd + runc shims",
               "shim_daemon": "shim daemon", "shim_workers": "shim zygote + workers"}


def rows(node: dict | None) -> list[Row]:
    def healthy(s: dict):
        phases = {name: p for name, p in s["phases"].items() if "skipped" not in p}
        flips = sum(p["readiness_changes"] for p in phases.values())
        restarts = sum(p["restarts"] for p in phases.values())
        not_ready = sum(p["not_ready_at_end"] for p in phases.values())
        failed = sum(p["probe_results"].get("failed", 0) for p in phases.values())
        note = f"{s['pods']} pods per phase; {failed} probes failed over the windows"
        return (f"{not_ready} not Ready, {flips} flips, {restarts} restarts", not (flips or restarts or not_ready),
                note)

    def bridged_vs_native(s: dict):
        native = s["phases"]["native"]["per_probe_ms"]["node"]
        bridged = s["phases"]["bridged"]["per_probe_ms"]["node"]
        exec_ = s["phases"]["exec"]["per_probe_ms"]["node"]
        context = f"classic exec probe {exec_:.1f} ms; {s['phases']['bridged']['probes_per_s']:.0f} probes/s"
        if native <= 0:  # the node was busier without probes than with the kubelet's own: noise, not a figure
            return ("no ratio", None, f"bridged {bridged:.2f} vs {native:.2f} ms: the kubelet's own probe measured "
                                      f"no cost above no probes (a busy machine); {context}")
        ratio = bridged / native
        moonshot = "met" if ratio <= NATIVE_RATIO_MOONSHOT else "NOT met"
        return (f"{ratio:.1f}x ({bridged:.2f} vs {native:.2f} ms)", ratio <= NATIVE_RATIO_TARGET,
                f"moonshot {NATIVE_RATIO_MOONSHOT}x {moonshot}; {context}")

    def native(s: dict):
        phase = s["phases"]["native"]
        per_probe = phase["per_probe_ms"]
        return (f"{per_probe['node']:.2f} ms", None,
                f"kubelet {per_probe['kubelet']:.2f} ms; {phase['probes_per_s']:.0f} probes/s")

    def shim_share(s: dict):
        per_probe = s["phases"]["bridged"]["per_probe_ms"]
        daemon, workers = per_probe["shim_daemon"], per_probe["shim_workers"]
        return (f"daemon {daemon:.2f} ms, workers {workers:.2f} ms",
                daemon <= SHIM_SHARE_TARGET_MS and workers <= SHIM_SHARE_TARGET_MS,
                f"at {s['phases']['bridged']['probes_per_s']:.0f} bridged probes/s")

    def delegated_vs_native(s: dict):
        phase = s["phases"]["delegated"]
        if "skipped" in phase:
            return ("skipped", None, phase["skipped"])
        native = s["phases"]["native"]["per_probe_ms"]["node"]
        per_probe = phase["per_probe_ms"]
        context = (f"kubelet {per_probe['kubelet']:.2f} ms, shim daemon {per_probe['shim_daemon']:.2f} ms, workers "
                   f"{per_probe['shim_workers']:.2f} ms; {phase['probes_per_s']:.0f} probes/s")
        if native <= 0:
            return ("no ratio", None, f"delegated {per_probe['node']:.2f} vs {native:.2f} ms: the kubelet's own "
                                      f"probe measured no cost above no probes (a busy machine); {context}")
        ratio = per_probe["node"] / native
        moonshot = "met" if ratio <= DELEGATED_RATIO_MOONSHOT else "NOT met"
        return (f"{ratio:.2f}x ({per_probe['node']:.2f} vs {native:.2f} ms)", ratio <= DELEGATED_RATIO_TARGET,
                f"moonshot {DELEGATED_RATIO_MOONSHOT}x {moonshot}; {context}")

    return [
        measured_row("node (real kubelet): every pod Ready, no flip, no restart, every phase", "0, 0, 0", node,
                     healthy),
        measured_row("node: node CPU per probe of the kubelet's own httpGet (the reference, same run)", "(none)",
                     node, native),
        measured_row("node: node CPU per bridged probe vs the kubelet's own httpGet", "<= 1.5x", node,
                     bridged_vs_native),
        measured_row("node: the shim's CPU per bridged probe", "<= 0.4 ms each", node, shim_share),
        measured_row("node: node CPU per delegated probe (the kubelet's CRIProbeDelegation) vs its own httpGet",
                     "<= 1.0x", node, delegated_vs_native),
    ]


def details(node: dict | None) -> str:
    if not node or "phases" not in node:
        return ""
    phases = node["phases"]
    header = ["phase", "probes/s", "results", "Ready in", *ROLE_TITLES.values()]
    body = []
    for name in PHASES:
        p = phases.get(name, {"skipped": "not run"})
        if "skipped" in p:
            body.append([name, "-", f"skipped: {p['skipped']}", "-", *["-" for _ in ROLE_TITLES]])
            continue
        per_probe = p.get("per_probe_ms", {})
        results = ", ".join(f"{n} {r}" for r, n in p["probe_results"].items()) or "-"
        cells = [f"{p['cpu_ms_per_s'][r]:.1f}" + (f" ({per_probe[r]:.2f})" if per_probe.get(r) is not None else "")
                 for r in ROLE_TITLES]
        body.append([name, f"{p['probes_per_s']:.1f}", results, f"{p['ready_s']:.1f} s", *cells])
    probed = ", ".join(PROBED)
    # Results recorded before the runtime was named ran on Debian's containerd 1.6.
    runtime = node.get("containerd", "1.6")
    build = node.get("kubelet_build", "released")
    return (f"node: {node['pods']} static pods under a real kubelet {node['kubelet']} ({build}) on containerd "
            f"{runtime}, one "
            "readiness probe each at "
            f"{node['period_s']} s: CPU ms per second over each phase's window (in brackets: ms per probe above the "
            f"'none' phase, for {probed})\n" + table(header, body))
