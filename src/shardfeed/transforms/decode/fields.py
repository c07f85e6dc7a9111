"""Where a sample's image (or mask) is and how it is stored: embedded, raw, or referenced.

An :class:`ImageField` is resolved from, in order: what the user passed, the schema handed to
``bind``, or the standard feature names (``image/encoded``, ``image/raw``, ``image/path``;
``mask/encoded``, ``mask/raw``) present in the sample.

Every failure caused by what one record holds (bytes that do not decode, an image larger than
``max_pixels``, a referenced path that is not UTF-8 text or holds a NUL byte, a raw image
whose stored height is not one positive int) is a :class:`DecodeError`, which a Loader with
``on_error="skip"`` replaces. A SchemaError means the decode op is not set up for the data
(no such feature: pass ``key=`` or bind to the schema).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from shardfeed.errors import DecodeError, SchemaError, StorageError, UnsafeRecordPathError
from shardfeed.format import spec
from shardfeed.storage.paths import confines, contained
from shardfeed.transforms.base import ImageInfoLike, Sample
from shardfeed.transforms.decode.image import (
    ImageDtype,
    Where,
    check_image_dtype,
    check_size,
    decode_error,
    decode_image,
    too_large_error,
    where_text,
    widen_to_uint16,
)
from shardfeed.transforms.decode.masks import LABEL_MAPS, MaskLabels, decode_mask
from shardfeed.transforms.decode.orientation import ExifOrientation, check_exif_orientation
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS, check_max_pixels, pixels_reason

Encoding = Literal["auto", "jpeg", "png", "mixed", "raw", "path"]
ENCODINGS: tuple[str, ...] = ("auto", "jpeg", "png", "mixed", "raw", "path")

_IMAGE_DEFAULTS: tuple[tuple[str, str], ...] = (
    (spec.IMAGE_ENCODED, "auto"),
    (spec.IMAGE_RAW, "raw"),
    (spec.IMAGE_PATH, "path"),
)
_MASK_DEFAULTS: tuple[tuple[str, str], ...] = (
    (spec.MASK_ENCODED, "auto"),
    (spec.MASK_RAW, "raw"),
)


def check_encoding(encoding: str) -> None:
    """Raise ValueError unless ``encoding`` is a known image encoding."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")


@dataclass(frozen=True, slots=True)
class ImageField:
    """Where one image-like feature is and how to turn it into pixels.

    ``key=None`` means "find the standard feature name in each sample". ``root`` is the
    folder or URL prefix that referenced (``"path"``) images are relative to, and lie
    inside (unless it is an :class:`~shardfeed.storage.paths.UnconfinedRoot`). For a mask
    (``is_mask``), ``mask_labels`` says how encoded pixels become class ids
    (:mod:`shardfeed.transforms.decode.masks`); raw masks keep their stored values and ``dtype``.
    ``max_pixels``: the most pixels one decoded image (or all images of one list feature
    together) may have; larger ones raise DecodeError before decoding. ``image_dtype``
    (images only): ``"uint8"`` decodes encoded images to uint8 (16-bit ones cut to 8 bits as
    OpenCV cuts them) and keeps raw ones as stored; ``"uint16"`` gives every image as uint16
    (16-bit samples kept, 8-bit ones, raw included, widened ×257; see
    :func:`~shardfeed.transforms.decode.image.decode_image`). ``exif_orientation``:
    ``"ignore"`` (default) decodes a JPEG's stored pixels, ``"apply"`` turns them as its
    EXIF tag says (:mod:`~shardfeed.transforms.decode.orientation`); for a mask, the mask
    file's own tag.
    """

    key: str | None = None
    encoding: Encoding = "auto"
    height_key: str | None = None
    width_key: str | None = None
    channels_key: str | None = None
    root: str | None = None
    is_mask: bool = False
    dtype: str = "uint8"
    mask_labels: MaskLabels = LABEL_MAPS
    max_pixels: int = DEFAULT_MAX_PIXELS
    image_dtype: ImageDtype = "uint8"
    exif_orientation: ExifOrientation = "ignore"

    def __post_init__(self) -> None:
        check_encoding(self.encoding)
        check_exif_orientation(self.exif_orientation)
        check_max_pixels(self.max_pixels)
        check_image_dtype(self.image_dtype)
        try:
            np.dtype(self.dtype)
        except TypeError:
            raise ValueError(f"dtype must be a NumPy dtype name, got {self.dtype!r}") from None

    def bound(self, info: ImageInfoLike | None, *, root: str | None) -> ImageField:
        """A copy completed from the schema's ImageInfo; what the user set explicitly wins."""
        if info is None or (self.key is not None and self.key != info.key):
            key, encoding = self.key, self.encoding
            hk, wk, ck = self.height_key, self.width_key, self.channels_key
            dtype = self.dtype
        else:
            key = info.key
            encoding = self.encoding if self.encoding != "auto" else _schema_encoding(info)
            hk = self.height_key or info.height_key
            wk = self.width_key or info.width_key
            ck = self.channels_key or info.channels_key
            dtype = str(getattr(info, "dtype", self.dtype))
        return ImageField(
            key=key,
            encoding=encoding,
            height_key=hk,
            width_key=wk,
            channels_key=ck,
            root=self.root if self.root is not None else root,
            is_mask=self.is_mask,
            dtype=dtype,
            mask_labels=self.mask_labels,
            max_pixels=self.max_pixels,
            image_dtype=self.image_dtype,
            exif_orientation=self.exif_orientation,
        )

    # --- locating -----------------------------------------------------------------------

    def locate(self, sample: Sample) -> tuple[str, str] | None:
        """``(key, encoding)`` of this field in ``sample``, or None if it is absent."""
        if self.key is not None:
            return (self.key, self.encoding) if self.key in sample else None
        for key, encoding in _MASK_DEFAULTS if self.is_mask else _IMAGE_DEFAULTS:
            if key in sample:
                return key, encoding
        return None

    def require(self, sample: Sample) -> tuple[str, str]:
        """Like :meth:`locate`, raising SchemaError naming the keys the sample has."""
        found = self.locate(sample)
        if found is None:
            what = "mask" if self.is_mask else "image"
            wanted = (
                repr(self.key)
                if self.key is not None
                else " or ".join(repr(k) for k, _ in (_MASK_DEFAULTS if self.is_mask else _IMAGE_DEFAULTS))
            )
            raise SchemaError(
                f"the sample has no {what} feature {wanted}; it has {sorted(sample)}. "
                f"Pass the {what}'s feature name (key=...) or bind the transform to the "
                "dataset's schema"
            )
        return found

    def where(self, sample: Sample, key: str) -> str:
        """Text naming the feature (and the file name when the sample carries one)."""
        text = f"feature '{key}'"
        name = sample.get(spec.IMAGE_FILENAME)
        if isinstance(name, bytes):
            text += f" of '{name.decode('utf-8', 'replace')}'"
        return text

    def where_lazy(self, sample: Sample, key: str) -> _LazyWhere:
        """:meth:`where` as a function, for messages built only when an error is raised."""
        return _LazyWhere(self, sample, key)

    # --- reading ------------------------------------------------------------------------

    def encoded_bytes(self, sample: Sample, key: str, encoding: str) -> bytes | memoryview:
        """The encoded image bytes (reading the referenced file for ``"path"``)."""
        value: bytes | memoryview = sample[key]
        if type(value) is not bytes:
            value = _single_bytes(value, key, self.where_lazy(sample, key))
        if encoding != "path":
            return value
        return self.read_referenced(value, self.where(sample, key))

    def read_referenced(self, value: bytes | memoryview, where: Where) -> bytes:
        """Read the file a ``"path"`` feature names, relative to ``root`` (the working
        directory when None).

        The path must lead to a file inside the root (no ``..`` out, no absolute path or URL
        elsewhere, no link out: :func:`~shardfeed.storage.paths.contained`) unless the root
        is an :class:`~shardfeed.storage.paths.UnconfinedRoot` (a dataset opened with
        ``allow_outside_paths=True``). A refused path, or one that is not UTF-8, raises
        :class:`~shardfeed.errors.UnsafeRecordPathError`, a DecodeError (skippable).
        """
        from shardfeed.storage import files

        full = referenced_file(self.root, value, where)
        try:
            return files.read_bytes(full)
        except (OSError, StorageError) as exc:
            raise DecodeError(
                f"cannot read the referenced image '{full}' ({where_text(where)}): {exc}. "
                "Check that the "
                "file exists and that the dataset root is right (Dataset(root=...))"
            ) from exc

    def decode(
        self, sample: Sample, *, fast_dct: bool = True, fast_upsample: bool = False
    ) -> np.ndarray:
        """Decode this field of ``sample``: images H×W×C (uint8, or uint16 with
        ``image_dtype="uint16"``), masks H×W class ids.

        Several encoded values (a list of bytes) decode to T×H×W×C / T×H×W.
        """
        key, encoding = self.require(sample)
        where = self.where_lazy(sample, key)
        if encoding == "raw":
            return self._raw(sample, key, where)
        value = sample[key]
        if isinstance(value, list) and encoding != "path":
            return self._decode_list(value, where, fast_dct, fast_upsample)
        data = self.encoded_bytes(sample, key, encoding)
        return self.decode_bytes(data, where, fast_dct, fast_upsample)

    def decode_bytes(
        self, data: bytes | memoryview, where: Where, fast_dct: bool, fast_upsample: bool = False
    ) -> np.ndarray:
        """Decode encoded bytes of this field: H×W×3 RGB for images (``image_dtype``), H×W
        class ids for masks (grey values, palette indices, or colours mapped by
        ``mask_labels``)."""
        return self._decode_bytes(data, where, fast_dct, fast_upsample, self.max_pixels)

    def _decode_bytes(self, data: bytes | memoryview, where: Where, fast_dct: bool,
                      fast_upsample: bool, max_pixels: int) -> np.ndarray:
        if self.is_mask:
            return decode_mask(data, labels=self.mask_labels, where=where, fast_dct=fast_dct,
                               max_pixels=max_pixels, exif_orientation=self.exif_orientation)
        return decode_image(data, mode="rgb", where=where, fast_dct=fast_dct,
                            fast_upsample=fast_upsample, max_pixels=max_pixels,
                            dtype=self.image_dtype, exif_orientation=self.exif_orientation)

    def _decode_list(self, values: list[Any], where: Where, fast_dct: bool,
                     fast_upsample: bool) -> np.ndarray:
        """Several encoded images of one feature, stacked; together at most ``max_pixels``."""
        datas = [_single_bytes(value, "", where) for value in values]
        what = "mask" if self.is_mask else "image"
        total = sum(check_size(data, max_pixels=self.max_pixels, where=where, what=what).pixels
                    for data in datas)
        if total > self.max_pixels:
            raise too_large_error(
                where, f"the {len(datas)} {what}s of this feature claim {total:,} pixels "
                f"together, more than max_pixels={self.max_pixels:,} (they decode into one "
                "array); if such records are intended, raise max_pixels",
                sum(len(data) for data in datas))
        frames = [self._decode_bytes(data, where, fast_dct, fast_upsample, self.max_pixels)
                  for data in datas]
        return _stack(frames, where)

    def _raw(self, sample: Sample, key: str, where: Where) -> np.ndarray:
        data = _single_bytes(sample[key], key, where)
        heights = (spec.MASK_HEIGHT, spec.IMAGE_HEIGHT) if self.is_mask else (spec.IMAGE_HEIGHT,)
        widths = (spec.MASK_WIDTH, spec.IMAGE_WIDTH) if self.is_mask else (spec.IMAGE_WIDTH,)
        height = _shape_value(sample, self.height_key, heights, where, "height")
        width = _shape_value(sample, self.width_key, widths, where, "width")
        what = "raw mask" if self.is_mask else "raw image"
        reason = pixels_reason(height, width, self.max_pixels, what=what)
        if reason is not None:
            raise too_large_error(where, reason, len(data))
        dtype = np.dtype(self.dtype)
        if len(data) % dtype.itemsize:
            raise decode_error(
                data, where, f"raw pixels of {len(data)} bytes are not whole {dtype} values"
            )
        pixels = np.frombuffer(data, dtype=dtype)
        if self.is_mask:
            expected = height * width
            if pixels.size != expected:
                raise decode_error(
                    data,
                    where,
                    f"raw mask has {pixels.size} values, expected height×width = "
                    f"{height}×{width} = {expected}",
                )
            return pixels.reshape(height, width)
        if self.channels_key is not None or spec.IMAGE_CHANNELS in sample:
            channels = _shape_value(
                sample, self.channels_key, (spec.IMAGE_CHANNELS,), where, "channels"
            )
        else:
            channels = pixels.size // max(1, height * width)
        expected = height * width * channels
        if pixels.size != expected or channels < 1:
            raise decode_error(
                data,
                where,
                f"raw image has {pixels.size} values, expected height×width×channels = "
                f"{height}×{width}×{channels} = {expected}",
            )
        return self._raw_depth(pixels.reshape(height, width, channels), where)

    def _raw_depth(self, image: np.ndarray, where: Where) -> np.ndarray:
        """A raw image as stored, or, with ``image_dtype="uint16"``, as uint16 (8-bit pixels
        widened ×257); SchemaError for raw pixels of another type then."""
        if self.image_dtype == "uint8" or image.dtype == np.uint16:
            return image
        if image.dtype != np.uint8:
            raise SchemaError(
                f"{where_text(where)}: the raw image holds {image.dtype} pixels; "
                "image_dtype='uint16' takes raw uint8 or uint16 images: pass "
                "image_dtype='uint8' to keep raw pixels as they are stored"
            )
        return widen_to_uint16(image)


def referenced_file(root: str | None, value: bytes | memoryview, where: Where) -> str:
    """The file a referenced path (a record's ``image/path`` bytes) names under ``root``.

    ``root`` None is the working directory. Raises
    :class:`~shardfeed.errors.UnsafeRecordPathError` naming ``where`` for a path that is not
    UTF-8 or that leads outside the root, unless the root is an
    :class:`~shardfeed.storage.paths.UnconfinedRoot` (see :mod:`shardfeed.storage.paths`).
    """
    raw = bytes(value)
    try:
        rel = raw.decode("utf-8")
    except UnicodeDecodeError:
        shown = raw.decode("utf-8", "backslashreplace")
        raise UnsafeRecordPathError(
            f"{where_text(where)}: the referenced image path '{shown}' is not UTF-8 text; the "
            "record is damaged, or was written by a tool that stores paths in another "
            "encoding: re-create the dataset, or skip such records with on_error='skip'",
            named=shown,
        ) from None
    return contained(os.curdir if root is None else root, rel, where=where_text(where),
                     what="referenced image", allow_outside=not confines(root),
                     error=UnsafeRecordPathError)


def _schema_encoding(info: ImageInfoLike) -> Encoding:
    encoding = info.encoding
    if encoding in ("jpeg", "png", "mixed"):
        return "auto"
    if encoding not in ENCODINGS:
        raise SchemaError(
            f"the schema gives image feature '{info.key}' the unknown encoding {encoding!r}; "
            f"expected one of {ENCODINGS[1:]}"
        )
    return encoding  # type: ignore[return-value]


class _LazyWhere:
    """``ImageField.where(sample, key)``, built when called (only for an error message)."""

    __slots__ = ("field", "key", "sample")

    def __init__(self, field: ImageField, sample: Sample, key: str) -> None:
        self.field = field
        self.sample = sample
        self.key = key

    def __call__(self) -> str:
        return self.field.where(self.sample, self.key)


def _single_bytes(value: Any, key: str, where: Where) -> bytes | memoryview:
    if isinstance(value, (bytes, memoryview, bytearray)):
        return value if not isinstance(value, bytearray) else bytes(value)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], bytes):
        return value[0]
    feature = f"'{key}' must be" if key else "the feature must be"
    raise DecodeError(
        f"{where_text(where)}: expected one bytes value, got {_kind_of(value)}; "
        f"{feature} a bytes_list feature holding one image: re-pack the record, or skip it "
        "with on_error='skip'"
    )


def _kind_of(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} values of shape {value.shape}"
    if isinstance(value, list):
        return f"a list of {len(value)} value{'' if len(value) == 1 else 's'}"
    return type(value).__name__


def _shape_value(
    sample: Sample, key: str | None, defaults: tuple[str, ...], where: Where, what: str
) -> int:
    keys = (key,) if key is not None else defaults
    for k in keys:
        if k in sample:
            stored = sample[k]
            value = np.asarray(stored).reshape(-1)
            if value.size == 1 and value.dtype.kind in "iu" and int(value[0]) > 0:
                return int(value[0])
            raise DecodeError(
                f"{where_text(where)}: the {what} feature '{k}' must hold one positive int, "
                f"it holds {_kind_of(stored)}; re-pack the record, or skip it with "
                "on_error='skip'"
            )
    raise SchemaError(
        f"{where_text(where)}: a raw image needs its {what}; the sample has no feature "
        f"{' or '.join(repr(k) for k in keys)}. Pass {what}_key=... or bind to the schema"
    )


def _stack(frames: list[np.ndarray], where: Where) -> np.ndarray:
    if not frames:
        raise DecodeError(f"{where_text(where)}: the feature holds no image; re-pack the "
                          "record, or skip it with on_error='skip'")
    shapes = {f.shape for f in frames}
    if len(shapes) != 1:
        raise DecodeError(
            f"{where_text(where)}: the {len(frames)} images of this feature have different shapes "
            f"{sorted(shapes)}; resize them before stacking (decode each and CropOrPad)"
        )
    return np.stack(frames)


__all__ = ["ENCODINGS", "Encoding", "ImageField", "check_encoding", "referenced_file"]
