"""Patch options and crop geometry: patches cut from an image decoded once (at reduced scale).

:class:`PatchOptions` holds what :class:`~shardfeed.pipeline.patches.Patches` cuts and caches.
:func:`~shardfeed.transforms.decode.patches.decode_for_patches` turns a record into a
:class:`~shardfeed.transforms.decode.patches.DecodedImage` (the pixels at scale ``1/d``, the
full-size mask, the record's other features); :func:`cut_patch` cuts one patch from it with a
keyed generator.

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

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfeed.pipeline.samplers import Sample
from shardfeed.sampling.crop_draws import PatchParams, compiled, compiled_patch_boxes
from shardfeed.sampling.keys import PATCH_CROP, sample_rng
from shardfeed.sampling.patches import PICKS, Pick
from shardfeed.transforms import arrays
from shardfeed.transforms.boxes import parse_size, uniform_is_affine
from shardfeed.transforms.decode import native_rows
from shardfeed.transforms.decode.orientation import ExifOrientation, check_exif_orientation
from shardfeed.transforms.decode.patches import DecodedImage
from shardfeed.transforms.decode.sizes import (
    DEFAULT_MAX_PIXELS,
    check_max_pixels,
    decode_peak_bytes,
)

__all__ = ["PICKS", "PatchOptions", "Pick", "cut_patch", "cut_rows", "draw_patch_box",
           "patch_boxes", "stacked_features", "stacked_values"]


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
    exif_orientation: ExifOrientation = "ignore"

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", parse_size(self.size))
        check_max_pixels(self.max_pixels)
        check_exif_orientation(self.exif_orientation)
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
    scale = options.scale
    y, x, ch, cw = draw_patch_box(rng, int(image.shape[0]), int(image.shape[1]), options)
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
    # the cached record's arrays are the image's for as long as it is cached: a sample gets
    # copies, which a transform may change in place without changing the next patches'
    sample = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in decoded.meta.items()}
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


def draw_patch_box(rng: np.random.Generator, height: int, width: int,
                   options: PatchOptions) -> tuple[int, int, int, int]:
    """The crop ``(y, x, h, w)`` of a patch in a ``height``×``width`` image as decoded (at
    scale ``1/d``), drawn from ``rng``: the scale (``uniform``) where ``options.scale`` is
    set, then the position (``integers``), each within the image."""
    ph, pw = options.size
    d = options.denominator
    scale = options.scale
    if scale is None:
        ch, cw = ph, pw
    else:
        s = float(rng.uniform(scale[0], scale[1]))
        ch, cw = max(1, round(ph * s / d)), max(1, round(pw * s / d))
    ch, cw = min(ch, height), min(cw, width)
    y = int(rng.integers(0, height - ch + 1))
    x = int(rng.integers(0, width - cw + 1))
    return y, x, ch, cw


def patch_boxes(seed: int, epoch: int, positions: np.ndarray, heights: np.ndarray,
                widths: np.ndarray, options: PatchOptions) -> np.ndarray:
    """:func:`draw_patch_box` of each output ``positions[i]`` (an image as decoded
    ``heights[i]``×``widths[i]``) from its generator keyed ``PATCH_CROP``: an ``n×4`` int64
    array, drawn in one compiled call where that build is known to agree with NumPy
    (:func:`compiled_patch_draws_agree`), else output by output."""
    if compiled_patch_draws_agree():
        boxes = compiled_patch_boxes(seed, PATCH_CROP, epoch, positions, heights, widths,
                                     _patch_params(options))
        if boxes is not None:
            return boxes
    return np.array([draw_patch_box(sample_rng(seed, epoch, int(p), PATCH_CROP), int(h),
                                    int(w), options)
                     for p, h, w in zip(positions.tolist(), heights, widths)],
                    dtype=np.int64).reshape(-1, 4)


def _patch_params(options: PatchOptions) -> PatchParams:
    ph, pw = options.size
    scale = options.scale
    lo, hi = (0.0, 0.0) if scale is None else (float(scale[0]), float(scale[1]))
    return PatchParams(ph, pw, options.denominator, lo, hi - lo, scale is not None)


@functools.cache
def compiled_patch_draws_agree() -> bool:
    """Whether the compiled patch draws give :func:`draw_patch_box`'s from NumPy generators
    on this build: checked once a process on 512 outputs of assorted image sizes (images
    smaller than the patch among them), without and with scales (reduced decode too)."""
    if not compiled() or not uniform_is_affine():
        return False
    sizes = np.random.Generator(np.random.Philox(9)).integers(1, 3000, (512, 2))
    sizes[:16] = 1
    positions = np.arange(2**40, 2**40 + 512, dtype=np.int64)
    for options in (PatchOptions(size=(32, 32)),
                    PatchOptions(size=(24, 40), scale=(0.5, 3.0)),
                    PatchOptions(size=(16, 16), scale=(2.0, 9.5))):
        boxes = compiled_patch_boxes(2**63 + 5, PATCH_CROP, 7, positions, sizes[:, 0],
                                     sizes[:, 1], _patch_params(options))
        if boxes is None:
            return False
        for row, (height, width) in enumerate(sizes.tolist()):
            rng = sample_rng(2**63 + 5, 7, int(positions[row]), PATCH_CROP)
            if draw_patch_box(rng, height, width, options) != tuple(boxes[row].tolist()):
                return False
    return True


def cut_rows(images: Sequence[np.ndarray], boxes: np.ndarray, out: np.ndarray,
             options: PatchOptions) -> bool:
    """Each patch ``images[i][box i]`` written into ``out[i]`` as :func:`cut_patch` makes it
    (padded with zeros, or resized where ``options.scale`` is set); False, nothing promised
    about ``out``, where a patch would not fit its row as it is (another dtype or channel
    count: the caller cuts those patches one by one)."""
    ph, pw = options.size
    scaled = options.scale is not None
    rows: Sequence[int] = range(len(images))
    if (native_rows.compiled is not None and out.ndim == 4 and out.flags.c_contiguous
            and out.flags.writeable and not out.dtype.hasobject
            and (not scaled or native_rows.agrees())):
        # the slice's patches in one call without the GIL; the rows it leaves are cut below
        try:
            done = native_rows.compiled.cut_rows(
                list(images), np.ascontiguousarray(boxes, dtype=np.int64), out, scaled)
        except (ValueError, BufferError, TypeError):  # a buffer it cannot take: all below
            done = bytes(len(images))
        rows = [row for row, flag in enumerate(done) if not flag] if 0 in done else []
    for row in rows:
        image, (y, x, ch, cw) = images[row], boxes[row].tolist()
        target = out[row]
        if image.dtype != target.dtype or image.shape[2:] != target.shape[2:]:
            return False
        region = image[y : y + ch, x : x + cw]
        if scaled:
            patch = arrays.resize(region, (ph, pw), is_mask=False)
            if patch.shape != target.shape:
                return False
            target[...] = patch
        elif (ch, cw) == (ph, pw):
            target[...] = region
        else:
            target[...] = 0
            target[:ch, :cw] = region
    return True


def stacked_features(metas: Sequence[dict[str, Any]], rows: np.ndarray | None = None, *,
                     alike: bool = False) -> dict[str, Any] | None:
    """The records' other features as columns (numeric arrays stacked, anything else a
    list), or None where they are not alike (other names, or arrays of other shapes).
    ``rows``: the batch's rows are ``metas[rows[i]]`` (a slice's patches share few images:
    each record's features are taken once, then spread over its rows; on 2 cores, 256
    patches of 64 images of 5 features: 470 -> 180 µs a slice); None: one row each.
    ``alike``: the caller knows the records alike (their
    :func:`~shardfeed.transforms.decode.patches.meta_kinds` are one object), so they are not
    compared again (the same 256 patches: 75 -> 49 µs)."""
    names = list(metas[0])
    count = len(names)
    if not alike and any(len(m) != count for m in metas):
        return None
    picks = None if rows is None else rows.tolist()
    columns: dict[str, Any] = {}
    for name in names:
        try:  # as many names each, and each of these: the same names
            values = [m[name] for m in metas]
        except KeyError:
            return None
        first = values[0]
        if isinstance(first, np.ndarray) and first.dtype.kind in "biufc":
            shape, dtype = first.shape, first.dtype
            if not alike:
                for v in values:
                    if not (isinstance(v, np.ndarray) and v.shape == shape
                            and v.dtype == dtype):
                        return None
            # np.stack's copy, without its per-array views (a record's label: a (1,) array)
            stacked = (np.concatenate(values).reshape(len(values), *shape) if shape
                       else np.array(values, dtype=dtype))
            columns[name] = stacked if rows is None else stacked[rows]
        elif picks is None:
            columns[name] = values
        else:
            columns[name] = list(map(values.__getitem__, picks))
    return columns


def stacked_values(kinds: tuple[tuple[Any, ...], ...], values: Sequence[tuple[Any, ...]],
                   rows: np.ndarray | None = None) -> dict[str, Any]:
    """:func:`stacked_features` of records alike, each given as its features' values in the
    order of their one ``kinds``, numeric arrays C-contiguous
    (:attr:`~shardfeed.transforms.decode.patches.DecodedImage.values`): a column is a
    ``zip`` and a join of their bytes (one copy, writable), not a look-up and an array a
    record."""
    picks = None if rows is None else rows.tolist()
    count = len(values)
    columns: dict[str, Any] = {}
    for kind, column in zip(kinds, zip(*values, strict=True), strict=True):
        if len(kind) > 1:  # (name, shape, dtype): each record's bytes, C order
            stacked = np.frombuffer(bytearray().join(column), dtype=kind[2]).reshape(
                count, *kind[1])
            columns[kind[0]] = stacked if rows is None else stacked[rows]
        else:
            columns[kind[0]] = list(column) if picks is None else list(
                map(column.__getitem__, picks))
    return columns


def _pad(region: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``region`` (an image or mask crop) padded with zeros at the bottom/right to ``size``."""
    h, w = size
    if region.shape[:2] == (h, w):
        return region.copy()
    out = np.zeros((h, w) + region.shape[2:], dtype=region.dtype)
    out[: region.shape[0], : region.shape[1]] = region
    return out
