"""Geometry for segmentation and detection: a random fixed-size crop that pads what is
smaller, vertical flips, quarter turns, random rotation/scale/shift, random scale.

Like the ops of :mod:`shardfeed.transforms.geometry`, each applies one geometry to every image
key (linear interpolation, area when shrinking; dtype kept: uint8, uint16, float32), every
mask key (nearest neighbour only: class ids are never blended) and every box key (moved,
clipped, dropped when empty, per-box fields with them). Pads and uncovered corners are
``fill`` in images and ``mask_fill`` in masks (e.g. 255, the usual "ignore" id).

The segmentation training standard, random scale then a fixed crop::

    Compose([DecodeImage(), DecodeMask(), RandomScale((0.5, 2.0)),
             RandomCrop(512, mask_fill=255), RandomHorizontalFlip()])

Determinism: every op draws the same number of values from its generator whatever the
sample (a function of the sample's key only). State: none. Memory: the output arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from shardfeed.transforms import arrays
from shardfeed.transforms import placement as place
from shardfeed.transforms.base import Sample, Specs
from shardfeed.transforms.boxes import check_range, parse_size
from shardfeed.transforms.geometry import CropOrPad, GeometricBase
from shardfeed.transforms.placement import BoxFields

_KEYS = ("image",)
_MASKS = ("mask",)


def _into(result: np.ndarray, dst: np.ndarray | None) -> np.ndarray:
    if dst is None:
        return result
    np.copyto(dst, result, casting="unsafe")
    return dst


def _probability(p: float) -> float:
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"p is a probability in [0, 1], got {p!r}")
    return float(p)


class RandomCrop(CropOrPad):
    """A random ``size`` window (int or ``(h, w)``); a dimension smaller than the window is
    padded instead, the image placed at a random position in it (``fill`` / ``mask_fill``
    around it). The output always has the requested shape.

    Determinism: two draws a sample (the window's row, then column). State: none.
    """

    __slots__ = ()
    draws_random = True

    def __init__(self, size: int | Sequence[int], *, fill: float = 0, mask_fill: int = 0,
                 keys: Sequence[str] = _KEYS, mask_keys: Sequence[str] = _MASKS,
                 boxes: BoxFields | None = None) -> None:
        h, w = parse_size(size)
        super().__init__(h, w, fill=fill, mask_fill=mask_fill, keys=keys, mask_keys=mask_keys,
                         boxes=boxes)

    def _offset(self, h: int, w: int, rng: np.random.Generator) -> tuple[int, int]:
        oh, ow = self.size
        return int(rng.integers(0, abs(h - oh) + 1)), int(rng.integers(0, abs(w - ow) + 1))

    def __repr__(self) -> str:
        return f"RandomCrop({self.size}, fill={self.fill}, mask_fill={self.mask_fill})"


class RandomVerticalFlip(GeometricBase):
    """Mirror top-bottom with probability ``p``.

    Determinism: one draw ``rng.random() < p`` a sample. State: none.
    """

    __slots__ = ("p",)
    draws_random = True

    def __init__(self, p: float = 0.5, *, keys: Sequence[str] = _KEYS,
                 mask_keys: Sequence[str] = _MASKS, boxes: BoxFields | None = None) -> None:
        super().__init__(keys=keys, mask_keys=mask_keys, boxes=boxes)
        self.p = _probability(p)

    def __call__(self, sample: Sample, rng: np.random.Generator, /, *,
                 out: np.ndarray | None = None) -> Sample:
        h, w = self._reference_hw(sample)
        flip = bool(rng.random() < self.p)

        def op(arr: np.ndarray, is_mask: bool, dst: np.ndarray | None) -> np.ndarray:
            if not flip:
                return _into(arr, dst)
            axis = arr.ndim - (1 if is_mask else 2) - 1
            return _into(np.ascontiguousarray(np.flip(arr, axis=axis)), dst)

        moved = place.vflip(h, w) if flip else place.quarter_turns(0, h, w)
        return self._apply(sample, op, out, moved)

    def output_spec(self, specs: Specs) -> Specs:
        return dict(specs)

    def __repr__(self) -> str:
        return f"RandomVerticalFlip(p={self.p})"


class RandomRotate90(GeometricBase):
    """Turn by a random multiple of 90° (counter-clockwise, as ``np.rot90``): 0, 1, 2 or 3
    quarter turns, equally likely. Lossless; a non-square image comes out ``W×H`` after an
    odd number of turns.

    Determinism: one draw a sample. State: none.
    """

    __slots__ = ()
    draws_random = True

    def __init__(self, *, keys: Sequence[str] = _KEYS, mask_keys: Sequence[str] = _MASKS,
                 boxes: BoxFields | None = None) -> None:
        super().__init__(keys=keys, mask_keys=mask_keys, boxes=boxes)

    def __call__(self, sample: Sample, rng: np.random.Generator, /, *,
                 out: np.ndarray | None = None) -> Sample:
        h, w = self._reference_hw(sample)
        k = int(rng.integers(0, 4))

        def op(arr: np.ndarray, is_mask: bool, dst: np.ndarray | None) -> np.ndarray:
            row = arr.ndim - (2 if is_mask else 3)
            return _into(np.ascontiguousarray(np.rot90(arr, k, axes=(row, row + 1))), dst)

        return self._apply(sample, op, out, place.quarter_turns(k, h, w))

    def output_spec(self, specs: Specs) -> Specs:
        result = dict(specs)
        for key in self.keys + self.mask_keys:
            spec = result.get(key)
            if spec is None:
                continue
            lead = len(spec.shape) - (2 if key in self.mask_keys else 3)
            h, w = spec.shape[lead], spec.shape[lead + 1]
            if h != w or h is None:  # an odd turn swaps them: unknown ahead
                return self._fixed_specs(specs, (None, None))
        return result

    def __repr__(self) -> str:
        return "RandomRotate90()"


class RandomAffine(GeometricBase):
    """Rotate by an angle drawn from ``degrees`` (``(lo, hi)`` or ``d`` for ``(-d, d)``),
    scale by a factor from ``scale``, and shift by up to ``translate`` (fractions of the
    width and height), about the image centre; the output keeps the input's size, corners
    left uncovered are ``fill`` / ``mask_fill``.

    Determinism: four draws a sample (angle, scale, shift x, shift y). State: none.
    """

    __slots__ = ("degrees", "fill", "mask_fill", "scale", "translate")
    draws_random = True

    def __init__(self, degrees: float | Sequence[float] = 0.0, *,
                 scale: Sequence[float] = (1.0, 1.0), translate: Sequence[float] = (0.0, 0.0),
                 fill: float = 0, mask_fill: int = 0, keys: Sequence[str] = _KEYS,
                 mask_keys: Sequence[str] = _MASKS, boxes: BoxFields | None = None) -> None:
        super().__init__(keys=keys, mask_keys=mask_keys, boxes=boxes)
        if isinstance(degrees, (int, float)):
            degrees = (-abs(float(degrees)), abs(float(degrees)))
        self.degrees = check_range(degrees, name="degrees", low=-360.0, high=360.0)
        self.scale = check_range(scale, name="scale", low=1e-3, high=1e3)
        tx, ty = (float(v) for v in translate)
        if not (0.0 <= tx <= 1.0 and 0.0 <= ty <= 1.0):
            raise ValueError(f"translate is (fraction of width, of height) in [0, 1], got "
                             f"{translate!r}")
        self.translate = (tx, ty)
        self.fill = fill
        self.mask_fill = mask_fill

    def __call__(self, sample: Sample, rng: np.random.Generator, /, *,
                 out: np.ndarray | None = None) -> Sample:
        h, w = self._reference_hw(sample)
        angle = float(rng.uniform(*self.degrees))
        factor = float(rng.uniform(*self.scale))
        shift_x = float(rng.uniform(-1.0, 1.0)) * self.translate[0] * w
        shift_y = float(rng.uniform(-1.0, 1.0)) * self.translate[1] * h
        matrix = cv2.getRotationMatrix2D(((w - 1) / 2.0, (h - 1) / 2.0), angle, factor)
        matrix[:, 2] += np.array([shift_x, shift_y])

        def op(arr: np.ndarray, is_mask: bool, dst: np.ndarray | None) -> np.ndarray:
            fill = self.mask_fill if is_mask else self.fill
            return _into(_warp(arr, matrix, (h, w), is_mask=is_mask, fill=fill), dst)

        return self._apply(sample, op, out, place.from_cv2(matrix, (h, w)))

    def output_spec(self, specs: Specs) -> Specs:
        return dict(specs)

    def __repr__(self) -> str:
        return (f"RandomAffine(degrees={self.degrees}, scale={self.scale}, "
                f"translate={self.translate})")


class RandomScale(GeometricBase):
    """Resize by a factor drawn from ``scale`` (both sides by the same factor). Put a
    :class:`RandomCrop` after it for batches of one shape.

    Determinism: one draw a sample. State: none.
    """

    __slots__ = ("scale",)
    draws_random = True

    def __init__(self, scale: Sequence[float] = (0.5, 2.0), *, keys: Sequence[str] = _KEYS,
                 mask_keys: Sequence[str] = _MASKS, boxes: BoxFields | None = None) -> None:
        super().__init__(keys=keys, mask_keys=mask_keys, boxes=boxes)
        self.scale = check_range(scale, name="scale", low=1e-3, high=1e3)

    def __call__(self, sample: Sample, rng: np.random.Generator, /, *,
                 out: np.ndarray | None = None) -> Sample:
        h, w = self._reference_hw(sample)
        factor = float(rng.uniform(*self.scale))
        target = (max(1, round(h * factor)), max(1, round(w * factor)))

        def op(arr: np.ndarray, is_mask: bool, dst: np.ndarray | None) -> np.ndarray:
            return arrays.resize(arr, target, is_mask=is_mask, out=dst)

        moved = place.shift_scale(0.0, 0.0, target[1] / w, target[0] / h, target)
        return self._apply(sample, op, out, moved)

    def output_spec(self, specs: Specs) -> Specs:
        return self._fixed_specs(specs, (None, None))

    def __repr__(self) -> str:
        return f"RandomScale({self.scale})"


def _warp(arr: np.ndarray, matrix: np.ndarray, hw: tuple[int, int], *, is_mask: bool,
          fill: float) -> np.ndarray:
    """``cv2.warpAffine`` of an image (H×W×C, any C; linear) or mask (H×W; nearest), frame by
    frame for a window (T×...)."""
    h, w = hw
    if arr.ndim == (3 if is_mask else 4):
        return np.stack([_warp(f, matrix, hw, is_mask=is_mask, fill=fill) for f in arr])
    if is_mask and arr.dtype not in _CV2_DTYPES:
        return _warp_nearest(arr, matrix, hw, fill)
    flags = cv2.INTER_NEAREST if is_mask else cv2.INTER_LINEAR
    if is_mask or arr.shape[2] <= 4:
        channels = 1 if is_mask else arr.shape[2]
        warped = cv2.warpAffine(arr, matrix, (w, h), flags=flags,
                                borderMode=cv2.BORDER_CONSTANT,
                                borderValue=(fill,) * max(channels, 1))
        return warped.reshape((h, w) if is_mask else (h, w, arr.shape[2]))
    parts = [_warp(arr[..., c:c + 4], matrix, hw, is_mask=False, fill=fill)
             for c in range(0, arr.shape[2], 4)]
    return np.concatenate(parts, axis=2)


_CV2_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int16),
               np.dtype(np.float32), np.dtype(np.float64))


def _warp_nearest(mask: np.ndarray, matrix: np.ndarray, hw: tuple[int, int],
                  fill: float) -> np.ndarray:
    """Nearest-neighbour warp of a mask of a dtype OpenCV does not warp (int32, int64, bool):
    each output pixel centre mapped back, rounded as OpenCV rounds."""
    h, w = hw
    inverse = cv2.invertAffineTransform(matrix)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    sx = inverse[0, 0] * xs + inverse[0, 1] * ys + inverse[0, 2]
    sy = inverse[1, 0] * xs + inverse[1, 1] * ys + inverse[1, 2]
    ix, iy = np.rint(sx).astype(np.int64), np.rint(sy).astype(np.int64)
    inside = (ix >= 0) & (ix < mask.shape[1]) & (iy >= 0) & (iy < mask.shape[0])
    out = np.full((h, w), fill, dtype=mask.dtype)
    out[inside] = mask[iy[inside], ix[inside]]
    return out


__all__ = ["RandomAffine", "RandomCrop", "RandomRotate90", "RandomScale", "RandomVerticalFlip"]
