"""Turning one :class:`PackItem` into the payload of one record, in one of three modes.

=============  ==========================================================================
``embedded``   the image file's bytes as they are (no re-encoding): ``image/encoded``,
               ``image/format`` (from the magic bytes), ``image/filename``, height, width,
               channels (from the header); a mask as ``mask/encoded`` + ``mask/format``
``referenced`` only the path relative to the dataset root: ``image/path`` (``mask/path``);
               the image is read when a loader decodes it
``raw``        decoded uint8 pixels: ``image/raw`` with ``image/height``, ``image/width``,
               ``image/channels`` (a mask as ``mask/raw`` with ``mask/height``/``width``)
=============  ==========================================================================

Every mode adds the item's labels and its group and order values (the order key as int64
nanoseconds: see :mod:`shardfeed.tools.pack.time`). Determinism: a payload is
a pure function of the item and the file bytes, so any number of workers writes the same
bytes. Memory: one image (decoded, in raw mode) per call.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Literal

import numpy as np

from shardfeed.errors import DecodeError, PackError
from shardfeed.format import spec
from shardfeed.format.example import encode_example
from shardfeed.tools.pack.items import PackItem
from shardfeed.transforms.decode.image import PNG_MAGIC
from shardfeed.transforms.decode.masks import decode_mask
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

Mode = Literal["embedded", "referenced", "raw"]
MODES: tuple[str, ...] = ("embedded", "referenced", "raw")
MASK_PATH = spec.MASK_PATH

_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


def image_format(data: bytes) -> str:
    """The encoding named by the magic bytes: jpeg, png, bmp, gif, webp, tiff, pnm, or
    ``other``."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == PNG_MAGIC:
        return "png"
    if data[:2] == b"BM":
        return "bmp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if data[:1] == b"P" and data[1:2] in b"1234567" and data[2:3] in b" \t\r\n#":
        return "pnm"  # PBM/PGM/PPM/PAM (binary or text), as OpenCV reads them
    return "other"


def _read(path: str, item: PackItem) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise PackError(
            f"cannot read '{path}' (input row {item.row}): {exc.strerror or exc}; check that "
            "the file exists and is readable"
        ) from None


def _where(path: str, item: PackItem) -> str:
    return f"file '{path}' (input row {item.row})"


def image_shape(
    data: bytes, *, where: str, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[int, int, int]:
    """``(height, width, channels)`` of an encoded image, from its header when it has one;
    PackError for an image that claims more than ``max_pixels`` pixels."""
    from shardfeed.transforms.decode.image import check_size

    try:
        check_size(data, max_pixels=max_pixels, where=where)
    except DecodeError as exc:
        raise _pack_error(exc) from None
    kind = image_format(data)
    if kind == "png" and len(data) >= 26 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return int(height), int(width), _PNG_CHANNELS.get(data[25], 3)
    if kind == "jpeg":
        from shardfeed.transforms.decode.image import jpeg_header

        try:
            height, width, space = jpeg_header(data, where=where)
        except DecodeError as exc:
            raise _pack_error(exc) from None
        channels = 1 if space == "Gray" else 4 if space in ("CMYK", "YCCK") else 3
        return height, width, channels
    image = _decode(data, where=where, mode="unchanged", max_pixels=max_pixels)
    return int(image.shape[0]), int(image.shape[1]), 1 if image.ndim == 2 else int(image.shape[2])


def _decode(data: bytes, *, where: str, mode: Literal["rgb", "gray", "unchanged"],
            max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    from shardfeed.transforms.decode.image import decode_image

    try:
        return decode_image(data, mode=mode, where=where, max_pixels=max_pixels)
    except DecodeError as exc:
        raise _pack_error(exc) from None


def _pack_error(exc: DecodeError) -> PackError:
    text = str(exc).split(". The record holds")[0]
    return PackError(f"{text}. Fix or remove that input file (or its CSV row)")


def _decode_raw(data: bytes, *, where: str, mode: Literal["gray", "unchanged"],
                max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    image = _decode(data, where=where, mode=mode, max_pixels=max_pixels)
    if image.dtype != np.uint8:
        raise PackError(
            f"{where}: the image has {image.dtype} pixels; raw mode stores uint8 only: convert "
            "it to 8 bits, or pack with --mode embedded"
        )
    return image


def _labels(item: PackItem, group_key: str | None, order_key: str | None) -> dict[str, Any]:
    features: dict[str, Any] = {}
    for name, ints in item.int_labels.items():
        features[name] = np.asarray(ints, dtype=np.int64)
    for name, floats in item.float_labels.items():
        features[name] = np.asarray(floats, dtype=np.float32)
    if group_key is not None and item.group_value is not None:
        features[group_key] = item.group_value
    if order_key is not None and item.order_ns is not None:
        features[order_key] = np.asarray([item.order_ns], dtype=np.int64)
    return features


def build_payload(
    item: PackItem,
    *,
    mode: Mode,
    group_key: str | None = None,
    order_key: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> bytes:
    """The serialized ``tf.train.Example`` of ``item`` in ``mode`` (see the module table);
    images and masks of more than ``max_pixels`` pixels raise PackError.

    The order key is stored as int64 nanoseconds: exact, where float32 (the only float an
    Example holds) would round a Unix time to minutes.
    """
    features = _labels(item, group_key, order_key)
    if mode == "referenced":
        features[spec.IMAGE_PATH] = item.name
        if item.mask_name is not None:
            features[MASK_PATH] = item.mask_name
        return encode_example(features)
    data = _read(item.source, item)
    where = _where(item.source, item)
    features[spec.IMAGE_FILENAME] = item.name
    if mode == "embedded":
        kind = image_format(data)
        height, width, channels = image_shape(data, where=where, max_pixels=max_pixels)
        features[spec.IMAGE_ENCODED] = data
        features[spec.IMAGE_FORMAT] = kind
    else:
        image = _decode_raw(data, where=where, mode="unchanged", max_pixels=max_pixels)
        height, width = int(image.shape[0]), int(image.shape[1])
        channels = 1 if image.ndim == 2 else int(image.shape[2])
        features[spec.IMAGE_RAW] = np.ascontiguousarray(image).tobytes()
    features[spec.IMAGE_HEIGHT] = height
    features[spec.IMAGE_WIDTH] = width
    features[spec.IMAGE_CHANNELS] = channels
    if item.mask_source is not None:
        mask = _read(item.mask_source, item)
        mwhere = _where(item.mask_source, item)
        if mode == "embedded":
            # refuse an unreadable mask now, not in training
            image_shape(mask, where=mwhere, max_pixels=max_pixels)
            features[spec.MASK_ENCODED] = mask
            features[spec.MASK_FORMAT] = image_format(mask)
        else:
            # a mask is a label map: palette PNGs keep their indices (decode_mask), never grey levels
            try:
                pixels = decode_mask(mask, where=mwhere, max_pixels=max_pixels)
            except DecodeError as exc:
                raise _pack_error(exc) from exc
            features[spec.MASK_RAW] = np.ascontiguousarray(pixels).tobytes()
            features[spec.MASK_HEIGHT] = int(pixels.shape[0])
            features[spec.MASK_WIDTH] = int(pixels.shape[1])
    return encode_example(features)


def _label_bytes(item: PackItem) -> int:
    total = sum(len(n) + 8 * len(v) + 8 for n, v in item.int_labels.items())
    return total + sum(len(n) + 4 * len(v) + 8 for n, v in item.float_labels.items())


def estimate_size(item: PackItem, *, mode: Mode) -> int:
    """Estimated framed record size in bytes, for cutting shards before writing.

    Cheap and deterministic: file sizes (embedded), header dimensions (raw), name lengths
    (referenced). Exact sizes are not needed: ``--shard-size`` is a target.
    """
    overhead = 96 + len(item.name) + _label_bytes(item) + spec.FRAMING_BYTES
    if mode == "referenced":
        return overhead + (len(item.mask_name) if item.mask_name else 0)
    if mode == "embedded":
        size = os.path.getsize(item.source) if os.path.exists(item.source) else 0
        if item.mask_source is not None and os.path.exists(item.mask_source):
            size += os.path.getsize(item.mask_source)
        return overhead + size
    height, width, channels = image_shape(
        _read(item.source, item), where=_where(item.source, item)
    )
    size = height * width * channels
    if item.mask_source is not None:
        mh, mw, _ = image_shape(_read(item.mask_source, item), where=_where(item.mask_source, item))
        size += mh * mw
    return overhead + size


def fingerprint(item: PackItem) -> str:
    """One line that changes when anything deciding the item's record bytes changes."""
    stats = []
    for path in (item.source, item.mask_source):
        if path is None:
            continue
        try:
            st = os.stat(path)
            stats.append(f"{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            stats.append("missing")
    return repr(
        (
            item.name, item.mask_name, sorted(item.int_labels.items()),
            sorted(item.float_labels.items()), item.group, item.group_value, item.order_ns, stats,
        )
    )
