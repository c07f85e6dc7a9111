"""A slice's JPEG crops made in one compiled call that holds no GIL.

For the rows of :func:`~shardfeed.transforms.decode.crop_rows.crop_rows_into` whose crop is
resized linearly at full scale (the box under 2× the output one way or both: no DCT scale,
no area resize), the compiled part (``_jpeg_rows.c``) decodes each box with libjpeg (only
its iMCU columns and the rows down to its last where chroma is replicated, the train
preset's default; every column and the rows above it read and dropped with libjpeg's smooth
upsampling), resizes it with OpenCV's 8-bit linear arithmetic and flips it straight into its
batch row, all the slice's rows in one call without the GIL. The bytes are those of the
Python path (the whole image decoded by simplejpeg, or its region by nvImageCodec, then
``cv2.resize`` and ``cv2.flip``): ``tests/transforms/test_native_rows.py`` compares them.

A row the call does not take (a libjpeg error or warning, a JPEG without its end-of-image
marker, a frame of another size than its header said, another colour space than RGB out)
is left to the Python path, which gives the same bytes or the error that names the record.
The call reads a JPEG as far as the Python path would: to its end (so that damage below the
crop fails the row, as a whole decode fails), except for the rows that path decodes as
regions (:func:`~shardfeed.transforms.decode.crop_rows.plain_region_rows`: large images,
where nvImageCodec is installed), which stop at the crop's last row as a region decode does.
Only for RGB uint8 rows in C order with ``exif_orientation="ignore"``; else nothing is done
here. Where the package was built without libjpeg's headers the call is absent and every row
goes the Python path.

Determinism: pure. State: none. Memory: one box's decoded rows and two resized rows, freed
by the call.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from shardfeed.format.native import compiled_module
from shardfeed.transforms.decode.fields import ImageField


class CropOp(Protocol):
    """What the call needs of a crop op (the part of ``crop_rows.CropRowsOp`` it reads)."""

    @property
    def size(self) -> tuple[int, int]: ...
    @property
    def channels(self) -> str: ...
    @property
    def fast_dct(self) -> bool: ...
    @property
    def fast_upsample(self) -> bool: ...
    @property
    def image_field(self) -> ImageField: ...

compiled = compiled_module("shardfeed.transforms.decode._jpeg_rows")
"""The compiled call (``_jpeg_rows.c``); None where built without a C compiler or libjpeg."""


def native_rows_into(op: CropOp, values: list[bytes],
                     drawn: list[tuple[int, ...] | None], image_out: np.ndarray,
                     regions: list[int]) -> int:
    """The rows of ``drawn`` (``(height, width, y, x, h, w, flip)`` a JPEG row, None for
    others) that the compiled call decoded, resized and flipped into ``image_out``, as a bit
    mask; 0 where it does not apply (see the module doc). ``regions``: the rows the Python
    path decodes as regions (:func:`~.crop_rows.plain_region_rows`); every other row is read
    to its end, as the Python path's whole decode reads it."""
    if (compiled is None or op.channels != "rgb" or image_out.dtype != np.uint8
            or not image_out.flags.c_contiguous or image_out.ndim != 4
            or op.image_field.exif_orientation != "ignore"):
        return 0
    rows = [row for row, known in enumerate(drawn) if known is not None]
    if not rows:
        return 0
    table = np.ones((len(rows), 9), dtype=np.int64)
    table[:, 0] = rows
    table[:, 1:8] = np.array([drawn[row] for row in rows], dtype=np.int64)
    if regions:
        table[np.isin(table[:, 0], regions), 8] = 0
    out_h, out_w = op.size
    flags: Any = compiled.crop_rows(values, table, image_out, out_h, out_w, op.fast_dct,
                                    op.fast_upsample)
    done = 0
    for row, flag in zip(rows, flags):
        if flag:
            done |= 1 << row
    return done


__all__ = ["compiled", "native_rows_into"]
