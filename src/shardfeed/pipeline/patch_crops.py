"""Patch options and crop geometry: an image decoded once (at reduced scale) and patches cut from it.

:class:`PatchOptions` holds what :class:`~shardfeed.pipeline.patches.Patches` cuts and caches.
:func:`decode_for_patches` turns a record into a :class:`DecodedImage` (the pixels at scale
``1/d``, the full-size mask, the record's other features); :func:`cut_patch` cuts one patch
from it with a keyed generator.

Crops. ``scale=None``: a ``size`` crop at a uniform position (images smaller than ``size``
are padded with zeros, bottom and right). ``scale=(lo, hi)``: a square-pixel crop of
``s × size`` pixels, ``s`` uniform in ``[lo, hi]``, resized to ``size``; when ``lo >= 2`` a
JPEG is decoded at reduced DCT scale ``1/d`` (``d`` the largest of 2, 4, 8 not above ``lo``;
other encodings are shrunk by ``d`` after decoding). Masks get the same box (nearest
neighbour).

An image (or mask) whose header claims more than ``max_pixels`` pixels is refused before
decoding, whatever the scale it would be decoded at, with a DecodeError naming it.

Determinism: a patch is a function of the decoded image and the generator's draws.
State: none. Memory: one decoded image per :class:`DecodedImage`; a patch is a new array;
a decode holds at most :attr:`PatchOptions.decode_bytes` while it runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import cv2
import numpy as np
import simplejpeg

from shardfeed.errors import DecodeError
from shardfeed.pipeline.samplers import Sample
from shardfeed.transforms import arrays
from shardfeed.transforms.boxes import parse_size
from shardfeed.transforms.decode import (
    check_pixels,
    decode_error,
    jpeg_header,
    out_of_memory,
    sniff_format,
)
from shardfeed.transforms.fields import ImageField
from shardfeed.transforms.image_size import (
    DEFAULT_MAX_PIXELS,
    check_max_pixels,
    decode_peak_bytes,
)

__all__ = ["PICKS", "DecodedImage", "PatchOptions", "Pick", "cut_patch", "decode_for_patches"]

Pick = Literal["stratified", "uniform"]
PICKS: tuple[Pick, ...] = get_args(Pick)
_CMYK = ("CMYK", "YCCK")


@dataclass(kw_only=True, frozen=True, slots=True)
class PatchOptions:
    """How patches are cut and cached (see :class:`Patches` for the meaning of each)."""

    size: tuple[int, int]
    scale: Sequence[float] | None = None  # kept as a pair of floats
    cache_images: int = 64
    refresh_every: int = 100
    pick: Pick = "stratified"
    reduced_decode: bool = True
    cache: bool = True
    cache_bytes: int | None = None
    mask: bool | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", parse_size(self.size))
        check_max_pixels(self.max_pixels)
        for name in ("cache_images", "refresh_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}; e.g. "
                                 f"cache_images=64, refresh_every=100")
        if self.scale is not None:
            try:
                lo, hi = (float(v) for v in self.scale)
            except (TypeError, ValueError):
                raise ValueError(f"scale must be None or a pair (min, max), got "
                                 f"{self.scale!r}") from None
            if not (0.0 < lo <= hi and math.isfinite(hi)):
                raise ValueError(f"scale must satisfy 0 < min <= max, got {self.scale!r}; "
                                 "e.g. scale=(1, 4) cuts 1x to 4x the patch size and "
                                 "resizes it to size")
            object.__setattr__(self, "scale", (lo, hi))
        if self.pick not in PICKS:
            raise ValueError(f"pick must be one of {PICKS}, got {self.pick!r}")
        for name in ("reduced_decode", "cache"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.cache_bytes is not None and (
            isinstance(self.cache_bytes, bool) or not isinstance(self.cache_bytes, int)
            or self.cache_bytes < 0
        ):
            raise ValueError(f"cache_bytes must be an int >= 0 or None (derived from "
                             f"cache_images), got {self.cache_bytes!r}")
        if self.mask is not None and not isinstance(self.mask, bool):
            raise TypeError(f"mask must be None, True or False, got {self.mask!r}")

    @property
    def denominator(self) -> int:
        """The reduced decode scale ``1/d`` of every image (1: full size)."""
        if self.scale is None or not self.reduced_decode:
            return 1
        d = 1
        while d < 8 and 2 * d <= self.scale[0]:
            d *= 2
        return d

    @property
    def decode_bytes(self) -> int:
        """The most memory one image's decode holds while it runs (``max_pixels`` pixels,
        and its mask), in bytes."""
        return decode_peak_bytes(self.max_pixels)

    def slack_images(self) -> int:
        """Images beyond ``cache_images`` the default byte bound allows (threads run ahead)."""
        return max(2, self.cache_images // 8)


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """A cached image: pixels at scale 1/d, full-size mask, the record's other features."""

    image: np.ndarray
    mask: np.ndarray | None
    meta: dict[str, Any]
    full_hw: tuple[int, int]

    @property
    def nbytes(self) -> int:
        mask = 0 if self.mask is None else self.mask.nbytes
        return self.image.nbytes + mask + 64 * (len(self.meta) + 1)


def decode_for_patches(
    record: Sample,
    *,
    image_field: ImageField,
    mask_field: ImageField | None,
    options: PatchOptions,
) -> DecodedImage:
    """Decode the record's image at scale ``1/options.denominator`` and its mask at full size.

    ``image_field`` and ``mask_field`` are bound to the dataset's schema; ``mask_field=None``
    leaves the mask in the record's other features. The mask decodes to class ids as
    ``mask_field.mask_labels`` says (grey values, palette indices; a colour or 16-bit mask
    is a DecodeError by default: see :mod:`shardfeed.transforms.masks`). Raises DecodeError when the mask's size
    differs from the image's or an image (or mask) claims more than ``options.max_pixels``
    pixels (the fields' own ``max_pixels`` applies to what they decode), SchemaError when
    ``options.mask`` is True and there is no mask.
    """
    key, encoding = image_field.require(record)
    where = image_field.where(record, key)
    d = options.denominator
    image: np.ndarray | None = None
    full_hw = (0, 0)
    if encoding in ("auto", "path") and not isinstance(record[key], list):
        data = image_field.encoded_bytes(record, key, encoding)
        if sniff_format(data) == "jpeg":
            height, width, space = jpeg_header(data, where=where)
            check_pixels(height, width, max_pixels=options.max_pixels, where=where,
                         nbytes=len(data))
            if space not in _CMYK:
                image = _decode_jpeg(data, d, where)
                full_hw = (height, width)
        if image is None:
            image = image_field.decode_bytes(data, where, True)
    else:
        image = image_field.decode(record)
    if full_hw == (0, 0):
        full_hw = (int(image.shape[0]), int(image.shape[1]))
    if image.ndim == 2:
        image = image[:, :, None]
    if d > 1 and image.shape[:2] == full_hw:
        shape = (math.ceil(full_hw[1] / d), math.ceil(full_hw[0] / d))
        try:
            image = cv2.resize(image, shape, interpolation=cv2.INTER_AREA).reshape(
                shape[1], shape[0], image.shape[2])
        except (cv2.error, MemoryError) as exc:
            raise DecodeError(f"{where}: cannot shrink the decoded {full_hw[0]}×{full_hw[1]} "
                              f"image by {d}: {exc}") from None
    drop = [key] if encoding != "path" else []
    mask = None
    if mask_field is not None:
        found = mask_field.locate(record)
        if found is None and options.mask:
            mask_field.require(record)  # raises SchemaError naming the keys
        if found is not None:
            mask = mask_field.decode(record)
            drop.append(found[0])
            if mask.shape[:2] != full_hw:
                raise DecodeError(
                    f"{mask_field.where(record, found[0])}: the mask is "
                    f"{mask.shape[0]}×{mask.shape[1]} (height×width) but its image is "
                    f"{full_hw[0]}×{full_hw[1]}; a mask must have its image's size: re-create "
                    "the mask at the image's size, or skip such records with on_error='skip'"
                )
    meta = {k: v for k, v in record.items() if k not in drop}
    return DecodedImage(np.ascontiguousarray(image), mask, meta, full_hw)


def cut_patch(
    decoded: DecodedImage, rid: int, rng: np.random.Generator, options: PatchOptions
) -> Sample:
    """One patch of ``decoded`` (record ``rid``) at a position (and scale) drawn from ``rng``.

    The sample holds the record's other features, ``"image"`` (and ``"mask"``),
    ``"patch/box"`` (``y, x, h, w`` in full-size pixels) and ``"patch/record"``.
    """
    ph, pw = options.size
    d = options.denominator
    image = decoded.image
    height, width = int(image.shape[0]), int(image.shape[1])
    scale = options.scale
    if scale is None:
        ch, cw = ph, pw
    else:
        s = float(rng.uniform(scale[0], scale[1]))
        ch, cw = max(1, round(ph * s / d)), max(1, round(pw * s / d))
    ch, cw = min(ch, height), min(cw, width)
    y = int(rng.integers(0, height - ch + 1))
    x = int(rng.integers(0, width - cw + 1))
    region = image[y : y + ch, x : x + cw]
    if scale is None:
        patch = _pad(region, (ph, pw))
    else:
        patch = arrays.resize(region, (ph, pw), is_mask=False)
        if patch is region:
            patch = region.copy()
    full_h, full_w = decoded.full_hw
    fy, fx = min(y * d, full_h - 1), min(x * d, full_w - 1)
    fh, fw = min(ch * d, full_h - fy), min(cw * d, full_w - fx)
    sample = dict(decoded.meta)
    sample["image"] = patch
    if decoded.mask is not None:
        mregion = decoded.mask[fy : fy + fh, fx : fx + fw]
        if scale is None:
            sample["mask"] = _pad(mregion, (ph, pw))
        else:
            sample["mask"] = np.ascontiguousarray(
                arrays.resize(mregion, (ph, pw), is_mask=True))
    sample["patch/box"] = np.array([fy, fx, fh, fw], dtype=np.int64)
    sample["patch/record"] = np.int64(rid)
    return sample


def _decode_jpeg(data: bytes | memoryview, d: int, where: str) -> np.ndarray:
    """Decode a JPEG to RGB at scale ``1/d`` (libjpeg-turbo DCT scaling) into a new array."""
    try:
        if d == 1:
            image: np.ndarray = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True)
        else:
            height, width, _ = jpeg_header(data, where=where)
            image = simplejpeg.decode_jpeg(
                data, colorspace="RGB", fastdct=True,
                min_height=math.ceil(height / d), min_width=math.ceil(width / d),
            )
    except ValueError as exc:
        raise decode_error(data, where, f"damaged JPEG: {exc}") from None
    except MemoryError:
        raise out_of_memory(data, where, "the JPEG") from None
    return image


def _pad(region: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``region`` (an image or mask crop) padded with zeros at the bottom/right to ``size``."""
    h, w = size
    if region.shape[:2] == (h, w):
        return region.copy()
    out = np.zeros((h, w) + region.shape[2:], dtype=region.dtype)
    out[: region.shape[0], : region.shape[1]] = region
    return out
