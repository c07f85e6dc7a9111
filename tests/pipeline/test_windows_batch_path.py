"""Windows on the batch path: a slice's frames read as columns and decoded straight into the
batch rows give the very batches of the sample-by-sample path (each window made from its
frames' samples), for every label mode, stride, preset and thread count; a damaged frame is
still named, or skipped exactly as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import assert_same_batches, collect
from test_windows import write_frames

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.windows import Windows
from shardfeed.tools.index import index_files
from shardfeed.transforms import Compose, DecodeImage, presets


def _sample_path(transform: Any) -> Any:
    """The same transform with no batch form (a plain function after it)."""
    if transform is None:
        return lambda sample: sample
    return Compose([transform, lambda sample, rng: sample])


def _pair(folder: Path, transform: Any, *, windows: dict[str, Any] | None = None,
          **options: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Batches of the batch path, of the sample path, and the windows the batch path's run
    made one by one."""
    options = {"batch_size": 4, "shuffle": True, "seed": 3, **options}
    made = 0
    original = Windows.make_sample

    def counting(self: Windows, *args: Any, **kwargs: Any) -> Any:
        nonlocal made
        made += 1
        return original(self, *args, **kwargs)

    w = windows or {"length": 3}
    Windows.make_sample = counting  # type: ignore[method-assign]
    try:
        fast = collect(Loader(Windows(Dataset(str(folder)), **w), transform=transform,
                              **options))
    finally:
        Windows.make_sample = original  # type: ignore[method-assign]
    slow = collect(Loader(Windows(Dataset(str(folder)), **w),
                          transform=_sample_path(transform), **options))
    return fast, slow, made


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("windows", [
    {"length": 3}, {"length": 2, "stride": 2}, {"length": 3, "labels": "all"},
    {"length": 3, "label_keys": ["labels", "image/filename"]},
])
def test_train_windows_are_the_sample_paths(tmp_path: Path, windows: dict[str, Any],
                                             threads: int) -> None:
    folder = write_frames(tmp_path / "frames")
    fast, slow, made = _pair(folder, presets.train(32), windows=windows, num_threads=threads)
    assert_same_batches(fast, slow)
    assert made <= 1  # one sample sizes the batch; every window was built from columns
    first = fast[0]
    assert first["image"].shape[:2] == (4, windows["length"])
    if windows.get("labels") == "all":
        assert first["labels"].shape == (4, windows["length"], 4)
    else:
        assert first["labels"].shape == (4, 4)  # the last frame's
        # the last frame's label, and the frames stacked in time order
        assert np.all(first["labels"][:, 3] == first["day"][:, -1])
    if "label_keys" in windows:  # a bytes label: the last frame's name
        assert all(isinstance(name, bytes) for name in first["image/filename"])
    else:
        assert all(len(names) == windows["length"] for names in first["image/filename"])


@pytest.mark.parametrize("transform", [presets.eval(32), DecodeImage(channels="rgb"), None],
                         ids=["eval", "decode", "none"])
def test_other_transforms_are_the_sample_paths(tmp_path: Path, transform: Any) -> None:
    folder = write_frames(tmp_path / "frames")
    fast, slow, made = _pair(folder, transform)
    assert_same_batches(fast, slow)
    assert made <= 1


def test_frames_of_one_window_share_the_crop(tmp_path: Path) -> None:
    """One generator a window: every frame of a window has the same crop and flip (R and G
    of the frames encode where a pixel came from; B the frame)."""
    folder = write_frames(tmp_path / "frames")
    fast, _, _ = _pair(folder, presets.train(32))
    for batch in fast:
        images = batch["image"].astype(np.int16)
        spread = np.abs(images[:, 1:, :, :, :2] - images[:, :1, :, :, :2]).max()
        assert spread <= 8  # JPEG noise only: the same box in every frame


def _damage(folder: Path, record: int) -> None:
    """Rewrite the shards with record ``record``'s JPEG cut short (a decode error)."""
    ds = Dataset(str(folder))
    shards: dict[str, list[dict[str, Any]]] = {}
    for i in range(len(ds)):
        values = dict(ds[i])
        if i == record:
            values["image/encoded"] = values["image/encoded"][:200]
        shards.setdefault(ds.locate(i)[0], []).append(values)
    for path, records in shards.items():
        with ShardWriter(path) as writer:
            for values in records:
                writer.write_example(values)


def test_a_damaged_frame_is_named_or_skipped_as_before(tmp_path: Path) -> None:
    folder = write_frames(tmp_path / "frames", index=False)
    _damage(folder, 5)
    index_files(folder, group_key="day", order_key="timestamp")
    with pytest.raises(DecodeError) as raised:
        collect(Loader(Windows(Dataset(str(folder)), length=3), batch_size=4,
                       transform=presets.train(32), shuffle=True, seed=1))
    assert "frames-00.tfrecord" in str(raised.value)
    fast, slow, _ = _pair(folder, presets.train(32), on_error="skip", max_skipped=8)
    assert_same_batches(fast, slow)


@pytest.mark.parametrize("transform", [None, presets.train(32)], ids=["none", "train"])
def test_windows_of_one_frame_are_the_sample_paths(tmp_path: Path, transform: Any) -> None:
    """A window of one frame is still a window: its bytes features a list of one value."""
    folder = write_frames(tmp_path / "frames")
    fast, slow, made = _pair(folder, transform, windows={"length": 1})
    assert_same_batches(fast, slow)
    assert made <= 1
    assert all(len(names) == 1 for names in fast[0]["image/filename"])
