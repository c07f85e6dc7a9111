"""decode_mask on the files Pillow writes: exactly the indices Pillow reads, at every depth."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import simplejpeg
from mask_files import VOC, palette_png
from PIL import Image

from shardfeed.errors import DecodeError
from shardfeed.transforms.decode.masks import MaskLabels, decode_mask, read_mask


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("palette", ["voc", "random", "one colour"])
@pytest.mark.parametrize("transparency", [None, 0])
def test_palette_indices_equal_pillows(bits: int, palette: str, transparency: int | None) -> None:
    rng = np.random.default_rng(bits)
    colours = {"voc": VOC, "random": rng.integers(0, 256, (256, 3)).astype(np.uint8),
               "one colour": np.full((256, 3), 7, np.uint8)}[palette]
    for height, width in ((1, 1), (5, 13), (37, 29)):
        indices = rng.integers(0, 1 << bits, (height, width)).astype(np.uint8)
        data = palette_png(indices, palette=colours, bits=bits, transparency=transparency)
        pillow = np.asarray(Image.open(io.BytesIO(data)))
        mask = decode_mask(data)
        assert mask.dtype == np.uint8 and np.array_equal(mask, pillow)
        assert np.array_equal(mask, indices)


def test_one_bit_grey_mask_gives_zero_and_one() -> None:
    binary = np.random.default_rng(0).integers(0, 2, (9, 17)).astype(bool)
    out = io.BytesIO()
    Image.fromarray(binary).save(out, format="PNG")  # mode "1": a 1-bit grey PNG
    data = out.getvalue()
    assert data[24] == 1 and data[25] == 0
    assert np.array_equal(decode_mask(data), binary.astype(np.uint8))  # not {0, 255}


def test_damaged_palette_png_is_a_decode_error() -> None:
    data = palette_png(np.zeros((8, 8), np.uint8))
    with pytest.raises(DecodeError, match="mask 7"):
        decode_mask(data[:40], where="mask 7")


def test_colour_jpeg_mask_says_jpeg_changes_colours() -> None:
    pixels = np.zeros((16, 16, 3), np.uint8)
    pixels[:, 8:] = (200, 30, 30)
    data = simplejpeg.encode_jpeg(pixels, quality=90)
    assert read_mask(data).kind == "colour"
    with pytest.raises(DecodeError, match="JPEG changes colours"):
        decode_mask(data)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_palette_index_outside_a_short_palette_cannot_be_mapped() -> None:
    # Written by hand: Pillow would shrink the bit depth (and the indices) to fit the palette.
    indices = np.array([[0, 1], [2, 3]], np.uint8)
    rows = b"".join(b"\x00" + row.tobytes() for row in indices)  # filter 0 on each row
    data = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 3, 0, 0, 0))
            + _chunk(b"PLTE", bytes([0, 0, 0, 128, 0, 0]))  # two colours; 2 and 3 have none
            + _chunk(b"IDAT", zlib.compress(rows)) + _chunk(b"IEND", b""))
    assert np.array_equal(decode_mask(data), indices)  # without a mapping: the indices
    with pytest.raises(DecodeError, match="palette has 2 colours"):
        decode_mask(data, labels=MaskLabels(colors={(0, 0, 0): 0, (128, 0, 0): 1}))


def test_a_mapping_wins_over_equal_channels() -> None:
    # A black-and-white mask saved as RGB: without a mapping its grey values, with one, ids.
    pixels = np.zeros((6, 6, 3), np.uint8)
    pixels[2:4] = 255
    out = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(out, format="PNG")
    data = out.getvalue()
    assert set(np.unique(decode_mask(data)).tolist()) == {0, 255}
    labels = MaskLabels(colors={(0, 0, 0): 0, (255, 255, 255): 1})
    assert np.array_equal(decode_mask(data, labels=labels), (pixels[:, :, 0] > 0).astype(np.uint8))
