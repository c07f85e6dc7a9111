"""The scaled warp (a crop box sampled from its JPEG decoded at a DCT scale) gives the same
bytes compiled and in NumPy, for any box, scale, size, channel count and flip; it samples the
box's exact pixel centres (within a rounding of OpenCV's own warp of the same box); a flip is
the mirror image; and a train crop that a user decodes at reduced scale is the same with the
compiled part and without it."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed.transforms.boxes import Box
from shardfeed.transforms.decode import warp
from shardfeed.transforms.decode.crop import DecodeRandomResizedCrop


def _case(rng: np.random.Generator) -> tuple[np.ndarray, Box, int, tuple[int, int]]:
    d = int(rng.choice([1, 2, 4, 8]))
    height, width = (int(v) for v in rng.integers(1, 300, 2))
    image = rng.integers(0, 256, (-(-height // d), -(-width // d), int(rng.integers(1, 5))),
                         dtype=np.uint8)
    h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
    box = Box(int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
    return image, box, d, (int(rng.integers(1, 70)), int(rng.integers(1, 70)))


@pytest.mark.skipif(warp._compiled is None, reason="checked where the compiled part is built")
def test_compiled_and_numpy_give_the_same_bytes() -> None:
    rng = np.random.default_rng(1)
    for _ in range(1500):
        image, box, d, size = _case(rng)
        flip = bool(rng.integers(2))
        got = warp.scaled_warp(image, box, d, size, flip)
        assert got.tobytes() == warp._numpy_warp(image, box, d, size, flip).tobytes(), (
            image.shape, box, d, size, flip)


def test_a_flip_is_the_mirror_image_and_out_is_written() -> None:
    rng = np.random.default_rng(2)
    for _ in range(100):
        image, box, d, size = _case(rng)
        plain = warp.scaled_warp(image, box, d, size, False)
        out = np.zeros_like(plain)
        assert warp.scaled_warp(image, box, d, size, True, out) is out
        assert out.tobytes() == plain[:, ::-1].tobytes()


def test_it_samples_the_box_centres_as_opencvs_warp_does() -> None:
    """OpenCV's warp of the same box (its own rounding: 1/32 of a pixel) differs by at most
    one level; a 16-bit image takes the NumPy form, scaled alike."""
    rng = np.random.default_rng(3)
    for _ in range(60):
        image = cv2.GaussianBlur(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8), (5, 5), 2)
        h, w = int(rng.integers(64, 240)), int(rng.integers(64, 320))
        box = Box(int(rng.integers(0, 240 - h + 1)), int(rng.integers(0, 320 - w + 1)), h, w)
        sx, sy = box.w / (32 * 2), box.h / (32 * 2)
        matrix = np.array([[sx, 0, (box.x + 0.5 * box.w / 32) / 2 - 0.5],
                           [0, sy, (box.y + 0.5 * box.h / 32) / 2 - 0.5]])
        expected = cv2.warpAffine(image, matrix, (32, 32),
                                  flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                  borderMode=cv2.BORDER_REPLICATE)
        got = warp.scaled_warp(image, box, 2, (32, 32), False)
        assert np.abs(got.astype(int) - expected).max() <= 1
        wide = warp.scaled_warp(image.astype(np.uint16) * 257, box, 2, (32, 32), False)
        assert wide.dtype == np.uint16
        assert np.abs(wide.astype(int) - got.astype(int) * 257).max() <= 257


def test_a_users_crop_is_the_same_with_and_without_the_compiled_part(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import simplejpeg

    rng = np.random.default_rng(4)
    pixels = cv2.GaussianBlur(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8), (5, 5), 2)
    data = bytes(simplejpeg.encode_jpeg(pixels, quality=90))
    op = DecodeRandomResizedCrop(48, hflip=0.5)

    def crops() -> list[Any]:
        return [op({"image/encoded": data}, np.random.default_rng(k))["image"]
                for k in range(40)]

    compiled = crops()
    monkeypatch.setattr(warp, "_compiled", None)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(compiled, crops()))
