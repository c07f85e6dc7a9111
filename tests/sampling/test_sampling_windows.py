"""WindowIndex: every valid window exactly once, never across a group or a gap; vs brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.sampling import WindowIndex

# -- brute-force references (one anchor at a time, plain Python) ------------------------------


def reference_fixed(groups: list[int], times: list[float] | None, *, length: int, stride: int,
                    max_gap: float | None) -> tuple[list[list[int]], dict[str, int]]:
    n = len(groups)
    windows: list[list[int]] = []
    excluded = {"group_end": 0, "gap": 0, "missing_time": 0, "off_grid": 0}
    for i in range(n):
        frames = [i + j * stride for j in range(length)]
        if frames[-1] >= n or any(groups[f] != groups[i] for f in frames):
            excluded["group_end"] += 1
            continue
        if max_gap is not None and length > 1:
            assert times is not None
            ts = [times[f] for f in frames]
            if any(math.isnan(x) for x in ts):
                excluded["missing_time"] += 1
                continue
            if any(b - a > max_gap for a, b in itertools.pairwise(ts)):
                excluded["gap"] += 1
                continue
        windows.append(frames)
    return windows, excluded


def reference_timed(groups: list[int], times: list[float], *, length: int, delta: float,
                    tolerance: float, max_gap: float | None
                    ) -> tuple[list[list[int]], dict[str, int]]:
    n = len(groups)
    windows: list[list[int]] = []
    excluded = {"group_end": 0, "gap": 0, "missing_time": 0, "off_grid": 0}
    for i in range(n):
        if math.isnan(times[i]):
            excluded["missing_time"] += 1
            continue
        members = [r for r in range(n) if groups[r] == groups[i] and not math.isnan(times[r])]
        if times[i] + (length - 1) * delta - tolerance >= max(times[r] for r in members):
            excluded["group_end"] += 1
            continue
        frames, reason = [i], None
        for j in range(1, length):
            target = times[i] + j * delta
            later = [r for r in members if times[r] > times[frames[-1]]]
            best = min(later, key=lambda r: (abs(times[r] - target), r), default=None)
            if best is None or abs(times[best] - target) >= tolerance:
                reason = "off_grid"
                break
            if max_gap is not None and times[best] - times[frames[-1]] > max_gap:
                reason = "gap"
                break
            frames.append(best)
        if reason is None:
            windows.append(frames)
        else:
            excluded[reason] += 1
    return windows, excluded


def as_lists(index: WindowIndex) -> list[list[int]]:
    frames: list[list[int]] = index.frames_many(np.arange(len(index))).tolist()
    return frames


def excluded_dict(index: WindowIndex) -> dict[str, int]:
    e = index.excluded
    return {"group_end": e.group_end, "gap": e.gap, "missing_time": e.missing_time,
            "off_grid": e.off_grid}


@st.composite
def grouped_records(draw: st.DrawFn, *, allow_nan: bool) -> tuple[list[int], list[float]]:
    """Contiguous groups (ids in any order), times non-decreasing per group, some gaps/dups/NaN."""
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=6))
    ids = draw(st.permutations(list(range(len(sizes)))))
    groups: list[int] = []
    times: list[float] = []
    for gid, size in zip(ids, sizes):
        t = draw(st.floats(-100, 100).map(lambda x: float(round(x))))
        for _ in range(size):
            step = draw(st.sampled_from([0.0, 1.0, 2.0, 2.0, 2.0, 2.5, 3.0, 7.0]))
            t += step
            groups.append(gid)
            times.append(float("nan") if allow_nan and draw(st.integers(0, 9)) == 0 else t)
    return groups, times


@given(records=grouped_records(allow_nan=True), length=st.integers(1, 4),
       stride=st.integers(1, 3), max_gap=st.none() | st.sampled_from([2.0, 4.0, 6.5]))
@settings(max_examples=150, deadline=None)
def test_fixed_stride_agrees_with_brute_force(
    records: tuple[list[int], list[float]], length: int, stride: int, max_gap: float | None
) -> None:
    groups, times = records
    index = WindowIndex.build(groups, times, length=length, stride=stride,
                              max_gap_seconds=max_gap)
    windows, excluded = reference_fixed(groups, times, length=length, stride=stride,
                                        max_gap=max_gap)
    assert as_lists(index) == windows
    assert excluded_dict(index) == excluded
    assert len(index) + index.excluded.total == len(groups)


@given(records=grouped_records(allow_nan=True), length=st.integers(1, 4),
       delta=st.sampled_from([2.0, 4.0, 5.0]), tolerance=st.none() | st.sampled_from([0.5, 1.5]),
       max_gap=st.none() | st.sampled_from([3.0, 6.0]))
@settings(max_examples=150, deadline=None)
def test_time_based_agrees_with_brute_force(
    records: tuple[list[int], list[float]], length: int, delta: float, tolerance: float | None,
    max_gap: float | None,
) -> None:
    groups, times = records
    index = WindowIndex.build(groups, times, length=length, stride_seconds=delta,
                              tolerance_seconds=tolerance, max_gap_seconds=max_gap)
    windows, excluded = reference_timed(groups, times, length=length, delta=delta,
                                        tolerance=delta / 2 if tolerance is None else tolerance,
                                        max_gap=max_gap)
    assert as_lists(index) == windows
    assert excluded_dict(index) == excluded


def test_time_based_on_globally_unsorted_times_uses_the_same_rule() -> None:
    # Group 1's clock restarts at 0: the binary-search path, not the global searchsorted one.
    groups = [5] * 6 + [1] * 6
    times = [100.0, 108.0, 116.0, 124.0, 132.0, 140.0, 0.0, 8.0, 16.0, 24.0, 32.0, 40.0]
    index = WindowIndex.build(groups, times, length=3, stride_seconds=16.0)
    windows, excluded = reference_timed(groups, times, length=3, delta=16.0, tolerance=8.0,
                                        max_gap=None)
    assert as_lists(index) == windows == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]]
    assert excluded_dict(index) == excluded


def test_windows_respect_stride_groups_and_last_frame() -> None:
    groups = np.repeat([3, 1, 2], [7, 5, 2])
    times = np.arange(14) * 8.0
    index = WindowIndex.build(groups, times, length=3, stride=2)
    frames = index.frames_many(np.arange(len(index)))
    assert (np.diff(frames, axis=1) == 2).all()
    assert (groups[frames] == groups[frames[:, :1]]).all()
    assert frames.tolist() == [[0, 2, 4], [1, 3, 5], [2, 4, 6], [7, 9, 11]]
    assert index.last_frame(3) == 11
    assert index.last_frames(np.array([0, 3])).tolist() == [4, 11]
    assert index.frames(1).tolist() == [1, 3, 5]
    assert index.excluded.group_end == 10


def test_max_gap_splits_a_group_and_spacing_is_kept() -> None:
    # Frames every 8 s with a one-hour hole after record 4.
    times = np.concatenate([np.arange(5) * 8.0, 3600 + np.arange(5) * 8.0])
    index = WindowIndex.build(np.zeros(10, dtype=int), times, length=2, max_gap_seconds=20)
    frames = index.frames_many(np.arange(len(index)))
    assert [4, 5] not in frames.tolist() and len(index) == 8
    assert (np.diff(times[frames], axis=1) <= 20).all()
    assert index.excluded.gap == 1 and index.excluded.group_end == 1
    timed = WindowIndex.build(None, times, length=3, stride_seconds=16, max_gap_seconds=20)
    spacing = np.diff(times[timed.frames_many(np.arange(len(timed)))], axis=1)
    assert (spacing == 16).all()
    assert len(timed) == 2  # [0, 2, 4] and [5, 7, 9]


def test_time_based_skips_missing_timestamps_and_counts_them() -> None:
    times = np.array([0.0, 8.0, np.nan, 24.0, 32.0, 40.0])
    index = WindowIndex.build(None, times, length=2, stride_seconds=16)
    assert as_lists(index) == [[1, 3], [3, 5]]
    assert index.excluded.missing_time == 1
    # 0 -> target 16: nearest is 8 or 24 (8 s away, not strictly within Δ/2): off grid.
    assert index.excluded.off_grid == 1
    assert index.excluded.group_end == 2


def test_group_ids_without_order_keys_and_one_group_defaults() -> None:
    index = WindowIndex.build(["a", "a", "b", "b", "b"], None, length=2)
    assert as_lists(index) == [[0, 1], [2, 3], [3, 4]]
    single = WindowIndex.build(None, np.arange(4.0), length=4)
    assert as_lists(single) == [[0, 1, 2, 3]]
    empty = WindowIndex.build(np.zeros(0, dtype=int), np.zeros(0), length=2)
    assert len(empty) == 0 and empty.frames_many([]).shape == (0, 2)


def test_non_contiguous_groups_name_the_record() -> None:
    with pytest.raises(ValueError, match="group 1 appears again at record 4"):
        WindowIndex.build([1, 1, 2, 2, 1], None, length=2)


def test_decreasing_order_keys_name_the_record() -> None:
    with pytest.raises(ValueError, match="record 3 has order key 1.0 after record 1"):
        WindowIndex.build([0, 0, 0, 0], [0.0, 2.0, np.nan, 1.0], length=2)
    # Decreasing across a group boundary is fine.
    assert len(WindowIndex.build([0, 0, 1, 1], [5.0, 6.0, 1.0, 2.0], length=2)) == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"length": 0}, ValueError, "length must be >= 1"),
        ({"length": 2, "stride": 0}, ValueError, "stride must be >= 1"),
        ({"length": 2, "stride": 2, "stride_seconds": 4.0}, ValueError, "not both"),
        ({"length": 2, "tolerance_seconds": 1.0}, ValueError, "also give stride_seconds"),
        ({"length": 2, "stride_seconds": -1.0}, ValueError, "stride_seconds must be a finite"),
        ({"length": 2, "max_gap_seconds": float("nan")}, ValueError, "max_gap_seconds must be"),
        ({"length": 2.5}, TypeError, "length must be an integer"),
    ],
)
def test_bad_options_name_the_value(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        WindowIndex.build([0, 0, 0], [0.0, 1.0, 2.0], **kwargs)  # type: ignore[arg-type]


def test_bad_arrays() -> None:
    with pytest.raises(ValueError, match="one value per record"):
        WindowIndex.build([0, 0, 0], [0.0, 1.0], length=1)
    with pytest.raises(ValueError, match="need per-record times"):
        WindowIndex.build([0, 0], None, length=2, stride_seconds=1.0)
    with pytest.raises(ValueError, match="1-D"):
        WindowIndex.build(np.zeros((2, 2)), None, length=1)
    index = WindowIndex.build([0, 0, 0], None, length=2)
    with pytest.raises(IndexError, match="window 2 out of range"):
        index.frames(2)


def test_large_dataset_is_indexed_and_compact() -> None:
    # 257 groups (days) x 5,000 frames, 8 s apart: 1.3M records.
    groups = np.repeat(np.arange(257), 5000)
    times = np.tile(np.arange(5000) * 8.0, 257) + np.repeat(np.arange(257) * 86400.0, 5000)
    index = WindowIndex.build(groups, times, length=3, stride=2, max_gap_seconds=20)
    assert len(index) == 257 * (5000 - 4)
    assert index.nbytes == 4 * len(index)
    some = np.array([0, 4995, 4996, len(index) - 1])
    assert index.frames_many(some).tolist() == [[0, 2, 4], [4995, 4997, 4999],
                                                [5000, 5002, 5004],
                                                [257 * 5000 - 5, 257 * 5000 - 3, 257 * 5000 - 1]]
    timed = WindowIndex.build(groups, times, length=3, stride_seconds=16)
    assert len(timed) == len(index)
    np.testing.assert_array_equal(timed.frames_many(some), index.frames_many(some))
