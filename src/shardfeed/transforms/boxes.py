"""Crop-box arithmetic shared by the decode-fused and the array transforms (no image data).

A box is ``(y, x, h, w)`` in pixels of the full-size image. Everything here is a pure
function of its arguments and, for the random box, of the generator's draws.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from shardfeed.sampling.crop_draws import CropParams, RowKeys, compiled, compiled_resized_crops
from shardfeed.sampling.keys import sample_rng


class Box(NamedTuple):
    """A crop box in full-image pixels: top row, left column, height, width."""

    y: int
    x: int
    h: int
    w: int


def parse_size(size: int | Sequence[int], *, name: str = "size") -> tuple[int, int]:
    """``224`` → ``(224, 224)``; ``(h, w)`` stays. Raises ValueError for anything else."""
    if isinstance(size, (bool, str, bytes)):
        raise TypeError(f"{name} must be an int or (height, width), got {size!r}")
    if isinstance(size, (int, np.integer)):
        pair = (int(size), int(size))
    else:
        try:
            values = [int(v) for v in size]
        except TypeError:
            raise TypeError(f"{name} must be an int or (height, width), got {size!r}") from None
        if len(values) != 2:
            raise ValueError(f"{name} must be an int or (height, width), got {size!r}")
        pair = (values[0], values[1])
    if pair[0] < 1 or pair[1] < 1:
        raise ValueError(f"{name} must be >= 1 in both dimensions, got {size!r}")
    return pair


def check_range(
    values: Sequence[float], *, name: str, low: float, high: float
) -> tuple[float, float]:
    """Validate a ``(min, max)`` pair within ``(low, high]``; return it as floats."""
    try:
        a, b = (float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (min, max), got {values!r}") from None
    if not (low < a <= b <= high):
        raise ValueError(f"{name} must satisfy {low} < min <= max <= {high}, got {values!r}")
    return a, b


@functools.cache
def uniform_is_affine() -> bool:
    """Whether ``Generator.uniform(lo, hi)`` equals ``lo + (hi - lo) * Generator.random()``
    bit for bit on this build of NumPy (checked once on 4,096 draws of several ranges).

    NumPy computes ``lo + range * u`` in C; a compiler that fuses it into one multiply-add
    rounds once instead of twice, and the last bit can differ. Where the check passes,
    :func:`random_resized_box` draws with ``random()`` (a quarter of the cost of
    ``uniform()``, which dominates a small image's crop); elsewhere it keeps ``uniform()``.
    Either way the boxes are those ``uniform()`` gives.
    """
    ranges = ((0.08, 1.0), (math.log(3 / 4), math.log(4 / 3)), (0.25, 0.75), (-1.5, 3.25))
    for lo, hi in ranges:
        a = np.random.Generator(np.random.Philox(12345)).uniform(lo, hi, 4096)
        b = lo + (hi - lo) * np.random.Generator(np.random.Philox(12345)).random(4096)
        if not np.array_equal(a, b):
            return False
    return True


def random_resized_box(
    height: int,
    width: int,
    rng: np.random.Generator,
    *,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    attempts: int = 10,
) -> Box:
    """Draw the crop of Inception-style random-resized-crop in a ``height``×``width`` image.

    Area fraction uniform in ``scale``, aspect ratio (w/h) log-uniform in ``ratio``, position
    uniform; after ``attempts`` misses, the largest centered box whose ratio lies in
    ``ratio``. Always inside the image and at least 1×1.

    Draws per attempt: ``rng.uniform(*scale)``, ``rng.uniform(log ratio)``, then on a hit
    ``rng.integers(height - h + 1)`` and ``rng.integers(width - w + 1)`` (the uniform draws
    are taken through ``rng.random()`` where that gives the same numbers, see
    :func:`uniform_is_affine`).
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    scale_lo, scale_hi = scale
    integers = rng.integers
    if uniform_is_affine():
        random = rng.random
        scale_range = scale_hi - scale_lo
        log_range = log_hi - log_lo
        for _ in range(attempts):
            target = area * (scale_lo + scale_range * random())
            aspect = math.exp(log_lo + log_range * random())
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                return Box(int(integers(height - h + 1)), int(integers(width - w + 1)), h, w)
    else:
        for _ in range(attempts):
            target = area * float(rng.uniform(scale_lo, scale_hi))
            aspect = math.exp(float(rng.uniform(log_lo, log_hi)))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                return Box(int(integers(height - h + 1)), int(integers(width - w + 1)), h, w)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w = width
        h = min(height, max(1, round(w / ratio[0])))
    elif in_ratio > ratio[1]:
        h = height
        w = min(width, max(1, round(h * ratio[1])))
    else:
        h, w = height, width
    return Box((height - h) // 2, (width - w) // 2, h, w)


def crop_params(
    scale: tuple[float, float], ratio: tuple[float, float], hflip: float, attempts: int = 10
) -> CropParams:
    """The terms :func:`random_resized_box` computes from its ranges (the same float
    arithmetic), for the compiled draws of :func:`resized_boxes`."""
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    return CropParams(scale[0], scale[1] - scale[0], log_lo, log_hi - log_lo, ratio[0],
                      ratio[1], float(hflip), attempts)


def resized_boxes(
    keys: RowKeys, rows: npt.NDArray[np.intp], heights: npt.NDArray[np.int64],
    widths: npt.NDArray[np.int64], *, scale: tuple[float, float], ratio: tuple[float, float],
    hflip: float,
) -> npt.NDArray[np.int64] | None:
    """For each of ``rows`` (an image ``heights[i]``×``widths[i]``), the box of
    :func:`random_resized_box` and the flip drawn after it (``random() < hflip`` when
    ``hflip > 0``) from the row's generator in ``keys``: an ``n×5`` int64 array
    ``(y, x, h, w, flip)``, the same numbers, drawn in one compiled call. The rows' generators
    go on from after these draws.

    None (nothing drawn) where the compiled draws are absent or not known to match NumPy on
    this build (checked once a process, see :func:`compiled_draws_agree`), or a row was drawn
    from already: the caller then draws row by row.
    """
    if not compiled_draws_agree():
        return None
    return compiled_resized_crops(keys, rows, heights, widths, crop_params(scale, ratio, hflip))


@functools.cache
def compiled_draws_agree() -> bool:
    """Whether the compiled crop draws give what :func:`random_resized_box` and a flip draw
    give from NumPy generators, boxes and the streams after them, on this build: checked
    once on 512 rows of assorted sizes and ranges (including images of one pixel's side and
    ratios far from the image's, which take the fallback box)."""
    if not compiled() or not uniform_is_affine():
        return False
    sizes = np.random.Generator(np.random.Philox(7)).integers(1, 5000, (512, 2))
    sizes[:16, 0] = 1
    sizes[16:32, 1] = 1
    cases = (((0.08, 1.0), (3 / 4, 4 / 3), 0.5), ((0.9, 1.0), (0.1, 0.2), 0.3),
             ((0.25, 0.5), (5.0, 9.0), 0.0))
    for scale, ratio, hflip in cases:
        keys = RowKeys(2**63 + 11, 3, np.arange(2**40, 2**40 + 512, dtype=np.int64))
        rows = np.arange(512)
        boxes = compiled_resized_crops(keys, rows, sizes[:, 0], sizes[:, 1],
                                       crop_params(scale, ratio, hflip))
        if boxes is None:
            return False
        for row, (height, width) in enumerate(sizes.tolist()):
            rng = sample_rng(keys.seed, keys.epoch, int(keys.positions[row]))
            box = random_resized_box(height, width, rng, scale=scale, ratio=ratio)
            flip = hflip > 0 and bool(rng.random() < hflip)
            after = keys[row]
            if ((*box, int(flip)) != tuple(boxes[row].tolist())
                    or after.random() != rng.random() or after.integers(1000) != rng.integers(1000)):
                return False
    return True


def center_box(height: int, width: int, out_h: int, out_w: int, *, crop_fraction: float) -> Box:
    """The box that "resize the shorter side to ``max(out)/crop_fraction``, then center-crop
    ``out_h``×``out_w``" keeps, in full-image pixels (one resize instead of two)."""
    resized_short = max(out_h, out_w) / crop_fraction
    scale = resized_short / min(height, width)
    h = min(height, max(1, round(out_h / scale)))
    w = min(width, max(1, round(out_w / scale)))
    return Box((height - h) // 2, (width - w) // 2, h, w)


def scale_denominator(
    crop_h: int, crop_w: int, out_h: int, out_w: int, *, max_denominator: int = 8
) -> int:
    """The largest ``d`` in {1, 2, 4, 8} (≤ ``max_denominator``) with ``crop/d ≥ out`` in both
    dimensions: decoding at scale 1/d then still only shrinks (never enlarges) the crop."""
    d = 1
    while d * 2 <= max_denominator and crop_h >= out_h * d * 2 and crop_w >= out_w * d * 2:
        d *= 2
    return d


def scale_denominators(crop_h: np.ndarray, crop_w: np.ndarray, out_h: int, out_w: int, *,
                       max_denominator: int = 8) -> np.ndarray:
    """:func:`scale_denominator` of many crops at once (int64 arrays of their heights and
    widths): the same rule, an int64 array."""
    d = np.ones(np.shape(crop_h), dtype=np.int64)
    while True:
        grows = (d * 2 <= max_denominator) & (crop_h >= out_h * d * 2) & (crop_w >= out_w * d * 2)
        if not grows.any():
            return d
        d[grows] *= 2


def scaled_box(box: Box, denominator: int, height: int, width: int) -> Box:
    """``box`` in the pixels of the image decoded at scale ``1/denominator`` (whose size is
    ``height``×``width``), rounded to whole pixels and kept inside, at least 1×1."""
    if denominator == 1:
        return box
    y0 = min(height - 1, round(box.y / denominator))
    x0 = min(width - 1, round(box.x / denominator))
    y1 = max(y0 + 1, min(height, round((box.y + box.h) / denominator)))
    x1 = max(x0 + 1, min(width, round((box.x + box.w) / denominator)))
    return Box(y0, x0, y1 - y0, x1 - x0)


__all__ = [
    "Box",
    "center_box",
    "check_range",
    "compiled_draws_agree",
    "crop_params",
    "parse_size",
    "random_resized_box",
    "resized_boxes",
    "scale_denominator",
    "scale_denominators",
    "scaled_box",
    "uniform_is_affine",
]
