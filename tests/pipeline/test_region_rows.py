"""A slice's region crops decoded in one call of the region decoder: the very batches of the
sample-by-sample path (and of one region at a time), on 1 and 2 threads, with EXIF turns
applied; a damaged image in the slice is still named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from pipeline_helpers import assert_same_batches, collect

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.transforms import Compose, presets
from shardfeed.transforms.decode import crop_rows, region

pytestmark = pytest.mark.skipif(region.backend() is None,
                                reason="nvImageCodec's CPU decoder is not installed")


def _photo(i: int, h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 3 + i) % 256, (y * 5) % 256, (x + y + 7 * i) % 256],
                    axis=-1).astype(np.uint8)


def _write(folder: Path, n: int = 40, *, bad: int | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "big.tfrecord")) as writer:
        for i in range(n):
            h, w = ((300, 400), (380, 330), (512, 384))[i % 3]  # all >= 2**16 pixels
            data = simplejpeg.encode_jpeg(_photo(i, h, w), quality=90)
            if i == bad:
                data = data[: len(data) // 3]  # cut short
            writer.write_example({"image/encoded": data, "label": [i % 5], "index": [i]})
    return folder


def _pair(folder: Path, transform: Any, **options: Any) -> tuple[list[Any], list[Any], int]:
    """Batches of the batch path, of the sample path, and the regions decoded in batches."""
    options = {"batch_size": 8, "shuffle": True, "seed": 2, **options}
    batched = 0
    original = crop_rows.decode_regions

    def counting(datas: Any, boxes: Any, **kw: Any) -> Any:
        nonlocal batched
        out = original(datas, boxes, **kw)
        batched += sum(r is not None for r in out)
        return out

    crop_rows.decode_regions = counting  # type: ignore[assignment]
    try:
        fast = collect(Loader(Dataset(str(folder)), transform=transform, **options))
    finally:
        crop_rows.decode_regions = original  # type: ignore[assignment]
    slow = collect(Loader(Dataset(str(folder)),
                          transform=Compose([transform, lambda sample, rng: sample]),
                          **options))
    return fast, slow, batched


@pytest.mark.parametrize("threads", [1, 2])
def test_regions_of_a_slice_are_the_sample_paths(tmp_path: Path, threads: int) -> None:
    folder = _write(tmp_path / "big")
    fast, slow, batched = _pair(folder, presets.train(size=160), num_threads=threads)
    assert_same_batches(fast, slow)
    assert batched >= 10  # most crops below 2x the output: regions, decoded a slice at once


def test_a_damaged_image_among_regions_is_named(tmp_path: Path) -> None:
    folder = _write(tmp_path / "bad", bad=7)
    with pytest.raises(DecodeError, match=r"big\.tfrecord', record 7"):
        collect(Loader(Dataset(str(folder)), transform=presets.train(size=160), batch_size=8,
                       shuffle=False, num_threads=2))
