"""The daemon's one directory of pod sandboxes: how each is resolved, who it is, and whether the kubelet stopped it.

One instance, made by the daemon and given to the registry, the kubelet bridge and the results manager, so that
each fact about a sandbox has one holder:
- resolution: the source's (`resolve`, for RunProbe and a resume: always asked afresh), or the remembered one
  (`resolve_cached`, ExecProbe's and the bridge's hot path: no CRI call per attempt, see cache.py); dropped when
  the CRI proxy sees the sandbox stop or go (`sandbox_stopping`);
- identity (`note`, `identity`, `known`): the pod's name, namespace and uid that label spans and metrics, for the
  sandboxes the daemon probes;
- the stopped set: sandboxes the kubelet stopped. A CRI sandbox never runs again, so their workers are never
  resumed; the mark goes with the sandbox's removal (`forget`);
- the sandboxes refused for sharing the node's network namespace (hostNetwork), as last asked about, so that
  `probectl pods` can say "host network" (a bounded set: any caller may name any sandbox).
"""

from __future__ import annotations

from collections import OrderedDict

from shim.sandboxes.cache import ResolvedSandboxes
from shim.sandboxes.resolver import HostNetworkSandbox, SandboxInfo, SandboxSource

HOST_NETWORK_REMEMBERED = 1024


class SandboxDirectory:
    """Create it inside the event loop that calls it (the cache watches sandbox processes on that loop)."""

    def __init__(self, source: SandboxSource, cache: ResolvedSandboxes | None = None) -> None:
        self._source = source
        self._cache = cache if cache is not None else ResolvedSandboxes(source)
        self._identities: dict[str, SandboxInfo] = {}
        self._stopped: set[str] = set()
        self._host_network: OrderedDict[str, None] = OrderedDict()

    # --- resolution ---------------------------------------------------------------------------------------------

    async def resolve(self, sandbox_id: str) -> SandboxInfo:
        """The runtime's answer now (SandboxNotFound, SandboxNotReady and RuntimeUnavailable propagate)."""
        try:
            return await self._source.resolve(sandbox_id)
        except HostNetworkSandbox:
            self._refused_host_network(sandbox_id)
            raise

    async def resolve_cached(self, sandbox_id: str) -> SandboxInfo:
        """As `resolve`, answered from memory while the sandbox provably lives (cache.py)."""
        try:
            return await self._cache.resolve(sandbox_id)
        except HostNetworkSandbox:
            self._refused_host_network(sandbox_id)
            raise

    def host_network(self) -> list[str]:
        """The sandboxes refused for being in the node's network namespace, as far as remembered."""
        return list(self._host_network)

    def _refused_host_network(self, sandbox_id: str) -> None:
        self._host_network[sandbox_id] = None
        self._host_network.move_to_end(sandbox_id)
        if len(self._host_network) > HOST_NETWORK_REMEMBERED:
            self._host_network.popitem(last=False)

    async def list(self) -> list[SandboxInfo]:
        return await self._source.list()

    async def gone(self, running: dict[str, int]) -> dict[str, str]:
        return await self._source.gone(running)

    # --- identity -------------------------------------------------------------------------------------------------

    def note(self, sandbox: SandboxInfo) -> None:
        """A sandbox the daemon probes in: its identity labels what its probes produce."""
        self._identities[sandbox.id] = sandbox

    def identity(self, sandbox_id: str) -> SandboxInfo | None:
        return self._identities.get(sandbox_id)

    def known(self) -> dict[str, SandboxInfo]:
        return dict(self._identities)

    # --- sandbox life ---------------------------------------------------------------------------------------------

    def sandbox_stopping(self, sandbox_id: str, removed: bool) -> None:
        """The CRI proxy saw StopPodSandbox (removed=False: marked stopped) or RemovePodSandbox: no remembered
        resolution answers for it any more."""
        self._cache.forget(sandbox_id)
        if not removed:
            self._stopped.add(sandbox_id)

    def is_stopped(self, sandbox_id: str) -> bool:
        return sandbox_id in self._stopped

    def remembered(self) -> set[str]:
        """Every sandbox this directory holds something about (an identity or the stopped mark)."""
        return set(self._identities) | self._stopped

    def forget(self, sandbox_id: str) -> None:
        """Nothing left to remember about the sandbox (it has no probes, or it is gone)."""
        self._identities.pop(sandbox_id, None)
        self._stopped.discard(sandbox_id)
        self._host_network.pop(sandbox_id, None)

    def close(self) -> None:
        self._cache.close()
