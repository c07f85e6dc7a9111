"""Region decode of JPEGs (the optional nvImageCodec CPU backend): the pixels of a crop decoded
alone are exactly those of the whole image decoded and sliced, so the train preset gives the
same bytes with the backend or without it; a damaged JPEG is still a DecodeError naming the
record."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
from transforms_helpers import count_region_decodes, jpeg_shard, train_batches

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.transforms.boxes import Box
from shardfeed.transforms.decode import native_rows, region


def test_the_region_decoder_is_installed_for_the_tests() -> None:
    """`make` installs the optional extra, so the region path is what these tests check."""
    assert region.backend() is not None, 'install it: pip install -e ".[nvimgcodec]"'


def photo(seed: int, height: int, width: int) -> np.ndarray:
    """Smooth colour with edges and noise: chroma that upsampling has work to do on."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 16 + 2, width // 16 + 2, 3), dtype=np.uint8)
    image = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    noise = rng.integers(-12, 13, image.shape)
    return np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def jpeg(seed: int, height: int, width: int, **params: int) -> bytes:
    flags: list[int] = [cv2.IMWRITE_JPEG_QUALITY, 90]
    for key, value in params.items():
        flags += [getattr(cv2, key), value]
    ok, encoded = cv2.imencode(".jpg", photo(seed, height, width)[..., ::-1], flags)
    assert ok
    return encoded.tobytes()


KINDS = {
    "420": {},
    "444": {"IMWRITE_JPEG_SAMPLING_FACTOR": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444},
    "422": {"IMWRITE_JPEG_SAMPLING_FACTOR": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422},
    "progressive": {"IMWRITE_JPEG_PROGRESSIVE": 1},
    "restarts": {"IMWRITE_JPEG_RST_INTERVAL": 3},
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("fast_dct", [True, False])
@pytest.mark.parametrize("fast_upsample", [True, False])
def test_a_region_is_the_whole_decode_sliced(kind: str, fast_dct: bool,
                                             fast_upsample: bool) -> None:
    rng = np.random.default_rng(len(kind))
    for seed, (height, width) in enumerate([(375, 500), (301, 257), (64, 999)]):
        data = jpeg(seed, height, width, **KINDS[kind])
        whole = simplejpeg.decode_jpeg(data, fastdct=fast_dct, fastupsample=fast_upsample)
        for _ in range(8):
            h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
            y, x = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            got = region.decode_region(data, Box(y, x, h, w), fast_dct=fast_dct,
                                       fast_upsample=fast_upsample)
            if got is None:  # refused (never silently different): decoded whole instead
                assert kind == "progressive", f"{kind}: a plain JPEG was refused"
                continue
            np.testing.assert_array_equal(got, whole[y:y + h, x:x + w])


def test_what_it_cannot_decode_is_none() -> None:
    """Damaged or cut short (even below the crop, which the whole decode would meet): None,
    so the usual decode raises the DecodeError."""
    data = jpeg(1, 200, 300)
    assert region.decode_region(data[: len(data) // 2], Box(0, 0, 50, 50), fast_dct=True,
                                fast_upsample=True) is None
    assert region.decode_region(b"\xff\xd8" + b"x" * 100, Box(0, 0, 5, 5), fast_dct=True,
                                fast_upsample=True) is None


def test_the_region_is_chosen_by_cost() -> None:
    assert region.region_pays(375, 500, Box(0, 0, 150, 200), 1)  # top corner: little to read
    assert not region.region_pays(375, 500, Box(0, 0, 375, 500), 1)  # the whole image
    assert not region.region_pays(375, 500, Box(20, 0, 355, 480), 1)  # nearly all of it
    assert region.region_pays(375, 500, Box(300, 0, 75, 500), 1)  # 1/5 of the pixels
    assert not region.region_pays(96, 128, Box(0, 0, 20, 20), 1)  # too small to pay
    # where a DCT scale applies the scaled decode is kept (its bytes, and cheaper)
    assert not region.region_pays(1500, 2000, Box(0, 0, 600, 800), 2)


def _shard(folder: Path, count: int, *, damaged: int | None = None) -> Dataset:
    dataset: Dataset = jpeg_shard(folder, count,
                                  lambda i: jpeg(i, 300 + 7 * (i % 5), 400 - 9 * (i % 4)),
                                  damaged=damaged)
    return dataset


def test_the_train_preset_gives_the_same_bytes_with_it_and_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _shard(tmp_path / "d", 40)
    native = train_batches(ds, num_threads=2)  # the compiled call's rows, where it is built
    monkeypatch.setattr(native_rows, "compiled", None)  # the Python path's
    used = count_region_decodes(monkeypatch)
    runs = {t: train_batches(ds, num_threads=t) for t in (1, 2, 4)}
    assert sum(used) > 40, "the region path was not taken"
    monkeypatch.setattr(region, "_loaded", [None])  # as without the extra
    without = train_batches(ds, num_threads=2)
    for images in [*runs.values(), native]:
        assert len(images) == len(without)
        for a, b in zip(images, without):
            np.testing.assert_array_equal(a, b)


def test_a_damaged_jpeg_is_still_named(tmp_path: Path) -> None:
    ds = _shard(tmp_path / "d", 12, damaged=7)
    with pytest.raises(DecodeError, match=r"record 7 at byte \d+"):
        train_batches(ds)
