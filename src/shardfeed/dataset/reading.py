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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from shardfeed.dataset.data_source import Into
from shardfeed.dataset.shards import RERUN_HINT, ShardTable
from shardfeed.errors import CorruptRecordError, location
from shardfeed.format import native
from shardfeed.format.columns import compiled_columns
from shardfeed.format.framing import unframe_bytes_at

T = TypeVar("T")
R = TypeVar("R")


@dataclass(kw_only=True, frozen=True, slots=True)
class ReadOptions:
    """How :class:`~shardfeed.dataset.Dataset` groups reads.

    ``coalesce_gap_bytes``: records at most this far apart in a shard are read as one range
    (the bytes between are read and dropped). ``max_read_bytes``: a coalesced range stops
    growing past this size (one record larger than it is still read whole). 1 MiB keeps
    a range in the CPU cache while its records are checked and parsed (measured faster than
    16 MiB ranges); remote sources merge ranges again into their own requests. 16 KiB of
    gap: on local files a second read costs less than copying more of the gap (measured on
    shuffled batches of 1 KB to 4 KB records: 64 KiB read 2.4× slower on 4 KB records).
    """

    coalesce_gap_bytes: int = 16 << 10
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


SMALL_GROUP = 32
"""Records of one shard up to which a read is planned with Python ints rather than NumPy:
on a few records NumPy's fixed cost a call (fancy indexing, argsort, ``tolist``) is most of
the work; the plan is the same either way."""

_Range = tuple[int, int, tuple[int, ...]]
"""(offset, length, members): a :class:`ReadRange` as a plain tuple, cheaper to build."""


def plan_reads(starts: np.ndarray | Sequence[int], ends: np.ndarray | Sequence[int],
               options: ReadOptions) -> list[ReadRange]:
    """Group records ``[starts[k], ends[k])`` of one shard into coalesced ranges.

    Every k appears in exactly one range's ``members``; duplicates share one read.
    Deterministic: depends on the offsets and options only.
    """
    return [ReadRange(o, n, m) for o, n, m in _coalesce(starts, ends, options)]


def _coalesce(starts: np.ndarray | Sequence[int], ends: np.ndarray | Sequence[int],
              options: ReadOptions) -> list[_Range]:
    """:func:`plan_reads` as tuples: records in (offset, position) order, joined greedily."""
    n = len(starts)
    if n == 0:
        return []
    records: Iterator[tuple[int, int, int]]  # (start, position, end)
    if n > SMALL_GROUP and isinstance(starts, np.ndarray):
        order = np.argsort(starts, kind="stable")
        records = zip(starts[order].tolist(), order.tolist(), np.asarray(ends)[order].tolist())
    else:
        if isinstance(starts, np.ndarray):
            starts = starts.tolist()
        if isinstance(ends, np.ndarray):
            ends = ends.tolist()
        # positions are unique, so ends are never compared and equal starts keep their
        # order: the same order as the stable argsort above
        records = iter(sorted(zip(starts, range(n), ends)))
    gap = options.coalesce_gap_bytes
    cap = options.max_read_bytes
    out: list[_Range] = []
    lo, first, hi = next(records)
    members = [first]
    for sk, m, ek in records:
        # a record inside the range so far (a duplicate) always joins: it costs nothing
        if ek <= hi:
            members.append(m)
        elif sk - hi <= gap and ek - lo <= cap:
            hi = ek
            members.append(m)
        else:
            out.append((lo, hi - lo, tuple(members)))
            lo, hi = sk, ek
            members = [m]
    out.append((lo, hi - lo, tuple(members)))
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
    ranges: list[_Range]


_Group = tuple[int, list[int] | np.ndarray, list[int] | np.ndarray]
"""(shard, positions in the output, records in the shard) of the records asked of a shard."""

GATHER_FROM = 1
"""Records asked from which ``gather`` is tried: every read of mapped local shards. One record
alone, on 2 cores: a 945 KB one 127 µs against 1,013 by a read of its range (whose copy and
CRC hold the GIL), a 700 B one 8.6 against 15.8."""

GROUP_IN_PYTHON = 1024
"""Records asked up to which they are grouped by shard with Python ints, not NumPy's
argsort and split (whose fixed costs a group dominate when the groups are small)."""


class Gather(Protocol):
    """``gather(shard, local, verify) -> payloads | None``: records ``local[i]`` of shards
    ``shard[i]`` in one call, or None to have them read by ranges (see
    ``OpenShards.gather``). It does not check that the shards' files are still those opened:
    its caller does, after the read (``Dataset._read_shards``), as for every read."""

    def __call__(self, shard: np.ndarray, local: np.ndarray, verify: bool, /
                 ) -> list[bytes] | None: ...


class GatherColumns(Protocol):
    """``OpenShards.gather_columns``: :class:`Gather`'s arguments, then the feature names
    (bytes), how many features every record holds (-1: any that include them) and one fill
    (or None) a name; the gathered columns, or None."""

    def __call__(self, shard: np.ndarray, local: np.ndarray, verify: bool,
                 keys: tuple[bytes, ...], count: int, fills: tuple[np.ndarray | None, ...], /
                 ) -> list[Any] | None: ...


def read_gathered(table: ShardTable, idx: np.ndarray, gather_columns: GatherColumns, *,
                  verify: bool, names: Sequence[str], exact: bool, into: Into | None,
                  ) -> dict[str, Any] | None:
    """The records ``idx`` as columns of features ``names`` (``exact``: the records hold
    these and no other) in one compiled pass over the mapped shards, features ``into`` asks
    for copied into its rows; None where a record is not accepted (read them by
    :func:`read_payloads`, which names a fault)."""
    try:
        keys = tuple(name.encode() for name in names)
    except UnicodeEncodeError:
        return None
    asked = into(names) if into is not None else {}
    fills = {name: rows for name, rows in asked.items() if _fill_fits(rows, len(idx))}
    got = gather_columns(*table.shard_of(idx), verify, keys,
                         len(names) if exact else -1, tuple(fills.get(n) for n in names))
    return None if got is None else compiled_columns(names, got, len(idx), fills)


def _fill_fits(rows: object, count: int) -> bool:
    """Whether ``rows`` can take one value a record: a writable C-ordered 2-D uint8 array
    of ``count`` rows of at least one byte."""
    return (isinstance(rows, np.ndarray) and rows.ndim == 2 and rows.dtype == np.uint8
            and rows.flags.c_contiguous and rows.flags.writeable and len(rows) == count
            and rows.shape[1] > 0)


def read_payloads(
    table: ShardTable, idx: np.ndarray, *, read: ReadRanges, options: ReadOptions,
    verify: bool, run_all: RunAll | None = None, gather: Gather | None = None,
) -> list[bytes]:
    """The payloads of global records ``idx`` (bounds-checked), in that order: grouped by
    shard, each shard's records read as coalesced ranges by ``read(shard, ranges)``; or, with
    ``gather``, all in one call where it can (a record it refuses: the ranges path names
    the fault).

    Without ``run_all`` the shards are read one after another (in shard order), each checked
    right after its read (while its bytes are in the CPU cache); with it, all shards' reads
    go to ``run_all`` at once and are checked when all have returned.
    """
    if len(idx) == 0:
        return []
    if gather is not None and len(idx) >= GATHER_FROM:
        got = gather(*table.shard_of(idx), verify)
        if got is not None:
            return got
    out: list[bytes | None] = [None] * len(idx)
    groups = _group(table, idx)

    def fetch(item: _Group) -> tuple[_ShardRead, list[bytes]]:
        plan = _plan(table, item, options)
        return plan, read(item[0], [(r[0], r[1]) for r in plan.ranges])

    if run_all is None or len(groups) < 2:
        urls = table.urls
        for item in groups:  # fetch() inlined: the local path is call-bound
            k, group, recs = item
            if len(recs) == 1:  # one record of this shard: one range, nothing to plan
                r = int(recs[0])
                at = table.offsets_view(k).item
                start, end = at(r), at(r + 1)
                blob = read(k, [(start, end - start)])[0]
                if end - start > len(blob):
                    raise _truncated(urls[k], r, start, end - start)
                out[int(group[0])] = unframe_bytes_at(blob, 0, end - start, path=urls[k],
                                                      record=r, offset=start, verify=verify)
                continue
            plan = _plan(table, item, options)
            blobs = read(k, [(r[0], r[1]) for r in plan.ranges])
            _unframe(urls[k], plan, blobs, out, verify)
    else:  # index loads, size checks and reads of all shards at once
        for plan, blobs in run_all(fetch, groups):
            _unframe(table.urls[plan.shard], plan, blobs, out, verify)
    return [v for v in out if v is not None]


def _group(table: ShardTable, idx: np.ndarray) -> list[_Group]:
    """The records ``idx`` by shard, shards in increasing order, each shard's records in the
    order asked."""
    shard, local = table.shard_of(idx)
    if len(idx) <= GROUP_IN_PYTHON:
        positions: dict[int, list[int]] = {}
        records: dict[int, list[int]] = {}
        for p, (k, r) in enumerate(zip(shard.tolist(), local.tolist())):
            if k in positions:
                positions[k].append(p)
                records[k].append(r)
            else:
                positions[k] = [p]
                records[k] = [r]
        return [(k, positions[k], records[k]) for k in sorted(positions)]
    order = np.argsort(shard, kind="stable")
    cuts = np.flatnonzero(np.diff(shard[order])) + 1
    return [(int(shard[g[0]]), g, local[g]) for g in np.split(order, cuts)]


def _plan(table: ShardTable, item: _Group, options: ReadOptions) -> _ShardRead:
    """The byte ranges of one shard's records (its index loaded, and checked, on first use)."""
    k, group, recs = item
    offsets = table.offsets_view(k)
    group_l = group.tolist() if isinstance(group, np.ndarray) else group
    if len(recs) <= SMALL_GROUP:  # Python ints: see SMALL_GROUP
        recs_l = recs.tolist() if isinstance(recs, np.ndarray) else recs
        at = offsets.item
        if len(recs_l) == 1:  # the commonest group of a shuffled slice over many shards
            r = recs_l[0]
            start, end = at(r), at(r + 1)
            return _ShardRead(k, group_l, recs_l, [start], [end], [(start, end - start, (0,))])
        starts = [at(r) for r in recs_l]
        ends = [at(r + 1) for r in recs_l]
        return _ShardRead(k, group_l, recs_l, starts, ends, _coalesce(starts, ends, options))
    recs_arr = np.asarray(recs, dtype=np.int64)
    starts_arr = offsets[recs_arr].astype(np.int64)
    ends_arr = offsets[recs_arr + 1].astype(np.int64)
    return _ShardRead(k, group_l, recs_arr.tolist(), starts_arr.tolist(), ends_arr.tolist(),
                      _coalesce(starts_arr, ends_arr, options))


def _unframe(url: str, plan: _ShardRead, blobs: list[bytes], out: list[bytes | None],
             verify: bool) -> None:
    """Slice each record of ``plan`` out of its range, check it, store it at its position.

    The compiled part (where built) checks the whole plan in one call; a record it finds
    unsound, and every plan without it, goes through the checks below, which name the fault.
    """
    _, group, recs, starts, ends, ranges = plan
    wire = native.wire
    if wire is not None:
        payloads = wire.unframe(blobs, ranges, starts, ends, verify)
        if isinstance(payloads, list):
            for m, payload in enumerate(payloads):
                out[group[m]] = payload
            return
    for (offset, _, members), blob in zip(ranges, blobs):
        size = len(blob)
        for m in members:
            a, b = starts[m] - offset, ends[m] - offset
            if b > size:
                raise _truncated(url, recs[m], starts[m], b - a)
            out[group[m]] = unframe_bytes_at(blob, a, b, path=url, record=recs[m],
                                             offset=starts[m], verify=verify)


def _truncated(url: str, record: int, offset: int, size: int) -> CorruptRecordError:
    """The error for a record of ``size`` bytes at ``offset`` that the file ends within."""
    return CorruptRecordError(
        f"{location(url, record, offset)}: truncated, the file ends before the record's "
        f"{size} bytes; the shard changed after indexing: {RERUN_HINT}",
        path=url, record=record, offset=offset,
    )
