"""A slice's JPEG crops made in one compiled call that holds no GIL.

For the rows of :func:`~shardfeed.transforms.decode.crop_rows.crop_rows_into` whose crop is
resized linearly (no area resize), the compiled part (``_jpeg_rows.c``) decodes each box
with libjpeg (only its iMCU columns and the rows down to its last where chroma is
replicated, the train preset's default; every column and the rows above it read and
dropped with libjpeg's smooth upsampling), resizes it and flips it straight into its batch
row, all the slice's rows in one call without the GIL. A box under 2× the output one way or
both is decoded at full scale and resized with OpenCV's 8-bit linear arithmetic; a larger
one at the DCT scale ``1/d`` the Python path picks (``boxes.scale_denominator``), only the
scaled rows and columns its samples read, then sampled by the scaled warp
(:mod:`~shardfeed.transforms.decode.warp`). The bytes are those of the Python path (the
whole image decoded by simplejpeg, or its region by nvImageCodec, then ``cv2.resize`` or
the scaled warp, and ``cv2.flip``): ``tests/transforms/test_native_rows.py`` compares them.

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

import logging
import threading
from typing import NamedTuple

import numpy as np

from shardfeed.format.native import compiled_module
from shardfeed.transforms.boxes import Box, scale_denominators

compiled = compiled_module("shardfeed.transforms.decode._jpeg_rows")
"""The compiled call (``_jpeg_rows.c``); None where built without a C compiler or libjpeg,
or where its pixels are not the Python path's (:func:`agrees`)."""

_checked: list[bool] = []  # the one check of this process, once made: whole, scaled
_lock = threading.Lock()


def agrees() -> bool:
    """Whether the compiled call gives the Python path's bytes here, checked once a process
    on a small JPEG (4:2:0 in both upsampling modes, 4:2:2, a whole image and regions, at full and
    DCT scale, flipped and not): the libjpeg it was built with is the machine's, the Python
    path's decoders bring their own. Where it does not, the call is not used (and a warning
    says so); where only its scaled decode differs, the scaled rows are left to the Python
    path."""
    with _lock:
        if not _checked:
            try:
                _checked.extend(_self_check())
            except Exception:
                logging.getLogger(__name__).warning(
                    "the check of the compiled JPEG crop call failed: crops are made by the "
                    "Python path", exc_info=True)
                _checked[:] = [False, False]
                return False
            if not _checked[0]:
                logging.getLogger(__name__).warning(
                    "the compiled JPEG crop call gives other pixels than simplejpeg and "
                    "OpenCV here (another libjpeg): crops are made by the Python path")
            elif not _checked[1]:
                logging.getLogger(__name__).warning(
                    "the compiled JPEG crop call's scaled decode gives other pixels than "
                    "simplejpeg's here (another libjpeg): crops decoded at a DCT scale are "
                    "made by the Python path")
        return _checked[0]


def _self_check() -> tuple[bool, bool]:
    """(whole-scale rows agree, DCT-scaled rows agree)."""
    import cv2
    import simplejpeg

    from shardfeed.transforms.decode.warp import scaled_warp

    y, x = np.mgrid[0:96, 0:128]
    pixels = np.dstack([x * 2, y * 3, (x + y) * 3 // 2]).astype(np.uint8)
    out_h, out_w = 16, 20  # boxes under 2x of it one way (d 1), and scaled ones (d 2, 4)
    rows = [(96, 128, 0, 0, 30, 128, 0, 1, 1), (96, 128, 9, 13, 14, 23, 1, 1, 1),
            (96, 128, 17, 21, 25, 40, 0, 0, 1), (96, 128, 0, 0, 96, 128, 1, 1, 4),
            (96, 128, 3, 5, 41, 50, 1, 1, 2), (96, 128, 7, 2, 70, 90, 0, 1, 4)]
    agree = [True, True]
    for subsampling, fast_upsample in (("420", True), ("420", False), ("422", True)):
        data = bytes(simplejpeg.encode_jpeg(pixels, quality=85, colorsubsampling=subsampling))
        decoded = {d: simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True,
                                             fastupsample=fast_upsample,
                                             **({} if d == 1 else {"min_height": 96 // d,
                                                                   "min_width": 128 // d}))
                   for d in (1, 2, 4)}
        out = np.zeros((len(rows), out_h, out_w, 3), np.uint8)
        table = np.array([(k, *row) for k, row in enumerate(rows)], dtype=np.int64)
        assert compiled is not None
        try:
            flags = compiled.crop_rows([data] * len(rows), table, out, out_h, out_w, True,
                                       fast_upsample)
        except Exception:  # noqa: BLE001 - a call that fails here is not used
            return False, False
        for k, (_, _, top, left, h, w, flip, _, d) in enumerate(rows):
            if d == 1:
                expected = cv2.resize(decoded[1][top:top + h, left:left + w], (out_w, out_h),
                                      interpolation=cv2.INTER_LINEAR)
                if flip:
                    expected = cv2.flip(expected, 1)
            else:
                expected = scaled_warp(decoded[d], Box(top, left, h, w), d, (out_h, out_w),
                                       flip != 0)
            if not flags[k] or out[k].tobytes() != expected.tobytes():
                agree[d > 1] = False
    return agree[0], agree[0] and agree[1]


class DrawnRows(NamedTuple):
    """A slice's drawn JPEG rows at once (:func:`drawn_rows`): their row numbers, their
    draws a row (``height, width, y, x, h, w, flip``, int64), and each crop's DCT scale
    denominator (:func:`~shardfeed.transforms.boxes.scale_denominators`)."""

    rows: np.ndarray
    table: np.ndarray
    d: np.ndarray


def drawn_rows(drawn: list[tuple[int, ...] | None], size: tuple[int, int], *,
               max_denominator: int) -> DrawnRows | None:
    """The rows of ``drawn`` that are not None, as one table, with their denominators for
    outputs of ``size`` (worked out once a slice for the region rule and the compiled call);
    None where there is none."""
    rows = [row for row, known in enumerate(drawn) if known is not None]
    if not rows:
        return None
    table = np.array([drawn[row] for row in rows], dtype=np.int64)
    d = scale_denominators(table[:, 4], table[:, 5], size[0], size[1],
                           max_denominator=max_denominator)
    return DrawnRows(np.array(rows, dtype=np.int64), table, d)


def native_rows_into(values: list[bytes], drawn: DrawnRows, image_out: np.ndarray,
                     regions: np.ndarray | None, *, size: tuple[int, int], fast_dct: bool,
                     fast_upsample: bool) -> int:
    """The rows of ``drawn`` (:func:`drawn_rows` of the slice's JPEG rows) that the compiled
    call decoded, resized to ``size`` and flipped into ``image_out`` (RGB uint8 rows, in C
    order), as a bit mask; 0 where it does not apply (see the module doc). ``regions``: for
    each drawn row, whether the Python path decodes it as a region
    (:func:`~.crop_rows.plain_region_rows`; None: none); every other row is read to its end,
    as the Python path's whole decode reads it. The caller takes only ops that turn nothing
    (``exif_orientation="ignore"``) and give RGB."""
    if (compiled is None or image_out.dtype != np.uint8 or not image_out.flags.c_contiguous
            or image_out.ndim != 4 or not agrees()):
        return 0
    table = np.empty((len(drawn.rows), 10), dtype=np.int64)
    table[:, 0] = drawn.rows
    table[:, 1:8] = drawn.table
    table[:, 8] = 1 if regions is None else ~regions  # read to the end: not a region
    table[:, 9] = drawn.d
    if not _checked[1]:
        table[table[:, 9] > 1, 9] = 0  # the scaled decode is not the Python path's here
    out_h, out_w = size
    flags: bytes = compiled.crop_rows(values, table, image_out, out_h, out_w, fast_dct,
                                      fast_upsample)
    done = 0
    for row, flag in zip(drawn.rows.tolist(), flags):
        if flag:
            done |= 1 << row
    return done


__all__ = ["DrawnRows", "compiled", "drawn_rows", "native_rows_into"]
