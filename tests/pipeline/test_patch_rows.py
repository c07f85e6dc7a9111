"""Patches without a transform on the batch path (a slice's crops drawn in one call and cut
straight into the batch rows, the other features stored a column at a time): the very
batches of the sample-by-sample path, for every crop option, thread count and pick, with and
without the cache; a bad image is still named or skipped as before; the compiled draws agree
with NumPy's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import assert_same_batches, collect
from test_patches import write_photos

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.pipeline import Loader, patch_crops
from shardfeed.pipeline.patch_crops import (
    PatchOptions,
    compiled_patch_draws_agree,
    draw_patch_box,
    patch_boxes,
)
from shardfeed.sampling.keys import PATCH_CROP, sample_rng
from shardfeed.transforms import Compose, RandomHorizontalFlip


def _pair(folder: Path, patches: dict[str, Any], transform: Any = None, **options: Any
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Batches of the batch path, of the sample path (``transform`` behind a plain
    function), and the patches the batch path's run cut one by one."""
    from shardfeed.pipeline.patches import Patches

    options = {"batch_size": 8, "shuffle": True, "seed": 5, **options}
    cut = 0
    original = patch_crops.cut_patch

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal cut
        cut += 1
        return original(*args, **kwargs)

    import shardfeed.pipeline.patches as module

    module.cut_patch = counting  # type: ignore[assignment]
    try:
        fast = collect(Loader(Patches(Dataset(str(folder)), **patches), transform=transform,
                              **options))
    finally:
        module.cut_patch = original  # type: ignore[assignment]
    plain: Any = (lambda sample: sample) if transform is None else Compose(
        [transform, lambda sample, rng: sample])
    slow = collect(Loader(Patches(Dataset(str(folder)), **patches), transform=plain,
                          **options))
    return fast, slow, cut


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_photos(tmp_path_factory.mktemp("jpegs"), 12, masks=False, jpeg_size=(70, 90))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("patches", [
    {"size": 16, "cache_images": 3, "refresh_every": 5},
    {"size": (12, 20), "scale": (0.5, 3.0), "cache_images": 4, "refresh_every": 3},
    {"size": 8, "scale": (2.0, 4.5), "cache_images": 2, "refresh_every": 4},  # 1/2 decode
    {"size": 100, "cache_images": 2, "refresh_every": 3},  # larger than the images: padded
    {"size": 16, "cache_images": 3, "refresh_every": 5, "pick": "uniform"},
    {"size": 16, "cache_images": 3, "refresh_every": 5, "cache": False},
    # a block of 8 outputs within a refresh: each output of a slice its own image
    {"size": 16, "cache_images": 8, "refresh_every": 16},
])
def test_rows_are_the_sample_paths(jpegs: Path, patches: dict[str, Any], threads: int) -> None:
    fast, slow, cut = _pair(jpegs, patches, num_threads=threads)
    assert_same_batches(fast, slow)
    assert cut <= 1  # one sample sizes the batch; every other patch was cut in rows
    assert len(fast) > 2
    size = patches["size"]
    h, w = (size, size) if isinstance(size, int) else size
    assert fast[0]["image"].shape == (8, h, w, 3)
    # the features of the patch's own record: its box lies in that image
    for batch in fast:
        assert batch["patch/record"].tolist() == batch["index"].tolist()
        y, x, bh, bw = batch["patch/box"].T
        assert np.all((y >= 0) & (x >= 0) & (y + bh <= 70) & (x + bw <= 90))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("p", [0.5, 1.0])
def test_a_flip_after_the_cut_is_the_sample_paths(jpegs: Path, p: float, threads: int) -> None:
    """The docs' Patches recipe (a random flip as the transform) takes the rows path too."""
    patches = {"size": 16, "cache_images": 3, "refresh_every": 5}
    fast, slow, cut = _pair(jpegs, patches, RandomHorizontalFlip(p), num_threads=threads)
    assert_same_batches(fast, slow)
    assert cut <= 1
    unflipped, _, _ = _pair(jpegs, patches, num_threads=threads)
    changed = sum(not np.array_equal(a["image"][i], b["image"][i])
                  for a, b in zip(fast, unflipped) for i in range(len(a["image"])))
    total = sum(len(a["image"]) for a in fast)
    assert (changed == total) if p == 1.0 else (0 < changed < total)


def test_masks_and_lossless_images_are_the_sample_paths(tmp_path: Path) -> None:
    folder = write_photos(tmp_path / "png", 8)  # PNG images with masks: the sample path
    fast, slow, _ = _pair(folder, {"size": 16, "cache_images": 2, "refresh_every": 3})
    assert_same_batches(fast, slow)
    assert "mask" in fast[0]


def test_a_bad_image_is_named_or_skipped_as_before(tmp_path: Path) -> None:
    folder = write_photos(tmp_path / "bad", 6, masks=False, jpeg_size=(40, 50), bad=(2,))
    from shardfeed.pipeline.patches import Patches

    with pytest.raises(DecodeError, match=r"photos-00\.tfrecord', record 2"):
        collect(Loader(Patches(Dataset(str(folder)), size=8, cache_images=2, refresh_every=3),
                       batch_size=4, seed=1, num_threads=2))
    fast, slow, _ = _pair(folder, {"size": 8, "cache_images": 2, "refresh_every": 3},
                          on_error="skip", max_skipped=100, batch_size=4)
    assert_same_batches(fast, slow)
    assert 2 not in {int(i) for b in fast for i in b["index"]}


@pytest.mark.parametrize("options", [
    PatchOptions(size=32), PatchOptions(size=(5, 9), scale=(0.25, 7.0)),
    PatchOptions(size=64, scale=(4.0, 8.0)),
])
def test_batch_draws_are_numpys(options: PatchOptions) -> None:
    assert compiled_patch_draws_agree()  # the build here has them, and they agree
    rng = np.random.default_rng(3)
    heights = rng.integers(1, 2000, 300)
    widths = rng.integers(1, 2000, 300)
    positions = rng.integers(0, 2**40, 300)
    boxes = patch_boxes(17, 2, positions, heights, widths, options)
    for row in range(300):
        expected = draw_patch_box(sample_rng(17, 2, int(positions[row]), PATCH_CROP),
                                  int(heights[row]), int(widths[row]), options)
        assert tuple(boxes[row].tolist()) == expected


def test_one_image_is_held_at_a_time_without_a_cache(jpegs: Path) -> None:
    """Without a cache every output decodes an image of its own: the rows path holds one of
    them at a time, as the sample path does (not a slice's worth)."""
    import weakref

    from shardfeed.pipeline.patches import Patches

    source = Patches(Dataset(str(jpegs)), size=16, cache_images=3, refresh_every=5,
                     cache=False)
    alive: list[weakref.ref[Any]] = []
    most = 0
    load = source._load

    def watched(rid: int, record: Any) -> Any:
        nonlocal most
        held = sum(ref() is not None for ref in alive)
        most = max(most, held)
        made = load(rid, record)
        alive.append(weakref.ref(made[0].image))  # the decoded pixels
        return made

    source._load = watched  # type: ignore[method-assign]
    collect(Loader(source, batch_size=16, seed=1, num_threads=1))
    assert most <= 1


def test_a_failing_batch_form_falls_back_to_the_sample_path(jpegs: Path) -> None:
    """A bug in a transform's batch form does not stop the loader: the slice is made
    sample by sample, which gives the transform's own outputs."""

    class Flaky(RandomHorizontalFlip):
        def apply_batch(self, *args: Any, **kwargs: Any) -> Any:
            raise KeyError("a bug in the batch form")

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

    from shardfeed.pipeline.patches import Patches

    patches = {"size": 16, "cache_images": 3, "refresh_every": 5}
    got = collect(Loader(Patches(Dataset(str(jpegs)), **patches), transform=Flaky(),
                         batch_size=8, seed=5, shuffle=True))
    want = collect(Loader(Patches(Dataset(str(jpegs)), **patches),
                          transform=Compose([RandomHorizontalFlip(),
                                             lambda sample, rng: sample]),
                          batch_size=8, seed=5, shuffle=True))
    assert_same_batches(got, want)


def test_rows_are_the_sample_paths_when_the_records_kinds_are_not_shared(
        jpegs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the kinds kept, records alike are compared value by value again: the same
    batches, still cut in rows."""
    from shardfeed.transforms.decode import patches as decode_patches

    patches = {"size": 16, "cache_images": 3, "refresh_every": 5}
    before, _, _ = _pair(jpegs, patches, num_threads=2)
    monkeypatch.setattr(decode_patches, "_KINDS_KEPT", 0)
    monkeypatch.setattr(decode_patches, "_KINDS", {})
    fast, slow, cut = _pair(jpegs, patches, num_threads=2)
    assert_same_batches(fast, slow)
    assert_same_batches(fast, before)
    assert cut <= 1


def test_records_whose_features_differ_are_not_stacked_alike(tmp_path: Path) -> None:
    """A record whose label has another length than the others' (the batch holds the labels
    as a list): the batches of the sample path, the odd label among them."""
    import simplejpeg

    from shardfeed.format.writer import ShardWriter

    with ShardWriter(str(tmp_path / "odd.tfrecord")) as writer:
        for i in range(6):
            pixels = np.full((40, 50, 3), 20 * i, np.uint8)
            writer.write_example({"image/encoded": simplejpeg.encode_jpeg(pixels),
                                  "label": [i, i] if i == 4 else [i]})
    patches = {"size": 8, "cache_images": 3, "refresh_every": 4}
    fast, slow, _ = _pair(tmp_path, patches, batch_size=16)
    labels = [[label.tolist() for label in batch.pop("label")] for batch in fast]
    assert labels == [[label.tolist() for label in batch.pop("label")] for batch in slow]
    assert_same_batches(fast, slow)
    assert [4, 4] in labels[0] and [3] in labels[0]


def test_a_transform_that_changes_a_feature_in_place_changes_its_own_patch_only(
        jpegs: Path) -> None:
    """The cached record's arrays are not the sample's: a transform adding to its label in
    place (on the sample path) leaves the next patches of the same image as they were, and
    their features as alike as before."""
    from shardfeed.pipeline.patches import Patches

    def bump(sample: dict[str, Any]) -> dict[str, Any]:
        sample["label"] += 100
        sample["index"].shape = ()  # a view's shape, set in place
        return sample

    patches = {"size": 16, "cache_images": 3, "refresh_every": 5}
    options = {"batch_size": 8, "shuffle": True, "seed": 5}
    plain = collect(Loader(Patches(Dataset(str(jpegs)), **patches), **options))
    bumped = collect(Loader(Patches(Dataset(str(jpegs)), **patches), transform=bump,
                            **options))
    assert len(bumped) == len(plain) > 2
    for a, b in zip(plain, bumped):
        np.testing.assert_array_equal(np.asarray(b["label"]).ravel(),
                                      np.asarray(a["label"]).ravel() + 100)
        np.testing.assert_array_equal(np.asarray(b["index"]).ravel(),
                                      np.asarray(a["index"]).ravel())
