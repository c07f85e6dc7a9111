"""The patch cache's default size holds the images a user has, not the first one decoded: a
small first image among 1411 x 1411 photos used to size the cache for 6 small images, so
every large one was decoded again for each patch (17 decodes for 20 patches). Outputs are
the same whatever the cache does; only the decode count changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg

from shardfeed.dataset import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.patches import Patches

LARGE, SMALL = 1411, 64
IMAGES, CACHE, REFRESH = 8, 4, 4  # (8 - 4 + 1) x 4 = 20 patches an epoch


def _photo(side: int, index: int) -> np.ndarray:
    y, x = np.mgrid[0:side, 0:side]
    return np.stack([x % 256, y % 256, np.full_like(x, 30 * index)], -1).astype(np.uint8)


@pytest.fixture(scope="module")
def mixed_sizes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Record 0 (the first image decoded below) is 64 x 64, the others 1411 x 1411."""
    folder = tmp_path_factory.mktemp("mixed")
    with ShardWriter(str(folder / "photos-00.tfrecord")) as writer:
        for i in range(IMAGES):
            side = SMALL if i == 0 else LARGE
            writer.write_example({
                "image/encoded": simplejpeg.encode_jpeg(_photo(side, i), quality=90),
                "image/height": [side], "image/width": [side], "index": [i]})
    return folder


def _epoch(patches: Patches, **options: Any) -> list[bytes]:
    with Loader(patches, batch_size=4, seed=0, shuffle=False, **options) as loader:
        return [b"".join(np.ascontiguousarray(b[k]).tobytes()
                         for k in ("image", "patch/box", "index")) for b in loader]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_small_first_image_does_not_leave_the_large_ones_uncached(
    mixed_sizes: Path, threads: int
) -> None:
    ds = Dataset(str(mixed_sizes))
    patches = Patches(ds, size=32, cache_images=CACHE, refresh_every=REFRESH)
    assert int(patches.order_positions(0, 0, np.array([0]))[0]) == 0  # the small one first
    cached = _epoch(patches, num_threads=threads)
    stats = patches.cache_stats()
    assert stats is not None and stats.max_bytes is not None
    assert len(cached) * 4 == len(patches) == 20
    # every image decoded once in its residency (was 17 decodes for the 20 patches)
    assert stats.loads == IMAGES and stats.uncached == 0
    # the bound followed the largest image: N + 2 of them, and was kept to
    assert stats.max_bytes >= (CACHE + 2) * LARGE * LARGE * 3
    assert stats.peak_bytes <= stats.max_bytes
    # the outputs are what decoding every patch gives
    uncached = Patches(ds, size=32, cache_images=CACHE, refresh_every=REFRESH, cache=False)
    assert cached == _epoch(uncached, num_threads=threads)
    ds.close()


def test_a_stated_cache_bytes_stays_the_bound(mixed_sizes: Path) -> None:
    ds = Dataset(str(mixed_sizes))
    bound = 2 * LARGE * LARGE * 3 + 100_000  # two large images
    patches = Patches(ds, size=32, cache_images=CACHE, refresh_every=REFRESH,
                      cache_bytes=bound)
    cached = _epoch(patches, num_threads=1)
    stats = patches.cache_stats()
    assert stats is not None and stats.max_bytes == bound
    assert stats.peak_bytes <= bound and stats.loads > IMAGES  # what it costs: re-decodes
    uncached = Patches(ds, size=32, cache_images=CACHE, refresh_every=REFRESH, cache=False)
    assert cached == _epoch(uncached, num_threads=1)
    ds.close()
