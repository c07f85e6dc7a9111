"""8-bit PNGs decoded straight into their batch rows: the small-image path of the batch decode.

Determinism: a pure function of the bytes (the pixels of :func:`~shardfeed.transforms.decode.image.decode_image`). State: none.
Memory: OpenCV's decoded image, copied into the row.
"""

from __future__ import annotations

import struct

import cv2
import numpy as np

from shardfeed.transforms.decode.image import PNG_MAGIC, PNG_RGB_FLAG

_PNG_SIZE = struct.Struct(">II")  # IHDR: width, height

__all__ = ["decode_png_into"]


def decode_png_into(data: bytes, target: np.ndarray, *, max_pixels: int) -> bool:
    """Decode an 8-bit PNG straight into ``target`` (H×W×1 grey or H×W×3 RGB uint8) when its
    header says it holds exactly those channels; False (nothing written) for any other image.

    The pixels are those of ``decode_image`` followed by the channel conversion of the
    decode ops (a grey PNG's RGB decode is three equal channels, whose grey value is that
    value again), without the intermediate arrays. Anything unusual (a damaged header, more
    pixels than ``max_pixels``, bytes OpenCV refuses) returns False: ``decode_image`` then
    decodes it, or raises the DecodeError naming the record.
    """
    if data[:8] != PNG_MAGIC or len(data) < 33 or target.ndim != 3:
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
    flags = cv2.IMREAD_GRAYSCALE if channels == 1 or rgb_flag is None else rgb_flag
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error:
        return False  # decode_image names the damage
    if image is None or image.shape[:2] != (height, width):
        return False
    target[...] = image.reshape(target.shape)
    return True
