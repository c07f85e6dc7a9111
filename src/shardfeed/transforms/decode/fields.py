"""Where a sample's image (or mask) is and how it is stored: embedded, raw, or referenced.

An :class:`ImageField` is resolved from, in order: what the user passed, the schema handed to
``bind``, or the standard feature names (``image/encoded``, ``image/raw``, ``image/path``;
``mask/encoded``, ``mask/raw``) present in the sample.

Raw pixels take their shape from shape features, a fixed ``shape``, or (a mask) its image's:
see :mod:`shardfeed.transforms.decode.raw`.

Every failure caused by what one record holds (bytes that do not decode, an image larger than
``max_pixels``, a referenced path that is not UTF-8 text or holds a NUL byte, a raw image
whose stored height is not one positive int) is a :class:`DecodeError`, which a Loader with
``on_error="skip"`` replaces. A SchemaError means the decode op is not set up for the data:
no such feature (pass ``key=`` or bind to the schema), no shape feature of a raw image, or
a file path stored where image bytes were expected (bytes that fail to decode and read as a
file name: valid UTF-8 text of one line ending in an extension such as ``.jpg``; pass
``encoding="path"``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
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
    decode_image,
    sniff_format,
    too_large_error,
    where_text,
)
from shardfeed.transforms.decode.masks import LABEL_MAPS, MaskLabels, decode_mask
from shardfeed.transforms.decode.orientation import ExifOrientation, check_exif_orientation
from shardfeed.transforms.decode.raw import RawShape, check_fixed_shape, kind_of, raw_pixels
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS, check_max_pixels

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

    Raw pixels: ``height_key``/``width_key``/``channels_key`` name the features of their
    shape; ``shape`` (``(height, width)`` or ``(height, width, channels)``; a mask's
    ``(height, width)``) is the fixed shape of records that store none, and makes the field
    raw (``encoding`` ``"auto"`` or ``"raw"``; the shape features are then not read).
    ``image`` (a mask's field only): its image's field, whose shape features (or fixed
    shape) a raw mask without its own takes; see :mod:`shardfeed.transforms.decode.raw`.

    Raises ValueError for an unknown option value, a ``shape`` that is not positive ints
    of the right length, or a ``shape`` beside an option it contradicts (an encoded
    ``encoding``, a ``height_key``/``width_key``, a ``channels_key`` beside three values).
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
    shape: RawShape | None = None
    image: ImageField | None = None

    def __post_init__(self) -> None:
        check_encoding(self.encoding)
        check_exif_orientation(self.exif_orientation)
        check_max_pixels(self.max_pixels)
        check_image_dtype(self.image_dtype)
        try:
            np.dtype(self.dtype)
        except TypeError:
            raise ValueError(f"dtype must be a NumPy dtype name, got {self.dtype!r}") from None
        if self.shape is not None:
            self._check_shape()
        if self.image is not None and (not self.is_mask or self.image.is_mask):
            raise ValueError("image= is a mask's link to its image's field: pass it only to "
                             "the field of a mask (is_mask=True), and the image's field")

    def _check_shape(self) -> None:
        """Normalise ``shape`` and make the field raw (see :func:`~.raw.check_fixed_shape`)."""
        shape = check_fixed_shape(self.shape, is_mask=self.is_mask, encoding=self.encoding,
                                  keys=(self.height_key, self.width_key, self.channels_key))
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "encoding", "raw")

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
        if self.shape is not None:  # a fixed shape: the schema's shape features are not read
            hk = wk = None
            ck = ck if len(self.shape) == 2 else None
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
            shape=self.shape,
            image=self.image,
        )

    def with_image(self, image: ImageField) -> ImageField:
        """This mask's field linked to ``image``, its image's field (see the class doc)."""
        return self if self.image == image else replace(self, image=image)

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
                f"Pass the {what}'s feature name ({'mask_key' if self.is_mask else 'key'}"
                "=...) or bind the transform to the dataset's schema"
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
            data = _single_bytes(sample[key], key, where)
            try:
                return raw_pixels(self, data, sample, where)
            except DecodeError as exc:
                self._raise_if_path(data, where, exc)
                raise
        value = sample[key]
        if isinstance(value, list) and encoding != "path":
            return self._decode_list(value, where, fast_dct, fast_upsample)
        data = self.encoded_bytes(sample, key, encoding)
        return self.decode_bytes(data, where, fast_dct, fast_upsample,
                                 from_record=encoding != "path")

    def decode_bytes(
        self, data: bytes | memoryview, where: Where, fast_dct: bool, fast_upsample: bool = False,
        *, from_record: bool = False,
    ) -> np.ndarray:
        """Decode encoded bytes of this field: H×W×3 RGB for images (``image_dtype``), H×W
        class ids for masks (grey values, palette indices, or colours mapped by
        ``mask_labels``).

        ``from_record``: ``data`` is the record's own value (not the content of a file it
        references); bytes that fail to decode and read as a file path then raise the
        SchemaError that says so (pass ``encoding="path"``) instead of the DecodeError.
        """
        try:
            return self._decode_bytes(data, where, fast_dct, fast_upsample, self.max_pixels)
        except DecodeError as exc:
            if from_record:
                self._raise_if_path(data, where, exc)
            raise

    def _raise_if_path(self, data: bytes | memoryview, where: Where,
                       exc: DecodeError) -> None:
        """The SchemaError of a stored file path, from ``exc``, where ``data`` reads as one
        (see :func:`stored_path`); nothing otherwise."""
        path = stored_path(data)
        if path is None:
            return
        prefix = "mask_" if self.is_mask else ""
        shown = path if len(path) <= 120 else path[:117] + "..."
        raise SchemaError(
            f"{where_text(where)}: this feature holds a file path ('{shown}'), not "
            f"{'mask' if self.is_mask else 'image'} bytes; pass {prefix}encoding=\"path\" "
            "to read the file it names (and root=..., on the Dataset or the decode op, "
            "naming the folder the paths are relative to)"
        ) from exc

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
        f"{where_text(where)}: expected one bytes value, got {kind_of(value)}; "
        f"{feature} a bytes_list feature holding one image: re-pack the record, or skip it "
        "with on_error='skip'"
    )


#: A file name's extension: a dot, a letter, then up to 4 letters or digits, at the end.
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,4}")
_MAX_PATH_BYTES = 4096


def stored_path(data: bytes | memoryview) -> str | None:
    """``data`` as text when it reads as a file path or URL rather than an image: at most
    4096 bytes, no JPEG or PNG signature, valid UTF-8 of one printable line (no control
    character), whose last part ends in an extension (``cat.jpg``, ``a/b/0001.png``,
    ``s3://bucket/x.JPEG``); None otherwise. Checked only once a decode failed."""
    if not 0 < len(data) <= _MAX_PATH_BYTES or sniff_format(data) != "other":
        return None
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text.isprintable() or text != text.strip():
        return None
    name = text.replace("\\", "/").rsplit("/", 1)[-1]
    stem, dot, extension = name.rpartition(".")
    if not stem or not dot or not _EXTENSION.fullmatch(dot + extension):
        return None
    return text


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


__all__ = ["ENCODINGS", "Encoding", "ImageField", "check_encoding", "referenced_file",
           "stored_path"]
