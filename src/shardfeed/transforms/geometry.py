"""Geometric transforms on decoded arrays: one geometry for the image, the mask and any
second image.

Each op reads ``keys`` (images, default ``("image",)``; linear/area interpolation) and
``mask_keys`` (default ``("mask",)``; nearest neighbour) and applies the same crop, resize
or flip to every one present. Parameters come from the first image key's size. Images may
be H×W×C or T×H×W×C (a window of frames: one geometry for all frames); masks H×W or T×H×W.
Boxes (``boxes=BoxFields(...)``, default the key ``boxes`` with per-box ``box_labels``) move
with the pixels: each op states its placement (:mod:`shardfeed.transforms.placement`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from shardfeed.errors import SchemaError
from shardfeed.transforms import arrays
from shardfeed.transforms import placement as place
from shardfeed.transforms.base import ArraySpec, Sample, Specs, TransformBase
from shardfeed.transforms.boxes import Box, check_range, parse_size, random_resized_box
from shardfeed.transforms.placement import BoxFields, Placement

ArrayOp = Callable[[np.ndarray, bool, "np.ndarray | None"], np.ndarray]


class GeometricBase(TransformBase):
    """Apply one geometry to every image and mask key of a sample."""

    __slots__ = ("boxes", "keys", "mask_keys")
    accepts_out = True

    def __init__(self, *, keys: Sequence[str] = ("image",), mask_keys: Sequence[str] = ("mask",),
                 boxes: BoxFields | None = None):
        self.boxes = boxes or BoxFields()
        if isinstance(keys, str) or isinstance(mask_keys, str):
            raise TypeError("keys and mask_keys are sequences of feature names, e.g. ('image',)")
        self.keys = tuple(keys)
        self.mask_keys = tuple(mask_keys)
        if not self.keys:
            raise ValueError("keys must name at least one image feature, e.g. ('image',)")

    def _reference_hw(self, sample: Sample) -> tuple[int, int]:
        for key in self.keys:
            value = sample.get(key)
            if isinstance(value, np.ndarray):
                return arrays.spatial_shape(value, is_mask=False)
        for key in self.mask_keys:
            value = sample.get(key)
            if isinstance(value, np.ndarray):
                return arrays.spatial_shape(value, is_mask=True)
        raise SchemaError(
            f"{type(self).__name__} found no decoded image under {self.keys} (the sample has "
            f"{sorted(sample)}); put a decode op (DecodeImage) before it"
        )

    def _apply(self, sample: Sample, op: ArrayOp, out: np.ndarray | None,
               placement: Placement | None = None) -> Sample:
        if place.has_boxes(sample, self.boxes):
            if placement is None:
                raise SchemaError(f"{type(self).__name__} does not move boxes, and the sample "
                                  f"has {[k for k in self.boxes.keys if k in sample]}")
            place.apply_to_boxes(sample, placement, self.boxes, op=type(self).__name__)
        first = True
        for key in self.keys:
            value = sample.get(key)
            if isinstance(value, np.ndarray):
                sample[key] = op(value, False, out if first else None)
                first = False
        for key in self.mask_keys:
            value = sample.get(key)
            if isinstance(value, np.ndarray):
                sample[key] = op(value, True, None)
        if first:
            self._reference_hw(sample)  # raises SchemaError when there is nothing to transform
            if out is not None:
                raise SchemaError(
                    f"{type(self).__name__}: no image under {self.keys} to write out"
                )
        return sample

    def _fixed_specs(self, specs: Specs, hw: tuple[int | None, int | None]) -> Specs:
        result = dict(specs)
        for key in self.keys + self.mask_keys:
            spec = specs.get(key)
            if spec is None:
                continue
            is_mask = key in self.mask_keys
            lead = spec.shape[:-2] if is_mask else spec.shape[:-3]
            tail = () if is_mask else spec.shape[-1:]
            result[key] = ArraySpec(lead + hw + tail, spec.dtype)
        return result


def _crop_resize(box: Box, size: tuple[int, int]) -> ArrayOp:
    def op(arr: np.ndarray, is_mask: bool, out: np.ndarray | None) -> np.ndarray:
        region = arrays.crop(arr, box, is_mask=is_mask)
        result = arrays.resize(region, size, is_mask=is_mask, out=out)
        return result.copy() if result is region else result

    return op


class RandomResizedCrop(GeometricBase):
    """Crop a random box (area fraction in ``scale``, aspect ratio in ``ratio``) and resize it
    to ``size``. For JPEG input prefer :class:`DecodeRandomResizedCrop` (same boxes, faster).

    Determinism: the box comes from the generator (see ``random_resized_box``).
    State: none. Memory: the output arrays.
    """

    __slots__ = ("ratio", "scale", "size")
    draws_random = True

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        keys: Sequence[str] = ("image",),
        mask_keys: Sequence[str] = ("mask",),
        boxes: BoxFields | None = None,
    ) -> None:
        super().__init__(keys=keys, mask_keys=mask_keys, boxes=boxes)
        self.size = parse_size(size)
        self.scale = check_range(scale, name="scale", low=0.0, high=1.0)
        self.ratio = check_range(ratio, name="ratio", low=0.0, high=float("inf"))

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        h, w = self._reference_hw(sample)
        box = random_resized_box(h, w, rng, scale=self.scale, ratio=self.ratio)
        th, tw = self.size
        moved = place.shift_scale(-box.x, -box.y, tw / box.w, th / box.h, self.size)
        return self._apply(sample, _crop_resize(box, self.size), out, moved)

    def output_spec(self, specs: Specs) -> Specs:
        return self._fixed_specs(specs, self.size)

    def __repr__(self) -> str:
        return f"RandomResizedCrop({self.size}, scale={self.scale}, ratio={self.ratio})"


class Resize(GeometricBase):
    """Resize to ``size``: an int sets the shorter side (aspect ratio kept), ``(h, w)`` sets
    both. Images use linear interpolation (area when shrinking ≥ 2×), masks nearest.

    Determinism: deterministic; draws nothing. State: none. Memory: the output arrays.
    """

    __slots__ = ("shorter", "size")
    draws_random = False

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        keys: Sequence[str] = ("image",),
        mask_keys: Sequence[str] = ("mask",),
        boxes: BoxFields | None = None,
    ) -> None:
        super().__init__(keys=keys, mask_keys=mask_keys, boxes=boxes)
        self.shorter = isinstance(size, (int, np.integer)) and not isinstance(size, bool)
        self.size = parse_size(size)

    def target(self, height: int, width: int) -> tuple[int, int]:
        """The output ``(height, width)`` for an input of that size."""
        if not self.shorter:
            return self.size
        side = self.size[0]
        if height <= width:
            return side, max(1, round(width * side / height))
        return max(1, round(height * side / width)), side

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        h, w = self._reference_hw(sample)
        target = self.target(h, w)

        def op(arr: np.ndarray, is_mask: bool, dst: np.ndarray | None) -> np.ndarray:
            return arrays.resize(arr, target, is_mask=is_mask, out=dst)

        moved = place.shift_scale(0.0, 0.0, target[1] / w, target[0] / h, target)
        return self._apply(sample, op, out, moved)

    def output_spec(self, specs: Specs) -> Specs:
        if self.shorter:
            return self._fixed_specs(specs, (None, None))
        return self._fixed_specs(specs, self.size)

    def __repr__(self) -> str:
        return f"Resize({self.size[0] if self.shorter else self.size})"


class CropOrPad(GeometricBase):
    """Make any input exactly ``height``×``width``: center-crop larger dimensions, pad smaller
    ones (centered) with ``fill`` (images) / ``mask_fill`` (masks). ``CropOrPad(64)`` is
    64×64, as ``CenterCrop(64)`` and ``RandomCrop(64)`` are.

    Determinism: deterministic; draws nothing. State: none. Memory: the output arrays.
    """

    __slots__ = ("fill", "mask_fill", "size")
    draws_random = False

    def __init__(
        self,
        height: int,
        width: int | None = None,
        *,
        fill: float = 0,
        mask_fill: int = 0,
        keys: Sequence[str] = ("image",),
        mask_keys: Sequence[str] = ("mask",),
        boxes: BoxFields | None = None,
    ) -> None:
        super().__init__(keys=keys, mask_keys=mask_keys, boxes=boxes)
        self.size = parse_size((height, height if width is None else width))
        self.fill = fill
        self.mask_fill = mask_fill

    def _offset(self, h: int, w: int, rng: np.random.Generator) -> tuple[int, int]:
        """Where the window starts in a larger dimension, or the image in a smaller one:
        centred here (subclasses draw it)."""
        oh, ow = self.size
        return abs(h - oh) // 2, abs(w - ow) // 2

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        h, w = self._reference_hw(sample)
        oh, ow = self.size
        dy, dx = self._offset(h, w, rng)

        def op(arr: np.ndarray, is_mask: bool, dst: np.ndarray | None) -> np.ndarray:
            fill = self.mask_fill if is_mask else self.fill
            result = arrays.crop_or_pad(arr, self.size, is_mask=is_mask, fill=fill,
                                        offset=(dy, dx))
            if dst is not None:
                np.copyto(dst, result, casting="unsafe")
                return dst
            return np.ascontiguousarray(result) if result.base is arr else result

        moved = place.shift_scale(-dx if w >= ow else dx, -dy if h >= oh else dy, 1.0, 1.0,
                                  self.size)
        return self._apply(sample, op, out, moved)

    def output_spec(self, specs: Specs) -> Specs:
        return self._fixed_specs(specs, self.size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.size[0]}, {self.size[1]})"


class CenterCrop(CropOrPad):
    """Center-crop to ``size`` (int or ``(h, w)``); inputs smaller than that are padded with
    ``fill``, so the output always has the requested shape.

    Determinism: deterministic; draws nothing. State: none. Memory: the output arrays.
    """

    __slots__ = ()

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        fill: float = 0,
        mask_fill: int = 0,
        keys: Sequence[str] = ("image",),
        mask_keys: Sequence[str] = ("mask",),
        boxes: BoxFields | None = None,
    ) -> None:
        h, w = parse_size(size)
        super().__init__(h, w, fill=fill, mask_fill=mask_fill, keys=keys, mask_keys=mask_keys,
                         boxes=boxes)


class RandomHorizontalFlip(GeometricBase):
    """Mirror left-right with probability ``p`` (image, masks and second images together).

    Determinism: one draw ``rng.random() < p`` per sample. State: none. Memory: the output.
    """

    __slots__ = ("p",)
    draws_random = True

    def __init__(
        self,
        p: float = 0.5,
        *,
        keys: Sequence[str] = ("image",),
        mask_keys: Sequence[str] = ("mask",),
        boxes: BoxFields | None = None,
    ) -> None:
        super().__init__(keys=keys, mask_keys=mask_keys, boxes=boxes)
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p is a probability in [0, 1], got {p!r}")
        self.p = float(p)

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        h, w = self._reference_hw(sample)
        if bool(rng.random() < self.p):
            def op(arr: np.ndarray, is_mask: bool, dst: np.ndarray | None) -> np.ndarray:
                return arrays.hflip(arr, is_mask=is_mask, out=dst)
            moved = place.hflip(h, w)
        else:
            moved = place.quarter_turns(0, h, w)
            def op(arr: np.ndarray, is_mask: bool, dst: np.ndarray | None) -> np.ndarray:
                if dst is None:
                    return arr
                np.copyto(dst, arr, casting="unsafe")
                return dst
        return self._apply(sample, op, out, moved)

    def apply_batch(
        self, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
        out: Mapping[str, np.ndarray],
    ) -> dict[str, Any] | None:
        """The batch form (see :meth:`TransformBase.apply_batch`) where the rows hold one
        decoded image each under ``keys``' only key, as one array of the batch rows' shape,
        and no mask or boxes: each row's draw from its generator, the row mirrored into
        ``out["image"]`` (in place where it is already there) or copied as it is. None for
        anything else (the rows then go one by one)."""
        target = out.get("image")
        image = columns.get(self.keys[0])
        if (rngs is None or target is None or len(self.keys) != 1
                or not isinstance(image, np.ndarray) or image.shape != target.shape
                or image.dtype != target.dtype or image.ndim != 4
                or any(k in columns for k in self.mask_keys)
                or place.has_boxes(columns, self.boxes) or len(rngs) != len(image)):
            return None
        for row in range(len(image)):
            if bool(rngs[row].random() < self.p):
                arrays.hflip(image[row], is_mask=False, out=target[row])
            elif image is not target:
                target[row] = image[row]
        result = dict(columns)
        result[self.keys[0]] = target
        return result

    def output_spec(self, specs: Specs) -> Specs:
        return dict(specs)

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


__all__ = [
    "CenterCrop",
    "CropOrPad",
    "GeometricBase",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
]
