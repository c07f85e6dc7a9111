"""Patches cut palette masks as label maps: the indices, at the patch's box."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# The mask file helpers live beside the transforms tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transforms"))
from mask_files import (
    IDS,
    VOC,
    index_pattern,
    pack_csv,
    palette_png,
    rgb_png,
    write_seg_csv,
)

from shardfeed import Dataset, Loader, Patches
from shardfeed.errors import DecodeError

SIZE = 32


def packed(tmp_path: Path, masks: list[bytes]) -> Dataset:
    return Dataset(str(pack_csv(write_seg_csv(tmp_path / "src", masks), tmp_path / "out")))


def test_patches_keep_palette_indices(tmp_path: Path) -> None:
    labels = [index_pattern(SIZE, SIZE, i) for i in range(4)]
    ds = packed(tmp_path, [palette_png(m) for m in labels])
    patches = Patches(ds, size=12, cache_images=2, refresh_every=4)
    seen: set[int] = set()
    for batch in Loader(patches, batch_size=4, shuffle=True, seed=1, num_threads=2):
        for mask, image, box, label in zip(batch["mask"], batch["image"], batch["patch/box"],
                                           batch["image/class/label"]):
            y, x, h, w = (int(v) for v in box)
            assert np.array_equal(mask, labels[int(label)][y:y + h, x:x + w])
            assert np.array_equal(VOC[mask], image)
            seen.update(np.unique(mask).tolist())
    assert seen <= set(IDS) and len(seen) > 2


def test_patches_refuse_colour_masks(tmp_path: Path) -> None:
    ds = packed(tmp_path, [rgb_png(VOC[index_pattern(SIZE, SIZE, i)]) for i in range(4)])
    path = ds.locate(0)[0]
    loader = Loader(Patches(ds, size=12, cache_images=2, refresh_every=4), batch_size=4,
                    shuffle=False)
    with pytest.raises(DecodeError, match="colour \\(RGB\\)") as info:
        next(iter(loader))
    assert info.value.path == path
