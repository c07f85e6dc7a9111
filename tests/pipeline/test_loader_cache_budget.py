"""The Loader's stated memory bound includes the decoded-image cache of a Patches source."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from shardfeed.dataset import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.patches import DECODE_AHEAD_THREADS, Patches

HEIGHT, WIDTH, IMAGES = 60, 70, 10


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pictures")
    with ShardWriter(str(folder / "pictures.tfrecord")) as writer:
        for i in range(IMAGES):
            pixels = np.full((HEIGHT, WIDTH, 3), 20 * i, np.uint8)
            ok, data = cv2.imencode(".png", pixels)
            assert ok
            writer.write_example({"image/encoded": data.tobytes(), "label": [i]})
    return folder


def test_budget_counts_an_explicit_cache_bound(pictures: Path) -> None:
    with Dataset(str(pictures)) as ds:
        patches = Patches(ds, size=16, cache_images=4, refresh_every=3, cache_bytes=5_000_000)
        with Loader(patches, batch_size=8, seed=1, transform=None, num_threads=2) as loader:
            budget = loader.memory_budget()
            # the bound, and the images decoded ahead of the slices
            assert patches.cache is not None and patches.cache.largest_bytes > 0
            assert budget.cache_bytes == (5_000_000 + DECODE_AHEAD_THREADS
                                          * patches.cache.largest_bytes)
            assert loader.memory_bound_bytes == budget.total_bytes > 5_000_000


def test_budget_counts_a_derived_cache_bound_also_after_restore(pictures: Path) -> None:
    """The default bound: (N + 2) images of the first image's size, known once it decoded."""
    with Dataset(str(pictures)) as ds:
        patches = Patches(ds, size=16, cache_images=4, refresh_every=3)
        with Loader(patches, batch_size=8, seed=1, transform=None, num_threads=2) as loader:
            image_bytes = HEIGHT * WIDTH * 3
            budget = loader.memory_budget()
            assert budget.cache_bytes >= (4 + 2) * image_bytes
            loader.restore(loader.state())  # drops the cache, and the bound derived from it
            assert patches.cache_bytes is None
            again = loader.memory_budget()
            assert again.cache_bytes == budget.cache_bytes
            assert again.total_bytes == budget.total_bytes


def test_sources_without_a_cache_add_nothing(pictures: Path) -> None:
    with Dataset(str(pictures)) as ds, Loader(ds, batch_size=4, seed=1, transform=None,
                                               num_threads=1) as loader:
        budget = loader.memory_budget()
        assert budget.cache_bytes == 0
        assert budget.total_bytes == (budget.batch_bytes * budget.ring_batches
                                      + budget.work_bytes_per_thread * budget.threads
                                      + budget.decode_bytes_per_thread * budget.threads
                                      + budget.index_bytes + budget.fixed_bytes)
    with Dataset(str(pictures)) as ds:
        uncached = Patches(ds, size=16, cache_images=4, refresh_every=3, cache=False)
        with Loader(uncached, batch_size=8, seed=1, transform=None, num_threads=1) as loader:
            assert loader.memory_budget().cache_bytes == 0
