"""Raw images: stored pixel bytes made an array of their height, width and channels.

A raw image (or mask) has no header, so its shape comes from elsewhere, first found first:

==================  ==========================================================================
where               when
==================  ==========================================================================
a fixed ``shape``   given (``shape=(28, 28, 1)``; masks ``mask_shape=(h, w)``): records that
                    store no shape features, as MNIST-like raw bytes
named features      ``height_key`` / ``width_key`` / ``channels_key`` given (the decode ops'
                    ``mask_height_key`` / ``mask_width_key`` for a mask): those features only
the standard ones   an image: ``image/height``, ``image/width``, ``image/channels``. A mask:
                    ``mask/height`` and ``mask/width``, then its image's height and width
                    features (the image's ``height_key``/``width_key`` where given, as in
                    TensorFlow's guide layout ``height``, ``width``, ``image_raw``,
                    ``mask_raw``; then ``image/height``, ``image/width``), then the image's
                    fixed ``shape``: a mask has its image's height and width
==================  ==========================================================================

Channels that nothing names are as many as the bytes hold whole pixels (a mask has none).

Errors: no height or width found is a SchemaError naming the record's feature, the features
looked for, the features the sample has, and the option that names the right one (never one
the user passed already); bytes that do not fit the shape are a DecodeError (skippable)
naming the shape and where it came from; a shape value that is not one positive int, and a
shape larger than ``max_pixels``, are DecodeErrors too.

Determinism: a pure function of the record. State: none. Memory: none beyond the array,
which views the stored bytes (widened to uint16 only with ``image_dtype="uint16"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from shardfeed.errors import DecodeError, SchemaError
from shardfeed.format import spec
from shardfeed.transforms.base import Sample, ShapeKeysLike
from shardfeed.transforms.decode.image import (
    Where,
    decode_error,
    sniff_format,
    too_large_error,
    where_text,
    widen_to_uint16,
)
from shardfeed.transforms.decode.sizes import pixels_reason


class RawField(ShapeKeysLike, Protocol):
    """What the raw decode reads of a field (``fields.ImageField`` has it all): where the
    shape is, the pixels' type, and for a mask the image it belongs to."""

    @property
    def shape(self) -> tuple[int, ...] | None: ...
    @property
    def is_mask(self) -> bool: ...
    @property
    def dtype(self) -> str: ...
    @property
    def image_dtype(self) -> str: ...
    @property
    def max_pixels(self) -> int: ...
    @property
    def image(self) -> RawField | None: ...

RawShape = tuple[int, ...]
"""A fixed raw shape: ``(height, width)`` or ``(height, width, channels)``."""


def _shape_values(shape: object, *, option: str, is_mask: bool) -> RawShape:
    """``shape`` as a tuple of positive ints, ValueError naming ``option`` for anything else:
    an image's is ``(height, width)`` or ``(height, width, channels)``, a mask's
    ``(height, width)``."""
    lengths = (2,) if is_mask else (2, 3)
    form = "(height, width)" if is_mask else "(height, width) or (height, width, channels)"
    values = tuple(shape) if isinstance(shape, (tuple, list)) else None
    if (values is None or len(values) not in lengths
            or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0
                       for v in values)):
        raise ValueError(
            f"{option} is the fixed shape of raw pixels, {form} in positive ints "
            f"(e.g. {option}={(28, 28) if is_mask else (28, 28, 1)}), got {shape!r}"
        )
    return tuple(int(v) for v in values)


def check_fixed_shape(shape: object, *, is_mask: bool, encoding: str,
                      keys: tuple[str | None, str | None, str | None]) -> RawShape:
    """A field's fixed ``shape`` as a tuple of ints, checked against the field's other
    options: ``encoding`` must be ``"auto"`` or ``"raw"`` (the shape makes it raw), and no
    height or width feature may be named beside it (``keys``: the height, width and
    channels keys), nor a channels feature beside three values. ValueError otherwise, in
    the decode ops' words (``shape``, or ``mask_shape`` for a mask)."""
    prefix = "mask_" if is_mask else ""
    option = f"{prefix}shape"
    fixed = _shape_values(shape, option=option, is_mask=is_mask)
    if encoding not in ("auto", "raw"):
        raise ValueError(
            f"{option}={fixed} is the shape of raw pixels, and {prefix}encoding={encoding!r}: "
            f"leave {prefix}encoding out (or pass 'raw') for raw pixels, or drop {option} for "
            f"{encoding} images"
        )
    named = [name for name, key in zip(("height_key", "width_key", "channels_key"), keys)
             if key is not None and (name != "channels_key" or len(fixed) == 3)]
    if named:
        options = " and ".join(f"{prefix}{name}" for name in named)
        verb = "names a feature" if len(named) == 1 else "name features"
        raise ValueError(
            f"{option}={fixed} gives the shape, and {options} {verb} that gives it too: "
            f"pass one of them ({option} for records that store no shape features)"
        )
    return fixed


def raw_pixels(field: RawField, data: bytes | memoryview, sample: Sample,
               where: Where) -> np.ndarray:
    """The raw pixels ``data`` of ``field`` as an array: H×W×C for an image (its stored
    dtype, or uint16 with ``image_dtype="uint16"``), H×W for a mask; the shape as the module
    doc says. Raises SchemaError (no shape found) or DecodeError (bytes that do not fit)."""
    height = _dimension(field, sample, where, 0)
    width = _dimension(field, sample, where, 1)
    what = "raw mask" if field.is_mask else "raw image"
    reason = pixels_reason(height, width, field.max_pixels, what=what)
    if reason is not None:
        raise too_large_error(where, reason, len(data))
    dtype = np.dtype(field.dtype)
    if len(data) % dtype.itemsize:
        raise decode_error(
            data, where, f"raw pixels of {len(data)} bytes are not whole {dtype} values"
        )
    pixels = np.frombuffer(data, dtype=dtype)
    if field.is_mask:
        expected = height * width
        if pixels.size != expected:
            raise _misfit(field, data, where, pixels.size, f"height×width = {height}×{width} "
                          f"= {expected}")
        return pixels.reshape(height, width)
    channels = _channels(field, sample, where, pixels.size, height * width)
    expected = height * width * channels
    if pixels.size != expected or channels < 1:
        raise _misfit(field, data, where, pixels.size, f"height×width×channels = {height}×"
                      f"{width}×{channels} = {expected}")
    return _raw_depth(field, pixels.reshape(height, width, channels), where)


def _misfit(field: RawField, data: bytes | memoryview, where: Where, count: int,
            wanted: str) -> Exception:
    """The error of raw bytes of ``count`` values that are not the ``wanted`` shape; a
    fixed shape is named as the option that gave it."""
    what = "raw mask" if field.is_mask else "raw image"
    reason = f"{what} has {count} {np.dtype(field.dtype)} values, expected {wanted}"
    kind = sniff_format(data)
    if kind != "other":  # an encoded file read as raw pixels
        reason += (f"; these bytes are a {kind.upper()} file: decode this feature as an "
                   "image file, not as raw pixels")
    if field.shape is not None:
        option = "mask_shape" if field.is_mask else "shape"
        reason += (f" ({option}={field.shape}; if every record fails, {option} is not the shape "
                   "the records were written with)")
    return decode_error(data, where, reason)


def _dimension(field: RawField, sample: Sample, where: Where, axis: int) -> int:
    """The height (``axis`` 0) or width (1) of the raw pixels; see the module doc."""
    what = ("height", "width")[axis]
    if field.shape is not None:
        return field.shape[axis]
    named = (field.height_key, field.width_key)[axis]
    if named is not None:
        found = _feature_value(sample, (named,), where, what)
        if found is None:
            raise _no_named_feature(field, sample, where, what, named)
        return found
    keys = _standard_keys(field, axis)
    found = _feature_value(sample, keys, where, what)
    if found is not None:
        return found
    image = field.image
    if field.is_mask and image is not None and image.shape is not None:
        return image.shape[axis]
    raise _no_standard_feature(field, sample, where, what, keys)


def _standard_keys(field: RawField, axis: int) -> tuple[str, ...]:
    """The standard features of the height (``axis`` 0) or width (1), in the order looked
    at (a mask: its own, then its image's)."""
    if not field.is_mask:
        return ((spec.IMAGE_HEIGHT, spec.IMAGE_WIDTH)[axis],)
    keys = [(spec.MASK_HEIGHT, spec.MASK_WIDTH)[axis]]
    image = field.image
    if image is not None and image.shape is None:
        named = (image.height_key, image.width_key)[axis]
        if named is not None:
            keys.append(named)
    keys.append((spec.IMAGE_HEIGHT, spec.IMAGE_WIDTH)[axis])
    return tuple(dict.fromkeys(keys))


def _channels(field: RawField, sample: Sample, where: Where, count: int, area: int) -> int:
    """The channels of a raw image: its fixed shape's, its channels feature's, or as many as
    ``count`` values over ``area`` pixels hold whole."""
    if field.shape is not None and len(field.shape) == 3:
        return field.shape[2]
    keys = (field.channels_key,) if field.channels_key is not None else (spec.IMAGE_CHANNELS,)
    found = _feature_value(sample, keys, where, "channels")
    if found is not None:
        return found
    if field.channels_key is not None:
        raise _no_named_feature(field, sample, where, "channels", field.channels_key)
    return count // max(1, area)


def _feature_value(sample: Sample, keys: Sequence[str], where: Where, what: str) -> int | None:
    """The one positive int of the first of ``keys`` in ``sample``; None when none is there;
    DecodeError when the first there holds anything else."""
    for key in keys:
        if key in sample:
            stored = sample[key]
            value = np.asarray(stored).reshape(-1)
            if value.size == 1 and value.dtype.kind in "iu" and int(value[0]) > 0:
                return int(value[0])
            raise DecodeError(
                f"{where_text(where)}: the {what} feature '{key}' must hold one positive int, "
                f"it holds {kind_of(stored)}; re-pack the record, or skip it with "
                "on_error='skip'"
            )
    return None


def _option(field: RawField, what: str) -> str:
    """The decode op's option that names the feature of ``what`` (height, width, channels)."""
    return f"mask_{what}_key" if field.is_mask else f"{what}_key"


def _shape_option(field: RawField) -> str:
    return "mask_shape=(height, width)" if field.is_mask else (
        "shape=(height, width, channels)")


def _features_of(sample: Sample) -> str:
    names = sorted(sample)
    shown = ", ".join(repr(n) for n in names[:20])
    return f"[{shown}{', ...' if len(names) > 20 else ''}]"


def _no_named_feature(field: RawField, sample: Sample, where: Where, what: str,
                      named: str) -> SchemaError:
    """No feature ``named``, which a ``*_key`` option (or the dataset's schema) names."""
    kind = "mask" if field.is_mask else "image"
    option = _option(field, what)
    return SchemaError(
        f"{where_text(where)}: the raw {kind}'s {what} is to be read from the feature "
        f"'{named}' (named by {option} or the dataset's schema), which this record does not "
        f"have; it has {_features_of(sample)}. Name the feature that holds it ({option}=...; "
        "names are case-sensitive)"
    )


def _no_standard_feature(field: RawField, sample: Sample, where: Where, what: str,
                         keys: tuple[str, ...]) -> SchemaError:
    """No shape feature under any name looked at, and no fixed shape."""
    kind = "mask" if field.is_mask else "image"
    looked = " or ".join(repr(k) for k in keys)
    also = ""
    if field.is_mask:
        also = " (its own, then its image's)"
    return SchemaError(
        f"{where_text(where)}: a raw {kind} needs its {what}, and this record has no feature "
        f"{looked}{also}; it has {_features_of(sample)}. Pass {_option(field, what)}='...' "
        f"naming the feature that holds it, or {_shape_option(field)} when every {kind} has "
        "one shape"
    )


def _raw_depth(field: RawField, image: np.ndarray, where: Where) -> np.ndarray:
    """A raw image as stored, or, with ``image_dtype="uint16"``, as uint16 (8-bit pixels
    widened ×257); SchemaError for raw pixels of another type then."""
    if field.image_dtype == "uint8" or image.dtype == np.uint16:
        return image
    if image.dtype != np.uint8:
        raise SchemaError(
            f"{where_text(where)}: the raw image holds {image.dtype} pixels; "
            "image_dtype='uint16' takes raw uint8 or uint16 images: pass "
            "image_dtype='uint8' to keep raw pixels as they are stored"
        )
    return widen_to_uint16(image)


def kind_of(value: Any) -> str:
    """What a feature value is, in words (for messages)."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} values of shape {value.shape}"
    if isinstance(value, list):
        return f"a list of {len(value)} value{'' if len(value) == 1 else 's'}"
    return type(value).__name__


__all__ = ["RawShape", "check_fixed_shape", "kind_of", "raw_pixels"]
