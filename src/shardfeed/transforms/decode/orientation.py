"""EXIF orientation: one policy on every decode path.

A camera that was held sideways stores its pixels as the sensor saw them and writes an EXIF
``Orientation`` tag (1–8) saying how to turn them for display. shardfeed decodes a JPEG the
same way whatever path it takes (full decode, DCT-scaled decode, region decode, the GPU,
masks, patches), by one option, ``exif_orientation``:

``"ignore"`` (the default)
    The stored pixels, tag or not, as ``tf.io.decode_jpeg`` and torchvision's
    ``decode_jpeg`` give them. Sizes are the header's; a tagged and a stripped copy of a
    photo give the same bytes. (Decoders that would turn the image, OpenCV and nvImageCodec,
    are told not to.)

``"apply"``
    The pixels turned as the tag says (as Pillow's ``ImageOps.exif_transpose`` and photo
    viewers show them). For orientations 5–8 height and width swap: the sizes the crop ops
    draw their boxes in, the boxes they move and the output are the displayed image's. The
    crop ops still decode only what they need: the crop box is mapped back to the stored
    image (:func:`stored_box`), decoded there (at a DCT scale, or as a region) and turned
    (:func:`orient`), giving the pixels of the turned image cut at the box.

The tag is read from a JPEG's first ``APP1`` ``Exif`` segment (IFD0, tag 0x0112). Other
formats are decoded as stored under either policy, and so is a JPEG whose tag is absent,
damaged or out of range (orientation 1). A mask follows its own file's tag under
``"apply"``: a mask drawn on the displayed photo and saved without a tag stays as it is.

Determinism: pure functions of the bytes. State: none. Memory: the turned image (one copy).
"""

from __future__ import annotations

import struct
from typing import Literal

import cv2
import numpy as np

from shardfeed.transforms.boxes import Box

ExifOrientation = Literal["ignore", "apply"]
EXIF_ORIENTATIONS: tuple[str, ...] = ("ignore", "apply")

_EXIF = b"Exif\x00\x00"
_ORIENTATION_TAG = 0x0112
_SHORT = 3
_TIFF_ORDER = {b"II": "<", b"MM": ">"}
# Markers without a length: TEM, RST0-7, SOI (a stray one).
_BARE = frozenset((0x01, *range(0xD0, 0xD9)))


def check_exif_orientation(value: object) -> None:
    """ValueError unless ``value`` is ``"ignore"`` or ``"apply"``."""
    if value not in EXIF_ORIENTATIONS:
        raise ValueError(
            f"exif_orientation must be 'ignore' (decode the stored pixels, as "
            f"tf.io.decode_jpeg does) or 'apply' (turn them as the JPEG's EXIF tag says), "
            f"got {value!r}"
        )


def jpeg_orientation(data: bytes | memoryview) -> int:
    """The EXIF orientation (1–8) of JPEG ``data``; 1 when it has no readable tag.

    Walks the segments before the first scan, reads the first ``APP1`` segment that starts
    with ``Exif\\0\\0`` and, in its IFD0, the Orientation tag (one SHORT). Anything that does
    not parse, or a value outside 1–8, is orientation 1 (the stored pixels), as viewers
    treat it. Reads only the header segments; never raises for bad bytes.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return 1
    pos = 2
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return 1
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in _BARE:
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # start of scan, end of image: no more header segments
            return 1
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2:
            return 1
        end = pos + 2 + length
        if marker == 0xE1 and bytes(data[pos + 4:pos + 10]) == _EXIF:
            return _tiff_orientation(bytes(data[pos + 10:min(end, n)]))
        pos = end
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    """The Orientation tag of IFD0 of the TIFF structure of an EXIF segment; 1 if none."""
    order = _TIFF_ORDER.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    magic, ifd = struct.unpack_from(order + "HI", tiff, 2)
    if magic != 42 or ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for i in range(min(count, (len(tiff) - ifd - 2) // 12)):
        entry = ifd + 2 + 12 * i
        tag, kind, values = struct.unpack_from(order + "HHI", tiff, entry)
        if tag == _ORIENTATION_TAG:
            if kind != _SHORT or values != 1:
                return 1
            (value,) = struct.unpack_from(order + "H", tiff, entry + 8)
            return int(value) if 1 <= value <= 8 else 1
    return 1


def orientation_of(data: bytes | memoryview, policy: ExifOrientation) -> int:
    """The orientation ``policy`` gives encoded ``data``: 1 for ``"ignore"`` and for
    anything but a JPEG; the JPEG's tag (:func:`jpeg_orientation`) for ``"apply"``."""
    if policy == "ignore" or bytes(data[:3]) != b"\xff\xd8\xff":
        return 1
    return jpeg_orientation(data)


def swaps(orientation: int) -> bool:
    """Whether ``orientation`` swaps height and width (5–8: a quarter turn or a transpose)."""
    return orientation >= 5


def oriented_size(height: int, width: int, orientation: int) -> tuple[int, int]:
    """The displayed ``(height, width)`` of a stored ``height``×``width`` image."""
    return (width, height) if swaps(orientation) else (height, width)


def stored_box(box: Box, height: int, width: int, orientation: int) -> Box:
    """The box of the stored image whose pixels, turned by ``orientation``, are ``box`` of
    the displayed ``height``×``width`` image: ``orient(stored[stored_box]) ==
    orient(stored)[box]``."""
    y, x, h, w = box
    if orientation == 2:
        return Box(y, width - x - w, h, w)
    if orientation == 3:
        return Box(height - y - h, width - x - w, h, w)
    if orientation == 4:
        return Box(height - y - h, x, h, w)
    if orientation == 5:
        return Box(x, y, w, h)
    if orientation == 6:
        return Box(width - x - w, y, w, h)
    if orientation == 7:
        return Box(width - x - w, height - y - h, w, h)
    if orientation == 8:
        return Box(x, height - y - h, w, h)
    return box


_ROTATE = {3: cv2.ROTATE_180, 6: cv2.ROTATE_90_CLOCKWISE, 8: cv2.ROTATE_90_COUNTERCLOCKWISE}


def orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """``image`` (H×W or H×W×C, stored) turned for display as EXIF ``orientation`` says: a
    new C-contiguous array (OpenCV's flips, rotations and transpose, which release the GIL),
    or ``image`` itself for orientation 1.

    ====  ===========================  ====  ============================================
    2     mirrored left-right          5     transposed (mirrored about the main diagonal)
    3     turned 180°                  6     turned 90° clockwise
    4     mirrored top-bottom          7     transposed about the other diagonal
    8     turned 90° counter-clockwise
    ====  ===========================  ====  ============================================
    """
    if orientation == 1 or orientation not in range(2, 9):
        return image
    shape = image.shape
    if orientation == 2:
        turned = cv2.flip(image, 1)
    elif orientation == 4:
        turned = cv2.flip(image, 0)
    elif orientation in _ROTATE:
        turned = cv2.rotate(image, _ROTATE[orientation])
    else:
        turned = cv2.transpose(image)
        if orientation == 7:
            turned = cv2.rotate(turned, cv2.ROTATE_180)
    height, width = oriented_size(shape[0], shape[1], orientation)
    result: np.ndarray = np.asarray(turned).reshape(height, width, *shape[2:])
    return result


__all__ = [
    "EXIF_ORIENTATIONS",
    "ExifOrientation",
    "check_exif_orientation",
    "jpeg_orientation",
    "orient",
    "orientation_of",
    "oriented_size",
    "stored_box",
    "swaps",
]
