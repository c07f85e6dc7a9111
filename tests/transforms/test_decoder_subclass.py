"""A user's decoder subclass keeps the options it sets in ``__init__`` when the Loader binds
it to the dataset (the bound copy once kept only ``__slots__``, dropping them silently)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg

from shardfeed import Dataset, Loader
from shardfeed.format.writer import ShardWriter
from shardfeed.transforms import DecodeImage


class Darker(DecodeImage):
    """DecodeImage, then every pixel lowered by ``amount`` (an option without __slots__)."""

    def __init__(self, amount: int, **options: Any) -> None:
        super().__init__(**options)
        self.amount = amount

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator, /) -> dict[str, Any]:
        sample = super().__call__(sample, rng)
        sample["image"] = sample["image"] - np.uint8(self.amount)
        return sample


def test_options_of_a_subclass_survive_binding(tmp_path: Path) -> None:
    with ShardWriter(str(tmp_path / "part-0.tfrecord")) as writer:
        for i in range(4):
            image = np.full((16, 16, 3), 100 + i, np.uint8)
            writer.write_example({"image/encoded": simplejpeg.encode_jpeg(image, quality=100),
                                  "index": [i]})
    ds = Dataset(str(tmp_path))
    plain = next(iter(Loader(ds, batch_size=4, shuffle=False, transform=DecodeImage())))
    darker = next(iter(Loader(ds, batch_size=4, shuffle=False, transform=Darker(30))))
    np.testing.assert_array_equal(darker["image"], plain["image"] - 30)
