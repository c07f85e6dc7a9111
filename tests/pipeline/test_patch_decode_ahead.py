"""Patches decodes ahead of its slices on at most ``DECODE_AHEAD_THREADS`` threads: the
images the stated memory bound counts (``cache_bytes`` adds that many decoded images)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed.dataset import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader, patch_ahead
from shardfeed.pipeline import patches as patches_module
from shardfeed.pipeline.patches import DECODE_AHEAD_THREADS, Patches
from shardfeed.transforms.decode.patches import decode_for_patches

IMAGES, CACHE_IMAGES, SLICE_THREADS = 40, 16, 1


class DecodeCounter:
    """How many decodes run at once: on the decode-ahead threads, and on any thread."""

    def __init__(self, decode: Any) -> None:
        self._decode = decode
        self._lock = threading.Lock()
        self.ahead = self.every = 0
        self.most_ahead = self.most_every = self.decodes_ahead = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ahead = threading.current_thread().name == patch_ahead._DECODERS.name
        with self._lock:
            self.every += 1
            self.ahead += ahead
            self.decodes_ahead += ahead
            self.most_every = max(self.most_every, self.every)
            self.most_ahead = max(self.most_ahead, self.ahead)
        try:
            time.sleep(0.02)  # long enough for every decode started at once to overlap
            return self._decode(*args, **kwargs)
        finally:
            with self._lock:
                self.every -= 1
                self.ahead -= ahead


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pictures")
    with ShardWriter(str(folder / "pictures.tfrecord")) as writer:
        for i in range(IMAGES):
            ok, data = cv2.imencode(".png", np.full((40, 48, 3), 5 * i, np.uint8))
            assert ok
            writer.write_example({"image/encoded": data.tobytes(), "label": [i]})
    return folder


def test_decode_ahead_keeps_to_the_threads_the_memory_bound_counts(
        pictures: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first slice needs all 16 images of the cache at once (and every batch after it
    new ones): without the bound they were all decoded at once (12 of them measured), far
    past the two images ``cache_bytes`` counts for the decodes ahead."""
    counter = DecodeCounter(decode_for_patches)
    monkeypatch.setattr(patches_module, "decode_for_patches", counter)
    with Dataset(str(pictures)) as ds:
        patches = Patches(ds, size=8, cache_images=CACHE_IMAGES, refresh_every=1)
        with Loader(patches, batch_size=16, seed=3, transform=None,
                    num_threads=SLICE_THREADS) as loader:
            batches = sum(1 for _ in loader)
            assert patches.cache is not None
            counted = patches.cache_bytes
            stated = patches.cache.max_bytes
    assert batches > 1 and counter.decodes_ahead >= CACHE_IMAGES // 2  # decoded ahead, mostly
    assert 1 <= counter.most_ahead <= DECODE_AHEAD_THREADS
    # the slices' own decodes are counted per thread by the Loader: no other decode runs
    assert counter.most_every <= DECODE_AHEAD_THREADS + SLICE_THREADS
    assert counted is not None and stated is not None
    assert counted - stated == DECODE_AHEAD_THREADS * patches.cache.largest_bytes
