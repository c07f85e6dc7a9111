"""Decode a record once for patch cutting: the image at reduced scale, its mask at full size.

:func:`decode_for_patches` turns a record into a :class:`DecodedImage` (the pixels at scale
``1/d``, the full-size mask, the record's other features), from which
:class:`~shardfeed.pipeline.patches.Patches` cuts many patches. A JPEG is decoded at reduced
DCT scale ``1/d`` (:func:`~shardfeed.transforms.decode.image.decode_jpeg_reduced`); other
encodings, and CMYK JPEGs, are decoded whole and shrunk by ``d`` (area interpolation).

EXIF orientation follows the image field's ``exif_orientation``: ignored by default (the
stored pixels, as every decode path gives them); with ``"apply"`` a tagged JPEG's reduced
decode is turned, and the full size is the turned image's.

An image (or mask) whose header claims more than ``max_pixels`` pixels is refused before
decoding, whatever the scale it would be decoded at, with a DecodeError naming it. The
image's type is the image field's ``image_dtype`` (uint8, or uint16: a reduced-scale JPEG
decode widened ×257, as every other 8-bit image).

Determinism: a pure function of the record's bytes. State: none. Memory: one decoded image
(and mask) per :class:`DecodedImage`; a decode holds at most
:func:`~shardfeed.transforms.decode.sizes.decode_peak_bytes` of ``max_pixels`` while it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from shardfeed.errors import DecodeError
from shardfeed.transforms.base import Sample
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.image import (
    CMYK_SPACES,
    check_pixels,
    decode_jpeg_reduced,
    jpeg_header,
    sniff_format,
    to_image_dtype,
)
from shardfeed.transforms.decode.orientation import orient, orientation_of, oriented_size


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """A cached image: pixels at scale 1/d, full-size mask, the record's other features.

    Made once an image and read by every slice that cuts from it while it is cached (tens
    of slices), so what those slices need of it is worked out here, once: ``dims`` (the
    image's height and width, then the full size's), ``kinds`` (:func:`meta_kinds` of
    ``meta``, worked out here where not given) and ``values`` (``meta``'s values in the
    order of ``kinds``, each numeric array C-contiguous, the array itself where it is: a
    slice joins its images' bytes into a column, 64 images' labels in ~1.6 µs on 2 cores
    where stacking the arrays took ~6)."""

    image: np.ndarray
    mask: np.ndarray | None
    meta: dict[str, Any]
    full_hw: tuple[int, int]
    kinds: tuple[tuple[Any, ...], ...] = ()
    dims: tuple[int, int, int, int] = field(init=False)
    values: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = self.image.shape
        object.__setattr__(self, "dims", (int(shape[0]), int(shape[1]), *self.full_hw))
        if not self.kinds:
            object.__setattr__(self, "kinds", meta_kinds(self.meta))
        object.__setattr__(self, "values", tuple(  # in kinds' order
            np.ascontiguousarray(value) if len(kind) > 1 else value
            for kind, value in zip(self.kinds, self.meta.values(), strict=True)))

    @property
    def nbytes(self) -> int:
        mask = 0 if self.mask is None else self.mask.nbytes
        return self.image.nbytes + mask + 64 * (len(self.meta) + 1)


_KINDS: dict[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]] = {}
_KINDS_KEPT = 1024  # kinds of records: a dataset has one or a few


def meta_kinds(meta: dict[str, Any]) -> tuple[tuple[Any, ...], ...]:
    """What stacking ``meta`` with other records' features needs to know of it: its names in
    order, each numeric array's shape and dtype (``(name, shape, dtype)``), ``(name,)`` for
    any other value. Equal kinds are one object while fewer than ``_KINDS_KEPT`` are known
    (``is`` then tells records alike; see :func:`~shardfeed.pipeline.patch_crops.
    stacked_features`); past that, equal ones may be distinct objects, never unequal ones the
    same."""
    kinds = tuple((name, value.shape, value.dtype)
                  if isinstance(value, np.ndarray) and value.dtype.kind in "biufc" else (name,)
                  for name, value in meta.items())
    known = _KINDS.get(kinds)
    if known is not None:
        return known
    if len(_KINDS) < _KINDS_KEPT:  # no lock: of two threads adding equal kinds, both get
        return _KINDS.setdefault(kinds, kinds)  # the one kept
    return kinds


def decode_for_patches(
    record: Sample,
    *,
    image_field: ImageField,
    mask_field: ImageField | None,
    denominator: int,
    max_pixels: int,
    require_mask: bool | None,
) -> DecodedImage:
    """Decode the record's image at scale ``1/denominator`` and its mask at full size.

    ``image_field`` and ``mask_field`` are bound to the dataset's schema; ``mask_field=None``
    leaves the mask in the record's other features. The mask decodes to class ids as
    ``mask_field.mask_labels`` says (grey values, palette indices; a colour or 16-bit mask
    is a DecodeError by default: see :mod:`shardfeed.transforms.decode.masks`). Raises
    DecodeError when the mask's size differs from the image's or an image (or mask) claims
    more than ``max_pixels`` pixels (the fields' own ``max_pixels`` applies to what they
    decode), SchemaError when ``require_mask`` is True and there is no mask.
    """
    # What needs no pixels is worked out before the decode: the Python after a large decode
    # runs slower (on 2 cores, what follows a 1566² JPEG's decode in this function took
    # 132 µs of CPU where it took 10 with the decode faked; its CPU after the decode, in
    # three runs against the order before: 53 / 68 / 72 -> 38 / 56 / 50 µs an image)
    key, encoding = image_field.require(record)
    where = image_field.where(record, key)
    drop = [key] if encoding != "path" else []
    found = None if mask_field is None else mask_field.locate(record)
    if found is not None:
        drop.append(found[0])
    meta = {k: v for k, v in record.items() if k not in drop}
    kinds = meta_kinds(meta)
    image, full_hw = _decode_image_scaled(record, image_field, key, encoding, where=where,
                                          denominator=denominator, max_pixels=max_pixels)
    mask = None
    if mask_field is not None and found is None and require_mask:
        mask_field.require(record)  # raises SchemaError naming the keys
    if mask_field is not None and found is not None:
        mask = _decode_mask(record, mask_field, found[0], full_hw)
    if not image.flags.c_contiguous:
        image = np.ascontiguousarray(image)
    return DecodedImage(image, mask, meta, full_hw, kinds)


def _decode_image_scaled(
    record: Sample,
    image_field: ImageField,
    key: str,
    encoding: str,
    *,
    where: str,
    denominator: int,
    max_pixels: int,
) -> tuple[np.ndarray, tuple[int, int]]:
    """The image at scale 1/d (height × width × channels) and its full-size height and width.

    A JPEG (not CMYK) decodes at reduced DCT scale; anything else decodes whole and shrinks.
    """
    d = denominator
    image: np.ndarray | None = None
    full_hw = (0, 0)
    if encoding in ("auto", "path") and not isinstance(record[key], list):
        data = image_field.encoded_bytes(record, key, encoding)
        if sniff_format(data) == "jpeg":
            height, width, space = jpeg_header(data, where=where)
            check_pixels(height, width, max_pixels=max_pixels, where=where, nbytes=len(data))
            if space not in CMYK_SPACES:
                turn = orientation_of(data, image_field.exif_orientation)  # before: see
                full_hw = oriented_size(height, width, turn)  # decode_for_patches
                dtype = image_field.image_dtype
                image = decode_jpeg_reduced(data, height=height, width=width, denominator=d,
                                            where=where)
                if turn != 1:
                    image = orient(image, turn)
                if dtype is not None and image.dtype != dtype:
                    image = to_image_dtype(image, dtype, data=data, where=where)
        if image is None:
            image = image_field.decode_bytes(data, where, True, from_record=encoding != "path")
    else:
        image = image_field.decode(record)
    if full_hw == (0, 0):
        full_hw = (int(image.shape[0]), int(image.shape[1]))
    if image.ndim == 2:
        image = image[:, :, None]
    if d > 1 and image.shape[:2] == full_hw:
        image = _shrink(image, d, full_hw, where)
    return image, full_hw


def _decode_mask(record: Sample, mask_field: ImageField, key: str,
                 full_hw: tuple[int, int]) -> np.ndarray:
    """The record's full-size mask (its feature ``key``)."""
    mask = mask_field.decode(record)
    if mask.shape[:2] != full_hw:
        raise DecodeError(
            f"{mask_field.where(record, key)}: the mask is "
            f"{mask.shape[0]}×{mask.shape[1]} (height×width) but its image is "
            f"{full_hw[0]}×{full_hw[1]}; a mask must have its image's size: re-create "
            "the mask at the image's size, or skip such records with on_error='skip'"
        )
    return mask


def _shrink(image: np.ndarray, d: int, full_hw: tuple[int, int], where: str) -> np.ndarray:
    """A full-size decoded image shrunk by ``d`` (area interpolation), as a JPEG at 1/d."""
    shape = (math.ceil(full_hw[1] / d), math.ceil(full_hw[0] / d))
    try:
        return cv2.resize(image, shape, interpolation=cv2.INTER_AREA).reshape(
            shape[1], shape[0], image.shape[2])
    except (cv2.error, MemoryError) as exc:
        raise DecodeError(f"{where}: cannot shrink the decoded {full_hw[0]}×{full_hw[1]} "
                          f"image by {d}: {exc}") from None


__all__ = ["DecodedImage", "decode_for_patches", "meta_kinds"]
