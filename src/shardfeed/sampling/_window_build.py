"""Vectorised construction of window tables (used by :mod:`shardfeed.sampling.windows`).

No loop over records: the loops run over the frame offsets ``j < length`` and over the
passes of a binary search (log2 of the longest group).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
Counts = dict[str, int]


def group_runs(
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


def check_sorted(keys: npt.NDArray[Any], run_of: IntArray) -> None:
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
            f"{_show(keys[record])} after record {before} with {_show(keys[before])}; "
            f"sort the records "
            f"of each group by order key"
        )


def fixed_windows(
    group_end: IntArray,
    times: npt.NDArray[np.float64] | None,
    n: int,
    *,
    length: int,
    stride: int,
    max_gap: float | None,
) -> tuple[npt.NDArray[np.signedinteger], Counts]:
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
    excluded = {"group_end": int(n - fits.sum()), "gap": gap, "missing_time": missing}
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


def _nearest_frame(
    t: npt.NDArray[np.float64],
    previous: IntArray,
    hi: IntArray,
    target: npt.NDArray[np.float64],
    *,
    strictly_increasing: bool,
    globally_sorted: bool,
) -> tuple[IntArray, npt.NDArray[np.float64]]:
    """The record after ``previous`` (before ``hi``) whose time is nearest ``target``, and how far.

    A tie between the record before and after the target goes to the one before; among
    records with equal times the earliest is chosen.
    """
    last = max(t.size - 1, 0)
    if strictly_increasing:
        after = previous + 1
    else:
        after = _segment_search(t, previous + 1, hi, t[previous], strict=True,
                                globally_sorted=globally_sorted)
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
    return chosen, distance


def timed_windows(
    times: npt.NDArray[np.float64],
    run_of: IntArray,
    run_starts: IntArray,
    run_ends: IntArray,
    *,
    length: int,
    delta: float,
    tolerance: float,
    max_gap: float | None,
) -> tuple[npt.NDArray[np.signedinteger], Counts]:
    """Windows whose frame times step by ``delta`` (within ``tolerance``), and what was excluded."""
    n = times.size
    # Work on the records that have a time; map back to record indices at the end.
    timed = np.flatnonzero(~np.isnan(times))
    t = times[timed]
    runs = run_of[timed]
    seg_hi = np.searchsorted(timed, run_ends)[runs].astype(np.int64)
    globally_sorted = bool(np.all(t[1:] >= t[:-1]))
    strictly_increasing = not bool(np.any((runs[1:] == runs[:-1]) & (t[1:] <= t[:-1])))

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
        target = t[a] + j * delta
        chosen, distance = _nearest_frame(t, previous, hi, target,
                                          strictly_increasing=strictly_increasing,
                                          globally_sorted=globally_sorted)
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
    excluded = {"group_end": int(timed.size - fits.sum()), "gap": gap,
                "missing_time": int(n - timed.size), "off_grid": off_grid}
    return frames.astype(dtype), excluded
