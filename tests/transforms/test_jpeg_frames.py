"""The frame sizes the batch path reads for a whole slice at once (``_jpeg_frames.c``) are the
sizes simplejpeg's header reader gives, for every kind of JPEG a user stores; any other row
(CMYK, PNG, an odd frame, a damaged header) is left to that reader, so the crops drawn from
the sizes, and the errors raised, are those of the row-by-row path."""

from __future__ import annotations

import io
import struct

import cv2
import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from shardfeed.transforms.decode import crop_rows
from shardfeed.transforms.decode.image import jpeg_header

pytestmark = pytest.mark.skipif(crop_rows._frames is None,
                                reason="the compiled frame reader is not built here")


def _pixels(hw: tuple[int, int], channels: int = 3, seed: int = 0) -> np.ndarray:
    noise = np.random.default_rng(seed).integers(0, 256, (*hw, channels), dtype=np.uint8)
    return cv2.GaussianBlur(noise, (5, 5), 1.5).reshape(*hw, channels)


def _cv2_jpeg(hw: tuple[int, int], *flags: int) -> bytes:
    ok, buf = cv2.imencode(".jpg", _pixels(hw), list(flags))
    assert ok
    return buf.tobytes()


def _segment(code: int, payload: bytes) -> bytes:
    return bytes([0xFF, code]) + struct.pack(">H", len(payload) + 2) + payload


def _after_soi(jpeg: bytes, extra: bytes) -> bytes:
    return jpeg[:2] + extra + jpeg[2:]


def _pil_jpeg(mode: str, hw: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new(mode, (hw[1], hw[0]), 90).save(out, "JPEG", quality=90)
    return out.getvalue()


def _kinds() -> dict[str, bytes]:
    baseline = bytes(simplejpeg.encode_jpeg(_pixels((96, 128)), quality=90))
    return {
        "baseline 4:2:0": baseline,
        "4:4:4": bytes(simplejpeg.encode_jpeg(_pixels((33, 17)), colorsubsampling="444")),
        "4:2:2": bytes(simplejpeg.encode_jpeg(_pixels((50, 70)), colorsubsampling="422")),
        "grey": bytes(simplejpeg.encode_jpeg(_pixels((40, 30), 1), colorspace="GRAY")),
        "progressive": _cv2_jpeg((61, 83), cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
        "optimised": _cv2_jpeg((64, 64), cv2.IMWRITE_JPEG_OPTIMIZE, 1),
        "restart markers": _cv2_jpeg((120, 90), cv2.IMWRITE_JPEG_RST_INTERVAL, 2),
        "1×1": bytes(simplejpeg.encode_jpeg(_pixels((1, 1)))),
        "65500 wide": bytes(simplejpeg.encode_jpeg(np.zeros((8, 65500, 3), np.uint8))),
        "EXIF and comment": _after_soi(baseline, _segment(0xE1, b"Exif\0\0" + bytes(300))
                                       + _segment(0xFE, b"a comment")),
        "fill bytes": _after_soi(baseline, b"\xff\xff" + _segment(0xFE, b"x")),
        "PIL RGB": _pil_jpeg("RGB", (70, 50)),
    }


@pytest.mark.parametrize("kind", sorted(_kinds()))
def test_frame_sizes_are_the_header_readers(kind: str) -> None:
    data = _kinds()[kind]
    height, width, _ = jpeg_header(data)
    assert crop_rows.frame_sizes([data]).tolist() == [[height, width]]


def _other_frame(code: int) -> bytes:
    data = bytearray(bytes(simplejpeg.encode_jpeg(_pixels((20, 20)))))
    at = data.index(b"\xff\xc0")
    data[at + 1] = code
    return bytes(data)


def _precision(bits: int) -> bytes:
    data = bytearray(bytes(simplejpeg.encode_jpeg(_pixels((20, 20)))))
    data[data.index(b"\xff\xc0") + 4] = bits
    return bytes(data)


def test_rows_left_to_the_header_reader() -> None:
    baseline = bytes(simplejpeg.encode_jpeg(_pixels((20, 24))))
    sof = baseline.index(b"\xff\xc0")
    _, png = cv2.imencode(".png", _pixels((20, 24)))
    left = {
        "CMYK": _pil_jpeg("CMYK", (20, 24)),
        "PNG": png.tobytes(),
        "not an image": b"hello, world",
        "empty": b"",
        "cut before the frame header": baseline[: sof + 5],
        "lossless frame (SOF3)": _other_frame(0xC3),
        "arithmetic frame (SOF9)": _other_frame(0xC9),
        "12-bit": _precision(12),
        "stray bytes before a marker": baseline[:2] + b"\xff\xfe\x00\x04ab" + b"zz"
        + baseline[2:],
        "scan before a frame": baseline[:2] + b"\xff\xda\x00\x02" + baseline[2:],
        "a second SOI": baseline[:2] + baseline,
        "a length past the end": baseline[:sof] + b"\xff\xe1\xff\xff",
    }
    names = sorted(left)
    sizes = crop_rows.frame_sizes([left[name] for name in names] + [baseline])
    assert {name: tuple(size) for name, size in zip(names, sizes.tolist())} == dict.fromkeys(
        names, (0, 0))
    assert sizes[-1].tolist() == [20, 24]  # the rows around them are still read
    # a row of another type is left too (the batch path only passes bytes)
    assert crop_rows._frames.sizes([bytearray(baseline), baseline]) == struct.pack(
        "=4i", 0, 0, 20, 24)
    with pytest.raises(TypeError):
        crop_rows._frames.sizes((baseline,))


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(0, 700), flips=st.lists(st.tuples(st.integers(0, 700),
                                                           st.integers(0, 255)), max_size=3))
def test_damaged_headers_give_the_header_readers_size_or_none(
        cut: int, flips: list[tuple[int, int]]) -> None:
    data = bytearray(_kinds()["EXIF and comment"][: 2 + cut])
    for at, value in flips:
        if at < len(data):
            data[at] = value
    size = crop_rows.frame_sizes([bytes(data)])[0].tolist()
    try:
        height, width, space = jpeg_header(bytes(data))
    except Exception:  # noqa: BLE001 - the reader refuses it: the row's decode then fails too
        return
    if size != [0, 0]:
        assert size == [height, width]
        assert space not in ("CMYK", "YCCK")
