"""A slice's region crops decoded in one call of the region decoder (the Python path, where
the compiled call of native_rows is absent or leaves a row): the very batches of the
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
from shardfeed.transforms.boxes import Box
from shardfeed.transforms.decode import crop_rows, native_rows, region

pytestmark = pytest.mark.skipif(region.backend() is None,
                                reason="nvImageCodec's CPU decoder is not installed")


@pytest.fixture(autouse=True)
def _python_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows the compiled call takes go the Python path here (the one these tests are
    about; tests/transforms/test_native_rows.py compares the two)."""
    monkeypatch.setattr(native_rows, "compiled", None)


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


@pytest.mark.parametrize("reduced", [True, False])
def test_the_slices_choice_of_regions_is_the_one_row_rule(reduced: bool) -> None:
    """plain_region_rows picks, for a slice at once, exactly the rows (and boxes) the op's
    one-row rule (_region_box) decodes as regions: random images of sizes around the
    smallest region size and random boxes, including ones a DCT scale takes."""
    op = presets.train(size=112, reduced_decode=reduced)
    crop = next(part for part in op.transforms if hasattr(part, "_region_box"))
    rng = np.random.default_rng(5)
    for _ in range(200):
        rows = int(rng.integers(2, 12))
        drawn: list[tuple[int, ...] | None] = []
        for _ in range(rows):
            if rng.random() < 0.1:
                drawn.append(None)
                continue
            if rng.random() < 0.3:  # at the smallest region size: 256 x 256 = 2**16
                height, width = 256, 256 + int(rng.integers(-1, 2))
            else:
                height, width = (int(v) for v in rng.integers(150, 700, size=2))
            h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
            if rng.random() < 0.3:  # at a DCT scale's edge: 2 x 112
                h = min(height, 224 + int(rng.integers(-1, 2)))
                w = min(width, 224 + int(rng.integers(-1, 2)))
            y, x = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            drawn.append((height, width, y, x, h, w, int(rng.integers(0, 2))))
        one_by_one = [(row, Box(*known[2:6])) for row, known in enumerate(drawn)
                      if known is not None
                      and crop._region_box(b"\xff\xd8\xff\xd9", Box(*known[2:6]), known[0],
                                           known[1]) is not None]
        picked, boxes = crop_rows.plain_region_rows(crop, drawn)
        assert list(zip(picked, boxes)) == one_by_one
