"""Windows and Patches states: restored only on the same data and options, else StateError.

The user's steps each time: save from a Loader over source A, restore into a Loader over a
source B built differently. Options that change no sample (cache, threads) may differ.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from test_patches import write_photos
from test_windows import frame_image

from shardfeed import Dataset, Loader
from shardfeed.errors import StateError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline.patches import Patches
from shardfeed.pipeline.windows import Windows
from shardfeed.tools.index import index_files


def saved_after(loader: Loader, batches: int) -> dict[str, Any]:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return json.loads(json.dumps(loader.state()))


def write_cameras(folder: Path) -> Path:
    """12 frames 8 s apart, with two groupings: ``day`` (6 + 6) and ``camera`` (5 + 7)."""
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "frames-00.tfrecord")) as writer:
        for i in range(12):
            writer.write_example({
                "image/encoded": simplejpeg.encode_jpeg(frame_image(i), quality=90),
                "index": [i], "day": [i // 6], "camera": [0 if i < 5 else 1],
                "timestamp": [8.0 * i],
            })
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("restore-sources")
    by_day = write_cameras(root / "by-day")
    by_camera = root / "by-camera"
    shutil.copytree(by_day, by_camera)  # the same shard, bytes for bytes
    index_files(str(by_day), group_key="day", order_key="timestamp")
    index_files(str(by_camera), group_key="camera", order_key="timestamp")
    photos = write_photos(root / "photos", 10)
    # as many images under the same shard names, stored as JPEG: other records
    others = write_photos(root / "others", 10, jpeg_size=(80, 96))
    return {"by_day": by_day, "by_camera": by_camera, "photos": photos, "others": others}


# -- Windows -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("saved", "restored", "words"), [
    ({"length": 3}, {"length": 2}, "['length'] is 3, but this loader's Windows has length=2"),
    ({"length": 2, "stride": 1}, {"length": 2, "stride": 2},
     "construct Windows with stride=1"),
    ({"length": 2, "labels": "last"}, {"length": 2, "labels": "all"},
     "construct Windows with labels='last'"),
    ({"length": 2, "label_keys": ["index"]}, {"length": 2},
     "construct Windows with label_keys=('index',)"),
])
def test_windows_with_other_options_are_refused(data: dict[str, Path], saved: dict[str, Any],
                                                restored: dict[str, Any], words: str) -> None:
    ds = Dataset(str(data["by_day"]))
    state = saved_after(Loader(Windows(ds, **saved), batch_size=2, seed=0), 1)
    other = Loader(Windows(ds, **restored), batch_size=2, seed=0)
    with pytest.raises(StateError) as info:
        other.restore(state)
    assert words in str(info.value)


def test_windows_over_other_groups_of_the_same_shards_are_refused(
    data: dict[str, Path]
) -> None:
    """Same records, as many windows (5 + 5 and 4 + 6), other frames: the index differs."""
    by_day = Windows(Dataset(str(data["by_day"])), length=2)
    by_camera = Windows(Dataset(str(data["by_camera"])), length=2)
    assert len(by_day) == len(by_camera) == 10
    state = saved_after(Loader(by_day, batch_size=2, seed=0), 2)
    assert state["source"]["dataset"] == by_camera.state()["dataset"]  # same shard
    with pytest.raises(StateError, match=r"\['index'\] is '[0-9a-f]+', .*group ids or order keys"):
        Loader(by_camera, batch_size=2, seed=0).restore(state)


def test_windows_resume_with_other_threads(data: dict[str, Path]) -> None:
    ds = Dataset(str(data["by_day"]))

    def frames(loader: Loader) -> list[list[int]]:
        return [row for batch in loader for row in batch["index"].tolist()]

    whole = frames(Loader(Windows(ds, length=3), batch_size=2, seed=4))
    state = saved_after(Loader(Windows(ds, length=3), batch_size=2, seed=4, num_threads=3), 2)
    resumed = Loader(Windows(ds, length=3), batch_size=3, seed=4, num_threads=1)
    resumed.restore(state)
    assert frames(resumed) == whole[4:]


# -- Patches -----------------------------------------------------------------------------------

BASE: dict[str, Any] = {"size": 8, "cache_images": 3, "refresh_every": 4}


@pytest.mark.parametrize(("restored", "words"), [
    ({"cache_images": 4}, "['cache_images'] is 3, but this loader's Patches has cache_images=4"),
    ({"refresh_every": 5}, "construct Patches with refresh_every=4"),
    ({"size": 9}, "construct Patches with size=(8, 8)"),
    ({"scale": (0.5, 1.0)}, "construct Patches with scale=None"),
    ({"pick": "uniform"}, "construct Patches with pick='stratified'"),
])
def test_patches_with_other_options_are_refused(data: dict[str, Path], restored: dict[str, Any],
                                                words: str) -> None:
    ds = Dataset(str(data["photos"]))
    state = saved_after(Loader(Patches(ds, **BASE), batch_size=4, seed=0), 2)
    other = Loader(Patches(ds, **{**BASE, **restored}), batch_size=4, seed=0)
    with pytest.raises(StateError) as info:
        other.restore(state)
    assert words in str(info.value)


def test_patches_of_other_images_are_refused(data: dict[str, Path]) -> None:
    mine, others = Dataset(str(data["photos"])), Dataset(str(data["others"]))
    assert len(mine) == len(others) == 10
    state = saved_after(Loader(Patches(mine, **BASE), batch_size=4, seed=0), 1)
    with pytest.raises(StateError, match=r"\['dataset'\] is 'files:"):
        Loader(Patches(others, **BASE), batch_size=4, seed=0).restore(state)


def test_patches_resume_without_the_cache_and_with_other_threads(data: dict[str, Path]) -> None:
    ds = Dataset(str(data["photos"]))

    def boxes(loader: Loader) -> list[bytes]:
        return [batch["image"].tobytes() for batch in loader]

    whole = boxes(Loader(Patches(ds, **BASE), batch_size=4, seed=5))
    state = saved_after(Loader(Patches(ds, **BASE), batch_size=4, seed=5, num_threads=3), 3)
    resumed = Loader(Patches(ds, **BASE, cache=False, mask=False), batch_size=4, seed=5,
                     num_threads=1, prefetch_batches=1)
    resumed.restore(state)
    assert boxes(resumed) == whole[3:]


# -- a cache larger than the dataset ---------------------------------------------------------


def test_a_cache_larger_than_the_dataset_is_refused(data: dict[str, Path]) -> None:
    """cache_images=64 over 10 images gave an epoch of refresh_every=5 patches, silently."""
    ds = Dataset(str(data["photos"]))
    with pytest.raises(ValueError) as info:
        Patches(ds, size=8, cache_images=64, refresh_every=5)
    message = str(info.value)
    assert "cache_images=64 is more than the 10 images" in message
    assert "only refresh_every=5 patches" in message
    assert "pass cache_images=10 or fewer" in message and "cache_images=5 gives 30" in message
    # the fix it gives: an epoch of (10 - 5 + 1) * 5 patches
    fixed = Loader(Patches(ds, size=8, cache_images=5, refresh_every=5), batch_size=6)
    assert sum(len(batch["image"]) for batch in fixed) == 30
    whole = Patches(ds, size=8, cache_images=10, refresh_every=5)  # every image: allowed
    assert len(whole) == 5
    np.testing.assert_equal(len(Patches(ds, size=8, cache_images=1, refresh_every=5)), 50)
