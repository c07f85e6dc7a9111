"""The batch form of the crop-aware decode: a slice's images drawn, decoded, cropped, resized
and flipped straight into their batch rows.

:func:`crop_rows_into` runs, for each row, what
:meth:`~shardfeed.transforms.decode.crop.CropDecoderBase.__call__` runs for a sample, in the
same order and from the same generator: the same bytes, without a sample dict per image. The rows whose
crop is resized linearly (at full or DCT scale) are made first, a slice in one compiled call
that holds no GIL (:func:`~shardfeed.transforms.decode.native_rows.native_rows_into`); what
follows is for the rest, and for every row where the package was built without that call.
A mask beside the image (``mask_key``) is cropped, resized and flipped row by row by the
op's own method with each image's draws, into the batch's mask rows.
Where the op has a batch form of its draws (the random-resized crop's, see
:func:`~shardfeed.transforms.boxes.resized_boxes`) and the rows' generators are a
:class:`~shardfeed.sampling.crop_draws.RowKeys`, every JPEG row's header is read first and
the boxes and flips of all of them are drawn in one call; the rows' generators then go on
from after those draws for the ops that follow. The headers are read by one compiled call
for the slice (:func:`frame_sizes`); the rows whose crop is decoded as a region are then
decoded in one call (:func:`decode_regions`), those of the common case (an RGB JPEG decoded
whole at full scale) decoded, cut, resized and flipped in one tight loop, the other rows one
by one through the op's own methods. With ``exif_orientation="ignore"`` (the default) the
slice's choice of region rows is made at once (:func:`plain_region_rows`), so that the tight
loop also takes the large images whose crop is not a region.

Only for one embedded image a row (``encoding="auto"``), batch rows of the output's shape and
dtype (the op's ``image_dtype``) and, where a mask is cropped, mask rows in the batch; else
None (the loader goes sample by sample). uint16 rows (``image_dtype="uint16"``) skip the
tight loop, which resizes 8-bit decodes: each goes through the op's own methods, which widen
before they resample. An error
(a damaged image, a header over ``max_pixels``) propagates: the loader then makes the slice
sample by sample, which names the record or skips it.

Determinism: the sample path's. State: none. Memory: a few integers a row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import cv2
import numpy as np
import simplejpeg

from shardfeed.errors import SchemaError
from shardfeed.format.native import compiled_module
from shardfeed.sampling.crop_draws import RowKeys
from shardfeed.transforms.arrays import interpolation_for
from shardfeed.transforms.base import NO_RANDOMNESS
from shardfeed.transforms.boxes import Box
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.image import (
    CMYK_SPACES,
    Where,
    check_pixels,
    jpeg_header,
    scratch_buffer,
    sniff_format,
)
from shardfeed.transforms.decode.native_rows import DrawnRows, drawn_rows, native_rows_into
from shardfeed.transforms.decode.orientation import orientation_of, oriented_size
from shardfeed.transforms.decode.region import (
    REGION_MIN_PIXELS,
    backend,
    decode_regions,
    region_cost_pays,
)


class CropRowsOp(Protocol):
    """What the crop rows need of their op (``crop.CropDecoderBase`` has it): its options,
    where the image and mask are, the batch form of its box draws, and its one-sample decode
    of a crop (a row the batch form leaves to it)."""

    @property
    def size(self) -> tuple[int, int]: ...

    @property
    def channels(self) -> str: ...

    @property
    def fast_dct(self) -> bool: ...

    @property
    def fast_upsample(self) -> bool: ...

    @property
    def image_dtype(self) -> str: ...

    @property
    def keep_encoded(self) -> bool: ...

    @property
    def mask(self) -> bool | None: ...

    @property
    def image_field(self) -> ImageField: ...

    @property
    def max_denominator(self) -> int: ...

    @property
    def mask_field(self) -> ImageField: ...

    def _boxes_in_batch(self) -> bool: ...

    def _boxes(self, keys: RowKeys, rows: np.ndarray, heights: np.ndarray,
               widths: np.ndarray) -> np.ndarray | None: ...

    def _channel_count(self) -> int: ...

    def _crop_encoded(self, data: bytes | memoryview, rng: np.random.Generator, where: Any,
                      out: np.ndarray | None) -> tuple[np.ndarray, Any, tuple[int, int]]: ...

    def _jpeg_crop(self, data: bytes | memoryview, box: Box, height: int, width: int,
                   where: Any, flip: bool, out: np.ndarray | None) -> np.ndarray: ...

    def _region_box(self, data: bytes | memoryview, box: Box, height: int,
                    width: int) -> tuple[Box, int] | None: ...

    def _from_region(self, region: np.ndarray, turn: int, flip: bool,
                     out: np.ndarray | None) -> np.ndarray: ...

    def _mask_crop(self, sample: dict[str, Any], box: Box, image_hw: tuple[int, int],
                   flip: bool) -> tuple[np.ndarray | None, str | None]: ...

_frames = compiled_module("shardfeed.transforms.decode._jpeg_frames")
"""The compiled frame-size reader (``_jpeg_frames.c``); None where built without a C
compiler."""


def crop_rows_into(
    op: CropRowsOp, columns: dict[str, Any],
    rngs: Sequence[np.random.Generator] | None, out: Mapping[str, np.ndarray],
) -> dict[str, Any] | None:
    """``columns`` with ``"image"`` the batch rows ``out["image"]``, each written by ``op``
    (see the module doc); None when the batch form does not apply."""
    image_out = out.get("image")
    key = batch_key(op, columns, rngs, image_out, masks=True)
    if key is None or image_out is None:
        return None
    masked = has_mask(op, columns)
    mask_out = out.get("mask") if masked else None
    if masked and (mask_out is None or len(mask_out) != len(image_out)
                   or op.mask_field.locate(dict.fromkeys(columns)) is None):
        return None  # no rows for the masks, or none in the records: the sample path says
    # each row's box, image (H, W) and flip, where a mask is cropped by them
    placed: list[Any] = [None] * len(image_out) if mask_out is not None else []
    where = f"feature '{key}'"  # an error sends the rows to the sample path, which names it
    values = columns[key]
    drawn = draw_rows(op, values, rngs, where)
    done, every = 0, (1 << len(values)) - 1
    if drawn is not None:
        if op.channels == "rgb" and op.image_field.exif_orientation == "ignore":
            # the slice's draws as one table, its denominators and region rows worked out
            # once for the region rule and the compiled call
            table = drawn_rows(drawn, op.size, max_denominator=op.max_denominator)
            if table is not None:
                done = native_rows_into(values, table, image_out, plain_region_mask(table),
                                        size=op.size, fast_dct=op.fast_dct,
                                        fast_upsample=op.fast_upsample)
        if done != every:  # rows left: the other paths
            pending = drawn if not done else [None if done >> row & 1 else known
                                              for row, known in enumerate(drawn)]
            regions, made = _region_rows_into(op, values, pending, image_out)
            done |= made
            done |= _whole_rows_into(op, values, pending, image_out, done, regions)
    if done != every or placed:  # rows left, or every row's draws for its mask
        for row, data in enumerate(values):
            known = drawn[row] if drawn is not None else None
            if done >> row & 1:
                if placed:
                    height, width, y, x, h, w, flip = known  # type: ignore[misc]
                    placed[row] = Box(y, x, h, w), (height, width), flip != 0
                continue
            target = image_out[row]
            if known is not None:
                height, width, y, x, h, w, flip = known
                image = op._jpeg_crop(data, Box(y, x, h, w), height, width, where, flip != 0,
                                      target)
                if placed:
                    placed[row] = Box(y, x, h, w), (height, width), flip != 0
            else:
                rng = NO_RANDOMNESS if rngs is None else rngs[row]
                image, row_draw, image_hw = op._crop_encoded(data, rng, where, target)
                if placed:
                    placed[row] = row_draw.box, image_hw, row_draw.flip
            if image is not target:
                if image.shape != target.shape or image.dtype != target.dtype:
                    raise SchemaError(
                        f"image {image.dtype} {image.shape} does not fit the batch's "
                        f"{target.dtype} {target.shape}"
                    )
                target[...] = image
    mask_key = _masks_into(op, columns, placed, mask_out) if mask_out is not None else None
    result = dict(columns)
    if not op.keep_encoded:
        for name in (key, mask_key):
            if name is not None and name not in ("image", "mask"):
                result.pop(name, None)
    result["image"] = image_out
    if mask_out is not None:
        result["mask"] = mask_out
    return result


def _whole_rows_into(
    op: CropRowsOp, values: list[bytes], drawn: list[tuple[int, ...] | None],
    image_out: np.ndarray, done: int, regions: int | None,
) -> int:
    """The rows (not in ``done``) of the common case written in one tight loop: an RGB JPEG
    decoded whole at full scale (no DCT scale, no region decode), its box cut, resized
    linearly into its row and flipped there, as :meth:`CropDecoderBase._jpeg_crop` does for
    it, without its per-call checks (made once for the slice here). ``regions``: the bit
    mask of the rows the region rule picks, where known for the slice; where None, no image
    of ``REGION_MIN_PIXELS`` or more is taken while the region decoder is installed. Returns
    a bit mask of the rows done; the others, and every row from the first that does not
    decode, are left to the caller. uint8 rows only (none done for uint16 rows); a JPEG that
    ``exif_orientation="apply"`` turns is left to the caller too."""
    if (op.channels != "rgb" or image_out.dtype != np.uint8
            or not image_out.flags.c_contiguous):
        return 0
    out_h, out_w = op.size
    size = (out_w, out_h)
    # A box ≥ 2× the output both ways decodes at a DCT scale or resizes by area averaging;
    # an image of REGION_MIN_PIXELS or more may be decoded as a region where that is installed
    # (asked only then: loading the region decoder costs memory small images need not pay).
    large_h, large_w = 2 * out_h, 2 * out_w
    decode, resize, flip, linear = simplejpeg.decode_jpeg, cv2.resize, cv2.flip, cv2.INTER_LINEAR
    fast_dct, fast_upsample = op.fast_dct, op.fast_upsample
    policy = op.image_field.exif_orientation
    buf: np.ndarray | None = None
    skip = done | (regions or 0)
    made = 0
    for row, known in enumerate(drawn):
        if known is None or skip >> row & 1:
            continue
        height, width, y, x, h, w, flipped = known
        if (h >= large_h and w >= large_w) or (regions is None
                                                and height * width >= REGION_MIN_PIXELS
                                                and backend() is not None):
            continue
        if policy != "ignore" and orientation_of(values[row], policy) != 1:
            continue
        try:
            if buf is None or buf.size < height * width * 3:
                buf = scratch_buffer(height * width * 3)  # this thread's, as the general path's
            image = decode(values[row], colorspace="RGB", fastdct=fast_dct,
                           fastupsample=fast_upsample, buffer=buf)
        except (ValueError, MemoryError):
            break  # the general path decodes it again and raises the error that names it
        target = image_out[row]
        resize(image[y:y + h, x:x + w], size, dst=target, interpolation=linear)
        if flipped:
            flip(target, 1, dst=target)
        made |= 1 << row
    return made


def _region_rows_into(
    op: CropRowsOp, values: list[bytes], drawn: list[tuple[int, ...] | None],
    image_out: np.ndarray,
) -> tuple[int | None, int]:
    """The rows whose crop :meth:`CropDecoderBase._jpeg_crop` decodes as a region, decoded
    in one call of the region decoder (:func:`decode_regions`: one hand-over and one release
    of the GIL for the slice's regions, the pixels of one at a time), then turned, resized
    and flipped into their rows as one by one. Returns the bit mask of the rows the region
    rule picks (None where not known for the slice) and that of the rows done; a row the
    call does not decode, and a slice's one region, are left to the caller.

    Where nothing is turned (``exif_orientation="ignore"``, the default) the choice of rows
    is made for the slice at once (:func:`plain_region_rows`) and the regions are resized
    and flipped into their rows here, as :meth:`CropDecoderBase._resize_flip` does for
    them; else row by row through the op's own methods."""
    if image_out.dtype != np.uint8:
        return None, 0
    plain = (op.image_field.exif_orientation == "ignore" and op.channels == "rgb"
             and image_out.flags.c_contiguous)
    picked: int | None = None
    if plain:
        rows, boxes = plain_region_rows(op, drawn)
        turns = [1] * len(rows)
        picked = sum(1 << row for row in rows)
    else:
        rows, boxes, turns = [], [], []  # (_region_box asks for the backend only when large)
        for row, known in enumerate(drawn):
            if known is None:
                continue
            height, width, y, x, h, w, _ = known
            planned = op._region_box(values[row], Box(y, x, h, w), height, width)
            if planned is not None:
                rows.append(row)
                boxes.append(planned[0])
                turns.append(planned[1])
    if len(rows) < 2:
        return picked, 0  # one region: the row's own path decodes it the same way
    regions = decode_regions([values[r] for r in rows], boxes, fast_dct=op.fast_dct,
                             fast_upsample=op.fast_upsample)
    out_h, out_w = op.size
    size, resize, flip = (out_w, out_h), cv2.resize, cv2.flip
    made = 0
    for row, turn, region in zip(rows, turns, regions):
        if region is None:
            continue
        target = image_out[row]
        flipped = drawn[row][6] != 0  # type: ignore[index]
        if plain:
            resize(region, size, dst=target, interpolation=interpolation_for(
                region.shape[:2], op.size, is_mask=False))
            if flipped:
                flip(target, 1, dst=target)
        else:
            image = op._from_region(region, turn, flipped, target)
            if image is not target:
                target[...] = image
        made |= 1 << row
    return picked, made


def plain_region_rows(op: CropRowsOp, drawn: list[tuple[int, ...] | None]
                      ) -> tuple[list[int], list[Box]]:
    """The rows whose crop an op that turns nothing decodes as a region, and their boxes:
    :meth:`CropDecoderBase._region_box`'s rule (a DCT scale of 1, an image of
    ``REGION_MIN_PIXELS`` or more, :func:`region_cost_pays`) for the slice at once."""
    table = drawn_rows(drawn, op.size, max_denominator=op.max_denominator)
    if table is None:
        return [], []
    chosen = plain_region_mask(table)
    if chosen is None:
        return [], []
    return (table.rows[chosen].tolist(),
            [Box(*box) for box in table.table[chosen][:, 2:6].tolist()])


def plain_region_mask(drawn: DrawnRows) -> np.ndarray | None:
    """:func:`plain_region_rows`' rule on a slice's :func:`drawn_rows`: for each drawn row,
    whether its crop is decoded as a region; None where none is (then the region decoder is
    not asked for: loading it costs memory that small images need not pay)."""
    height, width, y, _, h, w = (drawn.table[:, k] for k in range(6))
    chosen: np.ndarray = ((drawn.d == 1) & (height * width >= REGION_MIN_PIXELS)
                          & region_cost_pays(height, width, np.minimum(height, y + h), h, w))
    if not chosen.any() or backend() is None:
        return None
    return chosen


def frame_sizes(values: list[bytes]) -> np.ndarray:
    """The (height, width) of each plain JPEG of ``values`` (rows×2 int64), read by the
    compiled part (``_jpeg_frames.c``) where the package was built with it; (0, 0) for every
    other row, and for every row without it (the rows the caller reads with
    :func:`~shardfeed.transforms.decode.image.jpeg_header`)."""
    if _frames is None:
        return np.zeros((len(values), 2), dtype=np.int64)
    return np.frombuffer(_frames.sizes(values), dtype=np.int32).reshape(-1, 2).astype(np.int64)


def draw_rows(
    op: CropRowsOp, values: list[bytes], rngs: Sequence[np.random.Generator] | None,
    where: Where,
) -> list[tuple[int, ...] | None] | None:
    """The draws of every JPEG row (not CMYK) made at once where ``op`` has a batch form of
    them (``op._boxes``): for each row ``(height, width, y, x, h, w, flip)``, or None for a
    row left to ``op._crop_encoded``; None when no batch form applies. The same headers are
    read and the same limits enforced as row by row; ``height`` and ``width`` are the image's
    as the op sees it (swapped for a JPEG that ``exif_orientation="apply"`` turns a quarter).
    """
    if not isinstance(rngs, RowKeys) or not op._boxes_in_batch():
        return None
    sizes = frame_sizes(values)
    max_pixels = op.image_field.max_pixels
    if len(sizes) and sizes[:, 0].all() and int((sizes[:, 0] * sizes[:, 1]).max()) <= max_pixels:
        rows = np.arange(len(values))  # every row a plain JPEG within the limit: none asked again
    else:
        over = np.flatnonzero(sizes[:, 0] * sizes[:, 1] > max_pixels)
        for row in np.flatnonzero(sizes[:, 0] == 0).tolist() + over[:1].tolist():
            data = values[row]
            if sniff_format(data) == "jpeg":
                height, width, space = jpeg_header(data, where=where)
                check_pixels(height, width, max_pixels=max_pixels, where=where,
                             nbytes=len(data))
                if space not in CMYK_SPACES:
                    sizes[row] = height, width
        rows = np.flatnonzero(sizes[:, 0])
    policy = op.image_field.exif_orientation
    if policy != "ignore":
        for row in rows.tolist():
            turn = orientation_of(values[row], policy)
            sizes[row] = oriented_size(int(sizes[row, 0]), int(sizes[row, 1]), turn)
    boxes = op._boxes(rngs, rows, sizes[rows, 0], sizes[rows, 1])
    if boxes is None:
        return None
    drawn: list[tuple[int, ...] | None] = [None] * len(values)
    for row, size, box in zip(rows.tolist(), sizes[rows].tolist(), boxes.tolist()):
        drawn[row] = (*size, *box)
    return drawn


def batch_key(
    op: CropRowsOp, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
    image_out: np.ndarray | None, *, masks: bool = False,
) -> str | None:
    """The feature of the rows' embedded images when the batch form applies, else None.
    ``masks``: whether rows with a mask are taken (the caller crops the masks)."""
    present = dict.fromkeys(columns)
    found = op.image_field.locate(present)
    if (image_out is None or found is None or found[1] != "auto"
            or (not masks and has_mask(op, present))
            or image_out.shape[1:] != (*op.size, op._channel_count())
            or image_out.dtype != np.dtype(op.image_dtype)):
        return None
    values = columns[found[0]]
    rows = len(image_out)
    if (not isinstance(values, list) or len(values) != rows
            or (rngs is not None and len(rngs) != rows)
            or not all(type(v) is bytes for v in values)):
        return None  # a list of frames, or a value of another kind
    return found[0]


def has_mask(op: CropRowsOp, columns: dict[str, Any]) -> bool:
    """Whether ``op`` crops a mask beside the image of rows with ``columns``."""
    return op.mask is not False and bool(op.mask or op.mask_field.locate(columns))


def _masks_into(op: CropRowsOp, columns: dict[str, Any], placed: list[Any],
                mask_out: np.ndarray) -> str | None:
    """Each row's mask cropped by its image's draws (``placed[row]``: the box, the image's
    (H, W) as the op sees it, the flip) into ``mask_out[row]``, by the op's own
    :meth:`CropDecoderBase._mask_crop` on the row's values: the sample path's pixels and
    checks. Returns the mask's feature (None where the rows have none)."""
    names = list(columns)
    mask_key: str | None = None
    for row, (box, image_hw, flip) in enumerate(placed):
        sample = {name: columns[name][row] for name in names}
        mask, mask_key = op._mask_crop(sample, box, image_hw, flip)
        target = mask_out[row]
        if mask is None or mask.shape != target.shape or mask.dtype != target.dtype:
            raise SchemaError(
                f"mask {None if mask is None else (mask.dtype, mask.shape)} does not fit the "
                f"batch's {target.dtype} {target.shape}")
        target[...] = mask
    return mask_key


__all__ = ["batch_key", "crop_rows_into", "draw_rows", "frame_sizes", "has_mask",
           "plain_region_rows"]
