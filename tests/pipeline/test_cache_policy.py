"""The cache policy: the disk cache makes the replay's decisions; the replay beats LRU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardfeed.pipeline.cache_policy import Access, replay_lru, replay_optimal
from shardfeed.storage.disk_cache import UNKNOWN_USE, DiskCache


def trace(seed: int, *, records: int, chunks: int, per_chunk: int,
          sizes: tuple[int, int]) -> list[Access]:
    """Chunks of distinct records drawn at random; next uses are the true next chunks."""
    rng = np.random.default_rng(seed)
    size_of = rng.integers(sizes[0], sizes[1] + 1, size=records)
    picks = [rng.choice(records, size=per_chunk, replace=False) for _ in range(chunks)]
    out = []
    for c, ids in enumerate(picks):
        nxt = []
        for r in ids.tolist():
            later = [d for d in range(c + 1, chunks) if r in set(picks[d].tolist())]
            nxt.append(10 * later[0] if later else UNKNOWN_USE)
        out.append(Access(ids.astype(np.int64), size_of[ids], np.asarray(nxt, np.int64), 10 * c))
    return out


def run_cache(seq: list[Access], capacity: int, folder: Path) -> int:
    """The accesses through a DiskCache, as a look-ahead session makes them."""
    cache = DiskCache(folder, max_bytes=capacity)
    for access in seq:
        keys = [f"k{r}" for r in access.ids.tolist()]
        got = cache.get_many(keys, next_use=access.next_use.tolist())
        misses = [j for j, v in enumerate(got) if v is None]
        kept = cache.reserve([(keys[j], "s3://b/x", int(access.sizes[j]),
                               int(access.next_use[j])) for j in misses], now=access.now)
        for j, ok in zip(misses, kept):
            if ok:
                cache.fill(keys[j], b"x" * int(access.sizes[j]))
        assert cache.summary().bytes <= capacity
    return cache.counters.hits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_disk_cache_makes_the_replayed_decisions(seed: int, tmp_path: Path) -> None:
    seq = trace(seed, records=120, chunks=40, per_chunk=12, sizes=(50, 150))
    capacity = 3000
    assert run_cache(seq, capacity, tmp_path) == replay_optimal(seq, capacity).hits


@pytest.mark.parametrize("seed", range(5))
def test_knowing_the_future_beats_lru(seed: int) -> None:
    seq = trace(seed, records=200, chunks=60, per_chunk=20, sizes=(100, 100))
    for capacity in (2000, 5000, 10000):
        optimal, lru = replay_optimal(seq, capacity), replay_lru(seq, capacity)
        assert optimal.accesses == lru.accesses == 1200
        assert optimal.hits >= lru.hits


def test_a_cache_as_large_as_the_data_misses_each_record_once() -> None:
    seq = trace(7, records=50, chunks=30, per_chunk=10, sizes=(10, 90))
    seen = len({r for a in seq for r in a.ids.tolist()})
    for replay in (replay_optimal, replay_lru):
        rate = replay(seq, 50 * 90)
        assert rate.accesses - rate.hits == seen
