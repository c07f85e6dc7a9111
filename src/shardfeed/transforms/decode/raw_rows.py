"""The batch form of decoding raw images: a slice's stored pixels copied into its batch rows.

A raw image (``image/raw`` bytes with its height, width and channels beside it, or of the
field's fixed ``shape``) needs no decode, only a copy. :func:`raw_rows_into` checks the slice's shape columns and byte lengths at
once against the batch rows' shape, then copies every row in one go (the rows' bytes joined
and viewed as one array). The channel conversion the sample path applies is applied here only
where it is a plain copy (stored channels equal to the output's; grey stored, RGB wanted: each
grey value repeated; RGBA stored, RGB wanted: alpha dropped); any other row (RGB stored, grey
wanted) goes through the op's own per-sample decode, so every row holds the bytes
``DecodeImage.__call__`` gives.

The reader may have copied the stored bytes into the batch rows already (see
:func:`raw_rows_target` and ``DecodeImage.bytes_into``: the column is a ``FilledColumn`` in
``out``): then only the checks run, and a row that fails them makes the loader rewrite every
row sample by sample.

Errors: a row that does not fit (another height or width than the batch's, bytes of another
length than its shape, a shape value that is not one positive int) raises SchemaError or
DecodeError without writing anything wrong: the loader then makes the slice sample by sample,
which names the record (or skips it).

Determinism: pure. State: none. Memory: the slice's pixels once more while they are joined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from shardfeed.errors import DecodeError, SchemaError
from shardfeed.format import spec
from shardfeed.format.columns import FilledColumn
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.sizes import pixels_reason

_ShapeKeys = tuple[str | None, str | None, str | None]
"""The height, width and channels features of a slice's raw images; None where not read (a
fixed shape's height and width; channels from the byte count)."""


class RawRowsDecoder(Protocol):
    """What the raw rows need of their decode op (``ops.RawRowsDecoder`` has it): where the
    image is, the channels asked, the pixel bound, and the whole-image decode of one
    sample (a row that does not fit the batch form)."""

    @property
    def image_field(self) -> ImageField: ...

    @property
    def channels(self) -> str: ...

    @property
    def max_pixels(self) -> int: ...

    def _decode_full(self, sample: dict[str, Any]) -> tuple[np.ndarray, str]: ...


def raw_rows_into(decoder: RawRowsDecoder, key: str, columns: Mapping[str, Any],
                  out: np.ndarray) -> bool:
    """Write each row's raw image of feature ``key`` into its row of ``out`` (N×H×W×C),
    channels converted as ``decoder`` converts them; see the module doc.

    False (nothing written) when these columns cannot take this path at all: ``out`` is not
    of the decoder's channel count or the field's dtype, a shape feature is missing, or a value
    is not one bytes value a row. Raises SchemaError/DecodeError for rows that do not fit.
    """
    values: Sequence[Any] = columns[key]
    dtype = np.dtype(decoder.image_field.dtype)
    if (out.ndim != 4 or len(values) != len(out) or out.dtype != dtype
            or out.shape[-1] != (3 if decoder.channels == "rgb" else 1)):
        return False
    if not len(out):
        return True
    keys = shape_keys(decoder, columns) or _fixed_keys(decoder, columns)
    if keys is None:
        return False  # the sample path raises the SchemaError naming the missing feature
    if isinstance(values, FilledColumn):
        if values.is_in(out):  # copied there as read: whole pixels of out's channels
            _stored_channels(decoder, columns, np.full(len(out), values.value_size), out,
                             keys)
            return True
        values = values[:]
    if not all(type(v) is bytes for v in values):
        raise DecodeError("a raw image value is not one bytes value")
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    stored = _stored_channels(decoder, columns, lengths, out, keys)
    _, height, width, channels = (int(n) for n in out.shape)
    first = int(stored[0])
    if (stored == first).all() and _copies(first, channels):
        pixels = np.frombuffer(b"".join(values), dtype=dtype)
        _copy_into(out, pixels.reshape(len(out), height, width, first))
        return True
    for row, data in enumerate(values):
        count = int(stored[row])
        if _copies(count, channels):
            _copy_into(out[row], np.frombuffer(data, dtype=dtype).reshape(height, width, count))
        else:
            _decode_row(decoder, key, columns, row, out[row], keys)
    return True


def shape_keys(decoder: RawRowsDecoder, columns: Mapping[str, Any]
               ) -> tuple[str, str, str | None] | None:
    """The height, width and (if any) channels features of the raw image; None when one the
    field names is not among the columns, or the field has a fixed ``shape`` (no height and
    width features are read: :func:`raw_rows_into` checks the rows against the shape, and
    paths that check shape features step aside)."""
    field = decoder.image_field
    if field.shape is not None:
        return None
    height_key = field.height_key or spec.IMAGE_HEIGHT
    width_key = field.width_key or spec.IMAGE_WIDTH
    channels_key = field.channels_key
    if channels_key is None and spec.IMAGE_CHANNELS in columns:
        channels_key = spec.IMAGE_CHANNELS
    if height_key not in columns or width_key not in columns or (
            channels_key is not None and channels_key not in columns):
        return None
    return height_key, width_key, channels_key


def _fixed_keys(decoder: RawRowsDecoder, columns: Mapping[str, Any]
                ) -> tuple[None, None, str | None] | None:
    """For a field of fixed ``shape``: no height and width features, and the channels
    feature the sample path reads (a shape of two values: ``channels_key``, or
    ``image/channels`` where present); None without a fixed shape, or when the channels
    feature named is not among the columns."""
    field = decoder.image_field
    if field.shape is None:
        return None
    if len(field.shape) == 3:
        return None, None, None
    channels_key = field.channels_key
    if channels_key is None and spec.IMAGE_CHANNELS in columns:
        channels_key = spec.IMAGE_CHANNELS
    if channels_key is not None and channels_key not in columns:
        return None
    return None, None, channels_key


def raw_rows_target(decoder: RawRowsDecoder, out: np.ndarray) -> np.ndarray | None:
    """``out`` viewed as one row of bytes a batch row, where a stored raw image of exactly
    a row's bytes is the row (out of the field's dtype and the decoder's channels, C-ordered:
    the copy :func:`raw_rows_into` makes); None otherwise."""
    if (out.ndim != 4 or not len(out) or out.dtype != np.dtype(decoder.image_field.dtype)
            or out.shape[-1] != (3 if decoder.channels == "rgb" else 1)
            or not out.flags.c_contiguous or not out.flags.writeable or not out.size):
        return None
    return out.reshape(len(out), -1).view(np.uint8)


def _stored_channels(decoder: RawRowsDecoder, columns: Mapping[str, Any], lengths: np.ndarray,
                     out: np.ndarray, shape_keys: _ShapeKeys) -> np.ndarray:
    """Each row's stored channel count, after checking every row (its value ``lengths``
    bytes long) against the batch rows: within ``max_pixels``, the batch's height×width
    (from the shape features, or the field's fixed shape where they are None), whole
    pixels."""
    rows, height, width, _ = (int(n) for n in out.shape)
    reason = pixels_reason(height, width, decoder.max_pixels, what="raw image")
    if reason is not None:
        raise DecodeError(reason)
    fixed = decoder.image_field.shape
    height_key, width_key, channels_key = shape_keys
    if height_key is not None and width_key is not None:
        fits = bool((_shape_column(columns, height_key, rows) == height).all()
                    and (_shape_column(columns, width_key, rows) == width).all())
    else:
        fits = fixed is not None and fixed[:2] == (height, width)
    if not fits:
        raise SchemaError(f"a raw image is not {height}×{width}, the batch's height×width")
    itemsize = np.dtype(decoder.image_field.dtype).itemsize
    area = height * width
    if fixed is not None and len(fixed) == 3:
        stored = np.full(rows, fixed[2], np.int64)
    elif channels_key is not None:
        stored = _shape_column(columns, channels_key, rows)
    else:  # as the sample path does: as many channels as the bytes hold whole pixels
        stored = lengths // itemsize // area
    if (stored < 1).any() or (lengths != stored * area * itemsize).any():
        raise DecodeError("a raw image's bytes do not match its height×width×channels")
    return stored


def _shape_column(columns: Mapping[str, Any], name: str, rows: int) -> np.ndarray:
    """The one int a row of shape feature ``name``; DecodeError when it holds anything else
    (the sample path's message names the record and what it holds)."""
    column = columns[name]
    if (not isinstance(column, np.ndarray) or column.shape != (rows, 1)
            or column.dtype.kind not in "iu"):
        raise DecodeError(f"the raw image's shape feature '{name}' is not one int a row")
    return column[:, 0]


def _copies(stored: int, channels: int) -> bool:
    """Whether stored channels become the output's by a plain copy, exactly as
    ``DecoderBase._convert_channels`` converts them (repeat grey; drop alpha)."""
    return stored == channels or (channels == 3 and stored in (1, 4))


def _copy_into(target: np.ndarray, pixels: np.ndarray) -> None:
    if pixels.shape[-1] == 4 and target.shape[-1] == 3:
        target[...] = pixels[..., :3]
    else:  # equal channels, or one grey channel broadcast to all three (np.repeat's values)
        target[...] = pixels


def _decode_row(decoder: RawRowsDecoder, key: str, columns: Mapping[str, Any], row: int,
                target: np.ndarray, shape_keys: _ShapeKeys) -> None:
    """Row ``row`` through the decoder's per-sample decode (a conversion that is no copy)."""
    sample: dict[str, Any] = {key: columns[key][row]}
    for name in shape_keys:
        if name is not None:
            sample[name] = columns[name][row]
    image = decoder._decode_full(sample)[0]
    if image.shape != target.shape or image.dtype != target.dtype:
        raise SchemaError(
            f"image {image.dtype} {image.shape} does not fit the batch's "
            f"{target.dtype} {target.shape}"
        )
    target[...] = image


__all__ = ["raw_rows_into", "raw_rows_target", "shape_keys"]
