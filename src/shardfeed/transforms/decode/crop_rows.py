"""The batch form of the crop-aware decode: a slice's images drawn, decoded, cropped, resized
and flipped straight into their batch rows.

:func:`crop_rows_into` runs, for each row, what
:meth:`~shardfeed.transforms.decode.crop.CropDecoderBase.__call__` runs for a sample, in the
same order and from the same generator: the same bytes, without a sample dict per image.
Where the op has a batch form of its draws (the random-resized crop's, see
:func:`~shardfeed.transforms.boxes.resized_boxes`) and the rows' generators are a
:class:`~shardfeed.sampling.crop_draws.RowKeys`, every JPEG row's header is read first and
the boxes and flips of all of them are drawn in one call; the rows' generators then go on
from after those draws for the ops that follow.

Only for one embedded image a row (``encoding="auto"``), no mask, and batch rows of the
output's shape and dtype; else None (the loader goes sample by sample). An error (a damaged
image, a header over ``max_pixels``) propagates: the loader then makes the slice sample by
sample, which names the record or skips it.

Determinism: the sample path's. State: none. Memory: a few integers a row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shardfeed.errors import SchemaError
from shardfeed.sampling.crop_draws import RowKeys
from shardfeed.transforms.base import NO_RANDOMNESS
from shardfeed.transforms.boxes import Box
from shardfeed.transforms.decode.image import (
    CMYK_SPACES,
    Where,
    check_pixels,
    jpeg_header,
    sniff_format,
)

if TYPE_CHECKING:
    from shardfeed.transforms.decode.crop import CropDecoderBase


def crop_rows_into(
    op: CropDecoderBase, columns: dict[str, Any],
    rngs: Sequence[np.random.Generator] | None, out: Mapping[str, np.ndarray],
) -> dict[str, Any] | None:
    """``columns`` with ``"image"`` the batch rows ``out["image"]``, each written by ``op``
    (see the module doc); None when the batch form does not apply."""
    image_out = out.get("image")
    key = _batch_key(op, columns, rngs, image_out)
    if key is None or image_out is None:
        return None
    where = f"feature '{key}'"  # an error sends the rows to the sample path, which names it
    values = columns[key]
    drawn = _draw_rows(op, values, rngs, where)
    for row, data in enumerate(values):
        target = image_out[row]
        known = drawn[row] if drawn is not None else None
        if known is not None:
            height, width, y, x, h, w, flip = known
            image = op._jpeg_crop(data, Box(y, x, h, w), height, width, where, flip != 0,
                                  target)
        else:
            rng = NO_RANDOMNESS if rngs is None else rngs[row]
            image = op._crop_encoded(data, rng, where, target)[0]
        if image is not target:
            if image.shape != target.shape or image.dtype != target.dtype:
                raise SchemaError(
                    f"image {image.dtype} {image.shape} does not fit the batch's "
                    f"{target.dtype} {target.shape}"
                )
            target[...] = image
    result = dict(columns)
    if not op.keep_encoded and key not in ("image", "mask"):
        del result[key]
    result["image"] = image_out
    return result


def _draw_rows(
    op: CropDecoderBase, values: list[bytes], rngs: Sequence[np.random.Generator] | None,
    where: Where,
) -> list[tuple[int, ...] | None] | None:
    """The draws of every JPEG row (not CMYK) made at once where ``op`` has a batch form of
    them (``op._boxes``): for each row ``(height, width, y, x, h, w, flip)``, or None for a
    row left to ``op._crop_encoded``; None when no batch form applies. The same headers are
    read and the same limits enforced as row by row."""
    if not isinstance(rngs, RowKeys) or not op._boxes_in_batch():
        return None
    sizes = np.zeros((len(values), 2), dtype=np.int64)
    max_pixels = op.image_field.max_pixels
    for row, data in enumerate(values):
        if sniff_format(data) == "jpeg":
            height, width, space = jpeg_header(data, where=where)
            check_pixels(height, width, max_pixels=max_pixels, where=where, nbytes=len(data))
            if space not in CMYK_SPACES:
                sizes[row] = height, width
    rows = np.flatnonzero(sizes[:, 0])
    boxes = op._boxes(rngs, rows, sizes[rows, 0], sizes[rows, 1])
    if boxes is None:
        return None
    drawn: list[tuple[int, ...] | None] = [None] * len(values)
    for row, size, box in zip(rows.tolist(), sizes[rows].tolist(), boxes.tolist()):
        drawn[row] = (*size, *box)
    return drawn


def _batch_key(
    op: CropDecoderBase, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
    image_out: np.ndarray | None,
) -> str | None:
    """The feature of the rows' embedded images when the batch form applies, else None."""
    present = dict.fromkeys(columns)
    found = op.image_field.locate(present)
    if (image_out is None or found is None or found[1] != "auto"
            or (op.mask is not False and (op.mask or op.mask_field.locate(present)))
            or image_out.shape[1:] != (*op.size, op._channel_count())
            or image_out.dtype != np.uint8):
        return None
    values = columns[found[0]]
    rows = len(image_out)
    if (not isinstance(values, list) or len(values) != rows
            or (rngs is not None and len(rngs) != rows)
            or not all(type(v) is bytes for v in values)):
        return None  # a list of frames, or a value of another kind
    return found[0]


__all__ = ["crop_rows_into"]
