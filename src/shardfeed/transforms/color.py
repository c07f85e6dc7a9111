"""Colour and value transforms on decoded images: jitter, normalisation, dtype and layout.

These touch ``sample["image"]`` only (masks keep their label values). ColorJitter works on
uint8 with OpenCV look-up tables (GIL released), and refuses any other type; the rest are
NumPy ufuncs.
Each has a batch form that runs its ``__call__`` on every row of a decoded image column
(see ``_apply_rows``), so a pipeline ending in them keeps the Loader's batch path.

Value scale: Normalize and ToFloat (with its default ``scale``) read an image's values on the
scale of its type, :func:`full_scale`: 0..255 for uint8, 0..65535 for uint16 (16-bit images,
``image_dtype="uint16"``), so both give the same floats for the same picture at either
depth. Float images are taken to be on the 0..255 scale (as before 16-bit support); other
types (int16, uint32, ...) are a TypeError: their scale is not known, so pass it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np

from shardfeed.errors import SchemaError
from shardfeed.transforms.base import (
    NO_RANDOMNESS,
    ArraySpec,
    Sample,
    Specs,
    TransformBase,
    call_into,
    output_spec_of,
)

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

_LEVELS = np.arange(256, dtype=np.float32)


def full_scale(dtype: np.dtype[Any], who: str) -> float:
    """The value of full intensity in an image of ``dtype``: 255.0 for uint8 (and for float
    images, taken on the 0..255 scale), 65535.0 for uint16. TypeError naming ``who`` for any
    other type."""
    if dtype == np.uint16:
        return 65535.0
    if dtype == np.uint8 or dtype.kind == "f":
        return 255.0
    raise TypeError(
        f"{who} takes uint8 (0..255), uint16 (0..65535) or float (0..255) images, got "
        f"{dtype}: its value range is not known; convert the image first, e.g. "
        "ToFloat(scale=1 / its maximum value)"
    )


def _image(sample: Sample, key: str, who: str) -> np.ndarray:
    value = sample.get(key)
    if not isinstance(value, np.ndarray):
        raise SchemaError(
            f"{who} found no decoded image under '{key}' (the sample has {sorted(sample)}); "
            "put a decode op before it"
        )
    return value


def _write(result: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return result
    if out.shape != result.shape:
        raise ValueError(f"out has shape {out.shape}, the result has shape {result.shape}")
    np.copyto(out, result, casting="unsafe")
    return out


def _lut(values: np.ndarray) -> np.ndarray:
    table: np.ndarray = np.clip(np.rint(values), 0, 255).astype(np.uint8)
    return table


def _factor_range(value: float | Sequence[float], name: str, *, center: float) -> tuple[float, float]:
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
        return max(0.0, center - float(value)), center + float(value)
    lo, hi = (float(v) for v in value)
    if not 0 <= lo <= hi:
        raise ValueError(f"{name} range must satisfy 0 <= min <= max, got {value!r}")
    return lo, hi



def _rows_batch_form(
    self: Any, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
    out: Mapping[str, np.ndarray],
) -> dict[str, Any] | None:
    """``apply_batch`` of an op that reads and writes only ``self.key``: each row of that
    column through the op's own ``__call__`` into its batch row (:func:`_apply_rows`); None
    where that does not apply. Assigned in each op's class body, so that the batch form is
    declared by the class that defines ``__call__``."""
    return _apply_rows(self, self.key, columns, rngs, out)

class ColorJitter(TransformBase):
    """Random brightness, contrast, saturation and hue changes of a uint8 RGB image, in a
    random order (as torchvision's ColorJitter).

    ``brightness=b`` multiplies by a factor in ``[max(0, 1-b), 1+b]``; ``contrast`` blends
    with the mean gray level; ``saturation`` blends with the grayscale image; ``hue`` in
    ``[0, 0.5]`` rotates the hue by up to that fraction of the colour circle. Each may also
    be a ``(min, max)`` factor range. Gray images get brightness and contrast only.

    Determinism: draws 4 factors then the order (always the same number of draws).
    State: none. Memory: two image-sized temporaries.
    """

    __slots__ = ("brightness", "contrast", "hue", "key", "saturation")
    draws_random = True

    def __init__(
        self,
        brightness: float | Sequence[float] = 0.0,
        contrast: float | Sequence[float] = 0.0,
        saturation: float | Sequence[float] = 0.0,
        hue: float = 0.0,
        *,
        key: str = "image",
    ) -> None:
        self.brightness = _factor_range(brightness, "brightness", center=1.0)
        self.contrast = _factor_range(contrast, "contrast", center=1.0)
        self.saturation = _factor_range(saturation, "saturation", center=1.0)
        if not 0.0 <= float(hue) <= 0.5:
            raise ValueError(f"hue must be in [0, 0.5], got {hue!r}")
        self.hue = float(hue)
        self.key = key

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        image = _image(sample, self.key, "ColorJitter")
        if image.dtype != np.uint8:
            raise _jitter_type_error(image.dtype)
        factors = (
            float(rng.uniform(*self.brightness)),
            float(rng.uniform(*self.contrast)),
            float(rng.uniform(*self.saturation)),
            float(rng.uniform(-self.hue, self.hue)),
        )
        order = rng.permutation(4)
        shape = image.shape
        # Pixelwise ops: view frames (T×H×W×C) as one tall image.
        work = np.ascontiguousarray(image).reshape(-1, shape[-2], shape[-1])
        color = shape[-1] == 3
        for op in order:
            f = factors[op]
            if op == 0 and f != 1.0:
                work = self._lut(work, _LEVELS * f)
            elif op == 1 and f != 1.0:
                mean = self._gray_mean(work, color)
                work = self._lut(work, (_LEVELS - mean) * f + mean)
            elif op == 2 and f != 1.0 and color:
                gray = cv2.cvtColor(work, cv2.COLOR_RGB2GRAY)
                gray3 = cv2.cvtColor(gray, cv2.COLOR_GRAY2RGB)
                work = cv2.addWeighted(work, f, gray3, 1.0 - f, 0.0)
            elif op == 3 and f != 0.0 and color:
                work = self._rotate_hue(work, f)
        sample[self.key] = work.reshape(shape)
        return sample

    # the batch form: this op's own __call__ on each row (see _rows_batch_form)
    apply_batch = _rows_batch_form

    @staticmethod
    def _lut(image: np.ndarray, values: np.ndarray) -> np.ndarray:
        lut = _lut(values)
        result: np.ndarray = cv2.LUT(image, lut)
        return result.reshape(image.shape)

    @staticmethod
    def _gray_mean(image: np.ndarray, color: bool) -> float:
        if not color:
            return float(image.mean())
        r, g, b, _a = cv2.mean(image)
        return 0.299 * r + 0.587 * g + 0.114 * b

    @staticmethod
    def _rotate_hue(image: np.ndarray, fraction: float) -> np.ndarray:
        hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)  # uint8 hue is 0..179 (degrees / 2)
        shift = round(fraction * 180)
        hue_lut = np.arange(256, dtype=np.int32)
        hue_lut[:180] = (hue_lut[:180] + shift) % 180
        hsv[..., 0] = cv2.LUT(hsv[..., 0], hue_lut.astype(np.uint8))
        result: np.ndarray = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
        return result

    def output_spec(self, specs: Specs) -> Specs:
        """The input's specs; TypeError for an image declared other than uint8 (reported
        when the Loader builds its first batch, before any sample is jittered)."""
        spec = specs.get(self.key)
        if spec is not None and spec.dtype != np.uint8:
            raise _jitter_type_error(spec.dtype)
        return dict(specs)

    def __repr__(self) -> str:
        return (
            f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, hue={self.hue})"
        )


def _jitter_type_error(dtype: np.dtype[Any]) -> TypeError:
    if dtype == np.uint16:
        return TypeError(
            "ColorJitter works on uint8 images, got uint16 (decoded with image_dtype="
            "'uint16'); its look-up tables have 256 levels and would cut 16-bit samples: "
            "decode with image_dtype='uint8' to jitter colours, or leave ColorJitter out"
        )
    return TypeError(
        f"ColorJitter works on uint8 images, got {dtype}; put it before Normalize/ToFloat"
    )


class Normalize(TransformBase):
    """``(image / full - mean) / std`` per channel, as float32 (``mean``/``std`` on the 0–1
    scale, e.g. ImageNet's), where ``full`` is the image type's full intensity
    (:func:`full_scale`): 255 for uint8, 65535 for uint16 (float images: 255). So a 16-bit
    image and its 8-bit version normalise alike. ``Normalize.symmetric()`` maps 0..255
    (uint8) or 0..65535 (uint16) to [-1, 1]. Other integer types are a TypeError.

    Determinism: deterministic; draws nothing. State: none. Memory: the float output.
    """

    __slots__ = ("bias", "key", "mean", "multiplier", "multiplier16", "std")
    accepts_out = True
    draws_random = False

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        *,
        key: str = "image",
    ) -> None:
        m = np.asarray(mean, dtype=np.float64).reshape(-1)
        s = np.asarray(std, dtype=np.float64).reshape(-1)
        if m.shape != s.shape or m.size == 0:
            raise ValueError(f"mean and std need one value per channel, got {mean!r}, {std!r}")
        if np.any(s <= 0):
            raise ValueError(f"std must be > 0, got {std!r}")
        self.mean = tuple(float(v) for v in m)
        self.std = tuple(float(v) for v in s)
        self.multiplier = (1.0 / (255.0 * s)).astype(np.float32)
        self.multiplier16 = (1.0 / (65535.0 * s)).astype(np.float32)  # for uint16 images
        self.bias = (-m / s).astype(np.float32)
        self.key = key

    @classmethod
    def symmetric(cls, *, key: str = "image") -> Normalize:
        """Map 0..255 (uint8) or 0..65535 (uint16) to [-1, 1] (mean 0.5, std 0.5 for every
        channel)."""
        return cls((0.5,), (0.5,), key=key)

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        image = _image(sample, self.key, "Normalize")
        c = image.shape[-1]
        if self.multiplier.size not in (1, c):
            raise ValueError(
                f"Normalize has {self.multiplier.size} channel values but the image has {c} "
                "channels; give one mean/std per channel"
            )
        wide = full_scale(image.dtype, "Normalize") == 65535.0
        multiplier = self.multiplier16 if wide else self.multiplier
        direct = out is not None and out.dtype == np.float32 and out.shape == image.shape
        target = out if direct and out is not None else np.empty(image.shape, np.float32)
        np.multiply(image, multiplier, out=target, dtype=np.float32)
        np.add(target, self.bias, out=target)
        sample[self.key] = target if direct else _write(target, out)
        return sample

    # the batch form: this op's own __call__ on each row (see _rows_batch_form)
    apply_batch = _rows_batch_form

    def output_spec(self, specs: Specs) -> Specs:
        result = dict(specs)
        if self.key in specs:
            result[self.key] = ArraySpec(specs[self.key].shape, np.dtype(np.float32))
        return result

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


class ToFloat(TransformBase):
    """Cast the image to ``dtype`` (float32 by default), multiplied by ``scale``.

    ``scale=None`` (default): ``1 / full_scale`` of the image's type, so values land in
    [0, 1] whatever the depth: 1/255 for uint8, 1/65535 for uint16 (a fixed 1/255 would give
    a 16-bit image values up to 257). Float images get 1/255 (taken on the 0..255 scale);
    other integer types are a TypeError: pass ``scale`` for them. A number: that factor,
    whatever the type.

    Determinism: deterministic. State: none. Memory: the float output.
    """

    __slots__ = ("dtype", "key", "scale")
    accepts_out = True
    draws_random = False

    def __init__(
        self, *, scale: float | None = None, dtype: Any = np.float32, key: str = "image"
    ) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise ValueError(f"ToFloat needs a floating dtype, got {self.dtype}")
        self.scale = None if scale is None else float(scale)
        self.key = key

    def scale_for(self, dtype: np.dtype[Any]) -> float:
        """The factor an image of ``dtype`` is multiplied by (see the class doc)."""
        if self.scale is not None:
            return self.scale
        return 1.0 / full_scale(dtype, "ToFloat with its default scale")

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        image = _image(sample, self.key, "ToFloat")
        factor = self.dtype.type(self.scale_for(image.dtype))
        if out is not None and out.dtype == self.dtype and out.shape == image.shape:
            np.multiply(image, factor, out=out, dtype=self.dtype)
            sample[self.key] = out
            return sample
        result = np.multiply(image, factor, dtype=self.dtype)
        sample[self.key] = _write(result, out)
        return sample

    # the batch form: this op's own __call__ on each row (see _rows_batch_form)
    apply_batch = _rows_batch_form

    def output_spec(self, specs: Specs) -> Specs:
        result = dict(specs)
        if self.key in specs:
            result[self.key] = ArraySpec(specs[self.key].shape, self.dtype)
        return result

    def __repr__(self) -> str:
        return f"ToFloat(scale={self.scale}, dtype={self.dtype})"


class ToCHW(TransformBase):
    """Move channels first: H×W×C → C×H×W (T×H×W×C → T×C×H×W), contiguous.

    Determinism: deterministic. State: none. Memory: one copy of the image.
    """

    __slots__ = ("key",)
    accepts_out = True
    draws_random = False

    def __init__(self, *, key: str = "image") -> None:
        self.key = key

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        image = _image(sample, self.key, "ToCHW")
        if image.ndim not in (3, 4):
            raise ValueError(f"ToCHW needs an H×W×C or T×H×W×C image, got shape {image.shape}")
        moved = np.moveaxis(image, -1, -3)
        sample[self.key] = _write(moved, out) if out is not None else np.ascontiguousarray(moved)
        return sample

    # the batch form: this op's own __call__ on each row (see _rows_batch_form)
    apply_batch = _rows_batch_form

    def output_spec(self, specs: Specs) -> Specs:
        result = dict(specs)
        spec = specs.get(self.key)
        if spec is not None and len(spec.shape) >= 3:
            shape = spec.shape
            result[self.key] = ArraySpec(
                shape[:-3] + (shape[-1], shape[-3], shape[-2]), spec.dtype
            )
        return result

    def __repr__(self) -> str:
        return "ToCHW()"



def _apply_rows(
    transform: TransformBase, key: str, columns: dict[str, Any],
    rngs: Sequence[np.random.Generator] | None, out: Mapping[str, np.ndarray],
) -> dict[str, Any] | None:
    """The batch form of an op that reads and writes only ``columns[key]``: its own
    ``__call__`` on each row (a one-entry sample, with the row's generator), written into
    ``out[key]`` as the sample path writes into a batch slot (see
    :meth:`~shardfeed.transforms.base.TransformBase.apply_batch`). A crop-aware decode's batch
    form fills the image column first (``Compose.apply_batch``), so the presets run as batches.

    None unless ``key`` is ``"image"``, the column is a decoded N×H×W×C (or deeper) array,
    and the op declares an output of the batch rows' shape and dtype.
    """
    images = columns.get(key)
    target = out.get(key)
    if (key != "image" or target is None or type(images) is not np.ndarray
            or images.ndim < 4 or len(images) != len(target)
            or (rngs is not None and len(rngs) != len(images))):
        return None
    specs = output_spec_of(transform, {key: ArraySpec(images.shape[1:], images.dtype)})
    spec = specs.get(key) if specs else None
    if spec is None or spec.shape != target.shape[1:] or spec.dtype != target.dtype:
        return None
    for row in range(len(images)):
        rng = NO_RANDOMNESS if rngs is None else rngs[row]
        call_into(transform, {key: images[row]}, rng, target[row])
    result = dict(columns)
    result[key] = target
    return result


__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "ColorJitter", "Normalize", "ToCHW", "ToFloat", "full_scale",
]
