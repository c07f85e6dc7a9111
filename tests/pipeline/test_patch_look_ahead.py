"""Patches decodes the images of the next outputs of a slice's stride ahead of the slices
that need them, within the cache's bound: each image is still decoded once per residency,
on one rank or several, and the outputs are those of decoding every patch."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed.dataset import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.patches import Patches
from shardfeed.pipeline.samplers import EpochContext

IMAGES, CACHE_IMAGES, REFRESH, BATCH = 24, 4, 8, 6  # 168 outputs: 84 a rank of 2


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(5)
    with ShardWriter(str(folder / "pictures.tfrecord")) as writer:
        for i in range(IMAGES):
            ok, data = cv2.imencode(".png", rng.integers(0, 256, (40, 48, 3), np.uint8))
            assert ok
            writer.write_example({"image/encoded": data.tobytes(), "label": [i]})
    return folder


class Watch:
    """Counts the decodes of images no slice had planned an output of yet (decoded ahead)."""

    def __init__(self, patches: Patches) -> None:
        self._patches = patches
        self._plan, self._load = patches.plan_units, patches._load
        self._lock = threading.Lock()
        self.planned: set[int] = set()
        self.ahead = 0
        patches.plan_units = self.plan  # type: ignore[method-assign]
        patches._load = self.load  # type: ignore[method-assign]

    def plan(self, ctx: EpochContext, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = self._patches.order_positions(ctx.seed, ctx.epoch, positions)
        with self._lock:  # before the plan starts any decode
            self.planned.update(int(r) for r in ctx.order[q])
        return self._plan(ctx, positions)

    def load(self, rid: int, record: Any) -> Any:
        with self._lock:
            self.ahead += rid not in self.planned
        return self._load(rid, record)


def _epoch(patches: Patches, rank: int, threads: int) -> list[dict[str, Any]]:
    with Loader(patches, batch_size=BATCH, seed=1, shuffle=True, rank=rank, world_size=2,
                num_threads=threads, transform=None) as loader:
        return list(loader)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rank", [0, 1])
def test_images_decoded_ahead_are_decoded_once_and_change_no_output(
        pictures: Path, rank: int, threads: int) -> None:
    with Dataset(str(pictures)) as ds:
        patches = Patches(ds, size=8, cache_images=CACHE_IMAGES, refresh_every=REFRESH)
        watch = Watch(patches)
        batches = _epoch(patches, rank, threads)
        stats = patches.cache_stats()
        uncached = _epoch(Patches(ds, size=8, cache_images=CACHE_IMAGES,
                                  refresh_every=REFRESH, cache=False), rank, threads)
    used = {int(i) for b in batches for i in b["patch/record"]}
    assert stats is not None and stats.uncached == 0
    assert watch.ahead > 0  # images decoded before any slice needed them
    assert stats.loads == len(used)  # each once: none decoded ahead was pushed out, or unused
    assert len(batches) == len(uncached) == 84 // BATCH
    for got, want in zip(batches, uncached):
        for key in ("image", "patch/box", "patch/record"):
            assert np.array_equal(got[key], want[key])


def test_a_stated_bound_without_room_decodes_nothing_ahead(pictures: Path) -> None:
    with Dataset(str(pictures)) as ds:
        probe = Patches(ds, size=8, cache_images=CACHE_IMAGES, refresh_every=REFRESH)
        _epoch(probe, 0, 1)
        assert probe.cache is not None
        image_bytes = probe.cache.largest_bytes
        # N images and the 2 of threads working ahead: no room for the look-ahead
        patches = Patches(ds, size=8, cache_images=CACHE_IMAGES, refresh_every=REFRESH,
                          cache_bytes=(CACHE_IMAGES + 2) * image_bytes)
        watch = Watch(patches)
        _epoch(patches, 0, 1)
    assert watch.ahead == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_each_output_is_looked_ahead_for_once(pictures: Path, threads: int) -> None:
    """A slice looks ahead only past the outputs an earlier slice of its stride looked at:
    over an epoch, no more outputs than the rank's (each slice looking again at the
    refreshes after it looked at about (L + 1) x R / stride outputs each)."""
    with Dataset(str(pictures)) as ds:
        patches = Patches(ds, size=8, cache_images=CACHE_IMAGES, refresh_every=REFRESH)
        looked: list[list[int]] = []
        look = patches._look_ahead

        def counted(ctx: EpochContext, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            q, units = look(ctx, positions)
            looked[-1].append(len(q))
            return q, units

        patches._look_ahead = counted  # type: ignore[method-assign]
        runs = []
        for _ in range(2):  # a new loader looks ahead anew
            looked.append([])
            runs.append(_epoch(patches, 0, threads))
    outputs = sum(len(b["image"]) for b in runs[0])
    for counts in looked:
        assert 0 < sum(counts) <= outputs
    for got, want in zip(*runs):
        assert np.array_equal(got["image"], want["image"])


@pytest.mark.parametrize("threads", [1, 2])
def test_an_epoch_read_again_by_the_same_loader_decodes_each_image_once(
        pictures: Path, threads: int) -> None:
    """An evaluation loader read every epoch (the same epoch again): each pass looks ahead
    anew and decodes each image once (a slice far behind the other thread on a loaded
    machine may find one of its images evicted: one more). A clock left at the last pass's
    end took the new pass's images for expired and evicted those needed next: 84-87
    decodes a pass of these 24 images."""
    with Dataset(str(pictures)) as ds:
        patches = Patches(ds, size=8, cache_images=CACHE_IMAGES, refresh_every=REFRESH)
        looked: list[int] = []
        look = patches._look_ahead

        def counted(ctx: EpochContext, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            q, units = look(ctx, positions)
            looked.append(len(q))
            return q, units

        patches._look_ahead = counted  # type: ignore[method-assign]
        passes = []
        with Loader(patches, batch_size=BATCH, seed=1, shuffle=True, num_threads=threads,
                    transform=None) as loader:
            for _ in range(3):
                loader.set_epoch(0)
                before = patches.cache_stats()
                del looked[:]
                batches = list(loader)
                after = patches.cache_stats()
                assert before is not None and after is not None
                passes.append((batches, after.loads - before.loads, sum(looked)))
    for batches, loads, ahead in passes:
        assert loads <= IMAGES + 2 and ahead > 0
        for got, want in zip(batches, passes[0][0]):
            assert np.array_equal(got["image"], want["image"])


def test_slices_look_again_once_a_quarter_of_the_horizon_is_new(
        pictures: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stride's slices look ahead again once a ``LOOK_AGAIN``-th of the horizon is past
    where they looked, not at every slice: fewer looks than with a look at every slice, the
    same outputs, each image still decoded once."""
    from shardfeed.pipeline import patch_ahead

    def epoch(look_again: int) -> tuple[int, list[dict[str, Any]], int]:
        monkeypatch.setattr(patch_ahead, "LOOK_AGAIN", look_again)
        with Dataset(str(pictures)) as ds:
            patches = Patches(ds, size=8, cache_images=CACHE_IMAGES, refresh_every=REFRESH)
            looks = 0
            look = patches._look_ahead

            def counted(ctx: EpochContext, positions: np.ndarray) -> tuple[
                    np.ndarray, np.ndarray]:
                nonlocal looks
                q, units = look(ctx, positions)
                looks += len(q) > 0
                return q, units

            patches._look_ahead = counted  # type: ignore[method-assign]
            batches = _epoch(patches, 0, 1)
            stats = patches.cache_stats()
        assert stats is not None
        return looks, batches, stats.loads

    every, want, loads_every = epoch(1 << 30)  # any new output: a look at every slice
    looks, got, loads = epoch(4)
    assert 0 < looks < every
    assert loads == loads_every
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a["image"], b["image"])
