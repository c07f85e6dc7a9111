"""By default a JPEG's EXIF orientation tag is ignored on every decode path, as
tf.io.decode_jpeg and torchvision's decode_jpeg ignore it: a photo tagged 2, 3, 6 or 8 and a
stripped copy of it give the same batches, through the whole decode, the DCT-scaled decode,
the region decode (with the nvImageCodec extra and without it), masks, and Patches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from exif_photos import (
    HEIGHT,
    ORIENTATIONS,
    WIDTH,
    assert_same,
    batches,
    encode,
    pack_csv,
    photo,
    png,
    with_orientation,
)

from shardfeed.dataset import Dataset
from shardfeed.pipeline import Patches
from shardfeed.transforms import presets
from shardfeed.transforms.decode import crop, region
from shardfeed.transforms.decode.ops import DecodeImage

COUNT = 6  # five plain JPEGs, one CMYK (decoded by OpenCV), each tagged in the tagged copy


def _photos() -> list[bytes]:
    return [encode(photo(i), cmyk=i == COUNT - 1) for i in range(COUNT)]


def _masks() -> list[bytes]:
    masks = []
    for i in range(COUNT):
        mask = np.zeros((HEIGHT, WIDTH), np.uint8)
        mask[: HEIGHT // 3, : WIDTH // 4] = 1 + i % 3  # a corner that a turn would move
        mask[HEIGHT // 2:, WIDTH // 2:] = 4
        masks.append(png(mask))
    return masks


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Dataset]:
    """Tagged and stripped copies, each packed with masks and without."""
    base = tmp_path_factory.mktemp("exif")
    stripped = _photos()
    tagged = [with_orientation(data, ORIENTATIONS[i % 4]) for i, data in enumerate(stripped)]
    return {
        "tagged": pack_csv(base / "tagged", tagged, None),
        "stripped": pack_csv(base / "stripped", stripped, None),
        "tagged+masks": pack_csv(base / "tagged-masks", tagged, _masks()),
        "stripped+masks": pack_csv(base / "stripped-masks", stripped, _masks()),
    }


Make = Callable[[Dataset], Any]


def _batches(source: Any, transform: Any, batch_size: int = 3) -> list[dict[str, np.ndarray]]:
    return batches(source, transform, batch_size=batch_size, seed=7)


_assert_same = assert_same


PRESETS = {
    # crop not shrunk 2x or more: the region decoder where installed
    "train-384": lambda: presets.train(size=384),
    "eval-384": lambda: presets.eval(size=384),
    # shrunk 2x or more: the DCT-scaled decode
    "train-96": lambda: presets.train(size=96),
    "eval-128": lambda: presets.eval(size=128),
    "train-384-gray-ops": lambda: crop.DecodeRandomResizedCrop(384, channels="gray"),
}


@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("extra", ["installed", "absent"])
def test_presets_give_the_same_batches_tagged_or_not(
        packed: dict[str, Dataset], name: str, masks: bool, extra: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert region.backend() is not None, 'install the extra: pip install -e ".[nvimgcodec]"'
    if extra == "absent":
        monkeypatch.setattr(region, "_loaded", [None])  # as without the extra
    suffix = "+masks" if masks else ""
    tagged = _batches(packed["tagged" + suffix], PRESETS[name]())
    stripped = _batches(packed["stripped" + suffix], PRESETS[name]())
    _assert_same(tagged, stripped)
    if masks:
        assert all("mask" in b for b in tagged)


@pytest.mark.parametrize("channels", ["rgb", "gray"])
def test_the_whole_decode_gives_the_stored_pixels(packed: dict[str, Dataset],
                                                  channels: str) -> None:
    tagged = _batches(packed["tagged+masks"], DecodeImage(channels=channels), batch_size=1)
    stripped = _batches(packed["stripped+masks"], DecodeImage(channels=channels),
                        batch_size=1)
    _assert_same(tagged, stripped)
    assert all(b["image"].shape[1:3] == (HEIGHT, WIDTH) for b in tagged)


@pytest.mark.parametrize("scale", [None, (2.0, 3.0)])
def test_patches_are_cut_from_the_stored_pixels(packed: dict[str, Dataset],
                                                scale: tuple[float, float] | None) -> None:
    def cut(ds: Dataset) -> list[dict[str, np.ndarray]]:
        patches = Patches(ds, size=48, scale=scale, cache_images=2, refresh_every=3)
        return _batches(patches, None, batch_size=4)

    _assert_same(cut(packed["tagged+masks"]), cut(packed["stripped+masks"]))


def test_the_region_decoder_is_told_to_ignore_the_tag() -> None:
    """The region decoder itself (nvImageCodec turns images by default): a tagged copy's box
    is the stripped copy's box, for every orientation, also 6 and 8 (which it refused)."""
    data = encode(photo(11))
    box = crop.Box(100, 150, 400, 500)
    want = region.decode_region(data, box, fast_dct=True, fast_upsample=False)
    assert want is not None
    for orientation in ORIENTATIONS:
        got = region.decode_region(with_orientation(data, orientation), box, fast_dct=True,
                                   fast_upsample=False)
        assert got is not None, orientation
        np.testing.assert_array_equal(got, want)

