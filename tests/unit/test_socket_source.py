"""The worker's socket pools (probe_worker/socket_source.py): the pure part. The pools with a real broker are
tests/system/test_pooled_worker.py's."""

from __future__ import annotations

from probe_worker.socket_source import BATCH, MAX_BATCH, MIN_BATCH, next_batch


def test_a_pools_batch_follows_its_use():
    assert next_batch(None, 0.0) == BATCH  # a sandbox's first
    assert [next_batch(8, 1.0), next_batch(16, 1.0)] == [16, MAX_BATCH]  # drained fast: larger, up to the bound
    assert next_batch(8, 10.0) == 8  # lasting between FAST_S and SLOW_S: kept
    assert [next_batch(16, 60.0), next_batch(4, 60.0)] == [8, MIN_BATCH]  # idle: smaller, down to the floor
