"""Fast-path decode options: writing into ``out`` (no per-sample arrays) and fast upsampling."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import simplejpeg
from transforms_helpers import smooth_image

from shardfeed.transforms import DecodeRandomResizedCrop, decode_image, presets
from shardfeed.transforms.decode.image import decode_jpeg_scratch


def _colour_edges(height: int, width: int) -> np.ndarray:
    """Saturated colour bars with sharp vertical and horizontal edges (chroma detail)."""
    image = smooth_image(height, width, seed=3)
    image[:, ::8] = (255, 0, 0)
    image[::6, :] = (0, 0, 255)
    return image


def _jpeg(image: np.ndarray, subsampling: str) -> bytes:
    return bytes(simplejpeg.encode_jpeg(image, quality=90, colorsubsampling=subsampling))


@pytest.fixture(scope="module")
def jpeg_420() -> bytes:
    return _jpeg(_colour_edges(75, 100), "420")


def _sample(data: bytes) -> dict[str, Any]:
    return {"image/encoded": data}


@pytest.mark.parametrize("fast_upsample", [False, True])
@pytest.mark.parametrize("hflip", [0.0, 1.0])
@pytest.mark.parametrize("reduced_decode", [False, True])
def test_crop_into_out_equals_a_fresh_result(
    jpeg_420: bytes, fast_upsample: bool, hflip: float, reduced_decode: bool
) -> None:
    op = DecodeRandomResizedCrop(
        24, hflip=hflip, fast_upsample=fast_upsample, reduced_decode=reduced_decode
    )
    for seed in range(12):
        fresh = op(_sample(jpeg_420), np.random.default_rng(seed))["image"]
        out = np.full((24, 24, 3), 7, np.uint8)
        result = op(_sample(jpeg_420), np.random.default_rng(seed), out=out)
        assert result["image"] is out
        np.testing.assert_array_equal(out, fresh)


def test_flip_in_place_mirrors_the_unflipped_crop(jpeg_420: bytes) -> None:
    # Both draw the same box (the flip is drawn after it); full-scale decodes, so both take
    # the resize path (a reduced-scale warp folds the flip into its sampling instead).
    mirrored = DecodeRandomResizedCrop(20, hflip=1.0, reduced_decode=False)
    plain = DecodeRandomResizedCrop(20, hflip=1e-12, reduced_decode=False)
    for seed in range(6):
        out = np.empty((20, 20, 3), np.uint8)
        mirrored(_sample(jpeg_420), np.random.default_rng(seed), out=out)
        reference = plain(_sample(jpeg_420), np.random.default_rng(seed))["image"]
        np.testing.assert_array_equal(out, reference[:, ::-1])


def test_fast_upsample_changes_only_chroma_detail() -> None:
    data = _jpeg(smooth_image(75, 100, seed=3), "420")
    smooth = decode_image(data).astype(np.float64)
    fast = decode_image(data, fast_upsample=True).astype(np.float64)
    assert fast.shape == smooth.shape
    diff = np.abs(fast - smooth)
    assert diff.max() > 0  # the option reaches the decoder
    assert diff.mean() < 4.0  # and costs little
    luma = np.array([0.299, 0.587, 0.114])
    assert np.abs(fast @ luma - smooth @ luma).mean() < 1.0  # brightness is kept
    # Without chroma subsampling there is nothing to upsample: identical pixels.
    full_chroma = _jpeg(_colour_edges(75, 100), "444")
    np.testing.assert_array_equal(
        decode_image(full_chroma, fast_upsample=True), decode_image(full_chroma)
    )


def test_scratch_decode_matches_the_plain_decode(jpeg_420: bytes) -> None:
    for fast in (False, True):
        scratch = decode_jpeg_scratch(jpeg_420, height=75, width=100, fast_upsample=fast)
        np.testing.assert_array_equal(scratch, decode_image(jpeg_420, fast_upsample=fast))


def test_presets_choose_fast_upsample_for_training_only() -> None:
    assert next(iter(presets.train(size=32))).fast_upsample is True  # type: ignore[attr-defined]
    assert next(iter(presets.train(size=32, fast_upsample=False))).fast_upsample is False  # type: ignore[attr-defined]
    assert next(iter(presets.eval(size=32))).fast_upsample is False  # type: ignore[attr-defined]
    bound = DecodeRandomResizedCrop(16, fast_upsample=True).bind(None, root=None)
    assert bound.fast_upsample is True  # bind keeps the option
