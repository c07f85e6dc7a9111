"""8-bit PNGs decoded straight into their batch rows: the small-image path of the batch decode.

:func:`decode_pngs_into` decodes a whole slice's PNGs in one call of the compiled part
(``_png.c``, where the package was built with it: zlib and the PNG filters, no GIL held),
which takes the plainest PNGs (8-bit grey or RGB, exactly the row's size, sound CRCs, one
zlib stream) and leaves every other row; :func:`decode_png_into` decodes one row with
OpenCV. Both give the pixels of :func:`~shardfeed.transforms.decode.image.decode_image`
(for such PNGs, the stored samples); tests compare them. Both write uint8 rows only: a
16-bit PNG, or a uint16 row (``image_dtype="uint16"``), is left to ``decode_image``, which
keeps or widens the samples as the op asks.

Determinism: a pure function of the bytes. State: none.
Memory: one image's scanlines (compiled), or OpenCV's decoded image, copied into the row.
"""

from __future__ import annotations

import struct

import cv2
import numpy as np

from shardfeed.format.native import compiled_module
from shardfeed.transforms.decode.image import NO_TURN, PNG_MAGIC, PNG_RGB_FLAG

_PNG_SIZE = struct.Struct(">II")  # IHDR: width, height

compiled = compiled_module("shardfeed.transforms.decode._png")
"""The compiled PNG rows (``_png.c``); None where built without a C compiler or zlib."""

__all__ = ["decode_png_into", "decode_pngs_into"]


def decode_pngs_into(values: list[bytes], out: np.ndarray, *, max_pixels: int) -> list[int]:
    """Decode the plainest PNGs of ``values`` into their rows of ``out`` (N×H×W×1 or ×3
    uint8); returns the rows left (all of them without the compiled part), for
    :func:`decode_png_into` or ``decode_image``."""
    if (compiled is None or out.ndim != 4 or out.dtype != np.uint8 or out.shape[-1] not in (1, 3)
            or not out.flags.c_contiguous or not out.flags.writeable):
        return list(range(len(values)))
    done = compiled.decode_rows(values, out, max_pixels)
    return [row for row, flag in enumerate(done) if not flag]


def decode_png_into(data: bytes, target: np.ndarray, *, max_pixels: int) -> bool:
    """Decode an 8-bit PNG straight into ``target`` (H×W×1 grey or H×W×3 RGB uint8) when its
    header says it holds exactly those channels; False (nothing written) for any other image.

    The pixels are those of ``decode_image`` followed by the channel conversion of the
    decode ops (a grey PNG's RGB decode is three equal channels, whose grey value is that
    value again), without the intermediate arrays. Anything unusual (a damaged header, more
    pixels than ``max_pixels``, bytes OpenCV refuses, a target that is not uint8) returns
    False: ``decode_image`` then decodes it, or raises the DecodeError naming the record.
    """
    if (data[:8] != PNG_MAGIC or len(data) < 33 or target.ndim != 3
            or target.dtype != np.uint8):
        return False
    height, width, channels = target.shape
    if data[24] != 8 or data[25] != (0 if channels == 1 else 2):  # bit depth, colour type
        return False
    rgb_flag = PNG_RGB_FLAG
    if channels == 3 and rgb_flag is None:
        return False
    if data[12:16] != b"IHDR" or _PNG_SIZE.unpack_from(data, 16) != (width, height):
        return False
    if height * width > max_pixels:
        return False  # decode_image refuses it, naming the record
    flags = cv2.IMREAD_GRAYSCALE | NO_TURN if channels == 1 or rgb_flag is None else rgb_flag
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error:
        return False  # decode_image names the damage
    if image is None or image.shape[:2] != (height, width):
        return False
    target[...] = image.reshape(target.shape)
    return True
