"""Decode masks as label maps: one class id a pixel, never a colour turned into a grey level.

==============================  ===========================================================
stored mask                     decoded (H×W)
==============================  ===========================================================
grey, 8-bit (PNG, JPEG, ...)    its values, uint8
grey PNG, 1, 2 or 4-bit         its stored values (0..1, 0..3, 0..15), not stretched to 0..255
grey, 16-bit                    its values as uint16 with ``dtype="uint16"``; else an error
palette PNG (any bit depth)     its palette indices (VOC: 0..20 and 255), whatever the colours
colour (RGB, RGBA), 8-bit      with ``colors``: the id of each pixel's colour (alpha is
                                ignored); without: an error, unless R = G = B at every pixel
                                (a grey mask stored in three channels: its values)
colour, 16-bit (PNG, TIFF, PNM) an error, before decoding (store 16-bit masks as one-channel
                                grey images)
==============================  ===========================================================

With ``colors``, a palette PNG's pixels are mapped by colour too (each index has its
palette colour): the mapping the user gives always wins over the file's own numbering.
A pixel whose colour is not in ``colors`` is an error, or ``unlisted`` when one is given.
Palettes of other formats (GIF, BMP, TIFF) decode to colours and follow the colour rule.

Palette indices are read without converting colours: the PNG is rewritten in memory as a grey
PNG (its header with colour type 0, then its image data unchanged: a palette PNG stores one
index a pixel, laid out exactly as grey samples of the same bit depth) and decoded by OpenCV
as it stands. The rewrite copies the file once (a few µs); the decode skips the palette → RGB
→ grey conversion, about 5× faster than decoding the colours. Decoders stretch 1/2/4-bit grey
samples to 0..255 by bit replication (value × 255 / (2^d − 1)); that is undone exactly.

Size limit: a mask is an image like any other: one whose header claims more than
``max_pixels`` pixels is refused before decoding (see :mod:`shardfeed.transforms.decode.sizes`).

This module reads the pixels (:func:`read_mask`); :mod:`shardfeed.transforms.decode.mask_labels`
gives them ids (:class:`MaskLabels`); :func:`decode_mask` does both.

Determinism: a pure function of the bytes. State: none. Memory: the decoded mask (and, for a
colour mask, its H×W×3 colours while ids are looked up, a chunk of rows at a time).
"""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np

from shardfeed.errors import DecodeError
from shardfeed.transforms.decode.image import (
    PNG_MAGIC,
    Where,
    check_size,
    decode_error,
    decode_image,
    out_of_memory,
    where_text,
)
from shardfeed.transforms.decode.mask_labels import (
    LABEL_MAPS,
    MASK_DTYPES,
    Color,
    MaskDtype,
    MaskLabels,
    MaskPixels,
)
from shardfeed.transforms.decode.orientation import ExifOrientation
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

_CHUNK_HEAD = struct.Struct(">I4s")
_GREY, _PALETTE = 0, 3


# --- reading the pixels ------------------------------------------------------------------


def _place(where: Where) -> str:
    text = where_text(where)
    return f"{text}: " if text else ""


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _scan_png(data: bytes | memoryview) -> tuple[int, bytes | None] | None:
    """Offset of the first IDAT chunk and the PLTE body (None if none); None if the chunks
    before the image data do not parse."""
    pos, size, palette = 8, len(data), None
    while pos + 12 <= size:
        length, kind = _CHUNK_HEAD.unpack_from(data, pos)
        if kind == b"IDAT":
            return pos, palette
        end = pos + 12 + length
        if end > size:
            return None
        if kind == b"PLTE":
            palette = bytes(data[pos + 8:pos + 8 + length])
        pos = end
    return None


def _read_one_sample_png(
    data: bytes | memoryview, where: Where, depth: int, colour_type: int
) -> MaskPixels:
    """A grey or palette PNG: its stored samples (indices), exactly."""
    scanned = _scan_png(data)
    if scanned is None:
        raise decode_error(data, where, "damaged PNG (its chunks do not lead to image data)")
    idat, plte = scanned
    if colour_type == _PALETTE and (plte is None or depth not in (1, 2, 4, 8)):
        raise decode_error(data, where, "damaged PNG (a palette image needs a palette and "
                           f"1, 2, 4 or 8 bits a pixel; it has {depth})")
    header = bytearray(data[16:29])
    header[9] = _GREY
    # Only IHDR and the image data: ancillary chunks (tRNS, sBIT, iCCP, bKGD) are laid out
    # per colour type and would not fit a grey header; none of them changes a sample.
    grey = PNG_MAGIC + _png_chunk(b"IHDR", bytes(header)) + bytes(data[idat:])
    try:
        plane = cv2.imdecode(np.frombuffer(grey, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as exc:
        raise decode_error(data, where, f"OpenCV failed: {exc}") from None
    if plane is None or plane.ndim != 2:
        raise decode_error(data, where, "damaged PNG")
    if depth < 8:
        plane = _unstretch(plane, depth)
    if colour_type == _GREY:
        return MaskPixels(plane, "grey")
    colours = np.frombuffer(plte or b"", dtype=np.uint8)
    return MaskPixels(plane, "palette", colours[: colours.size // 3 * 3].reshape(-1, 3))


def _unstretch(plane: np.ndarray, depth: int) -> np.ndarray:
    """Stored ``depth``-bit samples from a decode that may have stretched them to 0..255."""
    top = (1 << depth) - 1
    if int(plane.max(initial=0)) <= top:
        return plane  # this decoder kept the stored values (a stretched nonzero is > top)
    step = 255 // top
    lut = (np.arange(256) // step).astype(np.uint8)
    return np.asarray(cv2.LUT(plane, lut))


def read_mask(
    data: bytes | memoryview, *, where: Where = "", fast_dct: bool = True,
    max_pixels: int = DEFAULT_MAX_PIXELS, exif_orientation: ExifOrientation = "ignore",
) -> MaskPixels:
    """Decode a mask's pixels: grey values, palette indices (with the palette), or colours.

    ``exif_orientation``: as :func:`~shardfeed.transforms.decode.image.decode_image`'s, for
    the mask file's own tag (a JPEG mask's; PNG masks are decoded as stored).

    Raises DecodeError for bytes that do not decode, and, before decoding, for a mask whose
    header claims more than ``max_pixels`` pixels or 16-bit colours (such a mask is no
    label map, and takes 15 bytes a pixel and more to decode).
    """
    claim = check_size(data, max_pixels=max_pixels, where=where, what="mask")
    if claim.wide_colour:
        raise DecodeError(
            f"{_place(where)}the mask is a {claim.bits}-bit colour image ({claim.channels} "
            f"channels); masks are label maps: store 16-bit masks as one-channel grey images "
            "(and decode with mask_dtype='uint16'), colour masks with 8 bits a channel"
        )
    head = bytes(data[:29])
    if head[:8] == PNG_MAGIC and head[12:16] == b"IHDR" and len(head) == 29:
        depth, colour_type = head[24], head[25]
        if colour_type == _PALETTE or (colour_type == _GREY and depth < 8):
            try:
                return _read_one_sample_png(data, where, depth, colour_type)
            except MemoryError:
                raise out_of_memory(data, where, "the mask") from None
    image = decode_image(data, mode="unchanged", where=where, fast_dct=fast_dct,
                         max_pixels=max_pixels, exif_orientation=exif_orientation)
    source = "png" if head[:8] == PNG_MAGIC else "jpeg" if head[:3] == b"\xff\xd8\xff" else "other"
    if image.ndim == 2:
        return MaskPixels(image, "grey", source=source)
    if image.shape[2] == 1:
        return MaskPixels(np.ascontiguousarray(image[:, :, 0]), "grey", source=source)
    return MaskPixels(image[:, :, :3], "colour", source=source)  # RGBA: alpha is no label


def decode_mask(
    data: bytes | memoryview,
    *,
    labels: MaskLabels = LABEL_MAPS,
    where: Where = "",
    fast_dct: bool = True,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    exif_orientation: ExifOrientation = "ignore",
) -> np.ndarray:
    """Decode an encoded mask into an H×W array of class ids (``labels.dtype``).

    Grey masks keep their values, palette PNGs their indices; colour masks need
    ``labels.colors`` (see the module docstring). ``exif_orientation``: see
    :func:`read_mask`. Raises DecodeError naming ``where``, also for a mask whose header
    claims more than ``max_pixels`` pixels.
    """
    pixels = read_mask(data, where=where, fast_dct=fast_dct, max_pixels=max_pixels,
                       exif_orientation=exif_orientation)
    return labels.labels(pixels, where=where)


__all__ = [
    "LABEL_MAPS",
    "MASK_DTYPES",
    "Color",
    "MaskDtype",
    "MaskLabels",
    "MaskPixels",
    "decode_mask",
    "read_mask",
]
