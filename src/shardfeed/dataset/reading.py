"""Read planning: turn a set of records of one shard into few, large byte-range reads.

::

    records asked   :   [r7]      [r2][r3]          [r9]
    file            :  |--r2--|--r3--|--r4--|--r5--|--r6--|--r7--|--r8--|--r9--|
    sorted by offset:  r2 r3 (adjacent: one range) ... r7 (gap <= gap_bytes: joined) r9

Records are sorted by offset; neighbours whose gap is at most ``coalesce_gap_bytes`` join
one range, as long as the range stays within ``max_read_bytes``. :func:`read_payloads`
slices each record out of its range, checks its framing (and data CRC), and returns the
payloads in the order they were asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar

import numpy as np

from shardfeed.dataset.shards import RERUN_HINT, ShardTable
from shardfeed.errors import CorruptRecordError, location
from shardfeed.format.framing import unframe_bytes

T = TypeVar("T")
R = TypeVar("R")


@dataclass(kw_only=True, frozen=True, slots=True)
class ReadOptions:
    """How :class:`~shardfeed.dataset.Dataset` groups reads.

    ``coalesce_gap_bytes``: records at most this far apart in a shard are read as one range
    (the bytes between are read and dropped). ``max_read_bytes``: a coalesced range stops
    growing past this size (one record larger than it is still read whole). 1 MiB keeps
    a range in the CPU cache while its records are checked and parsed (measured faster than
    16 MiB ranges); remote sources merge ranges again into their own requests.
    """

    coalesce_gap_bytes: int = 64 << 10
    max_read_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not isinstance(self.coalesce_gap_bytes, int) or self.coalesce_gap_bytes < 0:
            raise ValueError(
                f"coalesce_gap_bytes must be an int >= 0, got {self.coalesce_gap_bytes!r}"
            )
        if not isinstance(self.max_read_bytes, int) or self.max_read_bytes < 1:
            raise ValueError(f"max_read_bytes must be an int >= 1, got {self.max_read_bytes!r}")


@dataclass(frozen=True, slots=True)
class ReadRange:
    """One read: ``length`` bytes from ``offset``; ``members`` index the planned records."""

    offset: int
    length: int
    members: tuple[int, ...]


def plan_reads(starts: np.ndarray, ends: np.ndarray, options: ReadOptions) -> list[ReadRange]:
    """Group records ``[starts[k], ends[k])`` of one shard into coalesced ranges.

    Every k appears in exactly one range's ``members``; duplicates share one read.
    Deterministic: depends on the offsets and options only.
    """
    n = len(starts)
    if n == 0:
        return []
    order = np.argsort(starts, kind="stable")
    s = starts[order].tolist()
    e = ends[order].tolist()
    ids = order.tolist()
    gap = options.coalesce_gap_bytes
    cap = options.max_read_bytes
    out: list[ReadRange] = []
    lo, hi = s[0], e[0]
    members = [ids[0]]
    for k in range(1, n):
        sk, ek = s[k], e[k]
        new_hi = max(hi, ek)
        # a record inside the range so far (a duplicate) always joins: it costs nothing
        if ek <= hi or (sk - hi <= gap and new_hi - lo <= cap):
            hi = new_hi
            members.append(ids[k])
        else:
            out.append(ReadRange(lo, hi - lo, tuple(members)))
            lo, hi = sk, ek
            members = [ids[k]]
    out.append(ReadRange(lo, hi - lo, tuple(members)))
    return out


ReadRanges = Callable[[int, Sequence[tuple[int, int]]], list[bytes]]
"""``read(shard, [(offset, length), ...]) -> [bytes, ...]``."""


class RunAll(Protocol):
    """``run_all(fn, items) -> [fn(x) for x in items]``, possibly at the same time."""

    def __call__(self, fn: Callable[[T], R], items: Sequence[T], /) -> list[R]: ...


class _ShardRead(NamedTuple):
    """The planned reads of one shard: positions in the output, records, byte ranges.
    (A tuple: built once a shard per read, where a frozen dataclass costs measurably.)"""

    shard: int
    group: list[int]
    recs: list[int]
    starts: list[int]
    ends: list[int]
    ranges: list[ReadRange]


def read_payloads(
    table: ShardTable, idx: np.ndarray, *, read: ReadRanges, options: ReadOptions,
    verify: bool, run_all: RunAll | None = None,
) -> list[bytes]:
    """The payloads of global records ``idx`` (bounds-checked), in that order: grouped by
    shard, each shard's records read as coalesced ranges by ``read(shard, ranges)``.

    Without ``run_all`` the shards are read one after another, each checked right after
    its read (while its bytes are in the CPU cache); with it, all shards' reads go to
    ``run_all`` at once and are checked when all have returned.
    """
    out: list[bytes | None] = [None] * len(idx)
    if len(idx) == 0:
        return []
    shard, local = table.shard_of(idx)
    order = np.argsort(shard, kind="stable")
    cuts = np.flatnonzero(np.diff(shard[order])) + 1
    groups = [(int(shard[g[0]]), g) for g in np.split(order, cuts)]

    def fetch(item: tuple[int, np.ndarray]) -> tuple[_ShardRead, list[bytes]]:
        k, group_arr = item
        plan = _plan(table, k, group_arr, local[group_arr], options)
        return plan, read(k, [(r.offset, r.length) for r in plan.ranges])

    if run_all is None or len(groups) < 2:
        urls = table.urls
        for k, group_arr in groups:  # fetch() inlined: the local path is call-bound
            plan = _plan(table, k, group_arr, local[group_arr], options)
            blobs = read(k, [(r.offset, r.length) for r in plan.ranges])
            _unframe(urls[k], plan, blobs, out, verify)
    else:  # index loads, size checks and reads of all shards at once
        for plan, blobs in run_all(fetch, groups):
            _unframe(table.urls[plan.shard], plan, blobs, out, verify)
    return [v for v in out if v is not None]


def _plan(table: ShardTable, k: int, group_arr: np.ndarray, recs_arr: np.ndarray,
          options: ReadOptions) -> _ShardRead:
    offsets = table.offsets(k)
    starts_arr = np.asarray(offsets[recs_arr], dtype=np.int64)
    ends_arr = np.asarray(offsets[recs_arr + 1], dtype=np.int64)
    return _ShardRead(k, group_arr.tolist(), recs_arr.tolist(), starts_arr.tolist(),
                      ends_arr.tolist(), plan_reads(starts_arr, ends_arr, options))


def _unframe(url: str, plan: _ShardRead, blobs: list[bytes], out: list[bytes | None],
             verify: bool) -> None:
    """Slice each record of ``plan`` out of its range, check it, store it at its position."""
    _, group, recs, starts, ends, ranges = plan
    for rng, blob in zip(ranges, blobs):
        view = memoryview(blob)
        for m in rng.members:
            a, b = starts[m] - rng.offset, ends[m] - rng.offset
            if b > len(view):
                raise CorruptRecordError(
                    f"{location(url, recs[m], starts[m])}: truncated, the file ends "
                    f"before the record's {b - a} bytes; the shard changed after "
                    f"indexing: {RERUN_HINT}",
                    path=url, record=recs[m], offset=starts[m],
                )
            out[group[m]] = unframe_bytes(
                blob if (a == 0 and b == len(blob)) else view[a:b],
                path=url, record=recs[m], offset=starts[m], verify=verify)
