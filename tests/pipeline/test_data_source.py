"""A user's own input format: a few lines implementing shardfeed.DataSource over in-memory
arrays get the Loader's exact shuffle, Windows, thread-count independence and resume."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import simplejpeg

import shardfeed
from shardfeed.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop

RECORDS = 23
DAYS = np.repeat(np.arange(3), [8, 7, 8]).astype(np.int64)


class Arrays(shardfeed.DataSourceBase):
    """Images and labels held in memory, as a user would write it (docs/extending.md)."""

    def __init__(self, images: list[np.ndarray], labels: list[int]) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [{"image": self.images[i], "label": self.labels[i]} for i in indices]

    @property
    def fingerprint(self) -> str:
        digest = hashlib.blake2b(b"".join(a.tobytes() for a in self.images), digest_size=8)
        return f"arrays:{digest.hexdigest()}"


def make_arrays(*, days: bool = False) -> Arrays:
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (12, 10, 3), dtype=np.uint8) for _ in range(RECORDS)]
    data = Arrays(images, list(range(RECORDS)))
    if days:
        data.group_ids = DAYS
    return data


def augment() -> Compose:
    return Compose([RandomResizedCrop(6, scale=(0.3, 1.0)), RandomHorizontalFlip()])


def run(loader: shardfeed.Loader, batches: int | None = None) -> list[dict[str, Any]]:
    out = []
    for batch in loader:
        out.append({k: np.array(v) for k, v in batch.items()})
        if batches is not None and len(out) == batches:
            break
    return out


def labels_of(batches: list[dict[str, Any]]) -> list[int]:
    return [int(x) for b in batches for x in b["label"]]


def test_exact_shuffle_gives_every_record_once_an_epoch() -> None:
    data = make_arrays()
    loader = shardfeed.Loader(data, batch_size=5, shuffle=True, seed=3, num_threads=2)
    first = run(loader)
    second = run(loader)  # the next epoch
    assert sorted(labels_of(first)) == list(range(RECORDS))
    assert sorted(labels_of(second)) == list(range(RECORDS))
    assert labels_of(first) != labels_of(second) != list(range(RECORDS))
    for batch in first:  # each sample is the record its label names, untouched
        for image, label in zip(batch["image"], batch["label"]):
            assert np.array_equal(image, data.images[int(label)])


@pytest.mark.parametrize("windows", [False, True], ids=["records", "windows"])
def test_one_two_four_threads_give_identical_bytes(windows: bool) -> None:
    def make(num_threads: int) -> shardfeed.Loader:
        data: Any = make_arrays(days=windows)
        if windows:
            data = shardfeed.Windows(data, length=3, stride=2)
        return shardfeed.Loader(data, batch_size=4, shuffle=True, seed=11, transform=augment(),
                                num_threads=num_threads)

    reference = run(make(1))
    assert reference[0]["image"].shape == ((4, 3, 6, 6, 3) if windows else (4, 6, 6, 3))
    for num_threads in (2, 4):
        batches = run(make(num_threads))
        assert len(batches) == len(reference)
        for got, want in zip(batches, reference):
            assert got.keys() == want.keys()
            for key in want:
                assert got[key].tobytes() == want[key].tobytes(), (num_threads, key)


def test_windows_stay_within_groups_and_cover_each_window_once() -> None:
    data = make_arrays(days=True)
    windows = shardfeed.Windows(data, length=3, stride=2)
    # days of 8, 7 and 8 records: 4 + 3 + 4 windows of frames (r, r+2, r+4)
    assert len(windows) == 11
    loader = shardfeed.Loader(windows, batch_size=4, shuffle=True, seed=5, num_threads=2)
    starts = []
    for batch in run(loader):
        for frames, label in zip(batch["image"], batch["label"]):
            rids = [_record_of(data, frame) for frame in frames]
            assert rids == [rids[0], rids[0] + 2, rids[0] + 4]
            assert len({int(DAYS[r]) for r in rids}) == 1  # never across a day
            assert int(label) == rids[-1]  # the last frame's label
            starts.append(rids[0])
    assert sorted(starts) == [0, 1, 2, 3, 8, 9, 10, 15, 16, 17, 18]


def _record_of(data: Arrays, frame: np.ndarray) -> int:
    return next(i for i, image in enumerate(data.images) if np.array_equal(image, frame))


@pytest.mark.parametrize("windows", [False, True], ids=["records", "windows"])
def test_state_restores_the_exact_stream_on_other_threads(windows: bool) -> None:
    def make(num_threads: int) -> shardfeed.Loader:
        data: Any = make_arrays(days=windows)
        if windows:
            data = shardfeed.Windows(data, length=3, stride=2)
        return shardfeed.Loader(data, batch_size=3, shuffle=True, seed=2, transform=augment(),
                                num_threads=num_threads)

    reference = make(2)
    whole = run(reference) + run(reference)  # two epochs
    interrupted = make(4)
    head = run(interrupted, batches=2)
    state = json.loads(json.dumps(interrupted.state()))
    resumed = make(1)
    resumed.restore(state)
    rest = run(resumed) + run(resumed)
    assert len(head) + len(rest) == len(whole)
    for got, want in zip(head + rest, whole):
        for key in want:
            assert got[key].tobytes() == want[key].tobytes()


def test_a_state_is_refused_on_other_arrays() -> None:
    loader = shardfeed.Loader(make_arrays(), batch_size=4, seed=0)
    run(loader, batches=1)
    state = loader.state()
    other = make_arrays()
    other.images[0] = other.images[0] ^ np.uint8(1)  # the data changed: its fingerprint too
    with pytest.raises(shardfeed.StateError, match="dataset"):
        shardfeed.Loader(other, batch_size=4, seed=0).restore(state)


class Jpegs(shardfeed.DataSourceBase):
    """Encoded JPEGs in memory: what Patches decodes itself (under the standard name)."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __len__(self) -> int:
        return len(self.blobs)

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [{"image/encoded": self.blobs[i], "label": i} for i in indices]

    @property
    def fingerprint(self) -> str:
        return f"jpegs:{hashlib.blake2b(b''.join(self.blobs), digest_size=8).hexdigest()}"


def test_patches_over_a_data_source_of_jpegs_resume_on_other_threads() -> None:
    rng = np.random.default_rng(3)
    blobs = [simplejpeg.encode_jpeg(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
             for _ in range(9)]

    def make(num_threads: int) -> shardfeed.Loader:
        patches = shardfeed.Patches(Jpegs(blobs), size=8, cache_images=3, refresh_every=4)
        return shardfeed.Loader(patches, batch_size=5, seed=4, num_threads=num_threads)

    whole = run(make(1))
    assert sum(len(b["label"]) for b in whole) == (9 - 3 + 1) * 4
    assert whole[0]["image"].shape == (5, 8, 8, 3)
    interrupted = make(4)
    head = run(interrupted, batches=2)
    resumed = make(2)
    resumed.restore(json.loads(json.dumps(interrupted.state())))
    rest = run(resumed)
    assert len(head) + len(rest) == len(whole)
    for got, want in zip(head + rest, whole):
        for key in want:
            assert got[key].tobytes() == want[key].tobytes()


class _NoGroups:
    """Every member but group_ids (and so not a DataSource)."""

    fingerprint = "x"
    schema = root = order_keys = group_key = order_key = None

    def __len__(self) -> int:
        return 1

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [{"label": 0} for _ in indices]

    def locate(self, index: int) -> tuple[str, int, int]:
        return ("x", index, 0)


def test_a_missing_member_fails_at_construction_naming_it() -> None:
    with pytest.raises(TypeError, match="_NoGroups has no group_ids"):
        shardfeed.Loader(_NoGroups(), batch_size=1)
    with pytest.raises(TypeError, match="_NoGroups has no group_ids"):
        shardfeed.Windows(_NoGroups(), length=2)
    with pytest.raises(TypeError, match="has no read_many"):
        shardfeed.Loader([1, 2, 3], batch_size=2)

    class Forgetful(shardfeed.DataSourceBase):
        def __len__(self) -> int:
            return 0

        def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
            return []

    with pytest.raises(TypeError, match="fingerprint"):
        Forgetful()  # type: ignore[abstract]
