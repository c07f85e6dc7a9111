"""A mask whose size differs from its image's stops the Loader at that record, clearly.

The file is written the way other programs write TFRecords (``shardfeed pack`` itself
refuses such masks), then indexed and read as a user reads it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mask_files import VOC, index_pattern, palette_png, write_foreign_tfrecord

from shardfeed import Dataset, Loader
from shardfeed.errors import DecodeError
from shardfeed.transforms import Compose, CropOrPad, DecodeImage, presets

COUNT, SIZE, BAD = 6, 32, 3
LABEL = "image/class/label"


@pytest.fixture
def misaligned(tmp_path: Path) -> Dataset:
    masks = [palette_png(index_pattern(SIZE, SIZE, i)) for i in range(COUNT)]
    masks[BAD] = palette_png(index_pattern(SIZE - 2, SIZE, BAD))  # 30×32 for a 32×32 image
    return Dataset(str(write_foreign_tfrecord(tmp_path / "foreign", masks)))


@pytest.mark.parametrize("transform", [
    Compose([DecodeImage(), CropOrPad(SIZE, SIZE)]),
    presets.train(size=16),
    presets.eval(size=16),
], ids=["DecodeImage+CropOrPad", "train", "eval"])
def test_mask_of_another_size_is_a_decode_error_at_its_record(misaligned: Dataset,
                                                              transform: object) -> None:
    path, record, offset = misaligned.locate(BAD)
    loader = Loader(misaligned, batch_size=COUNT, shuffle=False, transform=transform)
    with pytest.raises(DecodeError) as info:
        next(iter(loader))
    assert (info.value.path, info.value.record, info.value.offset) == (path, record, offset)
    message = str(info.value)
    assert f"file '{path}', record {BAD} at byte {offset}" in message
    assert "30×32" in message and "32×32" in message


def test_skip_replaces_the_misaligned_sample(misaligned: Dataset) -> None:
    loader = Loader(misaligned, batch_size=COUNT, shuffle=False, on_error="skip",
                    max_skipped=1, transform=Compose([DecodeImage(), CropOrPad(SIZE, SIZE)]))
    batch = next(iter(loader))
    assert BAD not in batch[LABEL].tolist() and loader.stats().skipped_total == 1
    for mask, image in zip(batch["mask"], batch["image"]):
        assert np.array_equal(VOC[mask], image)  # every sample delivered is aligned
