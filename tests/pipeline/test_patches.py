"""Patches through the Loader: exact crops in bounds, masks aligned, identical for any thread
count, with or without the cache, many images per batch, each image decoded once per
residency, and a cache that never exceeds its byte bound."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.dataset import Dataset, DataSourceBase
from shardfeed.errors import DecodeError, StateError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.patches import LOOK_AHEAD_IMAGES, Patches
from shardfeed.sampling.patches import PatchSchedule
from shardfeed.transforms import RandomHorizontalFlip

HEIGHT, WIDTH = 80, 96


def photo(index: int, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """R = x, G = y (where a patch came from), B = 20 * index (which image)."""
    y, x = np.mgrid[0:height, 0:width]
    blue = np.full_like(x, 20 * index)
    return np.stack([x % 256, y % 256, blue], axis=-1).astype(np.uint8)


def png(pixels: np.ndarray) -> bytes:
    bgr = pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    ok, data = cv2.imencode(".png", bgr)
    assert ok
    return data.tobytes()


def write_photos(folder: Path, count: int = 12, *, shards: int = 2, masks: bool = True,
                 jpeg_size: tuple[int, int] | None = None, bad: Sequence[int] = ()) -> Path:
    """``count`` images (lossless PNG, or JPEG of ``jpeg_size``) with masks = the x coordinate."""
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, count, shards + 1).astype(int)
    for s in range(shards):
        with ShardWriter(str(folder / f"photos-{s:02d}.tfrecord")) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                if jpeg_size is None:
                    pixels = photo(i)
                    encoded = png(pixels)
                else:
                    pixels = photo(i, *jpeg_size)
                    encoded = simplejpeg.encode_jpeg(pixels, quality=95)
                features: dict[str, Any] = {
                    "image/encoded": b"not an image" if i in bad else encoded,
                    "image/height": [pixels.shape[0]],
                    "image/width": [pixels.shape[1]],
                    "index": [i],
                    "label": [i % 3],
                }
                if masks:
                    features["mask/encoded"] = png(np.ascontiguousarray(pixels[:, :, 0]))
                writer.write_example(features)
    return folder


@pytest.fixture(scope="module")
def photos_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_photos(tmp_path_factory.mktemp("photos"))


@pytest.fixture()
def photos(photos_folder: Path) -> Dataset:
    return Dataset(str(photos_folder))


def run(source: Patches, **options: Any) -> list[dict[str, Any]]:
    options.setdefault("batch_size", 8)
    options.setdefault("seed", 4)
    loader = Loader(source, **options)
    out = [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in b.items()}
           for b in loader]
    loader.close()
    return out


def fingerprint(batches: list[dict[str, Any]]) -> list[bytes]:
    return [b"".join(b[k].tobytes() for k in ("image", "mask", "patch/box", "index"))
            for b in batches]


def test_epoch_length_is_the_closed_form(photos: Dataset) -> None:
    patches = Patches(photos, size=16, cache_images=4, refresh_every=5)
    assert len(patches) == (12 - 4 + 1) * 5
    batches = run(patches, batch_size=7, num_threads=2)
    assert sum(len(b["index"]) for b in batches) == len(patches)
    used = {int(i) for b in batches for i in b["index"]}
    assert used == set(range(12))  # every image is cut from in an epoch


def test_patches_are_exact_crops_in_bounds_with_aligned_masks(photos: Dataset) -> None:
    patches = Patches(photos, size=(16, 24), cache_images=4, refresh_every=6)
    for batch in run(patches, num_threads=2):
        assert batch["image"].shape[1:] == (16, 24, 3) and batch["mask"].shape[1:] == (16, 24)
        for image, mask, box, record, index in zip(
            batch["image"], batch["mask"], batch["patch/box"], batch["patch/record"],
            batch["index"],
        ):
            y, x, h, w = (int(v) for v in box)
            assert (h, w) == (16, 24)
            assert 0 <= y and y + h <= HEIGHT and 0 <= x and x + w <= WIDTH
            assert record == index
            assert np.array_equal(image, photo(int(index))[y : y + h, x : x + w])
            assert np.array_equal(mask, image[:, :, 0])  # same box, same pixels


def test_images_smaller_than_the_patch_are_padded(photos: Dataset) -> None:
    patches = Patches(photos, size=(90, 32), cache_images=2, refresh_every=2)
    batch = run(patches, batch_size=4, num_threads=1)[0]
    assert batch["image"].shape == (4, 90, 32, 3)
    assert (batch["patch/box"][:, 2] == HEIGHT).all()
    assert not batch["image"][:, HEIGHT:].any()  # zero rows below the image


def test_outputs_identical_for_threads_processes_and_without_cache(photos: Dataset) -> None:
    def make(**options: Any) -> Patches:
        return Patches(photos, size=12, scale=(0.5, 2.0), cache_images=4, refresh_every=7,
                       **options)

    flip = RandomHorizontalFlip()
    reference = fingerprint(run(make(), num_threads=1, transform=flip))
    assert len(reference) > 5
    for threads in (2, 4):
        assert fingerprint(run(make(), num_threads=threads, transform=flip)) == reference
    assert fingerprint(run(make(cache=False), num_threads=2, transform=flip)) == reference
    tiny = make(cache_bytes=1)  # nothing fits: every patch decodes
    assert fingerprint(run(tiny, num_threads=3, transform=flip)) == reference
    assert fingerprint(run(make(), num_threads=2, transform=flip, workers="processes")) == (
        reference
    )


def test_batches_draw_on_many_images(photos: Dataset) -> None:
    def distinct(pick: str, batch_size: int) -> float:
        patches = Patches(photos, size=8, cache_images=8, refresh_every=20, pick=pick)
        batches = run(patches, batch_size=batch_size, num_threads=2, drop_last=True)
        return float(np.mean([len(set(b["index"].tolist())) for b in batches]))

    assert distinct("stratified", 8) >= 7.5  # B <= N: nearly every patch from another image
    assert distinct("uniform", 8) < distinct("stratified", 8)
    assert distinct("stratified", 16) >= 7.5  # B > N: about N images


def test_cache_is_bounded_and_decodes_each_image_once_per_residency(photos: Dataset) -> None:
    # one thread: 2 batches of 8 in flight span 16 outputs, and with R = 12 at most N + 2
    # images are needed (the max(2, N // 8) always there); 4 threads build 4 batches at once,
    # 32 outputs, and the cache grows to hold N + 3
    for threads, ahead in ((1, 2), (4, 3)):
        patches = Patches(photos, size=8, cache_images=3, refresh_every=12)
        used = {int(i) for b in run(patches, num_threads=threads) for i in b["index"]}
        stats = patches.cache_stats()
        assert stats is not None and stats.max_bytes is not None
        assert stats.loads == len(used) == 12, f"{threads} threads"
        image_bytes = HEIGHT * WIDTH * 3 + HEIGHT * WIDTH  # image + mask (+ a little meta)
        # N + ahead for the threads, + LOOK_AHEAD_IMAGES for the decodes ahead of the slices
        images = 3 + ahead + LOOK_AHEAD_IMAGES
        assert images * image_bytes <= stats.max_bytes <= images * (image_bytes + 1024)
        assert stats.peak_bytes <= stats.max_bytes
        assert stats.evictions > 0 or images >= 12
    small = Patches(photos, size=8, cache_images=4, refresh_every=4, cache_bytes=60_000)
    run(small, num_threads=3)
    stats = small.cache_stats()
    assert stats is not None and 0 < stats.peak_bytes <= 60_000
    assert stats.loads > 12  # fewer images fit than are resident: re-decodes, same outputs


@pytest.mark.parametrize("jpeg", [True, False])
def test_worker_processes_decode_and_the_parent_only_plans(tmp_path: Path, jpeg: bool) -> None:
    """With ``workers="processes"`` each process reads and decodes its images in a cache of
    its own: the parent plans the slices and decodes only the first sample's image (the
    batch layout), where it used to decode every image once more for nothing; the patches
    are those of threads, and the same sampler then decodes ahead again for a threads
    loader. JPEGs (the compiled read and decode) and PNGs with masks (the Python path)."""
    ds = Dataset(str(write_photos(tmp_path / "photos", 12, masks=not jpeg,
                                  jpeg_size=(96, 128) if jpeg else None)))
    keys = ("image", "patch/box", "index") if jpeg else ("image", "mask", "patch/box", "index")

    def digest(batches: list[dict[str, Any]]) -> list[bytes]:
        return [b"".join(b[k].tobytes() for k in keys) for b in batches]

    def made() -> Patches:
        return Patches(ds, size=16, cache_images=3, refresh_every=6)

    reference = digest(run(made(), num_threads=2, batch_size=6))
    parent = made()
    assert digest(run(parent, num_threads=2, batch_size=6, workers="processes")) == reference
    stats = parent.cache_stats()
    assert stats is not None and stats.loads <= 1  # the layout's sample, no more
    assert digest(run(parent, num_threads=2, batch_size=6)) == reference
    after = parent.cache_stats()
    assert after is not None and after.loads >= 12  # a threads pass decodes (ahead) again


def test_scaled_patches_decode_at_reduced_size(tmp_path: Path) -> None:
    ds = Dataset(str(write_photos(tmp_path / "big", 6, masks=False, jpeg_size=(160, 200))))
    reduced = Patches(ds, size=10, scale=(2.0, 3.0), cache_images=3, refresh_every=4)
    full = Patches(ds, size=10, scale=(2.0, 3.0), cache_images=3, refresh_every=4,
                   reduced_decode=False)
    assert reduced.options.denominator == 2 and full.options.denominator == 1
    a, b = run(reduced, num_threads=2), run(full, num_threads=2)
    for batch in a:
        assert batch["image"].shape[1:] == (10, 10, 3)
        boxes = batch["patch/box"]
        assert (boxes[:, 2] >= 20).all() and (boxes[:, 2] <= 30).all()
        assert (boxes[:, 0] + boxes[:, 2] <= 160).all() and (boxes[:, 1] + boxes[:, 3] <= 200).all()
        # the patch shows its box: mean R ~ x centre of the box, mean G ~ y centre
        image = batch["image"].astype(np.float64)
        centre_x = boxes[:, 1] + boxes[:, 3] / 2
        assert np.abs(image[:, :, :, 0].mean(axis=(1, 2)) - centre_x).max() < 4
    stats_r, stats_f = reduced.cache_stats(), full.cache_stats()
    assert stats_r is not None and stats_f is not None
    assert stats_r.max_bytes is not None and stats_f.max_bytes is not None
    assert stats_r.max_bytes < stats_f.max_bytes / 3  # a quarter of the pixels
    assert len(a) == len(b)


def test_eval_takes_images_in_stored_order(photos: Dataset) -> None:
    patches = Patches(photos, size=8, cache_images=3, refresh_every=5)
    batches = run(patches, shuffle=False, batch_size=5, num_threads=2)
    records = [int(i) for b in batches for i in b["patch/record"]]
    for p, record in enumerate(records):
        lo = p // 5
        assert lo <= record < lo + 3
    again = run(Patches(photos, size=8, cache_images=3, refresh_every=5), shuffle=False,
                batch_size=5, num_threads=1)
    assert fingerprint(again) == fingerprint(batches)


def test_transform_applies_after_the_crop(photos: Dataset) -> None:
    patches = Patches(photos, size=(8, 12), cache_images=2, refresh_every=3)
    batch = run(patches, transform=RandomHorizontalFlip(p=1.0), num_threads=1)[0]
    red = batch["image"][:, 0, :, 0].astype(int)
    assert (np.diff(red, axis=1) == -1).all()  # mirrored: x decreases left to right
    assert np.array_equal(batch["mask"][:, 0, :].astype(int), red)


def test_state_fingerprint_and_mismatch(photos: Dataset) -> None:
    loader = Loader(Patches(photos, size=8, cache_images=3, refresh_every=4), batch_size=4)
    state = json.loads(json.dumps(loader.state()))
    assert state["source"]["kind"] == "patches" and state["source"]["size"] == [8, 8]
    nocache = Loader(Patches(photos, size=8, cache_images=3, refresh_every=4, cache=False),
                     batch_size=4)
    nocache.restore(state)  # the cache is not part of the stream
    other = Loader(Patches(photos, size=8, cache_images=3, refresh_every=5), batch_size=4)
    with pytest.raises(StateError, match="Patches"):
        other.restore(state)
    for item in (loader, nocache, other):
        item.close()


def test_undecodable_image_names_the_record(tmp_path: Path) -> None:
    ds = Dataset(str(write_photos(tmp_path / "bad", 6, bad=(2,))))
    with pytest.raises(DecodeError, match=r"photos-00\.tfrecord', record 2"):
        run(Patches(ds, size=8, cache_images=2, refresh_every=3), num_threads=2)
    batches = run(Patches(ds, size=8, cache_images=2, refresh_every=3), num_threads=2,
                  on_error="skip", max_skipped=100)
    assert 2 not in {int(i) for b in batches for i in b["index"]}


@pytest.mark.parametrize(("options", "error"), [
    ({"size": 0}, ValueError),
    ({"size": (4, 4, 4)}, ValueError),
    ({"size": 8, "scale": (0, 2)}, ValueError),
    ({"size": 8, "scale": (3, 2)}, ValueError),
    ({"size": 8, "cache_images": 0}, ValueError),
    ({"size": 8, "refresh_every": 0}, ValueError),
    ({"size": 8, "pick": "random"}, ValueError),
    ({"size": 8, "cache_bytes": -1}, ValueError),
    ({"size": 8, "cache": "yes"}, TypeError),
])
def test_bad_arguments_fail_at_construction(photos: Dataset, options: dict[str, Any],
                                            error: type[Exception]) -> None:
    with pytest.raises(error):
        Patches(photos, **options)


class _Sized(DataSourceBase):
    """A dataset stand-in of ``n`` images (the pick needs no records)."""

    fingerprint = "stand-in"

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        raise AssertionError("not read")

    def locate(self, i: int) -> tuple[str, int, int]:
        return ("x", i, 0)


@settings(max_examples=80, deadline=None)
@given(
    images=st.integers(1, 60), cache=st.integers(1, 20), refresh=st.integers(1, 30),
    seed=st.integers(0, 2**40), epoch=st.integers(0, 5),
    pick=st.sampled_from(["stratified", "uniform"]),
)
def test_picks_stay_in_the_resident_window(images: int, cache: int, refresh: int, seed: int,
                                           epoch: int, pick: str) -> None:
    cache = min(cache, images)  # a larger cache is refused (test_cache_larger_than_dataset)
    patches = Patches(_Sized(images), size=4, cache_images=cache, refresh_every=refresh,
                      pick=pick)
    schedule = PatchSchedule(images, cache_images=cache, refresh_every=refresh)
    outputs = np.arange(len(schedule), dtype=np.int64)
    q = patches.order_positions(seed, epoch, outputs)
    lo, hi = schedule.windows_many(outputs)
    assert ((lo <= q) & (q < hi)).all()
    # the same outputs give the same picks whatever else is asked alongside
    half = outputs[::2]
    assert np.array_equal(patches.order_positions(seed, epoch, half), q[::2])
    if pick == "stratified":
        n = schedule.cache_images
        slots = q - lo
        for start in range(0, len(outputs) - n + 1, n):
            block = slice(start, start + n)
            if lo[block][0] == lo[block][-1]:  # no refresh inside: every slot once
                assert sorted(slots[block].tolist()) == list(range(n))


def test_block_permutations_drawn_together_are_each_blocks_own() -> None:
    """A slice's new blocks drawn in one call: each the argsort of its own slots' keyed
    draws, whichever blocks come with it or were kept from before."""
    from shardfeed.sampling import patches as module
    from shardfeed.sampling.keys import PATCH_SLOT, uniform_many

    def own(seed: int, epoch: int, block: int, n: int) -> np.ndarray:
        draws = uniform_many(seed, epoch, block * n + np.arange(n), PATCH_SLOT, draw=1)
        return np.argsort(draws, kind="stable")

    module._PERMUTATIONS.clear()
    for blocks in ([5, 2, 9], [2, 3], [7], [9, 5, 11, 2]):
        got = module.block_permutations(3, 1, blocks, 16)
        for block, perm in zip(blocks, got):
            np.testing.assert_array_equal(perm, own(3, 1, block, 16))
            assert not perm.flags.writeable
    assert not np.array_equal(module.block_permutations(3, 2, [5], 16)[0], own(3, 1, 5, 16))
