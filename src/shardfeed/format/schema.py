"""The feature schema of a dataset: what each feature holds, where the image and mask are.

Stored in the manifest (``to_json``/``from_json``) or inferred from a few decoded records
(:func:`infer_schema`) for TFRecord files written by other tools.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, get_args

import numpy as np

from shardfeed.errors import SchemaError
from shardfeed.format import spec as S
from shardfeed.format.example import KINDS, FeatureSpec, Kind, Value

Encoding = Literal["jpeg", "png", "mixed", "raw", "path"]
ENCODINGS: tuple[str, ...] = get_args(Encoding)


@dataclass(frozen=True, slots=True)
class FeatureInfo:
    """One feature: its value kind and its value count (``None`` when it varies by record)."""

    name: str
    kind: Kind
    length: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"feature {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}"
            )
        if self.length is not None and (not isinstance(self.length, int) or self.length < 0):
            raise ValueError(
                f"feature {self.name!r}: length must be a non-negative int or None, got "
                f"{self.length!r}"
            )

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "length": self.length}


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """Where an image (or mask) is in a record and how it is stored.

    ``encoding``: ``jpeg``/``png`` (encoded bytes), ``mixed`` (either, per record), ``raw``
    (pixel bytes of ``dtype``, shape from the height/width/channels features) or ``path``
    (a file path, relative to the dataset root, read when used).
    """

    key: str
    encoding: Encoding
    height_key: str | None = None
    width_key: str | None = None
    channels_key: str | None = None
    dtype: str = "uint8"

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(
                f"image {self.key!r}: encoding must be one of {ENCODINGS}, got {self.encoding!r}"
            )
        if self.encoding == "raw" and (self.height_key is None or self.width_key is None):
            raise ValueError(
                f"image {self.key!r}: raw pixels need height_key and width_key to know the shape"
            )
        try:
            np.dtype(self.dtype)
        except TypeError:
            raise ValueError(
                f"image {self.key!r}: dtype must be a NumPy dtype name, got {self.dtype!r}"
            ) from None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key, "encoding": self.encoding, "height_key": self.height_key,
            "width_key": self.width_key, "channels_key": self.channels_key, "dtype": self.dtype,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, field_name: str = "image") -> ImageInfo:
        """Inverse of :meth:`to_json`; raises :class:`SchemaError` naming ``field_name`` and
        the entry when a value has the wrong type or is out of range (a manifest is
        untrusted input)."""
        if not isinstance(data, dict):
            raise SchemaError(f"{field_name}: expected an object, got {type(data).__name__}")
        key = _text(data, "key", field_name, required=True)
        encoding = data.get("encoding")
        if encoding not in ENCODINGS:
            raise SchemaError(
                f"{field_name}.encoding: expected one of {', '.join(ENCODINGS)}, got "
                f"{_shown(encoding)}"
            )
        dtype = data.get("dtype", "uint8")
        if not is_pixel_dtype(dtype):
            raise SchemaError(
                f"{field_name}.dtype: expected the name of a number type of at most 8 bytes "
                f"(uint8, uint16, float32, ...), got {_shown(dtype)}"
            )
        try:
            return cls(
                key=key or "", encoding=encoding, height_key=_text(data, "height_key", field_name),
                width_key=_text(data, "width_key", field_name),
                channels_key=_text(data, "channels_key", field_name), dtype=dtype,
            )
        except ValueError as exc:  # e.g. raw pixels without their shape keys
            raise SchemaError(f"{field_name}: {exc}") from None


_DTYPE_NAME = re.compile(r"[<>|=]?[A-Za-z]{1,10}[0-9]{0,2}")


def is_pixel_dtype(value: object) -> bool:
    """True if ``value`` names a type raw pixels may have: a bool, integer or float of at
    most 8 bytes (``uint8``, ``<u2``, ``float32``). Only short plain names reach NumPy, so
    no structured, object or sized-string type is ever built from a manifest."""
    if not isinstance(value, str) or not _DTYPE_NAME.fullmatch(value):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated alias is refused, not warned about
        try:
            dtype = np.dtype(value)
        except (TypeError, ValueError, Warning):
            return False
    return dtype.kind in "biuf" and dtype.itemsize <= 8


def _shown(value: object) -> str:
    """A value's type and its first characters, for a message."""
    if isinstance(value, int) and value.bit_length() >= 256:
        return f"a {value.bit_length()}-bit int"
    text = repr(value)
    return f"{type(value).__name__} {text[:37] + '...' if len(text) > 40 else text}"


def _text(data: Mapping[str, Any], name: str, where: str, *, required: bool = False) -> str | None:
    """The string entry ``name`` of ``data`` (None when absent or null unless ``required``)."""
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise SchemaError(f"{where}.{name}: expected a non-empty string, got {_shown(value)}")
    return value


@dataclass(frozen=True, slots=True)
class Schema:
    """Features of a dataset, plus which feature is the image, the mask and the label."""

    features: Mapping[str, FeatureInfo] = field(default_factory=dict)
    image: ImageInfo | None = None
    mask: ImageInfo | None = None
    label_key: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", MappingProxyType(dict(self.features)))
        for role, info in (("image", self.image), ("mask", self.mask)):
            if info is not None and self.features and info.key not in self.features:
                raise ValueError(
                    f"schema: the {role} key {info.key!r} is not among the features "
                    f"{sorted(self.features)}"
                )
        if self.label_key is not None and self.features and self.label_key not in self.features:
            raise ValueError(
                f"schema: label_key {self.label_key!r} is not among the features "
                f"{sorted(self.features)}"
            )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the manifest's ``schema`` entry)."""
        return {
            # name order: the same schema always serialises to the same bytes
            "features": {name: self.features[name].to_json() for name in sorted(self.features)},
            "image": None if self.image is None else self.image.to_json(),
            "mask": None if self.mask is None else self.mask.to_json(),
            "label_key": self.label_key,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Schema:
        """Inverse of :meth:`to_json`; raises :class:`SchemaError` naming the entry when a
        value has the wrong type or is out of range (a manifest is untrusted input)."""
        if not isinstance(data, dict):
            raise SchemaError(f"schema: expected an object, got {type(data).__name__}")
        entries = data.get("features")
        if entries is None:
            entries = {}
        if not isinstance(entries, dict):
            raise SchemaError(f"schema.features: expected an object, got {_shown(entries)}")
        features = {name: _feature_from_json(name, f) for name, f in entries.items()}
        image, mask = data.get("image"), data.get("mask")
        try:
            return cls(
                features=features,
                image=None if image is None else ImageInfo.from_json(image,
                                                                     field_name="schema.image"),
                mask=None if mask is None else ImageInfo.from_json(mask,
                                                                   field_name="schema.mask"),
                label_key=_text(data, "label_key", "schema"),
            )
        except ValueError as exc:  # roles naming features the schema does not have
            raise SchemaError(str(exc)) from None


MAX_FEATURE_LENGTH = (1 << 31) - 1
"""Largest fixed value count a schema may give a feature."""


def _feature_from_json(name: str, data: object) -> FeatureInfo:
    where = f"schema.features[{name!r}]"
    if not isinstance(data, dict):
        raise SchemaError(f"{where}: expected an object, got {_shown(data)}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise SchemaError(f"{where}.kind: expected one of {', '.join(KINDS)}, got {_shown(kind)}")
    length = data.get("length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int)
                               or not 0 <= length <= MAX_FEATURE_LENGTH):
        raise SchemaError(
            f"{where}.length: expected null or an integer in [0, {MAX_FEATURE_LENGTH}], got "
            f"{_shown(length)}"
        )
    return FeatureInfo(name=name, kind=kind, length=length)


def _kind_and_count(value: Value) -> tuple[Kind | None, int]:
    if isinstance(value, bytes):
        return "bytes", 1
    if isinstance(value, np.ndarray):
        return ("int64" if value.dtype.kind in "iub" else "float"), int(value.size)
    if isinstance(value, list):
        return ("bytes" if value else None), len(value)
    raise SchemaError(f"cannot infer a schema from a value of type {type(value).__name__}")


def _sniff(data: bytes) -> str | None:
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return None


def _encoding_of(records: list[Mapping[str, Value]], key: str, format_key: str) -> Encoding:
    seen: set[str] = set()
    for rec in records:
        fmt = rec.get(format_key)
        name: str | None = None
        if isinstance(fmt, bytes):
            name = fmt.decode("ascii", "replace").lower()
            name = "jpeg" if name == "jpg" else name
        if name not in ("jpeg", "png"):
            value = rec.get(key)
            name = _sniff(value) if isinstance(value, bytes) else None
        if name is not None:
            seen.add(name)
    if seen == {"jpeg"}:
        return "jpeg"
    if seen == {"png"}:
        return "png"
    return "mixed"


def _present(features: Mapping[str, FeatureInfo], *keys: str) -> str | None:
    for key in keys:
        if key in features:
            return key
    return None


def _raw_mask_matches(records: list[Mapping[str, Value]], key: str, h: str, w: str) -> bool:
    """True when every sampled record's mask bytes are exactly height × width."""
    for rec in records:
        mask, height, width = rec.get(key), rec.get(h), rec.get(w)
        if not (isinstance(mask, bytes) and isinstance(height, np.ndarray)
                and isinstance(width, np.ndarray) and height.size == 1 and width.size == 1):
            return False
        if len(mask) != int(height[0]) * int(width[0]):
            return False
    return True


def schema_as_read(schema: Schema, spec: Mapping[str, FeatureSpec] | None) -> Schema:
    """``schema`` as a reader with feature specs ``spec`` sees the records: each listed
    feature that a spec gives a fixed shape has that many values in every record (a record
    without it gets the spec's default), whatever the stored records' counts."""
    fixed = {
        name: FeatureInfo(name=name, kind=fs.kind, length=math.prod(fs.shape))
        for name, fs in (spec or {}).items()
        if fs.shape is not None and name in schema.features
    }
    if not fixed:
        return schema
    return replace(schema, features={**schema.features, **fixed})


def infer_schema(decoded_records: Iterable[Mapping[str, Value]]) -> Schema:
    """Infer a :class:`Schema` from a sample of decoded records (``decode_example`` output).

    A feature's length is fixed when every sampled record has the same count. The image is
    found under the standard names (``image/encoded``, ``image/raw``, ``image/path``), its
    encoding from ``image/format`` or the bytes' signature; the mask under ``mask/encoded``,
    ``mask/raw`` or ``mask_raw`` (raw masks only when their size is height × width); the
    label under ``image/class/label`` or ``label``.
    """
    records = list(decoded_records)
    features = _infer_features(records)
    return Schema(
        features=features,
        image=_find_image(records, features),
        mask=_find_mask(records, features),
        label_key=_present(features, S.IMAGE_LABEL, "label"),
    )


def _infer_features(records: list[Mapping[str, Value]]) -> dict[str, FeatureInfo]:
    """Every feature seen in the sample, with one kind and a length fixed where all agree."""
    kinds: dict[str, Kind | None] = {}
    counts: dict[str, set[int]] = {}
    for rec in records:
        for name, value in rec.items():
            kind, count = _kind_and_count(value)
            old = kinds.get(name)
            if old is not None and kind is not None and kind != old:
                raise SchemaError(
                    f"feature {name!r} is {old} in one record and {kind} in another; records "
                    "of one dataset must agree (pass features= to read only some)"
                )
            if old is None:
                kinds[name] = kind
            counts.setdefault(name, set()).add(count)
    return {
        name: FeatureInfo(
            name=name,
            kind=kinds[name] or "bytes",
            length=next(iter(c)) if len(c) == 1 and all(name in r for r in records) else None,
        )
        for name, c in sorted(counts.items())
    }


def _find_image(
    records: list[Mapping[str, Value]], features: Mapping[str, FeatureInfo]
) -> ImageInfo | None:
    """The image feature under its standard names: encoded first, then raw, then a path."""
    hkey = _present(features, S.IMAGE_HEIGHT)
    wkey = _present(features, S.IMAGE_WIDTH)
    ckey = _present(features, S.IMAGE_CHANNELS)
    if S.IMAGE_ENCODED in features:
        return ImageInfo(S.IMAGE_ENCODED, _encoding_of(records, S.IMAGE_ENCODED, S.IMAGE_FORMAT),
                         hkey, wkey, ckey)
    if S.IMAGE_RAW in features and hkey and wkey:
        return ImageInfo(S.IMAGE_RAW, "raw", hkey, wkey, ckey)
    if S.IMAGE_PATH in features:
        return ImageInfo(S.IMAGE_PATH, "path", hkey, wkey, ckey)
    return None


def _find_mask(
    records: list[Mapping[str, Value]], features: Mapping[str, FeatureInfo]
) -> ImageInfo | None:
    """The mask feature: encoded, or raw when its byte count is height × width in every record."""
    mh = _present(features, S.MASK_HEIGHT, S.IMAGE_HEIGHT)
    mw = _present(features, S.MASK_WIDTH, S.IMAGE_WIDTH)
    if S.MASK_ENCODED in features:
        return ImageInfo(S.MASK_ENCODED, _encoding_of(records, S.MASK_ENCODED, S.MASK_FORMAT),
                         mh, mw)
    if mh and mw:
        for key in (S.MASK_RAW, "mask_raw"):
            if key in features and _raw_mask_matches(records, key, mh, mw):
                return ImageInfo(key, "raw", mh, mw)
    return None
