"""Decompression bombs at the decode functions and ops: the size claimed by the header is
checked against ``max_pixels`` before a pixel is decoded, for every format shardfeed decodes;
formats whose size cannot be read are refused; memory stays small."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
from image_bombs import bmp_bomb, jpeg_bomb, peak_rss_mb, png_bomb

from shardfeed.errors import DecodeError
from shardfeed.transforms import DecodeCenterCrop, DecodeImage, DecodeRandomResizedCrop, presets
from shardfeed.transforms.decode.image import decode_image
from shardfeed.transforms.decode.masks import decode_mask
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS, claimed_size

RNG = np.random.default_rng(0)


def _encode(ext: str, image: np.ndarray, *params: int) -> bytes:
    ok, data = cv2.imencode(ext, image, list(params))
    assert ok
    return data.tobytes()


def test_the_default_limit_fits_big_photos_and_refuses_more() -> None:
    assert DEFAULT_MAX_PIXELS == 16384 * 8192  # a 16K×8K panorama, a 100 MP photo (11648×8736)
    assert 11648 * 8736 < DEFAULT_MAX_PIXELS


@pytest.mark.parametrize(("name", "data", "size"), [
    ("JPEG", jpeg_bomb(30000, 30000), "30000×30000"),
    ("JPEG", jpeg_bomb(60000, 60000), "60000×60000"),
    ("PNG", png_bomb(60000, 60000), "60000×60000"),
    ("BMP", bmp_bomb(30000, 40000), "30000×40000"),
], ids=["jpeg-30000", "jpeg-60000", "png", "bmp"])
def test_a_bomb_is_refused_from_its_header_naming_size_and_option(
    name: str, data: bytes, size: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        decode_image(data, where="file 'a.tfrecord', record 3 at byte 99")
    text = str(caught.value)
    assert f"the {name} image claims {size}" in text
    assert "more than max_pixels=134,217,728" in text and "raise max_pixels" in text
    assert "file 'a.tfrecord', record 3 at byte 99" in text
    assert "on_error='skip'" in text


def test_decoding_bombs_takes_no_memory() -> None:
    """A 675-byte JPEG claiming 30000×30000 took 2.7 GB; a real 12000×12000 PNG 864 MB."""
    peak, result = peak_rss_mb("""
        import numpy as np
        from image_bombs import jpeg_bomb, png_real
        from shardfeed.errors import DecodeError
        from shardfeed.transforms import DecodeImage, presets
        messages = []
        for data in (jpeg_bomb(30000, 30000), jpeg_bomb(60000, 60000), png_real(12000, 12000)):
            for op in (DecodeImage(), presets.train(size=32), presets.eval(size=32)):
                try:
                    op({"image/encoded": data}, np.random.default_rng(0))
                except DecodeError as exc:
                    messages.append(str(exc))
        RESULT["messages"] = messages
    """)
    assert len(result["messages"]) == 9
    assert all("more than max_pixels" in m for m in result["messages"])
    assert peak < 300


def test_raising_max_pixels_lets_large_images_decode() -> None:
    image = RNG.integers(0, 256, (100, 120, 3), dtype=np.uint8)
    data = bytes(simplejpeg.encode_jpeg(image))
    with pytest.raises(DecodeError, match="100×120 .* = 12,000 pixels, more than max_pixels=11,999"):
        decode_image(data, max_pixels=11_999)
    assert decode_image(data, max_pixels=12_000).shape == (100, 120, 3)
    sample = {"image/encoded": data}
    with pytest.raises(DecodeError, match="max_pixels=5,000"):
        DecodeImage(max_pixels=5_000)(dict(sample), np.random.default_rng(0))
    assert DecodeImage(max_pixels=12_000)(dict(sample), np.random.default_rng(0))["image"].shape \
        == (100, 120, 3)


@pytest.mark.parametrize("op", [
    DecodeRandomResizedCrop(16, max_pixels=10_000),
    DecodeRandomResizedCrop(16, reduced_decode=False, max_pixels=10_000),
    DecodeCenterCrop(16, max_pixels=10_000),
    presets.train(size=16, max_pixels=10_000),
    presets.eval(size=16, max_pixels=10_000),
])
def test_crop_decodes_check_the_full_size_whatever_the_scale(op: object) -> None:
    """A 1/8-scale decode of a progressive JPEG still holds full-size coefficients."""
    image = RNG.integers(0, 256, (160, 80, 3), dtype=np.uint8)
    for data in (bytes(simplejpeg.encode_jpeg(image)), _encode(".png", image)):
        with pytest.raises(DecodeError, match="160×80 .* more than max_pixels=10,000"):
            op({"image/encoded": data}, np.random.default_rng(1))  # type: ignore[operator]
    small = image[:100, :100]
    out = op({"image/encoded": bytes(simplejpeg.encode_jpeg(small))},  # type: ignore[operator]
             np.random.default_rng(1))
    assert out["image"].shape == (16, 16, 3)


def _pillow(image: np.ndarray, fmt: str, **options: object) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, fmt, **options)
    return buffer.getvalue()


def _formats() -> dict[str, bytes]:
    image = RNG.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    return {
        "jpeg": bytes(simplejpeg.encode_jpeg(image)),
        "png": _encode(".png", image),
        "png16": _encode(".png", image.astype(np.uint16) * 257),
        "bmp": _encode(".bmp", image),
        "tiff": _encode(".tiff", image),
        "webp": _encode(".webp", image, cv2.IMWRITE_WEBP_QUALITY, 90),
        "webp-lossless": _encode(".webp", image, cv2.IMWRITE_WEBP_QUALITY, 101),
        "ppm": _encode(".ppm", image),
        "pgm": _encode(".pgm", image[:, :, 0]),
        "gif": _pillow(image, "GIF"),
        "tiff-pillow": _pillow(image, "TIFF"),
        "bmp-pillow": _pillow(image, "BMP"),
    }


@pytest.mark.parametrize("name", sorted(_formats()))
def test_every_format_is_sized_from_its_header_as_it_decodes(name: str) -> None:
    data = _formats()[name]
    claim = claimed_size(data)
    assert (claim.height, claim.width, claim.pixels) == (37, 53, 37 * 53)
    assert decode_image(data).shape == (37, 53, 3)
    with pytest.raises(DecodeError, match=r"37×53 .* = 1,961 pixels, more than max_pixels=1,960"):
        decode_image(data, max_pixels=1960)


def _tiff(width: int, height: int, *, bits: int = 8, samples: int = 3, big: bool = False) -> bytes:
    """A minimal little-endian TIFF header and first directory (no pixel data needed)."""
    tags = [(256, 4, width), (257, 4, height), (258, 3, bits), (277, 3, samples)]
    if big:
        head = b"II+\x00" + struct.pack("<HHQ", 8, 0, 16)
        body = struct.pack("<Q", len(tags))
        for tag, kind, value in tags:
            body += struct.pack("<HHQQ", tag, kind, 1, value)
        return head + body + bytes(8)
    head = b"II*\x00" + struct.pack("<I", 8)
    body = struct.pack("<H", len(tags))
    for tag, kind, value in tags:
        body += struct.pack("<HHII", tag, kind, 1, value)
    return head + body + bytes(4)


@pytest.mark.parametrize(("data", "size"), [
    (_tiff(40000, 50000), "50000×40000"),
    (_tiff(40000, 50000, big=True), "50000×40000"),
    (b"P6\n# a comment\n40000 50000\n255\n" + bytes(12), "50000×40000"),
    (b"P7\nWIDTH 40000\nHEIGHT 50000\nDEPTH 3\nMAXVAL 255\nENDHDR\n" + bytes(12),
     "50000×40000"),
], ids=["tiff", "bigtiff", "ppm", "pam"])
def test_other_headers_claiming_huge_sizes_are_refused(data: bytes, size: str) -> None:
    with pytest.raises(DecodeError, match=f"claims {size}"):
        decode_image(data)


def test_a_gif_frame_larger_than_its_screen_counts() -> None:
    gif = bytearray(_pillow(RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8), "GIF"))
    descriptor = 13 + (3 << ((gif[10] & 7) + 1) if gif[10] & 0x80 else 0)
    while gif[descriptor] == 0x21:  # extensions before the image: their sub-blocks
        descriptor += 2
        while gif[descriptor]:
            descriptor += 1 + gif[descriptor]
        descriptor += 1
    assert gif[descriptor] == 0x2C  # the first image descriptor
    struct.pack_into("<HH", gif, descriptor + 5, 40000, 50000)
    with pytest.raises(DecodeError, match="claims 50000×40000"):
        decode_image(bytes(gif))


def test_formats_whose_size_cannot_be_read_are_refused() -> None:
    """JPEG 2000, Sun raster, ...: OpenCV would decode them without a size check."""
    image = RNG.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    raster = _encode(".ras", image)
    assert cv2.imdecode(np.frombuffer(raster, np.uint8), cv2.IMREAD_COLOR) is not None
    with pytest.raises(DecodeError, match="not an image format whose size shardfeed can read"):
        decode_image(raster)


def test_a_float_tiff_is_refused_from_its_header() -> None:
    data = _tiff(30, 20, bits=32)
    with pytest.raises(DecodeError, match="samples of 32 bits.*8 or 16 bits"):
        decode_image(data)


def test_mask_bombs_are_refused_before_decoding() -> None:
    one_bit = bytearray(png_bomb(60000, 60000, grey=True))
    one_bit[24] = 1  # a 1-bit grey mask: the path that rewrites and decodes the PNG itself
    struct.pack_into(">I", one_bit, 29, zlib.crc32(bytes(one_bit[12:29])))
    for data in (bytes(one_bit), png_bomb(60000, 60000), jpeg_bomb(40000, 40000)):
        with pytest.raises(DecodeError, match="the (PNG|JPEG) mask claims .* more than"):
            decode_mask(data, where="feature 'mask/encoded'")


def test_sixteen_bit_colour_masks_are_refused_before_decoding() -> None:
    values = np.full((8, 8, 3), 300, np.uint16)
    with pytest.raises(DecodeError, match="16-bit colour image.*one-channel grey"):
        decode_mask(_encode(".png", values))


@pytest.mark.parametrize("value", [0, -5])
def test_max_pixels_must_be_positive(value: int) -> None:
    with pytest.raises(ValueError, match=f"max_pixels must be >= 1, got {value}"):
        DecodeImage(max_pixels=value)


def test_max_pixels_must_be_an_int() -> None:
    with pytest.raises(TypeError, match="max_pixels must be an int"):
        presets.train(max_pixels=1.5e8)  # type: ignore[arg-type]


def test_decode_ops_declare_their_decode_memory() -> None:
    from shardfeed.transforms.decode.sizes import decode_peak_bytes

    # 11 bytes a pixel, 128 a row and column
    assert decode_peak_bytes(1000) == 1000 * 11 + 1001 * 128
    assert decode_peak_bytes(1 << 27) == (1 << 27) * 11 + (65535 + 2048) * 128
    assert DecodeImage(max_pixels=1000).decode_bytes == decode_peak_bytes(1000)
    assert presets.train(max_pixels=1000).decode_bytes == decode_peak_bytes(1000)


def test_files_on_disk_decode_the_same(tmp_path: Path) -> None:
    path = tmp_path / "bomb.jpg"
    path.write_bytes(jpeg_bomb(30000, 30000))
    op = DecodeImage(encoding="path", key="image/path", root=str(tmp_path))
    with pytest.raises(DecodeError, match="claims 30000×30000"):
        op({"image/path": b"bomb.jpg"}, np.random.default_rng(0))
