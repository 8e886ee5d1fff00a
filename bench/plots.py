"""The suite's PNG plots (matplotlib, Agg: no display needed). Each function takes a
scenario's results and writes one file; a scenario without figures gets no plot."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from bench.stats import cdf  # noqa: E402

LABELS = {"exec_probe": "ExecProbe (shim)", "bridged_exec_sync": "kubelet bridge\nmarker ExecSync (shim)",
          "exec_sync_wget": "CRI ExecSync\nbusybox wget", "nsenter_curl": "nsenter + curl",
          "nsenter_wget": "nsenter +\nbusybox wget"}
COLORS = {"exec_probe": "C2", "bridged_exec_sync": "C1"}  # the shim's paths; the others are C0


def _log_x(ax) -> None:
    """A log x axis labelled in plain numbers (0.1, 0.2, 0.3, 0.5, 1, 2 ...), minor ticks unlabelled."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _finish_steps_axis(ax, ns: list[int], xlabel: str, ylabel: str, title: str) -> None:
    """Labels an axis whose x is the sandboxes of the scale steps, one tick per step; legend last, after every line."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(ns)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scale_cpu(scale: dict, out: Path, strict: dict | None = None) -> Path:
    steps = scale["steps"]
    ns = [s["sandboxes"] for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label, style in (("shim_total", "pooled: daemon + zygote + workers", "o-"), ("workers", "pooled: workers", "s--"),
                              ("daemon", "pooled: daemon", "^--"), ("targets", "target servers (not the shim)", "x:")):
        ax.plot(ns, [s["cpu_percent"][key] for s in steps], style, label=label)
    if strict and strict.get("steps"):
        ax.plot([s["sandboxes"] for s in strict["steps"]], [s["cpu_percent"]["shim_total"] for s in strict["steps"]],
                "o:", color="grey", label="strict (a worker per sandbox): daemon + zygote + workers")
    ax.axhline(30, color="red", lw=1, ls="--")
    ax.annotate("target at N=250: <= 30%", (ns[0], 30), textcoords="offset points", xytext=(0, 4),
                color="red", fontsize=8)
    _finish_steps_axis(ax, ns, "sandboxes (3 probes each, period 1 s)", "CPU, % of one core",
                       "CPU against the number of sandboxes")
    return _save(fig, out / "scale_cpu.png")


def scale_memory(scale: dict, out: Path, strict: dict | None = None) -> Path:
    steps = scale["steps"]
    ns = [s["sandboxes"] for s in steps]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for key, label, style in (("total_pss_mib", "pooled: total PSS (daemon + zygote + workers)", "o-"),
                              ("workers_pss_total_mib", "pooled: workers' PSS", "s--"),
                              ("daemon_rss_mib", "pooled: daemon RSS", "^:"), ("daemon_pss_mib", "pooled: daemon PSS", "v--")):
        ax.plot(ns, [s["memory"][key] for s in steps], style, label=label)
    if strict and strict.get("steps"):
        ax.plot([s["sandboxes"] for s in strict["steps"]], [s["memory"]["total_pss_mib"] for s in strict["steps"]],
                "o:", color="grey", label="strict: total PSS")
    _finish_steps_axis(ax, ns, "sandboxes", "MiB", "memory against the number of sandboxes")
    for mode, data, color in (("pooled", scale, "C0"), ("strict", strict or {}, "grey")):
        per_extra = (data.get("per_extra_sandbox") or {}).get("total_pss_mib")
        if per_extra is not None:
            ax2.bar(mode, per_extra, color=color)
            ax2.annotate(f"{per_extra:.2f}", (mode, per_extra), textcoords="offset points", xytext=(0, 3),
                         ha="center", fontsize=8)
    ax2.axhline(1.0, color="red", lw=1, ls="--", label="target per extra sandbox (pooled): <= 1.0 MiB")
    ax2.set_ylabel("MiB")
    ax2.set_title("total PSS per extra sandbox (slope)")
    ax2.legend(fontsize=8)
    return _save(fig, out / "scale_memory.png")


def latency_cdfs(latency: dict, out: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, kind in zip(axes, ("http", "tcp", "grpc")):
        samples = latency["samples"][kind]
        for who, style in (("engine", "-"), ("floor", "--")):
            xs, ys = cdf(samples[who])
            median = latency[kind][f"{who}_ms"]["median"]
            ax.plot(xs, ys, style, label=f"{who} (median {median:.3f} ms)")
        # Log scale: the bodies (tenths of a ms) and the tails (ms, noise of a shared machine) both show.
        _log_x(ax)
        ax.set_title(f"{kind.upper() if kind != 'grpc' else 'gRPC'}: ratio {latency[kind]['ratio_median']}x (median)")
        ax.set_xlabel("attempt duration, ms (log scale)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("fraction of attempts")
    fig.suptitle(f"one attempt inside the pod netns: engine vs raw-socket floor "
                 f"({latency['attempts_per_kind']} attempts each, same run)", fontsize=10)
    return _save(fig, out / "latency_cdf.png")


def exec_comparison(exec_: dict, out: Path) -> Path:
    paths = exec_["paths_ms"]
    names = list(paths)
    medians = [paths[n]["median"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.9 * len(names) + 1.5))
    bars = ax.barh([LABELS.get(n, n) for n in names], medians, color=[COLORS.get(n, "C0") for n in names])
    _log_x(ax)
    for bar, name, median in zip(bars, names, medians):
        speedup = exec_["speedup_median"].get(name)
        text = f"{median:.2f} ms" + (f"  (ExecProbe {speedup:.1f}x faster)" if speedup else "")
        ax.text(median * 1.08, bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=8)
    low = min(medians)
    engine = (exec_.get("bridge") or {}).get("engine_attempt_ms")
    if engine:  # what every path's wall time is built around
        ax.axvline(engine["median"], color="C3", lw=1, ls=":",
                   label=f"the engine's own attempt, median {engine['median']:.2f} ms")
        ax.legend(fontsize=8, loc="lower right")
        low = min(low, engine["median"])
    ax.set_xlim(low / 2, max(medians) * 8)
    ax.invert_yaxis()
    ax.set_xlabel("median wall time of one HTTP GET in the pod, ms (log scale)")
    ax.set_title(f"ExecProbe and the kubelet bridge vs exec probes\n({exec_['pod']})", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, out / "exec_probe_comparison.png")


def write_all(scenarios: dict, out: Path) -> list[Path]:
    written = []
    scale, latency, exec_ = scenarios.get("scale") or {}, scenarios.get("latency") or {}, scenarios.get("exec") or {}
    if scale.get("steps"):
        strict = scenarios.get("scale_strict") or {}
        written += [scale_cpu(scale, out, strict), scale_memory(scale, out, strict)]
    if latency.get("samples"):
        written.append(latency_cdfs(latency, out))
    if exec_.get("paths_ms"):
        written.append(exec_comparison(exec_, out))
    return written
