"""Windows through the Loader: each valid window once per epoch, never across a group or gap,
stride and time spacing kept, last frame's label, one crop/flip for all frames of a window."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.dataset import Dataset, DataSourceBase
from shardfeed.errors import SchemaError, StateError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.windows import Windows
from shardfeed.sampling.permutation import EpochOrder
from shardfeed.tools.index import index_files
from shardfeed.transforms import presets

HEIGHT, WIDTH = 80, 96
# day -> frame times (s): 8 s apart, day 1 has a 48 s gap, day 2 is too short for 3 frames
DAYS: dict[int, list[float]] = {
    0: [0, 8, 16, 24, 32, 40, 48, 56, 64],
    1: [0, 8, 16, 64, 72, 80],
    2: [0, 8],
    3: [0, 8, 16, 24, 32, 40, 48],
}


def frame_image(index: int) -> np.ndarray:
    """R = 2x, G = 3y (where a crop came from, and whether it was flipped), B = the frame."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    blue = np.full_like(x, 40 + (index * 37) % 160)
    return np.stack([2 * x, 3 * y, blue], axis=-1).astype(np.uint8)


def write_frames(folder: Path, days: Mapping[int, Sequence[float]] = DAYS, *, shards: int = 2,
                 index: bool = True) -> Path:
    """A time-lapse dataset: records sorted by day then time; group/order sidecars."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(day, float(t)) for day in sorted(days) for t in days[day]]
    bounds = np.linspace(0, len(rows), shards + 1).astype(int)
    for s in range(shards):
        with ShardWriter(str(folder / f"frames-{s:02d}.tfrecord")) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                day, t = rows[i]
                writer.write_example({
                    "image/encoded": simplejpeg.encode_jpeg(frame_image(i), quality=95),
                    "image/filename": f"d{day}_{int(t):03d}.jpg".encode(),
                    "image/height": [HEIGHT],
                    "image/width": [WIDTH],
                    "index": [i],
                    "labels": np.array([i, i + 0.5, -i, day], dtype=np.float32),
                    "day": [day],
                    "timestamp": [t],
                })
    if index:
        index_files(folder, group_key="day", order_key="timestamp")
    return folder


def expected_windows(days: Mapping[int, Sequence[float]], *, length: int, stride: int,
                     max_gap: float | None = None) -> set[tuple[int, ...]]:
    """Brute force: every anchor whose frames stay in its day (and within max_gap)."""
    out = set()
    start = 0
    for day in sorted(days):
        times = list(days[day])
        for a in range(len(times)):
            idx = [a + j * stride for j in range(length)]
            if idx[-1] >= len(times):
                continue
            if max_gap is not None and any(
                times[idx[j + 1]] - times[idx[j]] > max_gap for j in range(length - 1)
            ):
                continue
            out.add(tuple(start + i for i in idx))
        start += len(times)
    return out


@pytest.fixture(scope="module")
def frames_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_frames(tmp_path_factory.mktemp("frames"))


@pytest.fixture()
def frames_ds(frames_folder: Path) -> Dataset:
    return Dataset(str(frames_folder))


def all_batches(loader: Loader) -> list[dict[str, Any]]:
    out = [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in b.items()}
           for b in loader]
    loader.close()
    return out


def frame_rows(batches: list[dict[str, Any]]) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in row) for b in batches for row in b["index"]]


def test_every_window_once_per_epoch_never_across_groups(frames_ds: Dataset) -> None:
    windows = Windows(frames_ds, length=3, stride=2, label_keys=["labels"])
    expected = expected_windows(DAYS, length=3, stride=2)
    assert len(windows) == len(expected) == 5 + 2 + 0 + 3
    assert windows.excluded.group_end == sum(len(t) for t in DAYS.values()) - len(expected)
    loader = Loader(windows, batch_size=4, seed=3, num_threads=2)
    epochs = [frame_rows(all_batches(loader)) for _ in range(1)]
    loader = Loader(windows, batch_size=4, seed=3, num_threads=2)
    loader.set_epoch(1)
    epochs.append(frame_rows(all_batches(loader)))
    for rows in epochs:
        assert sorted(rows) == sorted(expected)  # each valid window exactly once
    assert epochs[0] != epochs[1]  # shuffled differently per epoch


def test_frames_share_group_stride_and_last_label(frames_ds: Dataset) -> None:
    windows = Windows(frames_ds, length=3, stride=2, max_gap_seconds=20)
    batches = all_batches(Loader(windows, batch_size=5, seed=1, num_threads=2))
    assert sum(len(b["day"]) for b in batches) == len(
        expected_windows(DAYS, length=3, stride=2, max_gap=20))
    for b in batches:
        assert all(len(frames) == 3 for frames in b["image/encoded"])  # no transform: bytes
        days, times = b["day"], b["timestamp"]
        assert days.shape[1:] == (3,) and times.shape[1:] == (3,)
        assert (days == days[:, :1]).all()  # never across a day
        assert np.allclose(np.diff(times, axis=1), 16.0)  # stride 2 of 8 s frames, no gap
        # labels="last": (B, 4), the last frame's; its time is the last frame time
        labels = b["labels"]
        assert labels.shape[1:] == (4,)
        assert np.array_equal(labels[:, 3], days[:, -1])
        last = labels[:, 0].astype(int)
        assert all(len(names) == 3 for names in b["image/filename"])
        for names, index in zip(b["image/filename"], last):
            day, t = names[-1].decode().removesuffix(".jpg").split("_")
            rows = [(d, float(s)) for d in sorted(DAYS) for s in DAYS[d]]
            assert rows[index] == (int(day[1:]), float(t))


def test_labels_all_stacks_every_frame(frames_ds: Dataset) -> None:
    windows = Windows(frames_ds, length=2, stride=1, labels="all")
    batch = next(iter(Loader(windows, batch_size=3, seed=0, num_threads=1)))
    assert batch["labels"].shape == (3, 2, 4)
    assert np.array_equal(batch["labels"][:, :, 0].astype(int), batch["index"])
    assert np.array_equal(batch["index"][:, 1] - batch["index"][:, 0], [1, 1, 1])


def test_time_based_windows_respect_spacing_and_gaps(frames_ds: Dataset) -> None:
    windows = Windows(frames_ds, length=3, stride_seconds=16, max_gap_seconds=30,
                      label_keys=["labels"])
    rows = frame_rows(all_batches(Loader(windows, batch_size=4, seed=5, num_threads=2)))
    expected = expected_windows(DAYS, length=3, stride=2, max_gap=30)
    assert sorted(rows) == sorted(expected)
    # day 1 has frames 0, 8, 16 | 64, 72, 80: no window spans the gap
    assert windows.excluded.total == sum(len(t) for t in DAYS.values()) - len(expected)
    assert windows.excluded.gap + windows.excluded.off_grid > 0


def test_all_frames_of_a_window_get_the_same_crop_and_flip(frames_ds: Dataset) -> None:
    windows = Windows(frames_ds, length=3, stride=1)
    loader = Loader(windows, batch_size=8, seed=11, num_threads=2,
                    transform=presets.train(size=24, scale=(0.1, 0.5)))
    flips = set()
    crops = set()
    for batch in loader:
        image = batch["image"].astype(np.int16)
        assert image.shape[1:] == (3, 24, 24, 3)
        for window in image:
            # R and G reveal where each output pixel came from: equal for all frames
            for f in (1, 2):
                assert np.abs(window[f, :, :, :2] - window[0, :, :, :2]).max() <= 6
            # B differs per frame: they are different frames
            assert abs(int(window[1, 12, 12, 2]) - int(window[0, 12, 12, 2])) > 10
            flips.add(bool(window[0, 12, 20, 0] < window[0, 12, 3, 0]))
            crops.add((int(window[0, 0, 0, 0]) // 8, int(window[0, 0, 0, 1]) // 8))
    loader.close()
    assert flips == {True, False}  # both flipped and unflipped windows were drawn
    assert len(crops) > 3  # and many different crops


def test_eval_reads_windows_in_stored_order(frames_ds: Dataset) -> None:
    windows = Windows(frames_ds, length=3, stride=2, label_keys=["labels"])
    rows = frame_rows(all_batches(Loader.for_eval(windows, batch_size=4, num_threads=2)))
    assert rows == [tuple(r) for r in windows.index.frames_many(np.arange(len(windows)))]
    assert rows == sorted(rows)


def test_ranks_split_the_windows(frames_ds: Dataset) -> None:
    windows = Windows(frames_ds, length=2, stride=1, label_keys=["labels"])
    parts = []
    for rank in range(2):
        loader = Loader(windows, batch_size=3, seed=2, rank=rank, world_size=2,
                        num_threads=1, drop_last=True)
        parts.append(frame_rows(all_batches(loader)))
    assert len(parts[0]) == len(parts[1])
    assert set(parts[0]).isdisjoint(parts[1])
    assert set(parts[0]) | set(parts[1]) <= expected_windows(DAYS, length=2, stride=1)


def test_thread_counts_and_processes_give_identical_windows(frames_ds: Dataset) -> None:
    def run(**options: Any) -> list[bytes]:
        loader = Loader(Windows(frames_ds, length=3, stride=1), batch_size=4, seed=8,
                        transform=presets.train(size=16), **options)
        return [b["image"].tobytes() + b["labels"].tobytes() for b in all_batches(loader)]

    reference = run(num_threads=1)
    assert run(num_threads=3) == reference
    assert run(num_threads=2, workers="processes") == reference


def test_state_carries_the_window_fingerprint(frames_ds: Dataset) -> None:
    loader = Loader(Windows(frames_ds, length=3, stride=2), batch_size=4, seed=0)
    state = json.loads(json.dumps(loader.state()))
    assert state["source"]["kind"] == "windows" and state["source"]["length"] == 3
    other = Loader(Windows(frames_ds, length=3, stride=1), batch_size=4, seed=0)
    with pytest.raises(StateError, match="stride=2"):
        other.restore(state)
    loader.close()
    other.close()


def test_dataset_without_groups_says_how_to_add_them(tmp_path: Path) -> None:
    folder = write_frames(tmp_path / "plain", index=False)
    with pytest.raises(SchemaError, match="--csv-group.*--group-key"):
        Windows(Dataset(str(folder)), length=3)


def test_time_options_need_order_keys(tmp_path: Path, frames_folder: Path) -> None:
    folder = write_frames(tmp_path / "groups-only", index=False)
    index_files(folder, group_key="day")
    ds = Dataset(str(folder))
    assert len(Windows(ds, length=2)) > 0  # record strides work with groups alone
    with pytest.raises(SchemaError, match="order keys"):
        Windows(ds, length=2, stride_seconds=8)


@pytest.mark.parametrize(("options", "error"), [
    ({"length": 0}, ValueError),
    ({"length": 3, "stride": 0}, ValueError),
    ({"length": 3, "labels": "first"}, ValueError),
    ({"length": 3, "label_keys": "labels"}, TypeError),
    ({"length": 3, "stride": 2, "stride_seconds": 16.0}, ValueError),
    ({"length": 2.5}, ValueError),
])
def test_bad_arguments_fail_at_construction(frames_ds: Dataset, options: dict[str, Any],
                                            error: type[Exception]) -> None:
    with pytest.raises(error):
        Windows(frames_ds, **options)


class _Keys(DataSourceBase):
    """A dataset stand-in with group and order sidecars only (plan needs no records)."""

    fingerprint = "stand-in"

    def __init__(self, groups: np.ndarray, order: np.ndarray) -> None:
        self.group_ids, self.order_keys = groups, order

    def __len__(self) -> int:
        return int(self.group_ids.size)

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        raise AssertionError("not read")

    def locate(self, i: int) -> tuple[str, int, int]:
        return ("x", i, 0)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    length=st.integers(1, 4),
    stride=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
def test_plan_covers_each_window_once_within_groups(sizes: list[int], length: int, stride: int,
                                                    seed: int) -> None:
    groups = np.repeat(np.arange(len(sizes)), sizes)
    order = np.concatenate([np.arange(n, dtype=np.float64) * 8 for n in sizes])
    windows = Windows(_Keys(groups, order), length=length, stride=stride)
    days = {g: list(order[groups == g]) for g in range(len(sizes))}
    expected = expected_windows(days, length=length, stride=stride)
    assert len(windows) == len(expected)
    from shardfeed.pipeline.samplers import EpochContext

    n = len(windows)
    ctx = EpochContext(seed, 0, EpochOrder(n, seed=seed, epoch=0, shuffle=True), n)
    plans = windows.plan(ctx, np.arange(n, dtype=np.int64)) if n else []
    assert sorted(tuple(p) for p in plans) == sorted(expected)
    for frames in plans:
        assert len(set(groups[list(frames)])) == 1
        assert all(b - a == stride for a, b in pairwise(frames))
