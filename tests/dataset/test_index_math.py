"""Properties of the pure index math: global record -> shard lookup and read planning."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.dataset.reading import ReadOptions, plan_reads
from shardfeed.dataset.shards import ShardTable


def _table(counts: list[int]) -> ShardTable:
    offsets = [np.arange(c + 1, dtype=np.uint64) * 10 for c in counts]
    return ShardTable([f"s{k}" for k in range(len(counts))], counts, offsets, lambda k: offsets[k])


@settings(max_examples=200)
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=12))
def test_every_record_maps_to_its_shard(counts: list[int]) -> None:
    table = _table(counts)
    brute = [(k, r) for k, c in enumerate(counts) for r in range(c)]
    assert len(table) == len(brute)
    if not brute:
        return
    shard, local = table.shard_of(np.arange(len(brute)))
    assert list(zip(shard.tolist(), local.tolist())) == brute


def test_lazy_offsets_load_once() -> None:
    calls: list[int] = []

    def load(k: int) -> np.ndarray:
        calls.append(k)
        return np.arange(4, dtype=np.uint64)

    table = ShardTable(["a", "b"], [3, 3], [None, None], load)
    assert table.index_bytes() == 2 * 8 + 3 * 8  # counts + starts, nothing loaded yet
    table.offsets(1)
    table.offsets(1)
    assert calls == [1]


ranges = st.lists(
    st.tuples(st.integers(0, 50), st.integers(1, 30)), min_size=0, max_size=40
)


@settings(max_examples=300)
@given(
    sizes=st.lists(st.integers(16, 200), min_size=1, max_size=40),
    picks=st.lists(st.integers(0, 39), max_size=60),
    gap=st.integers(0, 500),
    cap=st.integers(1, 3000),
)
def test_plan_reads_covers_each_record_once(
    sizes: list[int], picks: list[int], gap: int, cap: int
) -> None:
    offsets = np.cumsum([0, *sizes])
    recs = np.array([p % len(sizes) for p in picks], dtype=np.int64)
    starts, ends = offsets[recs], offsets[recs + 1]
    plan = plan_reads(starts, ends, ReadOptions(coalesce_gap_bytes=gap, max_read_bytes=cap))
    members = sorted(m for r in plan for m in r.members)
    assert members == list(range(len(recs)))
    for r in plan:
        for m in r.members:  # each record lies inside its range
            assert r.offset <= starts[m] and ends[m] <= r.offset + r.length
        if len(set(starts[list(r.members)].tolist())) > 1:
            assert r.length <= cap  # only a single record may exceed the cap
    for a, b in itertools.pairwise(plan):  # ranges are sorted and do not overlap
        assert a.offset + a.length <= b.offset
