"""Reads of many small records spread over many shards: exactly the records asked, in the
order asked, whether a shard's records are planned with Python ints (a few) or NumPy (many),
and the same reads and errors either way."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardfeed.dataset.open_shards as open_shards_module
from shardfeed.dataset import Dataset, ReadOptions
from shardfeed.dataset.reading import GROUP_IN_PYTHON, SMALL_GROUP, plan_reads
from shardfeed.errors import CorruptRecordError
from shardfeed.format.spec import HEADER_BYTES
from shardfeed.format.writer import ShardWriter
from shardfeed.storage import open_source
from shardfeed.storage.base import ByteSource

SHARD_RECORDS = [40, 1, 75, 3, 0, 60, 2, 90, 33, 1]


def _write(folder: Path, seed: int = 0) -> list[bytes]:
    """Shards of small records of random sizes and bytes; the payloads in global order."""
    rng = np.random.default_rng(seed)
    folder.mkdir()
    payloads: list[bytes] = []
    for k, count in enumerate(SHARD_RECORDS):
        with ShardWriter(folder / f"part-{k:03d}.tfrecord") as writer:
            for _ in range(count):
                payload = rng.bytes(int(rng.integers(0, 700)))
                writer.write(payload)
                payloads.append(payload)
    Dataset(folder).close()  # writes the indexes: later opens map them, as packed data
    return payloads


def _index_sets(total: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    firsts = np.cumsum([0, *SHARD_RECORDS])[:-1].tolist()
    sets: list[list[int]] = [
        [],
        [0], [total - 1], [firsts[1]], [firsts[9]],  # single records, one-record shards
        [5, 5], [7, 6, 5, 6, 7],  # duplicates, adjacent records backwards
        list(range(firsts[2], firsts[2] + 75)),  # a whole shard, more than SMALL_GROUP
        list(range(total))[::-1],
        rng.permutation(total)[:32].tolist(),  # a shuffled slice: one or two records a shard
        rng.integers(0, total, 256).tolist(),  # with duplicates
        rng.integers(0, total, GROUP_IN_PYTHON + 500).tolist(),  # grouped by NumPy
        # a big group beside small ones
        list(range(firsts[7], firsts[7] + 50)) + [3, firsts[5] + 2, 3, total - 1],
        [-1, -total, 2],  # negative indices count from the end
    ]
    for n in (2, 3, 5, 9, 33, 64):
        sets.append(rng.integers(0, total, n).tolist())
        start = int(rng.integers(0, total - n))
        sets.append(rng.permutation(np.arange(start, start + n)).tolist())  # adjacent
    return sets


@pytest.mark.parametrize("options", [
    ReadOptions(),
    ReadOptions(coalesce_gap_bytes=0),
    ReadOptions(coalesce_gap_bytes=300, max_read_bytes=1500),
    ReadOptions(max_read_bytes=1),  # every record alone
])
def test_shuffled_small_reads_give_the_records_asked(tmp_path: Path,
                                                     options: ReadOptions) -> None:
    payloads = _write(tmp_path / "ds")
    total = len(payloads)
    with Dataset(tmp_path / "ds", read_options=options) as ds:
        assert len(ds) == total
        for idx in _index_sets(total, seed=1):
            one_by_one = [ds.read_payloads([i])[0] for i in idx]
            assert one_by_one == [payloads[i] for i in idx]
            assert ds.read_payloads(idx) == one_by_one
            assert ds.read_payloads(np.asarray(idx, dtype=np.int64)) == one_by_one
            assert ds.read_payloads(np.asarray(idx, dtype=np.int32)) == one_by_one


def test_index_memory_is_the_offsets_loaded(tmp_path: Path) -> None:
    _write(tmp_path / "ds")
    with Dataset(tmp_path / "ds") as ds:
        before = ds.index_bytes()
        ds.read_payloads(range(len(ds)))
        ds.read_payloads(_index_sets(len(ds), seed=2)[9])
        shards = len(SHARD_RECORDS)
        # n + 1 offsets a shard, then the shard table's counts and starts
        assert ds.index_bytes() == before == 8 * (sum(SHARD_RECORDS) + shards) + 8 * (
            2 * shards + 1)


class _LoggingSource:
    """A shard source that notes the ranges it is asked for."""

    def __init__(self, inner: ByteSource,
                 log: list[tuple[str, int, int]]) -> None:
        self.inner = inner
        self.url = inner.url
        self.log = log

    def size(self) -> int:
        return self.inner.size()

    def read(self, offset: int, length: int) -> bytes:
        self.log.append((os.path.basename(self.url), offset, length))
        return self.inner.read(offset, length)

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read(o, n) for o, n in ranges]

    def close(self) -> None:
        self.inner.close()


def _reference_plan(starts: Sequence[int], ends: Sequence[int], gap: int,
                    cap: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """Records by (offset, position); each joins the last range if it lies inside it, or
    starts at most ``gap`` after it and the range stays within ``cap``."""
    ranges: list[tuple[int, int, list[int]]] = []
    for k in sorted(range(len(starts)), key=lambda k: (starts[k], k)):
        if ranges:
            lo, hi, members = ranges[-1]
            inside = ends[k] <= hi
            if inside or (starts[k] - hi <= gap and max(hi, ends[k]) - lo <= cap):
                ranges[-1] = (lo, max(hi, ends[k]), [*members, k])
                continue
        ranges.append((starts[k], ends[k], [k]))
    return [(lo, hi - lo, tuple(members)) for lo, hi, members in ranges]


def test_reads_issued_are_the_reference_plan(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "ds")
    log: list[tuple[str, int, int]] = []
    monkeypatch.setattr(open_shards_module, "open_source",
                        lambda url, **options: _LoggingSource(open_source(url, **options), log))
    options = ReadOptions(coalesce_gap_bytes=300, max_read_bytes=1500)
    with Dataset(tmp_path / "ds", read_options=options) as ds:
        for idx in _index_sets(len(ds), seed=3)[1:]:
            expected: list[tuple[str, int, int]] = []
            located = [ds.locate(i) for i in idx]
            for name in sorted({os.path.basename(path) for path, _, _ in located}):
                offsets = np.load(tmp_path / "ds" / f"{name}.idx.npy").tolist()
                recs = [rec for path, rec, _ in located if os.path.basename(path) == name]
                plan = _reference_plan([offsets[r] for r in recs],
                                       [offsets[r + 1] for r in recs], 300, 1500)
                expected += [(name, offset, length) for offset, length, _ in plan]
            log.clear()
            ds.read_payloads(idx)
            assert log == expected


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(16, 200), min_size=1, max_size=40),
    picks=st.lists(st.integers(0, 39), max_size=2 * SMALL_GROUP + 10),
    gap=st.integers(0, 500),
    cap=st.integers(1, 3000),
    kind=st.sampled_from(["int64", "uint64", "list"]),
)
def test_plan_reads_is_the_reference(sizes: list[int], picks: list[int], gap: int, cap: int,
                                     kind: str) -> None:
    offsets = np.cumsum([0, *sizes]).tolist()
    recs = [p % len(sizes) for p in picks]
    starts = [offsets[r] for r in recs]
    ends = [offsets[r + 1] for r in recs]
    expected = _reference_plan(starts, ends, gap, cap)
    options = ReadOptions(coalesce_gap_bytes=gap, max_read_bytes=cap)
    if kind == "list":
        plan = plan_reads(starts, ends, options)
    else:
        plan = plan_reads(np.asarray(starts, dtype=kind), np.asarray(ends, dtype=kind), options)
    assert [(r.offset, r.length, r.members) for r in plan] == expected
    assert all(type(v) is int for r in plan for v in (r.offset, r.length, *r.members))


def _damage(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("where", "match"), [
    ("payload", "bad data CRC"), ("header", "bad length CRC"), ("cut", "truncated"),
])
def test_damage_is_named_alike_in_small_and_large_reads(tmp_path: Path, where: str,
                                                         match: str) -> None:
    _write(tmp_path / "ds")
    shard = tmp_path / "ds" / "part-007.tfrecord"  # 90 records, from record 215 on
    first = sum(SHARD_RECORDS[:7])
    with Dataset(tmp_path / "ds") as ds:
        ds.read_payloads(range(len(ds)))  # every index loaded before the damage
        offsets = np.load(f"{shard}.idx.npy").tolist()
        if where == "payload":
            _damage(shard, offsets[89] + HEADER_BYTES)
        elif where == "header":
            _damage(shard, offsets[89] + 2)
        else:
            shard.write_bytes(shard.read_bytes()[:-3])
        asked = [
            [first + 89],  # alone
            [first + 88, 3, first + 89],  # with its neighbour
            list(range(first, first + 90)),  # in a group NumPy plans
            [*range(len(ds))] * 2,  # grouped by NumPy
        ]
        messages = []
        for idx in asked:
            with pytest.raises(CorruptRecordError, match=match) as info:
                ds.read_payloads(idx)
            err = info.value
            assert (err.path, err.record, err.offset) == (str(shard), 89, offsets[89])
            messages.append(str(err))
        assert f"'{shard}', record 89 at byte {offsets[89]}: " in messages[0]
        assert len(set(messages)) == 1
