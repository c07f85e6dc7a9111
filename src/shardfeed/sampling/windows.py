"""Windows: samples made of ``length`` frames (records) of one group, e.g. one day of a time-lapse.

Records of a group are contiguous and sorted by their order key (as ``shardfeed pack`` writes
them). Window ``w`` is a tuple of record indices; its label is usually the last frame's.

Fixed stride (``stride=s`` records), one window per anchor record ``i``::

    records   | 0  1  2  3  4  5  6 | 7  8  9  10 11 |      two groups (days)
    length=3, stride=2:
      w0      | 0     2     4       |                     anchors 0, 1, 2 fit in group 1;
      w1      |    1     3     5    |                     anchor 3 would need record 7
      w2      |       2     4     6 |                     (group end): excluded
      w3      |                     | 7     9     11      anchor 7 fits in group 2

Time-based (``stride_seconds=Δ``): frame j is the record of the anchor's group whose order key
(seconds) is nearest to ``t_anchor + j·Δ``, strictly less than ``tolerance_seconds`` away
(default Δ/2, so a frame exactly half a stride off does not count), and strictly later than
frame j-1 (ties go to the earlier record)::

    t (s)     0   8   16  24  32      48  56          frames every 8 s, one missing at 40
    Δ = 16:   [0, 16, 32]  [8, 24, 48?] -> target 40 has no frame within 8 s: off grid
              [16, 32, 48] [24, ...]

Windows never cross a group boundary, and with ``max_gap_seconds`` no two consecutive frames
of a window are further apart than that (for a fixed stride ``s`` that is ``s`` record
intervals, so ``max_gap_seconds`` must allow the normal frame spacing times ``s``). Anchors
that give no window are counted by reason in :class:`ExcludedWindows`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from shardfeed.sampling._checks import as_index, as_index_array, as_int

__all__ = ["ExcludedWindows", "WindowIndex"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ExcludedWindows:
    """How many anchor records give no window, by the first reason found.

    Reasons are checked in this order: ``missing_time`` (the anchor, or a frame that a gap
    check needs, has no timestamp: NaN), ``group_end`` (the window would run past the end of
    its group), ``off_grid`` (time-based only: no frame within the tolerance of a target
    time, or none strictly later than the previous frame), ``gap`` (two consecutive frames
    more than ``max_gap_seconds`` apart).
    """

    group_end: int = 0
    gap: int = 0
    missing_time: int = 0
    off_grid: int = 0

    @property
    def total(self) -> int:
        return self.group_end + self.gap + self.missing_time + self.off_grid


class WindowIndex:
    """All valid windows of a dataset, in record order: ``len``, ``frames(w)``, ``frames_many``.

    Build it with :meth:`build`. Window ``w`` is the ``w``-th valid anchor in record order,
    so ``range(len(index))`` is the evaluation order; shuffle with ``EpochOrder(len(index))``.

    Determinism: a pure function of the arrays and options. State: none. Memory: fixed stride
    4 bytes a window (8 past 2^31 records); time-based ``4·length`` bytes a window.
    Thread-safe (read-only after build).
    """

    __slots__ = ("_offsets", "_table", "excluded", "length", "max_gap_seconds", "num_records",
                 "stride", "stride_seconds", "tolerance_seconds")

    def __init__(
        self,
        *,
        length: int,
        stride: int,
        stride_seconds: float | None,
        tolerance_seconds: float | None,
        max_gap_seconds: float | None,
        num_records: int,
        excluded: ExcludedWindows,
        table: npt.NDArray[np.signedinteger],
    ) -> None:
        """Internal: use :meth:`build`. ``table`` holds the first frame of each window (1-D,
        fixed stride) or all its frames (2-D, time-based)."""
        self.length = length
        self.stride = stride
        self.stride_seconds = stride_seconds
        self.tolerance_seconds = tolerance_seconds
        self.max_gap_seconds = max_gap_seconds
        self.num_records = num_records
        self.excluded = excluded
        self._table = table
        self._offsets = np.arange(length, dtype=np.int64) * stride

    @classmethod
    def build(
        cls,
        group_ids: npt.ArrayLike | None,
        order_keys: npt.ArrayLike | None,
        *,
        length: int,
        stride: int = 1,
        stride_seconds: float | None = None,
        tolerance_seconds: float | None = None,
        max_gap_seconds: float | None = None,
    ) -> WindowIndex:
        """Index every window of ``length`` frames over per-record ``group_ids``/``order_keys``.

        ``group_ids=None`` means one group; ``order_keys=None`` is allowed unless
        ``stride_seconds`` or ``max_gap_seconds`` needs times. Raises ``ValueError`` naming the
        record if a group is split in two runs or order keys decrease inside a group.
        Cost: vectorised, about 10 ms per million records for a fixed stride (a loop over the
        ``length`` frame offsets, none over records).
        """
        length = _positive_int(length, "length")
        stride = _positive_int(stride, "stride")
        stride_s = _optional_seconds(stride_seconds, "stride_seconds", allow_zero=False)
        tolerance_s = _optional_seconds(tolerance_seconds, "tolerance_seconds", allow_zero=False)
        max_gap_s = _optional_seconds(max_gap_seconds, "max_gap_seconds", allow_zero=True)
        if stride_s is not None and stride != 1:
            raise ValueError(f"give either stride (records) or stride_seconds, not both; got "
                             f"stride={stride} and stride_seconds={stride_s}")
        if tolerance_s is not None and stride_s is None:
            raise ValueError("tolerance_seconds applies only to time-based windows; "
                             "also give stride_seconds, or drop tolerance_seconds")
        if stride_s is not None and tolerance_s is None:
            tolerance_s = stride_s / 2

        groups, keys, n = _check_arrays(group_ids, order_keys)
        if keys is None and (stride_s is not None or max_gap_s is not None):
            raise ValueError("stride_seconds and max_gap_seconds need per-record times: pass "
                             "order_keys (e.g. the dataset's order_keys), or drop those options")
        run_starts, run_ends = _group_runs(groups, n)
        run_of = np.repeat(np.arange(run_starts.size, dtype=np.int64), run_ends - run_starts)
        if keys is not None:
            _check_sorted(keys, run_of)
        times = None if keys is None else keys.astype(np.float64, copy=False)

        if stride_s is None or times is None or tolerance_s is None:
            table, excluded = _fixed_windows(run_ends[run_of], times, n, length=length,
                                             stride=stride, max_gap=max_gap_s)
        else:
            table, excluded = _timed_windows(times, run_of, run_starts, run_ends, length=length,
                                             delta=stride_s, tolerance=tolerance_s,
                                             max_gap=max_gap_s)
        return cls(length=length, stride=stride, stride_seconds=stride_s,
                   tolerance_seconds=tolerance_s, max_gap_seconds=max_gap_s, num_records=n,
                   excluded=excluded, table=table)

    def __len__(self) -> int:
        return int(self._table.shape[0])

    def __repr__(self) -> str:
        how = (f"stride_seconds={self.stride_seconds}" if self.stride_seconds is not None
               else f"stride={self.stride}")
        return (f"WindowIndex({len(self)} windows of {self.length} frames, {how}, over "
                f"{self.num_records} records, excluded={self.excluded})")

    @property
    def nbytes(self) -> int:
        """Bytes held by the index."""
        return int(self._table.nbytes)

    def frames(self, w: int) -> IntArray:
        """The record indices of window ``w``, shape ``(length,)``, increasing."""
        k = as_index(w, len(self), "window")
        row: IntArray = self.frames_many(np.array([k], dtype=np.int64))[0]
        return row

    def frames_many(self, ws: npt.ArrayLike) -> IntArray:
        """The record indices of many windows, shape ``(len(ws), length)``."""
        index = self._check_windows(ws)
        if self._table.ndim == 1:
            starts = self._table[index].astype(np.int64)
            return starts[:, None] + self._offsets[None, :]
        return self._table[index].astype(np.int64)

    def last_frame(self, w: int) -> int:
        """The record index of the last frame of window ``w`` (whose label a window carries)."""
        return int(self.frames(w)[-1])

    def last_frames(self, ws: npt.ArrayLike) -> IntArray:
        """The last frame of each of many windows, shape ``(len(ws),)``."""
        index = self._check_windows(ws)
        if self._table.ndim == 1:
            last: IntArray = self._table[index].astype(np.int64) + int(self._offsets[-1])
        else:
            last = self._table[index, -1].astype(np.int64)
        return last

    def _check_windows(self, ws: npt.ArrayLike) -> IntArray:
        index = as_index_array(ws, len(self), "window")
        if index.ndim != 1:
            raise ValueError(f"window indices must be 1-D, got shape {index.shape}")
        return index


# -- construction helpers ------------------------------------------------------------------


def _positive_int(value: object, name: str) -> int:
    number = as_int(value, name)
    if number < 1:
        raise ValueError(f"{name} must be >= 1, got {number}")
    return number


def _optional_seconds(value: float | None, name: str, *, allow_zero: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return seconds


def _check_arrays(
    group_ids: npt.ArrayLike | None, order_keys: npt.ArrayLike | None
) -> tuple[npt.NDArray[np.generic] | None, npt.NDArray[np.generic] | None, int]:
    groups = None if group_ids is None else np.asarray(group_ids)
    keys = None if order_keys is None else np.asarray(order_keys)
    for name, array in (("group_ids", groups), ("order_keys", keys)):
        if array is not None and array.ndim != 1:
            raise ValueError(f"{name} must be 1-D (one value per record), got shape {array.shape}")
    if keys is not None and keys.size and keys.dtype.kind not in "iuf":
        raise TypeError(f"order_keys must be numbers (e.g. seconds), got dtype {keys.dtype}")
    if groups is None and keys is None:
        raise ValueError("give group_ids or order_keys (at least one per-record array), to "
                         "know how many records there are")
    if groups is not None and keys is not None and groups.size != keys.size:
        raise ValueError(f"group_ids and order_keys must have one value per record; got "
                         f"{groups.size} group ids and {keys.size} order keys")
    n = int(groups.size if groups is not None else keys.size)  # type: ignore[union-attr]
    return groups, keys, n


def _group_runs(
    groups: npt.NDArray[np.generic] | None, n: int
) -> tuple[IntArray, IntArray]:
    """Start and end (exclusive) of each run of equal group ids; error if a group recurs."""
    if groups is None or n == 0:
        return np.array([0] * (n > 0), dtype=np.int64), np.array([n] * (n > 0), dtype=np.int64)
    change = np.flatnonzero(groups[1:] != groups[:-1]) + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    ends = np.concatenate([change, [n]]).astype(np.int64)
    run_ids = groups[starts]
    order = np.argsort(run_ids, kind="stable")
    repeated = run_ids[order[1:]] == run_ids[order[:-1]]
    if np.any(repeated):
        run = int(order[1:][repeated].min())
        record = int(starts[run])
        raise ValueError(
            f"records of a group must be contiguous: group {_show(run_ids[run])} appears again at "
            f"record {record} after other groups; sort the records by group id, then by "
            f"order key (as 'shardfeed pack' writes them)"
        )
    return starts, ends


def _show(value: object) -> str:
    """A value for a message: NumPy scalars as plain Python values."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _check_sorted(keys: npt.NDArray[Any], run_of: IntArray) -> None:
    """Order keys must not decrease inside a group (NaN, a missing time, is skipped)."""
    if keys.dtype.kind == "f":
        present = np.flatnonzero(~np.isnan(keys))
        values, runs = keys[present], run_of[present]
    else:
        present, values, runs = None, keys, run_of
    bad = np.flatnonzero((runs[1:] == runs[:-1]) & (values[1:] < values[:-1]))
    if bad.size:
        i = int(bad[0])
        before, record = (i, i + 1) if present is None else (int(present[i]), int(present[i + 1]))
        raise ValueError(
            f"order keys must not decrease within a group: record {record} has order key "
            f"{_show(keys[record])} after record {before} with {_show(keys[before])}; sort the records "
            f"of each group by order key"
        )


def _fixed_windows(
    group_end: IntArray,
    times: npt.NDArray[np.float64] | None,
    n: int,
    *,
    length: int,
    stride: int,
    max_gap: float | None,
) -> tuple[npt.NDArray[np.signedinteger], ExcludedWindows]:
    span = (length - 1) * stride
    anchors = np.arange(n, dtype=np.int64)
    fits = anchors + span < group_end
    candidates = anchors[fits]
    missing = gap = 0
    if max_gap is not None and length > 1 and candidates.size:
        assert times is not None
        before = times[candidates]
        no_time = np.isnan(before)
        too_far = np.zeros(candidates.size, dtype=bool)
        for j in range(1, length):
            after = times[candidates + j * stride]
            no_time |= np.isnan(after)
            too_far |= (after - before) > max_gap
            before = after
        too_far &= ~no_time
        missing, gap = int(no_time.sum()), int(too_far.sum())
        candidates = candidates[~(no_time | too_far)]
    dtype = np.int32 if n < 2**31 else np.int64
    excluded = ExcludedWindows(group_end=int(n - fits.sum()), gap=gap, missing_time=missing)
    return candidates.astype(dtype), excluded


def _segment_search(
    values: npt.NDArray[np.float64],
    lo: IntArray,
    hi: IntArray,
    target: npt.NDArray[np.float64],
    *,
    strict: bool,
    globally_sorted: bool,
) -> IntArray:
    """First index in ``[lo, hi)`` with ``values > target`` (strict) or ``>=``; ``hi`` if none.

    Each segment ``values[lo:hi]`` is sorted. Vectorised binary search (log2 of the longest
    segment passes), or one ``np.searchsorted`` clipped to the segment when the whole array
    is sorted.
    """
    side: Literal["left", "right"] = "right" if strict else "left"
    if globally_sorted:
        found: IntArray = np.clip(np.searchsorted(values, target, side=side), lo, hi)
        return found.astype(np.int64)
    lo, hi = lo.copy(), hi.copy()
    last = max(values.size - 1, 0)
    widest = int((hi - lo).max()) if lo.size else 0
    for _ in range(widest.bit_length()):
        mid = (lo + hi) >> 1
        probe = values[np.minimum(mid, last)]
        right = (probe <= target) if strict else (probe < target)
        active = lo < hi
        lo = np.where(active & right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)
    return lo


def _timed_windows(
    times: npt.NDArray[np.float64],
    run_of: IntArray,
    run_starts: IntArray,
    run_ends: IntArray,
    *,
    length: int,
    delta: float,
    tolerance: float,
    max_gap: float | None,
) -> tuple[npt.NDArray[np.signedinteger], ExcludedWindows]:
    n = times.size
    # Work on the records that have a time; map back to record indices at the end.
    timed = np.flatnonzero(~np.isnan(times))
    t = times[timed]
    runs = run_of[timed]
    seg_hi = np.searchsorted(timed, run_ends)[runs].astype(np.int64)
    globally_sorted = bool(np.all(t[1:] >= t[:-1]))
    strictly_increasing = not bool(np.any((runs[1:] == runs[:-1]) & (t[1:] <= t[:-1])))
    last = max(t.size - 1, 0)

    # Group end first: the last target lies past the group's last time (beyond tolerance).
    group_last = t[np.maximum(seg_hi - 1, 0)]
    fits = t + (length - 1) * delta - tolerance < group_last
    anchor = np.flatnonzero(fits)
    frames = np.empty((anchor.size, length), dtype=np.int64)
    frames[:, 0] = anchor
    alive = np.arange(anchor.size)
    off_grid = gap = 0
    for j in range(1, length):
        a = anchor[alive]
        previous = frames[alive, j - 1]
        hi = seg_hi[a]
        if strictly_increasing:
            after = previous + 1
        else:
            after = _segment_search(t, previous + 1, hi, t[previous], strict=True,
                                    globally_sorted=globally_sorted)
        target = t[a] + j * delta
        pos = _segment_search(t, after, hi, target, strict=False,
                              globally_sorted=globally_sorted)
        has_before = pos - 1 >= after
        has_after = pos < hi
        before_gap = np.where(has_before, target - t[np.maximum(pos - 1, 0)], np.inf)
        after_gap = np.where(has_after, t[np.minimum(pos, last)] - target, np.inf)
        take_before = before_gap <= after_gap
        chosen = np.where(take_before, pos - 1, pos)
        if not strictly_increasing:
            # Among records with equal times the earliest wins: step back over duplicates.
            chosen = _segment_search(t, after, hi, t[np.minimum(chosen, last)], strict=False,
                                     globally_sorted=globally_sorted)
        distance = np.where(take_before, before_gap, after_gap)
        ok = distance < tolerance
        off_grid += int((~ok).sum())
        if max_gap is not None:
            wide = ok & ((t[np.where(ok, chosen, 0)] - t[previous]) > max_gap)
            gap += int(wide.sum())
            ok &= ~wide
        frames[alive[ok], j] = chosen[ok]
        alive = alive[ok]
    frames = timed[frames[alive]]
    dtype = np.int32 if n < 2**31 else np.int64
    excluded = ExcludedWindows(group_end=int(timed.size - fits.sum()), gap=gap,
                               missing_time=int(n - timed.size), off_grid=off_grid)
    return frames.astype(dtype), excluded
