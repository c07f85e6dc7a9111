"""decode_image against pixels TensorFlow decoded, and its errors."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest
from transforms_helpers import jpeg_bytes, smooth_image

from shardfeed.errors import DecodeError, ShardfeedError
from shardfeed.transforms.decode.image import decode_image, sniff_format

# TensorFlow decodes JPEG with libjpeg's fast integer IDCT; with fast_dct=True we use the
# same method and match exactly on this build. Other libjpeg-turbo builds and the accurate
# IDCT may differ by a few levels: we allow max 3 levels per pixel, mean 1.5.
MAX_DIFF = 3
MEAN_DIFF = 1.5


@pytest.mark.parametrize("fast_dct", [True, False])
def test_matches_tensorflow_pixels(
    tf_records: list[dict[str, Any]],
    tf_pixels: dict[str, np.ndarray],
    tf_expected: dict[str, Any],
    fast_dct: bool,
) -> None:
    assert len(tf_records) == 21
    for i, record in enumerate(tf_records):
        expected = tf_expected["records"][i]
        image = decode_image(record["image/encoded"], fast_dct=fast_dct, where=f"record {i}")
        ref = tf_pixels[f"r{i}"]
        assert image.dtype == np.uint8
        assert list(image.shape) == expected["decoded_shape"]
        diff = np.abs(image.astype(np.int16) - ref.astype(np.int16))
        assert diff.max() <= MAX_DIFF, i
        assert diff.mean() <= MEAN_DIFF, i
        if expected["encoding"] == "png":
            assert int(image.sum()) == expected["decoded_sum"]
            np.testing.assert_array_equal(image, ref)
        else:
            # The pixel sum agrees to within the per-pixel tolerance.
            assert abs(int(image.sum()) - expected["decoded_sum"]) <= MEAN_DIFF * image.size
    # fast_dct is the method TensorFlow uses: pixel sums agree exactly on this build.
    if fast_dct:
        sums = [int(decode_image(r["image/encoded"]).sum()) for r in tf_records]
        assert sums == [r["decoded_sum"] for r in tf_expected["records"]]


def test_sniff_and_memoryview(tf_records: list[dict[str, Any]]) -> None:
    jpeg = tf_records[0]["image/encoded"]
    png = tf_records[4]["image/encoded"]
    assert sniff_format(jpeg) == "jpeg"
    assert sniff_format(png) == "png"
    assert sniff_format(b"GIF89a") == "other"
    np.testing.assert_array_equal(decode_image(memoryview(jpeg)), decode_image(jpeg))
    np.testing.assert_array_equal(decode_image(memoryview(png)), decode_image(png))


def test_modes() -> None:
    rgb = smooth_image(40, 30)
    data = jpeg_bytes(rgb)
    assert decode_image(data, mode="rgb").shape == (40, 30, 3)
    gray = decode_image(data, mode="gray")
    assert gray.shape == (40, 30)
    expected_gray = cv2.cvtColor(decode_image(data), cv2.COLOR_RGB2GRAY)
    assert np.abs(gray.astype(int) - expected_gray).max() <= 2
    assert decode_image(data, mode="unchanged").shape == (40, 30, 3)
    ok, png_gray = cv2.imencode(".png", expected_gray)
    assert ok
    assert decode_image(png_gray.tobytes(), mode="unchanged").shape == (40, 30)
    assert decode_image(png_gray.tobytes(), mode="rgb").shape == (40, 30, 3)
    # RGB order (not OpenCV's BGR) for PNG: a pure red image stays red.
    red = np.zeros((4, 5, 3), np.uint8)
    red[..., 0] = 255
    ok, png_red = cv2.imencode(".png", cv2.cvtColor(red, cv2.COLOR_RGB2BGR))
    np.testing.assert_array_equal(decode_image(png_red.tobytes()), red)
    rgba = np.dstack([red, np.full((4, 5), 7, np.uint8)])
    ok, png_rgba = cv2.imencode(".png", cv2.cvtColor(rgba, cv2.COLOR_RGBA2BGRA))
    np.testing.assert_array_equal(decode_image(png_rgba.tobytes(), mode="unchanged"), rgba)
    with pytest.raises(ValueError, match="mode"):
        decode_image(data, mode="bgr")  # type: ignore[arg-type]


WHERE = "file 'x.tfrecord', record 5 at byte 1234"


@pytest.mark.parametrize(
    "damage",
    ["truncated", "garbage-after-magic", "empty", "not-an-image", "png-truncated"],
)
def test_corrupt_images_raise_decode_error(damage: str) -> None:
    data = jpeg_bytes(smooth_image(64, 48))
    _ok, png = cv2.imencode(".png", smooth_image(20, 20))
    bad = {
        "truncated": data[: len(data) // 2],
        "garbage-after-magic": b"\xff\xd8\xff" + bytes(range(200)),
        "empty": b"",
        "not-an-image": b"hello, world",
        "png-truncated": png.tobytes()[:60],
    }[damage]
    with pytest.raises(DecodeError) as info:
        decode_image(bad, where=WHERE)
    message = str(info.value)
    assert WHERE in message
    assert "verify" in message  # says what to do
    assert isinstance(info.value, ShardfeedError)
