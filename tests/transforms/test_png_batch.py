"""A slice's PNGs decoded in one compiled call hold OpenCV's pixels, and every PNG it does not
take (palette, 16-bit, interlaced, transparency, damaged) is left to OpenCV, row by row.

The PNGs are written here chunk by chunk, so that every scanline filter, chunk layout and
damage is the one the test names, and by OpenCV and Pillow as users' files are.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Sequence

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from shardfeed.transforms import DecodeImage
from shardfeed.transforms.decode import png_rows
from shardfeed.transforms.decode.image import decode_image

pytestmark = pytest.mark.skipif(png_rows.compiled is None, reason="checked by test_native")


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def filtered(pixels: np.ndarray, filters: Sequence[int]) -> bytes:
    """The scanlines of ``pixels`` (H×W×C uint8), row y filtered with filters[y]."""
    height, width, channels = pixels.shape
    rows = pixels.reshape(height, width * channels).astype(int)
    out = bytearray()
    for y in range(height):
        up = rows[y - 1] if y else np.zeros_like(rows[y])
        kind = filters[y]
        line = []
        for x in range(width * channels):
            left = rows[y][x - channels] if x >= channels else 0
            up_left = up[x - channels] if x >= channels else 0
            predictor = [0, left, up[x], (left + up[x]) // 2, paeth(left, up[x], up_left)][kind]
            line.append((rows[y][x] - predictor) % 256)
        out += bytes([kind, *line])
    return bytes(out)


def png(pixels: np.ndarray, filters: Sequence[int] | None = None, *, split: int = 0,
        extra: Sequence[bytes] = (), colour_type: int | None = None, depth: int = 8,
        interlace: int = 0, data: bytes | None = None) -> bytes:
    height, width, channels = pixels.shape
    if colour_type is None:
        colour_type = 0 if channels == 1 else 2
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour_type, 0, 0, interlace)
    stream = zlib.compress(data if data is not None
                           else filtered(pixels, filters or [0] * height), 9)
    parts = [stream[i:i + split] for i in range(0, len(stream), split)] if split else [stream]
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + b"".join(extra)
            + b"".join(chunk(b"IDAT", p) for p in parts) + chunk(b"IEND", b""))


def opencv(data: bytes, channels: int) -> np.ndarray:
    image = decode_image(data, mode="gray" if channels == 1 else "rgb")
    return image.reshape(image.shape[0], image.shape[1], channels)


def batch(values: list[bytes], height: int, width: int, channels: int) -> tuple[np.ndarray, list[int]]:
    out = np.full((len(values), height, width, channels), 77, np.uint8)
    left = png_rows.decode_pngs_into(values, out, max_pixels=1 << 30)
    return out, left


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.sampled_from([1, 3]), st.data())
def test_every_filter_decodes_to_opencvs_pixels(height: int, width: int, channels: int,
                                                 data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    values, expected = [], []
    for _ in range(3):
        pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
        filters = data.draw(st.lists(st.integers(0, 4), min_size=height, max_size=height))
        encoded = png(pixels, filters, split=data.draw(st.sampled_from([0, 1, 7])))
        values.append(encoded)
        expected.append(opencv(encoded, channels))
        np.testing.assert_array_equal(expected[-1], pixels)
    out, left = batch(values, height, width, channels)
    assert left == []
    np.testing.assert_array_equal(out, np.stack(expected))


def test_files_written_by_opencv_and_pillow_decode_to_their_pixels() -> None:
    rng = np.random.default_rng(1)
    for channels in (1, 3):
        pixels = rng.integers(0, 256, (32, 24, channels), dtype=np.uint8)
        smooth = np.cumsum(pixels, axis=1, dtype=np.uint8)  # gives the encoders' filters work
        values = []
        for image in (pixels, smooth):
            to_cv = image if channels == 1 else image[..., ::-1]
            values.append(cv2.imencode(".png", to_cv)[1].tobytes())
            for optimize in (False, True):
                buffer = io.BytesIO()
                Image.fromarray(image.squeeze(-1) if channels == 1 else image).save(
                    buffer, format="PNG", optimize=optimize)
                values.append(buffer.getvalue())
        out, left = batch(values, 32, 24, channels)
        assert left == []
        np.testing.assert_array_equal(out, np.stack([opencv(v, channels) for v in values]))


def test_text_and_metadata_chunks_do_not_stop_it() -> None:
    pixels = np.arange(12, dtype=np.uint8).reshape(3, 4, 1)
    value = png(pixels, [1, 2, 4], extra=[chunk(b"tEXt", b"k\x00v"), chunk(b"pHYs", bytes(9))])
    out, left = batch([value], 3, 4, 1)
    assert left == []
    np.testing.assert_array_equal(out[0], pixels)


def odd_pngs() -> dict[str, bytes]:
    pixels = np.arange(20, dtype=np.uint8).reshape(4, 5, 1)
    good = png(pixels, [0, 1, 2, 3])
    bad_crc = bytearray(good)
    bad_crc[good.index(b"IDAT") + 6] ^= 1  # a byte of the stream: its CRC no longer matches
    stream = zlib.compress(filtered(pixels, [0] * 4))
    return {
        "palette": png(pixels, colour_type=3, extra=[chunk(b"PLTE", bytes(range(60)))]),
        "16-bit": png(pixels, colour_type=0, depth=16,
                      data=b"".join(b"\x00" + bytes(10) for _ in range(4))),
        "interlaced": png(pixels, interlace=1),
        "transparency": png(pixels, extra=[chunk(b"tRNS", b"\x00\x05")]),
        "gamma": png(pixels, extra=[chunk(b"gAMA", struct.pack(">I", 45455))]),
        "bad CRC": bytes(bad_crc),
        "cut short": good[:-20],
        "stream too short": png(pixels, data=filtered(pixels, [0] * 4)[:-5]),
        "bytes after the stream": (b"\x89PNG\r\n\x1a\n" + good[8:33]
                                   + chunk(b"IDAT", stream + b"xx") + chunk(b"IEND", b"")),
        "unknown filter": png(pixels, data=b"".join(b"\x05" + bytes(5) for _ in range(4))),
        "other size": png(np.zeros((5, 4, 1), np.uint8)),
        "RGB": png(np.zeros((4, 5, 3), np.uint8)),
        "JPEG": cv2.imencode(".jpg", pixels)[1].tobytes(),
        "nothing": b"",
    }


@pytest.mark.parametrize("name", sorted(odd_pngs()))
def test_what_it_does_not_take_is_left_to_opencv(name: str) -> None:
    good = png(np.arange(20, dtype=np.uint8).reshape(4, 5, 1))
    out, left = batch([good, odd_pngs()[name], good], 4, 5, 1)
    assert left == [1]
    np.testing.assert_array_equal(out[0], out[2])


def test_a_slice_with_odd_pngs_equals_the_sample_path() -> None:
    """What a user sees: the batch form of DecodeImage over good and odd PNGs gives each row
    what decoding that row alone gives (odd rows through OpenCV), or the same error."""
    rng = np.random.default_rng(3)
    decode = DecodeImage(channels="gray")
    values = [png(rng.integers(0, 256, (4, 5, 1), dtype=np.uint8), [4, 3, 2, 1])
              for _ in range(6)]
    odd = odd_pngs()
    values[1] = odd["transparency"]
    values[4] = odd["gamma"]
    columns = {"image/encoded": values}
    out = {"image": np.zeros((6, 4, 5, 1), np.uint8)}
    result = decode.apply_batch(columns, None, out)
    assert result is not None
    for row, value in enumerate(values):
        np.testing.assert_array_equal(result["image"][row],
                                      decode({"image/encoded": value}, None)["image"])
