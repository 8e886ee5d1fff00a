"""How big and how long each scenario runs in the quick and full modes."""

from __future__ import annotations

from dataclasses import dataclass

from bench.admission import AdmissionParams
from bench.bridge_load import BridgeLoadParams
from bench.node import NodeParams
from bench.pod_creation import PodCreationParams
from bench.restart import RestartParams
from bench.scale import ScaleParams


@dataclass(frozen=True)
class Mode:
    name: str
    scale: ScaleParams
    latency_count: int        # attempts per kind, engine and floor each
    latency_block: int        # the warm floor loop's attempts per request
    latency_warmup: int
    exec_count: int           # calls per path, interleaved
    exec_warmup: int
    spawn_sandboxes: int
    proxy_count: int          # calls per CRI method and path
    proxy_warmup: int
    bridge_load: BridgeLoadParams
    pressure_s: float
    pressure_warmup_s: float
    restart: RestartParams
    node: NodeParams
    admission: AdmissionParams
    pod_creation: PodCreationParams


QUICK = Mode(
    name="quick",  # under 2 minutes on a 2-core machine
    scale=ScaleParams(sandbox_counts=(10, 50), warmup_s=2.0, window_s=10.0, punctuality_s=5.0),
    latency_count=100, latency_block=50, latency_warmup=10,
    exec_count=20, exec_warmup=3,
    spawn_sandboxes=20,
    proxy_count=200, proxy_warmup=20,
    bridge_load=BridgeLoadParams(rates=(30.0, 300.0), window_s=8.0),
    pressure_s=10.0, pressure_warmup_s=2.0,
    restart=RestartParams(sandboxes=20, warmup_s=3.0, steady_s=10.0, settle_s=5.0),
    node=NodeParams(pods=10, warmup_s=3.0, window_s=10.0, restart_settle_s=5.0),
    admission=AdmissionParams(rate=200, window_s=10.0),
    pod_creation=PodCreationParams(pods=10),
)

FULL = Mode(
    name="full",  # the reference run: every figure at the size its target is for
    scale=ScaleParams(sandbox_counts=(10, 50, 100, 250), warmup_s=5.0, window_s=30.0, punctuality_s=15.0),
    latency_count=500, latency_block=50, latency_warmup=20,
    exec_count=200, exec_warmup=10,
    spawn_sandboxes=100,
    proxy_count=1000, proxy_warmup=200,
    bridge_load=BridgeLoadParams(rates=(30.0, 300.0), window_s=30.0, rounds=3),
    pressure_s=60.0, pressure_warmup_s=3.0,
    restart=RestartParams(sandboxes=250, warmup_s=5.0, steady_s=60.0, settle_s=30.0),
    node=NodeParams(pods=30, warmup_s=5.0, window_s=30.0),
    admission=AdmissionParams(rate=200, window_s=30.0),
    pod_creation=PodCreationParams(pods=30),
)

MODES = {m.name: m for m in (QUICK, FULL)}
